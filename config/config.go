// Package config is gpu-injector's versioned configuration file: types,
// defaults in one place, and validation that names every bad field.
package config

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

const (
	APIVersion = "config.gpu-injector.io/v1alpha1"
	Kind       = "InjectorConfiguration"
)

// What to do with an LD_LIBRARY_PATH the container already sets.
const (
	// LDLibraryPathAppend keeps the user's folders first: their choice wins.
	LDLibraryPathAppend = "Append"
	// LDLibraryPathPrepend puts the driver first, ahead of stale copies in the image.
	LDLibraryPathPrepend = "Prepend"
	// LDLibraryPathOff never touches LD_LIBRARY_PATH.
	LDLibraryPathOff = "Off"
)

// Which containers get the driver mounts.
const (
	ContainersGPU = "GPU"
	ContainersAll = "All"
)

// How to choose among the layouts a pod may use.
const (
	// LayoutPolicyMostGPUs prefers the layout with the most allocatable GPUs,
	// then the newest driver, then the smallest fingerprint.
	LayoutPolicyMostGPUs = "MostGPUs"
	// LayoutPolicyNewestDriver prefers the newest driver, then most GPUs.
	LayoutPolicyNewestDriver = "NewestDriver"
	// LayoutPolicySpread picks among the layouts that fit at random, weighted
	// by their allocatable GPUs, so that pods without constraints use every
	// pool instead of filling the largest first.
	LayoutPolicySpread = "Spread"
)

// What to do when no layout fits a GPU pod.
const (
	NoLayoutDeny   = "Deny"
	NoLayoutAllow  = "Allow"
	NoLayoutStatic = "Static"
)

// What to do in a namespace whose Pod Security level forbids hostPath.
const (
	PodSecurityWarn = "Warn"
	PodSecurityDeny = "Deny"
)

// What to do with driver folders or files a GPU container mounts by hand, as
// the classic tutorials taught (/usr/lib/nvidia-384/bin at /usr/local/nvidia/bin).
const (
	// LegacyMountsReplace drops the hand-written mounts (and their volumes,
	// when nothing else uses them) and injects the chosen layout's instead:
	// the old folder rarely exists on today's nodes.
	LegacyMountsReplace = "Replace"
	// LegacyMountsKeep keeps them and admits the pod only to layouts whose
	// host paths contain every hand-mounted one; none: no layout fits.
	LegacyMountsKeep = "Keep"
)

// What to do on nodes whose container runtime injects the driver itself.
const (
	// RuntimeInjectionPin pins the pod to such a layout without adding mounts
	// or LD_LIBRARY_PATH: the runtime's own mounts would collide with ours.
	RuntimeInjectionPin = "Pin"
	// RuntimeInjectionSkip leaves a pod whose chosen layout is such a node's
	// alone (only the legacy resource rename happens): for clusters where
	// every GPU node's runtime injects, where pinning adds nothing.
	RuntimeInjectionSkip = "Skip"
)

// How the driver reaches a GPU container (driverDelivery).
const (
	// DeliveryPreferRuntime injects at the runtime (gpu-injector's NRI plugin,
	// or the node's own runtime) when no known GPU node the pod can use needs
	// hostPath volumes: each has its plugin registered or injects the driver
	// itself (toolkit, CDI, GKE's device plugin), or the pod can use none yet
	// (every pool at zero, a node not yet probed), whether or not any node has
	// the plugin; hostPath volumes otherwise, except in a namespace whose Pod
	// Security level forbids them, where nodes with the plugin are chosen.
	DeliveryPreferRuntime = "PreferRuntime"
	// DeliveryHostPath always uses hostPath volumes, as before NRI.
	DeliveryHostPath = "HostPath"
	// DeliveryRuntime says every GPU node runs the plugin: every GPU pod is
	// injected at the runtime, decided from the pod alone.
	DeliveryRuntime = "Runtime"
)

// What to do for the toleration a renamed pod would have had.
const (
	// RenameTolerationAdd gives a pod whose legacy resource is renamed the
	// toleration that the ExtendedResourceToleration admission plugin gives
	// every pod requesting the new name: the plugin ran before the webhook,
	// saw the legacy name, which is no extended resource, and added none, so
	// the renamed pod could not use GPU nodes tainted for that name (GKE's
	// nvidia.com/gpu=present:NoSchedule).
	RenameTolerationAdd = "Add"
	// RenameTolerationNone adds none. (Not "Off": YAML 1.1, which the
	// configuration is read as, makes an unquoted Off the boolean false.)
	RenameTolerationNone = "None"
)

// Configuration is the file's schema.
type Configuration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	Resources      Resources      `json:"resources"`
	HostPaths      HostPaths      `json:"hostPaths"`
	ContainerPaths ContainerPaths `json:"containerPaths"`
	LDLibraryPath  string         `json:"ldLibraryPath"`
	Containers     string         `json:"containers"`
	LayoutPolicy   string         `json:"layoutPolicy"`
	NoLayout       NoLayout       `json:"noLayout"`
	StaticLayouts  []StaticLayout `json:"staticLayouts,omitempty"`
	// ExcludedNamespaces are never mutated, whatever their labels say.
	ExcludedNamespaces []string `json:"excludedNamespaces"`
	PodSecurity        string   `json:"podSecurity"`
	Pinning            Pinning  `json:"pinning"`
	// LegacyMounts is LegacyMountsReplace or LegacyMountsKeep.
	LegacyMounts string `json:"legacyMounts"`
	// RuntimeInjection is RuntimeInjectionPin or RuntimeInjectionSkip.
	RuntimeInjection string `json:"runtimeInjection"`
	// DriverDelivery is DeliveryPreferRuntime, DeliveryHostPath or
	// DeliveryRuntime.
	DriverDelivery string `json:"driverDelivery"`
	DRA            DRA    `json:"dra"`
	// Ranking bounds what the nodes of one layout can claim in the layout
	// choice: nodes publish their own layout and GPU count, and a node is
	// not to be trusted with every unconstrained GPU pod.
	Ranking Ranking `json:"ranking"`
	// Limits bound the work one pod can ask of the webhook.
	Limits Limits `json:"limits"`
	// Images says whether and how the webhook reads the configuration of a
	// GPU container's image (its ENV and labels) from the registry.
	Images Images `json:"images"`
}

