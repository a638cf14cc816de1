package precheck

import "github.com/gpu-injector/gpu-injector/status"

// How a GPU node's pods get the driver.
const (
	// DeliveryNRI: gpu-injector's NRI plugin mounts the node's driver when
	// the runtime creates the container; the pod carries a marker only.
	DeliveryNRI = "nri-plugin"
	// DeliveryNodeRuntime: the node's own runtime or device plugin (the
	// NVIDIA container toolkit, CDI, GKE's device plugin) injects the driver.
	DeliveryNodeRuntime = "node-runtime"
	// DeliveryHostPath: read-only hostPath volumes of the node's layout, and
	// a pin on it; Pod Security must allow hostPath (privileged).
	DeliveryHostPath = "hostPath"
	// DeliveryNone: a GPU pod that lands there gets no driver, or is refused.
	DeliveryNone = "none"
)

// Webhook check outcomes.
const (
	// WebhookOK: the API server called the webhook and its answer shows
	// gpu-injector's change (the injection record, the runtime marker) or a
	// warning it wrote.
	WebhookOK = "ok"
	// WebhookFailed: unreachable, denied, or admitted without gpu-injector's
	// change; Message has the API server's words.
	WebhookFailed = "failed"
	// WebhookSkipped: offline, or no namespace to try the pod in.
	WebhookSkipped = "skipped"
)

// Report is everything precheck found, in the order it prints it. Its JSON
// and YAML forms are the -o json and -o yaml output.
type Report struct {
	// Offline: read from a file (-f), so the webhook was not asked.
	Offline      bool              `json:"offline"`
	Config       ConfigCheck       `json:"config"`
	Nodes        []NodeCheck       `json:"nodes"`
	DevicePlugin DevicePluginCheck `json:"devicePlugin"`
	Webhook      WebhookCheck      `json:"webhook"`
	Namespaces   []NamespaceCheck  `json:"namespaces"`
	// Notes are worth knowing and need no action.
	Notes []string `json:"notes"`
	// Attention lists, one line each, what to act on: the exit status is
	// status.ExitAttention exactly when it is not empty.
	Attention []string `json:"attention"`
}

// ConfigCheck is the webhook configuration the checks ran with.
type ConfigCheck struct {
	// Source says where it came from: a file, the release's ConfigMap, or
	// the defaults.
	Source         string   `json:"source"`
	DriverDelivery string   `json:"driverDelivery"`
	PodSecurity    string   `json:"podSecurity"`
	Resources      []string `json:"resources"`
}

// NodeCheck is one GPU node: how its pods get the driver, and why.
type NodeCheck struct {
	Name string `json:"name"`
	// Evidence is what makes it a GPU node: the probe's state label, GPU
	// capacity, or a GPU label (NVIDIA's, a cloud's accelerator label).
	Evidence string `json:"evidence"`
	// State is the probe's gpu-injector.io/state; empty: not probed.
	State         string `json:"state,omitempty"`
	DriverVersion string `json:"driverVersion,omitempty"`
	Fingerprint   string `json:"fingerprint,omitempty"`
	// NRIPlugin is the gpu-injector.io/nri-plugin label.
	NRIPlugin string `json:"nriPlugin,omitempty"`
	Delivery  string `json:"delivery"`
	// Runtime is the layout's runtimeInjection (toolkit, cdi,
	// device-plugin) when the node's own runtime injects.
	Runtime string `json:"runtime,omitempty"`
	// Why says why the delivery is this one, in the webhook's terms, and
	// what to check when it is none.
	Why string `json:"why"`
	// AllocatableGPUs sums the node's allocatable of the configuration's
	// resources.names.
	AllocatableGPUs int64 `json:"allocatableGPUs"`
	// NeedsAttention: the node's GPU pods will not get the driver, and an
	// operator can change that.
	NeedsAttention bool `json:"needsAttention,omitempty"`
}

// DevicePluginCheck says whether each GPU node advertises GPUs to the
// scheduler: without allocatable GPUs a GPU pod is never placed there.
type DevicePluginCheck struct {
	// Resources are the configuration's resources.names.
	Resources []string `json:"resources"`
	// Advertising counts the GPU nodes with allocatable GPUs.
	Advertising int `json:"advertising"`
	// Without are the GPU nodes that advertise none, sorted.
	Without []string `json:"without,omitempty"`
}

// WebhookCheck is whether the API server reaches the webhook, by a
// server-side dry-run create of a small GPU pod in an opted-in namespace.
type WebhookCheck struct {
	Outcome string `json:"outcome"`
	Message string `json:"message"`
	// DryRun is the API server's answer as `gpu-injector status` reads it;
	// absent when no pod was tried.
	DryRun *status.DryRunLog `json:"dryRun,omitempty"`
}

// NamespaceCheck is one opted-in namespace and its Pod Security level
// against what its GPU pods need on each GPU node.
type NamespaceCheck struct {
	Name string `json:"name"`
	// Enforce is the pod-security.kubernetes.io/enforce label; empty: the
	// cluster's default level.
	Enforce string `json:"enforce,omitempty"`
	// Excluded: the webhook never sees it (the release's namespace, or the
	// configuration's excludedNamespaces), whatever its label says.
	Excluded bool `json:"excluded,omitempty"`
	// Refused are the GPU nodes where its GPU pods cannot get the driver at
	// this level, sorted; Reason says why in short, Message in the webhook's
	// words, for the first.
	Refused []string `json:"refused,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	Message string   `json:"message,omitempty"`
}
