package config

import (
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

const (
	APIVersion = "config.gpu-injector.io/v1alpha1"
	Kind       = "InjectorConfiguration"
)

// LDLibraryPath is what to do with an LD_LIBRARY_PATH the container already
// sets (ldLibraryPath).
type LDLibraryPath string

const (
	// LDLibraryPathAppend keeps the user's folders first: their choice wins.
	LDLibraryPathAppend LDLibraryPath = "Append"
	// LDLibraryPathPrepend puts the driver first, ahead of stale copies in the image.
	LDLibraryPathPrepend LDLibraryPath = "Prepend"
	// LDLibraryPathOff never touches LD_LIBRARY_PATH.
	LDLibraryPathOff LDLibraryPath = "Off"
)

// Containers says which containers get the driver mounts (containers).
type Containers string

const (
	ContainersGPU Containers = "GPU"
	ContainersAll Containers = "All"
)

// LayoutPolicy is how to choose among the layouts a pod may use
// (layoutPolicy).
type LayoutPolicy string

const (
	// LayoutPolicyMostGPUs prefers the layout with the most allocatable GPUs,
	// then the newest driver, then the smallest fingerprint.
	LayoutPolicyMostGPUs LayoutPolicy = "MostGPUs"
	// LayoutPolicyNewestDriver prefers the newest driver, then most GPUs.
	LayoutPolicyNewestDriver LayoutPolicy = "NewestDriver"
	// LayoutPolicySpread picks among the layouts that fit at random, weighted
	// by their allocatable GPUs, so that pods without constraints use every
	// pool instead of filling the largest first.
	LayoutPolicySpread LayoutPolicy = "Spread"
)

// NoLayoutAction is what to do when no layout fits a GPU pod
// (noLayout.action).
type NoLayoutAction string

const (
	NoLayoutDeny   NoLayoutAction = "Deny"
	NoLayoutAllow  NoLayoutAction = "Allow"
	NoLayoutStatic NoLayoutAction = "Static"
)

// PodSecurity is what to do in a namespace whose Pod Security level forbids
// hostPath (podSecurity).
type PodSecurity string

const (
	PodSecurityWarn PodSecurity = "Warn"
	PodSecurityDeny PodSecurity = "Deny"
)

// LegacyMounts is what to do with driver folders or files a GPU container
// mounts by hand, as the classic tutorials taught (/usr/lib/nvidia-384/bin at
// /usr/local/nvidia/bin) (legacyMounts).
type LegacyMounts string

const (
	// LegacyMountsReplace drops the hand-written mounts (and their volumes,
	// when nothing else uses them) and injects the chosen layout's instead:
	// the old folder rarely exists on today's nodes.
	LegacyMountsReplace LegacyMounts = "Replace"
	// LegacyMountsKeep keeps them and admits the pod only to layouts whose
	// host paths contain every hand-mounted one; none: no layout fits.
	LegacyMountsKeep LegacyMounts = "Keep"
)

// RuntimeInjection is what to do on nodes whose container runtime injects the
// driver itself (runtimeInjection).
type RuntimeInjection string

const (
	// RuntimeInjectionPin pins the pod to such a layout without adding mounts
	// or LD_LIBRARY_PATH: the runtime's own mounts would collide with ours.
	RuntimeInjectionPin RuntimeInjection = "Pin"
	// RuntimeInjectionSkip leaves a pod whose chosen layout is such a node's
	// alone (only the legacy resource rename happens): for clusters where
	// every GPU node's runtime injects, where pinning adds nothing.
	RuntimeInjectionSkip RuntimeInjection = "Skip"
)

// DriverDelivery is how the driver reaches a GPU container (driverDelivery).
type DriverDelivery string

const (
	// DeliveryPreferRuntime injects at the runtime (gpu-injector's NRI plugin,
	// or the node's own runtime) when no known GPU node the pod can use needs
	// hostPath volumes: each has its plugin registered or injects the driver
	// itself (toolkit, CDI, GKE's device plugin), or the pod can use none yet
	// (every pool at zero, a node not yet probed), whether or not any node has
	// the plugin; hostPath volumes otherwise, except in a namespace whose Pod
	// Security level forbids them, where nodes with the plugin are chosen.
	DeliveryPreferRuntime DriverDelivery = "PreferRuntime"
	// DeliveryHostPath always uses hostPath volumes, as before NRI.
	DeliveryHostPath DriverDelivery = "HostPath"
	// DeliveryRuntime says every GPU node runs the plugin: every GPU pod is
	// injected at the runtime, decided from the pod alone.
	DeliveryRuntime DriverDelivery = "Runtime"
)

// RenameToleration is what to do for the toleration a renamed pod would have
// had (resources.renameToleration).
type RenameToleration string

const (
	// RenameTolerationAdd gives a pod whose legacy resource is renamed the
	// toleration that the ExtendedResourceToleration admission plugin gives
	// every pod requesting the new name: the plugin ran before the webhook,
	// saw the legacy name, which is no extended resource, and added none, so
	// the renamed pod could not use GPU nodes tainted for that name (GKE's
	// nvidia.com/gpu=present:NoSchedule).
	RenameTolerationAdd RenameToleration = "Add"
	// RenameTolerationNone adds none. (Not "Off": YAML 1.1, which the
	// configuration is read as, makes an unquoted Off the boolean false.)
	RenameTolerationNone RenameToleration = "None"
)

// Configuration is the file's schema.
type Configuration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	Resources      Resources      `json:"resources"`
	HostPaths      HostPaths      `json:"hostPaths"`
	ContainerPaths ContainerPaths `json:"containerPaths"`
	LDLibraryPath  LDLibraryPath  `json:"ldLibraryPath"`
	Containers     Containers     `json:"containers"`
	LayoutPolicy   LayoutPolicy   `json:"layoutPolicy"`
	NoLayout       NoLayout       `json:"noLayout"`
	StaticLayouts  []StaticLayout `json:"staticLayouts,omitempty"`
	// ExcludedNamespaces are never mutated, whatever their labels say.
	ExcludedNamespaces []string    `json:"excludedNamespaces"`
	PodSecurity        PodSecurity `json:"podSecurity"`
	Pinning            Pinning     `json:"pinning"`
	// LegacyMounts is LegacyMountsReplace or LegacyMountsKeep.
	LegacyMounts LegacyMounts `json:"legacyMounts"`
	// RuntimeInjection is RuntimeInjectionPin or RuntimeInjectionSkip.
	RuntimeInjection RuntimeInjection `json:"runtimeInjection"`
	// DriverDelivery is DeliveryPreferRuntime, DeliveryHostPath or
	// DeliveryRuntime.
	DriverDelivery DriverDelivery `json:"driverDelivery"`
	DRA            DRA            `json:"dra"`
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

// ImagesMode is whether the webhook reads images' configuration
// (images.mode).
type ImagesMode string

const (
	// ImagesOff never contacts a registry: the pod alone is read.
	ImagesOff ImagesMode = "Off"
	// ImagesOn reads the images of GPU containers, in the namespaces of
	// Images.Namespaces (every namespace when that is empty).
	ImagesOn ImagesMode = "On"
)

// PullSecrets is which credentials an image's read uses (images.pullSecrets).
type PullSecrets string

const (
	// PullSecretsRead reads the Secrets the pod names in imagePullSecrets
	// (to which the API server's ServiceAccount admission has already added
	// its service account's): the webhook needs get on Secrets.
	PullSecretsRead PullSecrets = "Read"
	// PullSecretsNone reads anonymously: public images only.
	PullSecretsNone PullSecrets = "None"
)

// Images configures reading an image's configuration at admission. Every
// read is fail-soft: a registry that is down, slow, refusing, or not listed
// changes nothing but a warning and a metric.
type Images struct {
	// Mode is ImagesOff or ImagesOn.
	Mode ImagesMode `json:"mode"`
	// Namespaces, when set, limits reading to these namespaces.
	Namespaces []string `json:"namespaces,omitempty"`
	// Registries are the registry hosts (host or host:port, as an image
	// reference names them; docker.io for Docker Hub) the webhook may
	// contact. An image of any other registry is not read.
	Registries []string `json:"registries"`
	// InsecureRegistries are those of Registries reached over plain HTTP.
	InsecureRegistries []string `json:"insecureRegistries,omitempty"`
	// PullSecrets is PullSecretsRead or PullSecretsNone.
	PullSecrets PullSecrets `json:"pullSecrets"`
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
	// Pools declare pools before any of their nodes has published: a pool a
	// pod asks for with no ready node, and nothing remembered of it, is
	// served from its declaration, so that the first pod of a fresh cluster
	// is injected and the autoscaler adds a node for it. What the pool's
	// nodes publish, once remembered, comes first.
	Pools []DeclaredPool `json:"pools,omitempty"`
}

// DeclaredPool is one pool of Pinning.Pools, in the form of an entry of the
// pool memory's ConfigMap less its lastSeen, so that an entry of a cluster
// where the pool ran can be copied.
type DeclaredPool struct {
	// Pool gives each label of Pinning.NodeLabels its value for this pool.
	Pool map[string]string `json:"pool"`
	// NodeLabels are other labels every node of the pool gets from its
	// template, matched against a pod's node selector and affinity.
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	// Taints are the NoSchedule and NoExecute taints of the pool's nodes.
	Taints []PoolTaint `json:"taints,omitempty"`
	// Layout is the driver layout its nodes publish: the gpu-injector.io/layout
	// annotation, as `gpu-injector nodeprobe --once -o layout` prints it on a
	// machine of the pool's node image.
	Layout string `json:"layout"`
}

// PoolTaint is a taint of a declared pool's nodes.
type PoolTaint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// TaintList is the pool's taints as the API's.
func (p DeclaredPool) TaintList() []corev1.Taint {
	if len(p.Taints) == 0 {
		return nil
	}
	out := make([]corev1.Taint, 0, len(p.Taints))
	for _, t := range p.Taints {
		out = append(out, corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	return out
}

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
	RenameToleration RenameToleration `json:"renameToleration"`
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
	Action NoLayoutAction `json:"action"`
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