// Whether the webhook reads images' configuration.
const (
	// ImagesOff never contacts a registry: the pod alone is read.
	ImagesOff = "Off"
	// ImagesOn reads the images of GPU containers, in the namespaces of
	// Images.Namespaces (every namespace when that is empty).
	ImagesOn = "On"
)

// Which credentials an image's read uses.
const (
	// PullSecretsRead reads the Secrets the pod names in imagePullSecrets
	// (to which the API server's ServiceAccount admission has already added
	// its service account's): the webhook needs get on Secrets.
	PullSecretsRead = "Read"
	// PullSecretsNone reads anonymously: public images only.
	PullSecretsNone = "None"
)

// Images configures reading an image's configuration at admission. Every
// read is fail-soft: a registry that is down, slow, refusing, or not listed
// changes nothing but a warning and a metric.
type Images struct {
	// Mode is ImagesOff or ImagesOn.
	Mode string `json:"mode"`
	// Namespaces, when set, limits reading to these namespaces.
	Namespaces []string `json:"namespaces,omitempty"`
	// Registries are the registry hosts (host or host:port, as an image
	// reference names them; docker.io for Docker Hub) the webhook may
	// contact. An image of any other registry is not read.
	Registries []string `json:"registries"`
	// InsecureRegistries are those of Registries reached over plain HTTP.
	InsecureRegistries []string `json:"insecureRegistries,omitempty"`
	// PullSecrets is PullSecretsRead or PullSecretsNone.
	PullSecrets string `json:"pullSecrets"`
	// TagTTL is how long a tag's digest is believed; a reference by digest
	// is cached until evicted.
	TagTTL *metav1.Duration `json:"tagTTL,omitempty"`
	// Budget is the most one admission waits for registries, all its images
	// together; it must stay well inside the webhook's timeoutSeconds. A
	// read past it goes on in the background and fills the cache.
	Budget *metav1.Duration `json:"budget,omitempty"`
	// MaxEntries and MaxBytes bound the cache of images' configuration.
	MaxEntries int   `json:"maxEntries"`
	MaxBytes   int64 `json:"maxBytes"`
	// CredentialProviders, when its Config is set, adds the credentials of
	// the kubelet's image credential provider plugins (ECR's, Artifact
	// Registry's, ACR's), after the pod's pull secrets, as the kubelet
	// tries them.
	CredentialProviders CredentialProviders `json:"credentialProviders,omitzero"`
}

