package config

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

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
)

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

// DefaultRememberFor outlasts a weekend of an idle pool at zero.
const DefaultRememberFor = 7 * 24 * time.Hour

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
