package status

import (
	"time"

	"github.com/gpu-injector/gpu-injector/layout"
)

// Report is everything `gpu-injector status` found, in the order it prints
// it. Its JSON and YAML forms are the -o json and -o yaml output, so that a
// script reads the same facts a person sees.
type Report struct {
	Webhook WebhookStatus `json:"webhook"`
	Probe   ProbeStatus   `json:"probe"`
	Nodes   []NodeStatus  `json:"nodes"`
	// Plugin names the GPU nodes without gpu-injector's NRI plugin.
	Plugin     PluginStatus      `json:"nriPlugin"`
	Pools      PoolsStatus       `json:"pools"`
	Namespaces []NamespaceStatus `json:"namespaces"`
	Events     []EventStatus     `json:"layoutMismatchEvents"`
	// ImagesUnread are the pods admitted without their images'
	// configuration, as the pods say.
	ImagesUnread ImagesUnreadStatus `json:"imagesUnread"`
	// Attention lists, one line each, what needs an operator: the exit
	// status is non-zero exactly when it is not empty.
	Attention []string `json:"attention"`
}

// WebhookStatus is the webhook Deployment, its configuration, and whether the
// API server reaches it.
type WebhookStatus struct {
	// Namespace is where the chart's Deployment runs; empty when none was found.
	Namespace  string `json:"namespace"`
	Deployment string `json:"deployment"`
	Desired    int32  `json:"desired"`
	Ready      int32  `json:"ready"`
	// Configuration is the MutatingWebhookConfiguration's name; empty when
	// the cluster has none, so no pod reaches the webhook at all.
	Configuration string `json:"configuration"`
	FailurePolicy string `json:"failurePolicy,omitempty"`
	// CABundle says whether every webhook of the configuration has a CA:
	// without one the API server cannot verify the webhook and every call fails.
	CABundle bool      `json:"caBundle"`
	DryRun   DryRunLog `json:"dryRun"`
}

// Dry-run outcomes.
const (
	// DryRunInjected: the API server called the webhook and it injected.
	DryRunInjected = "injected"
	// DryRunUnchanged: admitted without the webhook's mark; with failurePolicy
	// Ignore that may also mean an unreachable webhook.
	DryRunUnchanged = "unchanged"
	// DryRunDenied: the webhook (or another admission step) refused the pod.
	DryRunDenied = "denied"
	// DryRunUnreachable: the API server could not call the webhook.
	DryRunUnreachable = "unreachable"
	// DryRunError: the request failed for another reason (RBAC, quota...).
	DryRunError = "error"
	// DryRunSkipped: no namespace is opted in, so there is nothing to try.
	DryRunSkipped = "skipped"
)

// DryRunLog is the outcome of a server-side dry-run create of a small GPU pod
// in an opted-in namespace: the API server runs every admission step, the
// webhook included, and stores nothing.
type DryRunLog struct {
	Outcome   string `json:"outcome"`
	Namespace string `json:"namespace,omitempty"`
	// Message is the error or denial, or why the dry run was skipped.
	Message string `json:"message,omitempty"`
	// What the answer carried, when admitted.
	Fingerprint   string            `json:"fingerprint,omitempty"`
	DriverVersion string            `json:"driverVersion,omitempty"`
	Runtime       string            `json:"runtime,omitempty"`
	HostPaths     []string          `json:"hostPaths,omitempty"`
	NodeSelector  map[string]string `json:"nodeSelector,omitempty"`
	RuntimeInject string            `json:"runtimeInject,omitempty"`
	Warnings      []string          `json:"warnings,omitempty"`
	// Policy: the chart's MutatingAdmissionPolicy admitted the pod (its label
	// gpu-injector.io/admission=policy), so the webhook was not called.
	Policy bool `json:"policy,omitempty"`
}

// ProbeStatus is the probe DaemonSet.
type ProbeStatus struct {
	Namespace string `json:"namespace"`
	DaemonSet string `json:"daemonSet"`
	Desired   int32  `json:"desired"`
	Ready     int32  `json:"ready"`
	Available int32  `json:"available"`
}

// NodeStatus is one GPU node as its probe published it.
type NodeStatus struct {
	Name          string `json:"name"`
	State         string `json:"state"`
	Reason        string `json:"reason,omitempty"`
	DriverVersion string `json:"driverVersion,omitempty"`
	Fingerprint   string `json:"fingerprint,omitempty"`
	GPUs          int64  `json:"gpus"`
	// NRIPlugin is the gpu-injector.io/nri-plugin label: the node injects
	// the driver at container creation, which Pod Security's baseline and
	// restricted levels allow (no hostPath in the pod).
	NRIPlugin string `json:"nriPlugin,omitempty"`
	// DriverMounts is the gpu-injector.io/driver-mounts label: how a driver
	// mounted on the host after the probe started reaches it (propagated:
	// at once; restart: the probe restarts its container to see it).
	DriverMounts string `json:"driverMounts,omitempty"`
	// Runtime is the layout's runtimeInjection (toolkit, cdi, device-plugin):
	// the node's own runtime or device plugin injects, so pods get no hostPath.
	Runtime       string `json:"runtime,omitempty"`
	Unschedulable bool   `json:"unschedulable,omitempty"`
	// StaleDriver is the NRI plugin's last scan of the node's GPU containers
	// for deleted driver libraries; nil when the node publishes none (no
	// plugin, or its scan is off). StaleDriverNote says why a published one
	// was not believed.
	StaleDriver     *layout.StaleDriver `json:"staleDriver,omitempty"`
	StaleDriverNote string              `json:"staleDriverNote,omitempty"`
	// StaleDriverNotOnNode is how many pods the record named that do not run
	// on the node, left out of StaleDriver.Pods.
	StaleDriverNotOnNode int `json:"staleDriverNotOnNode,omitempty"`
}

// PoolsStatus is the webhook's memory of pools at zero.
type PoolsStatus struct {
	// ConfigMap is the pool memory's name; Found says whether it exists.
	ConfigMap string       `json:"configMap"`
	Found     bool         `json:"found"`
	Pools     []PoolStatus `json:"pools,omitempty"`
	// Note says why the pools could not be decoded, when they could not.
	Note string `json:"note,omitempty"`
}

// PoolStatus is one remembered or declared pool.
type PoolStatus struct {
	Pool          string    `json:"pool"`
	Fingerprint   string    `json:"fingerprint"`
	DriverVersion string    `json:"driverVersion"`
	LastSeen      time.Time `json:"lastSeen,omitzero"`
	// Expires is when the layout stops serving pods of the pool: LastSeen
	// plus pinning.rememberFor.
	Expires time.Time `json:"expires,omitzero"`
	// Declared: served from config.pinning.pools, which never expires.
	Declared bool `json:"declared,omitempty"`
}

// NamespaceStatus is one opted-in namespace.
type NamespaceStatus struct {
	Name    string `json:"name"`
	Enforce string `json:"enforce,omitempty"`
	// Refused is set when GPU pods there will be refused, with why.
	Refused string `json:"refused,omitempty"`
	// Excluded: the configuration's excludedNamespaces wins over the label.
	Excluded bool `json:"excluded,omitempty"`
}

// EventStatus is one recent LayoutMismatch Event.
type EventStatus struct {
	Namespace string    `json:"namespace"`
	Object    string    `json:"object"`
	Count     int32     `json:"count"`
	Last      time.Time `json:"last"`
	Message   string    `json:"message"`
}