// CredentialProviders are the kubelet's image credential provider plugins,
// as the webhook's container sees them.
type CredentialProviders struct {
	// Config is the CredentialProviderConfig file (kubelet.config.k8s.io),
	// the kubelet's --image-credential-provider-config; "" uses none.
	Config string `json:"config,omitempty"`
	// BinDir is the folder of the plugins' binaries, the kubelet's
	// --image-credential-provider-bin-dir.
	BinDir string `json:"binDir,omitempty"`
	// Timeout bounds one run of a plugin. The run is part of a read, which
	// goes on past the admission's budget and fills the caches for the
	// next pod.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// Enabled reports whether plugins give credentials.
func (c CredentialProviders) Enabled() bool { return c.Config != "" }

// Defaults of Images; docs/configuration.md says why.
const (
	DefaultImageTagTTL     = 5 * time.Minute
	DefaultImageBudget     = time.Second
	DefaultImageMaxEntries = 10000
	DefaultImageMaxBytes   = 32 << 20
	// DefaultCredentialProviderTimeout is ample for a plugin that asks its
	// cloud's API for a token (ECR's GetAuthorizationToken, a metadata
	// server), which it does once per cacheDuration (hours).
	DefaultCredentialProviderTimeout = 5 * time.Second
	// MaxCredentialProviderTimeout leaves a read, which gives up after 30 s,
	// time for the registry once the plugin answered.
	MaxCredentialProviderTimeout = 20 * time.Second
)

// ReadsImages reports whether the webhook reads the images of a pod of the
// namespace.
func (i *Images) ReadsImages(namespace string) bool {
	return i.Mode == ImagesOn && (len(i.Namespaces) == 0 || slices.Contains(i.Namespaces, namespace))
}

// Ranking bounds the weight of node-published data in the layout choice.
type Ranking struct {
	// MaxGPUsPerNode is the most GPUs one node counts for, whatever it
	// reports: a node that claims 256 weighs as much as this.
	MaxGPUsPerNode int64 `json:"maxGPUsPerNode"`
	// MinNodes is how many nodes must publish a layout before it is
	// established: a layout of fewer nodes is preferred over no established
	// one, and NewestDriver does not weigh its driver.
	MinNodes int `json:"minNodes"`
}

// Limits bound one admission's work and answer.
type Limits struct {
	// MaxGPUContainers is the most containers of one pod that get the
	// driver; a pod with more is denied before any layout is fitted.
	MaxGPUContainers int `json:"maxGPUContainers"`
	// MaxPatchOperations and MaxPatchBytes bound the JSON Patch a pod would
	// get; a pod that would need more is denied.
	MaxPatchOperations int `json:"maxPatchOperations"`
	MaxPatchBytes      int `json:"maxPatchBytes"`
}

// Defaults of Ranking and Limits; docs/configuration.md says why.
const (
	// DefaultMaxGPUsPerNode: the largest GPU servers sold carry 8 to 16.
	DefaultMaxGPUsPerNode = 16
	DefaultMinLayoutNodes = 2
	// DefaultMaxGPUContainers is far above what a node's GPUs can serve.
	DefaultMaxGPUContainers = 128
	// DefaultMaxPatchOperations: 128 containers of a 30-mount plan.
	DefaultMaxPatchOperations = 4096
	// DefaultMaxPatchBytes is etcd's default request limit (1.5 MiB): a pod
	// whose patch alone is larger could not be stored.
	DefaultMaxPatchBytes = 1536 << 10
)

// DRA says which Dynamic Resource Allocation objects are NVIDIA GPUs.
type DRA struct {
	// DeviceClasses are names or path.Match patterns of DeviceClasses whose
	// devices are GPUs: a pod that claims one (spec.resourceClaims) is a GPU
	// pod, and the extended resource a GPU class declares is a GPU resource.
	DeviceClasses []string `json:"deviceClasses"`
	// Drivers are DRA driver names whose devices are GPUs: their ResourceSlice
	// devices count as a node's GPUs, and a DeviceClass whose CEL selector
	// requires device.driver == one of them is a GPU class too.
	Drivers []string `json:"drivers"`
}

// Pinning says how an injected pod is kept on nodes that have its layout.
type Pinning struct {
	// NodeLabels, when set, pin pods by the values of these node labels (a
	// pool) instead of the layout fingerprint label, which only the probe sets
	// and no autoscaler knows. A node belongs to a pool only when it carries
	// every one of them; list exactly the labels that decide a node's driver
	// (node pool, instance type, image).
	NodeLabels []string `json:"nodeLabels,omitempty"`
	// RememberFor is how long a pool's last layout stays usable after its
	// last node left, so that a pod for a pool scaled to zero is injected and
	// can trigger the scale-up. 0s forgets a pool as soon as it is empty.
	RememberFor *metav1.Duration `json:"rememberFor,omitempty"`
}

// DefaultRememberFor outlasts a weekend of an idle pool at zero.
const DefaultRememberFor = 7 * 24 * time.Hour

// MaxPinningLabels bounds the pool key: every label is a nodeSelector term
// and a ConfigMap key part.
const MaxPinningLabels = 8

// ByPool reports whether pods are pinned by pool labels.
func (p Pinning) ByPool() bool { return len(p.NodeLabels) > 0 }

// Remember is how long an empty pool's layout stays usable.
func (p Pinning) Remember() time.Duration {
	if p.RememberFor == nil {
		return DefaultRememberFor
	}
	return p.RememberFor.Duration
}

// Resources says which extended resources make a container a GPU container.
type Resources struct {
	// Names are resource names or path.Match patterns (nvidia.com/mig-*).
	Names []string `json:"names"`
	// Legacy names are rewritten to RenameTo in limits and requests.
	Legacy   []string `json:"legacy"`
	RenameTo string   `json:"renameTo"`
	// RenameToleration is RenameTolerationAdd or RenameTolerationNone.
	RenameToleration string `json:"renameToleration"`
}

// HostPaths is the trust boundary for layouts published by nodes.
type HostPaths struct {
	Allowlist []layout.AllowedPath `json:"allowlist"`
	// ExtraAllowlist is added to Allowlist, defaulted or not: a list given
	// for Allowlist replaces the defaults whole (and Helm replaces lists in
	// values too), so a cluster that only needs one more folder names it
	// here and keeps the defaults, including those of later releases.
	ExtraAllowlist     []layout.AllowedPath `json:"extraAllowlist,omitempty"`
	DriverFilePatterns []string             `json:"driverFilePatterns"`
}

// Entries is the allowlist in force: Allowlist, then ExtraAllowlist.
func (h HostPaths) Entries() []layout.AllowedPath {
	if len(h.ExtraAllowlist) == 0 {
		return h.Allowlist
	}
	// Clipped, so that the append copies instead of writing the extra entries
	// into spare capacity that Allowlist's own backing array may have.
	return append(slices.Clip(h.Allowlist), h.ExtraAllowlist...)
}

// ContainerPaths are where the driver appears inside containers.
type ContainerPaths struct {
	LibraryDir string `json:"libraryDir"`
	BinaryDir  string `json:"binaryDir"`
}

// NoLayout is the answer when no ready layout fits a GPU pod.
type NoLayout struct {
	Action string `json:"action"`
	// StaticLayout names an entry of StaticLayouts, with Action Static.
	StaticLayout string `json:"staticLayout,omitempty"`
}

// StaticLayout is a hand-written layout for clusters that run no probe.
type StaticLayout struct {
	Name string `json:"name"`
	// NodeSelector is added to pods that get this layout, in place of the
	// fingerprint selector of probed layouts.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	layout.Plan  `json:",inline"`
}

// Default returns the configuration used when no file is given.
func Default() *Configuration {
	c := &Configuration{}
	SetDefaults(c)
	return c
}

// SetDefaults fills every unset field; it is the one place defaults live.
func SetDefaults(c *Configuration) {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.Resources.Names == nil {
		c.Resources.Names = DefaultResourceNames()
	}
	if c.Resources.Legacy == nil {
		c.Resources.Legacy = []string{"alpha.kubernetes.io/nvidia-gpu"}
	}
	if c.Resources.RenameTo == "" {
		c.Resources.RenameTo = "nvidia.com/gpu"
	}
	if c.Resources.RenameToleration == "" {
		c.Resources.RenameToleration = RenameTolerationAdd
	}
	if c.HostPaths.Allowlist == nil {
		c.HostPaths.Allowlist = DefaultAllowlist()
	}
	if c.HostPaths.DriverFilePatterns == nil {
		c.HostPaths.DriverFilePatterns = DefaultDriverFilePatterns()
	}
	if c.ContainerPaths.LibraryDir == "" {
		c.ContainerPaths.LibraryDir = "/usr/local/nvidia/lib64"
	}
	if c.ContainerPaths.BinaryDir == "" {
		c.ContainerPaths.BinaryDir = "/usr/local/nvidia/bin"
	}
	if c.LDLibraryPath == "" {
		c.LDLibraryPath = LDLibraryPathAppend
	}
	if c.Containers == "" {
		c.Containers = ContainersGPU
	}
	if c.LayoutPolicy == "" {
		c.LayoutPolicy = LayoutPolicyMostGPUs
	}
	if c.NoLayout.Action == "" {
		c.NoLayout.Action = NoLayoutDeny
	}
	if c.ExcludedNamespaces == nil {
		c.ExcludedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}
	}
	if c.PodSecurity == "" {
		c.PodSecurity = PodSecurityWarn
	}
	if c.Pinning.RememberFor == nil {
		c.Pinning.RememberFor = &metav1.Duration{Duration: DefaultRememberFor}
	}
	if c.LegacyMounts == "" {
		c.LegacyMounts = LegacyMountsReplace
	}
	if c.RuntimeInjection == "" {
		c.RuntimeInjection = RuntimeInjectionPin
	}
	if c.DriverDelivery == "" {
		c.DriverDelivery = DeliveryPreferRuntime
	}
	if c.DRA.DeviceClasses == nil {
		// The classes NVIDIA's DRA driver (k8s-dra-driver-gpu) installs for
		// whole GPUs and MIG devices.
		c.DRA.DeviceClasses = []string{"gpu.nvidia.com", "mig.nvidia.com"}
	}
	if c.DRA.Drivers == nil {
		c.DRA.Drivers = []string{"gpu.nvidia.com"}
	}
	c.setLimitDefaults()
	c.setImageDefaults()
	for i := range c.StaticLayouts {
		if c.StaticLayouts[i].SchemaVersion == "" {
			c.StaticLayouts[i].SchemaVersion = layout.SchemaVersion
		}
	}
}

// DefaultResourceNames are what NVIDIA's k8s-device-plugin advertises, so that
// a pod asking for any of its resources is a GPU pod without configuration:
// whole GPUs (nvidia.com/gpu, also MIG's single strategy), time-sliced or MPS
// shared GPUs under renameByDefault (nvidia.com/gpu.shared), the MIG devices
// of its mixed strategy (nvidia.com/mig-1g.10gb, and nvidia.com/mig-1g.10gb.shared
// when those are shared too), and the alpha name of Kubernetes before 1.10.
func DefaultResourceNames() []string {
	return []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*", "alpha.kubernetes.io/nvidia-gpu"}
}

// DefaultAllowlist covers the driver folders of the common distributions and
// installers; shared system folders allow only driver files, one by one.
func DefaultAllowlist() []layout.AllowedPath {
	return []layout.AllowedPath{
		// Folders that only a driver installation creates, whose content the
		// probe still checks before mounting one whole.
		{Path: "/usr/local/nvidia"},
		{Path: "/usr/lib/nvidia"},
		{Path: "/usr/lib/nvidia-*"},
		{Path: "/usr/lib64/nvidia"},
		// Debian's nvidia/current (and legacy/tesla flavours) beside the system's libraries.
		{Path: "/usr/lib/x86_64-linux-gnu/nvidia"},
		{Path: "/usr/lib/aarch64-linux-gnu/nvidia"},
		// Bottlerocket's driver programs.
		{Path: "/usr/libexec/nvidia"},
		{Path: "/home/kubernetes/bin/nvidia"},
		{Path: "/opt/nvidia"},
		// NixOS: the driver package's store paths, immutable and root-owned.
		{Path: "/nix/store/*-nvidia-x11-*"},
		// The GPU operator's driver container binds the host's / at
		// /run/nvidia/driver, so only its driver files are allowed there.
		{Path: "/run/nvidia/driver/usr/lib/x86_64-linux-gnu", FilesOnly: true},
		{Path: "/run/nvidia/driver/usr/lib/aarch64-linux-gnu", FilesOnly: true},
		{Path: "/run/nvidia/driver/usr/lib64", FilesOnly: true},
		{Path: "/run/nvidia/driver/usr/bin", FilesOnly: true},
		{Path: "/usr/lib/x86_64-linux-gnu", FilesOnly: true},
		{Path: "/usr/lib/aarch64-linux-gnu", FilesOnly: true},
		{Path: "/usr/lib64", FilesOnly: true},
		{Path: "/usr/lib", FilesOnly: true},
		{Path: "/usr/local/lib", FilesOnly: true},
		{Path: "/usr/local/lib64", FilesOnly: true},
		{Path: "/usr/bin", FilesOnly: true},
		{Path: "/usr/sbin", FilesOnly: true},
		{Path: "/usr/local/bin", FilesOnly: true},
		{Path: "/opt/bin", FilesOnly: true},
	}
}

// DefaultDriverFilePatterns match the NVIDIA driver's compute and utility
// libraries and binaries, and nothing of the system around them.
func DefaultDriverFilePatterns() []string {
	return []string{
		"libcuda.so*", "libcudadebugger.so*", "libnvidia-*.so*", "libnvcuvid.so*",
		"libnvoptix.so*", "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
		"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
	}
}

// Rules returns the layout validation rules this configuration implies.
func (c *Configuration) Rules() layout.Rules {
	return layout.Rules{
		HostPathAllowlist:  c.HostPaths.Entries(),
		DriverFilePatterns: c.HostPaths.DriverFilePatterns,
		ContainerPathRoots: []string{c.ContainerPaths.LibraryDir, c.ContainerPaths.BinaryDir},
	}
}

// Static returns the static layout of that name.
func (c *Configuration) Static(name string) (*StaticLayout, bool) {
	for i := range c.StaticLayouts {
		if c.StaticLayouts[i].Name == name {
			return &c.StaticLayouts[i], true
		}
	}
	return nil, false
}

// The values of the fields that take one of a few, in the order the messages
// list them.
var (
	renameTolerations       = []string{RenameTolerationAdd, RenameTolerationNone}
	ldLibraryPaths          = []string{LDLibraryPathAppend, LDLibraryPathPrepend, LDLibraryPathOff}
	containerChoices        = []string{ContainersGPU, ContainersAll}
	layoutPolicies          = []string{LayoutPolicyMostGPUs, LayoutPolicyNewestDriver, LayoutPolicySpread}
	podSecurityActions      = []string{PodSecurityWarn, PodSecurityDeny}
	legacyMountsActions     = []string{LegacyMountsReplace, LegacyMountsKeep}
	runtimeInjectionActions = []string{RuntimeInjectionPin, RuntimeInjectionSkip}
	imageModes              = []string{ImagesOff, ImagesOn}
	pullSecretsChoices      = []string{PullSecretsRead, PullSecretsNone}
	deliveries              = []string{DeliveryPreferRuntime, DeliveryHostPath, DeliveryRuntime}
	noLayoutActions         = []string{NoLayoutDeny, NoLayoutAllow, NoLayoutStatic}
)

// Enums are the fields of the file that take one of a few values, by their
// path ("[*]": every item of a list), each with every value the file may
// give it, "" too where the field may be left empty. Validate refuses any
// other value; JSONSchema lists these.
func Enums() map[string][]string {
	defaulted := func(values []string) []string { return append([]string{""}, values...) }
	return map[string][]string{
		"apiVersion":                        defaulted([]string{APIVersion}),
		"kind":                              defaulted([]string{Kind}),
		"resources.renameToleration":        defaulted(renameTolerations),
		"ldLibraryPath":                     defaulted(ldLibraryPaths),
		"containers":                        defaulted(containerChoices),
		"layoutPolicy":                      defaulted(layoutPolicies),
		"podSecurity":                       defaulted(podSecurityActions),
		"legacyMounts":                      defaulted(legacyMountsActions),
		"runtimeInjection":                  defaulted(runtimeInjectionActions),
		"driverDelivery":                    defaulted(deliveries),
		"noLayout.action":                   defaulted(noLayoutActions),
		"images.mode":                       defaulted(imageModes),
		"images.pullSecrets":                defaulted(pullSecretsChoices),
		"staticLayouts[*].schemaVersion":    defaulted([]string{layout.SchemaVersion}),
		"staticLayouts[*].runtimeInjection": defaulted(layout.RuntimeInjections),
		"staticLayouts[*].mounts[*].kind":   {string(layout.KindDirectory), string(layout.KindFile)},
	}
}

// Validate reports every bad field.
func (c *Configuration) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	rp := field.NewPath("resources")
	if len(c.Resources.Names) == 0 {
		errs = append(errs, field.Required(rp.Child("names"), "at least one GPU resource name"))
	}
	for i, n := range c.Resources.Names {
		if _, err := path.Match(n, ""); err != nil || n == "" || !strings.Contains(n, "/") {
			errs = append(errs, field.Invalid(rp.Child("names").Index(i), n, "must be a qualified extended resource name or path.Match pattern, like nvidia.com/gpu or nvidia.com/mig-*"))
		}
	}
	for i, n := range c.Resources.Legacy {
		if msgs := validation.IsQualifiedName(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(rp.Child("legacy").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	for i, n := range c.Resources.Legacy {
		if n == c.Resources.RenameTo {
			errs = append(errs, field.Invalid(rp.Child("legacy").Index(i), n, "must differ from renameTo"))
		}
	}
	if msgs := validation.IsQualifiedName(c.Resources.RenameTo); len(msgs) > 0 {
		errs = append(errs, field.Invalid(rp.Child("renameTo"), c.Resources.RenameTo, strings.Join(msgs, "; ")))
	}
	errs = append(errs, oneOf(rp.Child("renameToleration"), c.Resources.RenameToleration, renameTolerations...)...)
	if c.Resources.RenameToleration == RenameTolerationAdd && len(c.Resources.Legacy) > 0 && !IsExtendedResourceName(c.Resources.RenameTo) {
		// The admission plugin adds nothing for such a name either, so there
		// is nothing to stand in for.
		errs = append(errs, field.Invalid(rp.Child("renameToleration"), c.Resources.RenameToleration, fmt.Sprintf("renameTo %q is no extended resource name (a domain outside kubernetes.io, like nvidia.com/gpu), for which the ExtendedResourceToleration admission plugin adds no toleration; set renameToleration: %s", c.Resources.RenameTo, RenameTolerationNone)))
	}
	hp := field.NewPath("hostPaths")
	if len(c.HostPaths.Allowlist) == 0 {
		errs = append(errs, field.Required(hp.Child("allowlist"), "an empty allowlist would reject every layout"))
	}
	errs = append(errs, validateAllowlist(hp.Child("allowlist"), c.HostPaths.Allowlist)...)
	errs = append(errs, validateAllowlist(hp.Child("extraAllowlist"), c.HostPaths.ExtraAllowlist)...)
	for i, p := range c.HostPaths.DriverFilePatterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.Contains(p, "/") {
			errs = append(errs, field.Invalid(hp.Child("driverFilePatterns").Index(i), p, "must be a file name pattern without '/'"))
		}
	}
	cp := field.NewPath("containerPaths")
	// In field order, so that the errors read the same on every start.
	for _, f := range []struct{ name, v string }{{"libraryDir", c.ContainerPaths.LibraryDir}, {"binaryDir", c.ContainerPaths.BinaryDir}} {
		if !path.IsAbs(f.v) || path.Clean(f.v) != f.v || f.v == "/" || strings.Contains(f.v, ":") {
			errs = append(errs, field.Invalid(cp.Child(f.name), f.v, "must be an absolute, clean path other than / without ':'"))
		}
	}
	errs = append(errs, oneOf(field.NewPath("ldLibraryPath"), c.LDLibraryPath, ldLibraryPaths...)...)
	errs = append(errs, oneOf(field.NewPath("containers"), c.Containers, containerChoices...)...)
	errs = append(errs, oneOf(field.NewPath("layoutPolicy"), c.LayoutPolicy, layoutPolicies...)...)
	errs = append(errs, oneOf(field.NewPath("podSecurity"), c.PodSecurity, podSecurityActions...)...)
	errs = append(errs, oneOf(field.NewPath("legacyMounts"), c.LegacyMounts, legacyMountsActions...)...)
	errs = append(errs, oneOf(field.NewPath("runtimeInjection"), c.RuntimeInjection, runtimeInjectionActions...)...)
	errs = append(errs, oneOf(field.NewPath("driverDelivery"), c.DriverDelivery, deliveries...)...)
	errs = append(errs, c.validateLimits()...)
	errs = append(errs, c.validateImages()...)
	dp := field.NewPath("dra")
	for i, n := range c.DRA.DeviceClasses {
		// A class name is a DNS subdomain; a pattern may hold * ? [ as well.
		plain := strings.NewReplacer("*", "x", "?", "x", "[", "x", "]", "x").Replace(n)
		if _, err := path.Match(n, ""); err != nil || len(validation.IsDNS1123Subdomain(plain)) > 0 {
			errs = append(errs, field.Invalid(dp.Child("deviceClasses").Index(i), n, "must be a DeviceClass name or path.Match pattern, like gpu.nvidia.com or *.gpu.nvidia.com"))
		}
	}
	for i, n := range c.DRA.Drivers {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(dp.Child("drivers").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	np := field.NewPath("noLayout")
	errs = append(errs, oneOf(np.Child("action"), c.NoLayout.Action, noLayoutActions...)...)
	if c.NoLayout.Action == NoLayoutStatic {
		if c.NoLayout.StaticLayout == "" {
			errs = append(errs, field.Required(np.Child("staticLayout"), "the name of a staticLayouts entry, with action Static"))
		} else if _, ok := c.Static(c.NoLayout.StaticLayout); !ok {
			errs = append(errs, field.NotFound(np.Child("staticLayout"), c.NoLayout.StaticLayout))
		}
	} else if c.NoLayout.StaticLayout != "" {
		errs = append(errs, field.Invalid(np.Child("staticLayout"), c.NoLayout.StaticLayout, "only used with action Static"))
	}
	names := map[string]bool{}
	for i, s := range c.StaticLayouts {
		sp := field.NewPath("staticLayouts").Index(i)
		if msgs := validation.IsDNS1123Label(s.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(sp.Child("name"), s.Name, strings.Join(msgs, "; ")))
		}
		if names[s.Name] {
			errs = append(errs, field.Duplicate(sp.Child("name"), s.Name))
		}
		names[s.Name] = true
		for _, e := range s.Plan.Validate(c.Rules()) {
			e.Field = sp.String() + strings.TrimPrefix(e.Field, "layout")
			errs = append(errs, e)
		}
		for k, v := range s.NodeSelector {
			if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
				errs = append(errs, field.Invalid(sp.Child("nodeSelector").Key(k), k, strings.Join(msgs, "; ")))
			}
			if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
				errs = append(errs, field.Invalid(sp.Child("nodeSelector").Key(k), v, strings.Join(msgs, "; ")))
			}
		}
	}
	errs = append(errs, c.Pinning.validate(field.NewPath("pinning"))...)
	for i, ns := range c.ExcludedNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, field.Invalid(field.NewPath("excludedNamespaces").Index(i), ns, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// validateAllowlist applies one set of rules to allowlist and extraAllowlist
// entries: an added folder is trusted exactly as a default one is.
func validateAllowlist(fp *field.Path, entries []layout.AllowedPath) field.ErrorList {
	var errs field.ErrorList
	for i, a := range entries {
		ip := fp.Index(i).Child("path")
		if !path.IsAbs(a.Path) || path.Clean(a.Path) != a.Path || a.Path == "/" {
			errs = append(errs, field.Invalid(ip, a.Path, "must be an absolute, clean path other than /"))
		} else if _, err := path.Match(a.Path, "/"); err != nil {
			errs = append(errs, field.Invalid(ip, a.Path, fmt.Sprintf("bad pattern: %v", err)))
		} else if s := sensitiveOverlap(a.Path); s != "" && !a.FilesOnly {
			errs = append(errs, field.Forbidden(ip, fmt.Sprintf("it would allow the system folder %s whole; allow it only with filesOnly: true, or name the driver's own folder", s)))
		}
	}
	return errs
}

func (p Pinning) validate(fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(p.NodeLabels) > MaxPinningLabels {
		errs = append(errs, field.TooMany(fp.Child("nodeLabels"), len(p.NodeLabels), MaxPinningLabels))
	}
	seen := map[string]bool{}
	for i, k := range p.NodeLabels {
		ip := fp.Child("nodeLabels").Index(i)
		switch {
		case len(validation.IsQualifiedName(k)) > 0:
			errs = append(errs, field.Invalid(ip, k, strings.Join(validation.IsQualifiedName(k), "; ")))
		case strings.HasPrefix(k, layout.Prefix):
			// The probe sets these after a node joined: no autoscaler can
			// know them for a node it has yet to create.
			errs = append(errs, field.Forbidden(ip, fmt.Sprintf("%s labels are set by the probe, which no autoscaler knows; name a label the autoscaler puts on new nodes, such as karpenter.sh/nodepool", layout.Prefix)))
		case seen[k]:
			errs = append(errs, field.Duplicate(ip, k))
		}
		seen[k] = true
	}
	if p.RememberFor != nil && p.RememberFor.Duration < 0 {
		errs = append(errs, field.Invalid(fp.Child("rememberFor"), p.RememberFor.Duration.String(), "must not be negative; 0s forgets a pool as soon as its last node leaves"))
	}
	return errs
}

// IsGPUResource reports whether name is one of resources.names, by name or
// as a path.Match pattern: the webhook's test of a GPU container and the node
// index's sum of a node's GPUs must agree.
func (c *Configuration) IsGPUResource(name string) bool {
	for _, pat := range c.Resources.Names {
		if name == pat {
			return true
		}
		if strings.ContainsAny(pat, "*?[") {
			if ok, _ := path.Match(pat, name); ok {
				return true
			}
		}
	}
	return false
}

// IsGPUClassName reports whether a DeviceClass's name is one of
// dra.deviceClasses, by name or as a path.Match pattern.
func (c *Configuration) IsGPUClassName(name string) bool {
	for _, pat := range c.DRA.DeviceClasses {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// IsExtendedResourceName reports whether name is an extended resource, as
// the API server decides it: a name with a domain outside kubernetes.io, not
// a quota's "requests." name, that is a qualified name with that prefix too.
// Only extended resources get a toleration from the ExtendedResourceToleration
// admission plugin.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// sensitiveFolders must never be mounted whole: the host's system, its
// secrets, and the kubelet's and runtimes' state.
var sensitiveFolders = []string{
	"/etc", "/usr", "/usr/lib", "/usr/lib64", "/usr/bin", "/usr/sbin", "/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu", "/lib", "/lib64", "/bin", "/sbin", "/var", "/root", "/home", "/proc",
	"/sys", "/dev", "/run", "/boot", "/var/lib/kubelet", "/var/lib/containerd", "/run/containerd",
	"/var/run", "/etc/kubernetes", "/var/log", "/opt", "/srv", "/tmp",
}

// IsSystemFolder reports whether p is one of the folders that must never be
// mounted whole, whatever the allowlist says.
func IsSystemFolder(p string) bool {
	for _, s := range sensitiveFolders {
		if p == s {
			return true
		}
	}
	return false
}

// sensitiveOverlap returns a sensitive folder that an allowlist entry (a path
// whose last element may be a pattern) matches, lies above, or lies inside
// /etc, /proc, /sys, /dev, /root or the kubelet's state.
func sensitiveOverlap(entry string) string {
	for _, s := range sensitiveFolders {
		if ok, _ := path.Match(entry, s); ok || entry == s || strings.HasPrefix(s, entry+"/") {
			return s
		}
		// A pattern in the last element may match an ancestor of s.
		for q := path.Dir(s); q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(entry, q); ok {
				return s
			}
		}
	}
	for _, s := range []string{"/etc", "/proc", "/sys", "/dev", "/root", "/var/lib/kubelet", "/run/containerd", "/var/lib/containerd"} {
		if strings.HasPrefix(entry, s+"/") {
			return s
		}
	}
	return ""
}

func oneOf(p *field.Path, v string, allowed ...string) field.ErrorList {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return field.ErrorList{field.NotSupported(p, v, allowed)}
}

// Parse decodes, defaults and validates a configuration file; unknown fields
// are errors so that a typo does not silently fall back to a default.
func Parse(data []byte) (*Configuration, error) {
	c, errs, err := decode(data)
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid configuration: %w", errs.ToAggregate())
	}
	return c, nil
}

// decode reads a configuration file strictly, fills the defaults and validates
// it: the one decoder of Parse and Check. err is why the file cannot be read at
// all; errs are its invalid fields at once, the unknown keys and Validate's
// errors, each with its line, in the file's order.
func decode(data []byte) (*Configuration, field.ErrorList, error) {
	c := &Configuration{}
	facts := fileFacts{}
	if len(bytes.TrimSpace(data)) > 0 {
		facts = readFacts(data)
		unmarshal := yaml.UnmarshalStrict
		if len(facts.unknown) > 0 {
			// The strict decoder would stop at the first unknown key, which
			// the walk has named already with every other; decoding around
			// them lets Validate name the invalid values in the same run.
			unmarshal = yaml.Unmarshal
		}
		if err := unmarshal(data, c); err != nil {
			if len(facts.unknown) > 0 {
				return nil, facts.unknown, nil
			}
			if fix := facts.boolFixes(); fix != "" && strings.Contains(err.Error(), "cannot unmarshal bool") {
				return nil, nil, fmt.Errorf("failed to parse configuration: %w; %s", err, fix)
			}
			return nil, nil, fmt.Errorf("failed to parse configuration: %w", err)
		}
	}
	SetDefaults(c)
	errs := append(slices.Clip(facts.unknown), facts.annotate(c.Validate())...)
	return c, facts.byLine(errs), nil
}

// Load reads a configuration file; an empty path gives the defaults.
func Load(file string) (*Configuration, error) {
	if file == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("failed to read configuration %q: %w", file, err)
	}
	return Parse(data)
}

func (c *Configuration) setLimitDefaults() {
	if c.Ranking.MaxGPUsPerNode == 0 {
		c.Ranking.MaxGPUsPerNode = DefaultMaxGPUsPerNode
	}
	if c.Ranking.MinNodes == 0 {
		c.Ranking.MinNodes = DefaultMinLayoutNodes
	}
	if c.Limits.MaxGPUContainers == 0 {
		c.Limits.MaxGPUContainers = DefaultMaxGPUContainers
	}
	if c.Limits.MaxPatchOperations == 0 {
		c.Limits.MaxPatchOperations = DefaultMaxPatchOperations
	}
	if c.Limits.MaxPatchBytes == 0 {
		c.Limits.MaxPatchBytes = DefaultMaxPatchBytes
	}
}

func (c *Configuration) validateLimits() field.ErrorList {
	var errs field.ErrorList
	rp, lp := field.NewPath("ranking"), field.NewPath("limits")
	for _, f := range []struct {
		path *field.Path
		v    int64
	}{
		{rp.Child("maxGPUsPerNode"), c.Ranking.MaxGPUsPerNode},
		{rp.Child("minNodes"), int64(c.Ranking.MinNodes)},
		{lp.Child("maxGPUContainers"), int64(c.Limits.MaxGPUContainers)},
		{lp.Child("maxPatchOperations"), int64(c.Limits.MaxPatchOperations)},
		{lp.Child("maxPatchBytes"), int64(c.Limits.MaxPatchBytes)},
	} {
		if f.v < 1 {
			errs = append(errs, field.Invalid(f.path, f.v, "must be at least 1"))
		}
	}
	return errs
}

func (c *Configuration) setImageDefaults() {
	im := &c.Images
	if im.Mode == "" {
		im.Mode = ImagesOff
	}
	if im.PullSecrets == "" {
		im.PullSecrets = PullSecretsNone
	}
	if im.TagTTL == nil {
		im.TagTTL = &metav1.Duration{Duration: DefaultImageTagTTL}
	}
	if im.Budget == nil {
		im.Budget = &metav1.Duration{Duration: DefaultImageBudget}
	}
	if im.MaxEntries == 0 {
		im.MaxEntries = DefaultImageMaxEntries
	}
	if im.MaxBytes == 0 {
		im.MaxBytes = DefaultImageMaxBytes
	}
	if cp := &im.CredentialProviders; cp.Enabled() && cp.Timeout == nil {
		cp.Timeout = &metav1.Duration{Duration: DefaultCredentialProviderTimeout}
	}
}

// maxImageBudget keeps a read well inside the API server's 30 s ceiling on
// a webhook's timeoutSeconds; the chart's default timeout is 5 s.
const maxImageBudget = 10 * time.Second

func (c *Configuration) validateImages() field.ErrorList {
	var errs field.ErrorList
	ip := field.NewPath("images")
	im := &c.Images
	errs = append(errs, oneOf(ip.Child("mode"), im.Mode, imageModes...)...)
	errs = append(errs, oneOf(ip.Child("pullSecrets"), im.PullSecrets, pullSecretsChoices...)...)
	for _, f := range []struct {
		name string
		v    []string
	}{{"registries", im.Registries}, {"insecureRegistries", im.InsecureRegistries}} {
		for i, r := range f.v {
			if r == "" || strings.ContainsAny(r, "/@ \t") || strings.Contains(r, "://") {
				errs = append(errs, field.Invalid(ip.Child(f.name).Index(i), r, "must be a registry host or host:port, like registry.example.com or localhost:5000"))
			}
		}
	}
	for i, r := range im.InsecureRegistries {
		if !slices.Contains(im.Registries, r) {
			errs = append(errs, field.Invalid(ip.Child("insecureRegistries").Index(i), r, "must also be listed in registries"))
		}
	}
	for i, n := range im.Namespaces {
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(ip.Child("namespaces").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	if im.TagTTL != nil && im.TagTTL.Duration < 0 {
		errs = append(errs, field.Invalid(ip.Child("tagTTL"), im.TagTTL.Duration.String(), "must not be negative; 0s reads a tag's digest on every admission"))
	}
	if im.Budget != nil && (im.Budget.Duration <= 0 || im.Budget.Duration > maxImageBudget) {
		errs = append(errs, field.Invalid(ip.Child("budget"), im.Budget.Duration.String(), fmt.Sprintf("must be above 0s and at most %s, and well inside the webhook's timeoutSeconds", maxImageBudget)))
	}
	if im.MaxEntries < 1 {
		errs = append(errs, field.Invalid(ip.Child("maxEntries"), im.MaxEntries, "must be at least 1"))
	}
	if im.MaxBytes < 1 {
		errs = append(errs, field.Invalid(ip.Child("maxBytes"), im.MaxBytes, "must be at least 1"))
	}
	return append(errs, validateCredentialProviders(ip.Child("credentialProviders"), im.CredentialProviders)...)
}

func validateCredentialProviders(p *field.Path, cp CredentialProviders) field.ErrorList {
	var errs field.ErrorList
	if !cp.Enabled() {
		if cp.BinDir != "" || cp.Timeout != nil {
			errs = append(errs, field.Required(p.Child("config"), "the CredentialProviderConfig file, with binDir or timeout set"))
		}
		return errs
	}
	for _, f := range []struct{ name, v string }{{"config", cp.Config}, {"binDir", cp.BinDir}} {
		switch {
		case !path.IsAbs(f.v) || path.Clean(f.v) != f.v:
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, "must be an absolute, clean path in the webhook's container"))
		case f.v == "/":
			// The chart mounts the node's path at the same path.
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, "must not be the root, which the chart would mount over the webhook's own"))
		}
	}
	if cp.Timeout != nil && (cp.Timeout.Duration <= 0 || cp.Timeout.Duration > MaxCredentialProviderTimeout) {
		errs = append(errs, field.Invalid(p.Child("timeout"), cp.Timeout.Duration.String(), fmt.Sprintf("must be above 0s and at most %s", MaxCredentialProviderTimeout)))
	}
	return errs
}
