// Package fakeroot builds host root folders that look like the driver
// installations of real distributions, for tests and for simulated nodes that
// have no GPU. Libraries are real (tiny) ELF shared objects carrying their
// SONAME, and /etc/ld.so.cache is written in glibc's format from what
// ldconfig would index, so the probe reads a fake root exactly as a real one.
package fakeroot

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/gpu-injector/gpu-injector/nodeprobe/hostroot"
	"github.com/gpu-injector/gpu-injector/nodeprobe/ldcache"
)

// Driver versions of the layouts.
const (
	Version384 = "384.130"
	Version390 = "390.48"
	Version460 = "460.32.03"
	Version535 = "535.104.05"
	Version550 = "550.54.15"
	Version580 = "580.159.04"
	// Versions of the distribution layouts, as their packages carried them.
	Version535Server = "535.216.03"
	Version535Debian = "535.247.01"
	Version550Old    = "550.90.07"
	Version565       = "565.77"
	Version570       = "570.172.08"
	Version570Short  = "570.181"
	Version575       = "575.57.08"
	Version580Run    = "580.95.05"
	// VersionBottlerocket is the Tesla driver of Bottlerocket's
	// kmod-6.1-nvidia package (tesla_ver).
	VersionBottlerocket = "535.216.01"
	ld64                = ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64
	x8664LibDir         = "/usr/lib/x86_64-linux-gnu"
	localNvidia         = "/usr/local/nvidia"
	kubernetesCOS       = "/home/kubernetes/bin/nvidia"
	devicePlugins       = "/var/lib/kubelet/device-plugins"
	gpuOperator         = "/run/nvidia/driver"
)

// Layout describes one fake host root.
type Layout struct {
	Name        string
	Description string
	// DriverVersion is the version of the running driver, what NVML would
	// report on such a node; empty where no usable driver exists.
	DriverVersion string
	// LDConf lists the folders written to /etc/ld.so.conf and indexed into
	// /etc/ld.so.cache, in the loader's order of preference.
	LDConf []string
	// CacheDir is where ld.so.conf and ld.so.cache go: "/etc" unless set;
	// "none" writes neither (NixOS has no loader cache for the driver).
	CacheDir string
	// Source says where the layout comes from: the packaging it models.
	Source string
	nodes  []node
}

type nodeKind int

const (
	kindLib nodeKind = iota
	kindLink
	kindFile
	kindDir
	// kindSocket is a unix socket's inode, as a listening server leaves
	// it: made with mknod, nothing listens.
	kindSocket
)

type node struct {
	path   string
	kind   nodeKind
	soname string // kindLib
	target string // kindLink
	data   string // kindFile
	mode   os.FileMode
	// machine is the ELF machine of a kindLib; 0 means x86-64.
	machine elf.Machine
}

func lib(p, soname string) node  { return node{path: p, kind: kindLib, soname: soname, mode: 0o755} }
func link(p, target string) node { return node{path: p, kind: kindLink, target: target} }
func file(p, data string) node   { return node{path: p, kind: kindFile, data: data, mode: 0o644} }
func executable(p string) node {
	return node{path: p, kind: kindFile, data: "#!/bin/sh\necho " + path.Base(p) + "\n", mode: 0o755}
}
func dir(p string) node    { return node{path: p, kind: kindDir, mode: 0o755} }
func socket(p string) node { return node{path: p, kind: kindSocket, mode: 0o755} }

// binaries are the driver's programs of a version: scripts that print their
// name and the version, as nvidia-smi prints the driver's.
func binaries(d, version string) []node { return binariesNamed(d, version, driverBinaries...) }
func binariesNamed(d, version string, names ...string) []node {
	var out []node
	for _, n := range names {
		out = append(out, node{path: path.Join(d, n), kind: kindFile, data: "#!/bin/sh\necho " + n + " " + version + "\n", mode: 0o755})
	}
	return out
}

var driverBinaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}

// driverLib installs one driver library as the NVIDIA installer does: the
// versioned file, its SONAME link, and the unversioned development link.
// soMajor "" means the SONAME is the versioned file name itself.
func driverLib(d, base, version, soMajor string) []node {
	name := base + ".so." + version
	soname := name
	out := []node{}
	if soMajor != "" {
		soname = base + ".so." + soMajor
	}
	out = append(out, lib(path.Join(d, name), soname))
	if soname != name {
		out = append(out, link(path.Join(d, soname), name))
	}
	out = append(out, link(path.Join(d, base+".so"), soname))
	return out
}

// computeLibs are the compute and utility libraries of a driver of that era.
func computeLibs(d, version string, era int) []node {
	libs := [][2]string{
		{"libcuda", "1"}, {"libnvidia-ml", "1"}, {"libnvidia-ptxjitcompiler", "1"},
		{"libnvidia-opencl", "1"}, {"libnvidia-cfg", "1"},
	}
	switch {
	case era < 450:
		libs = append(libs, [2]string{"libnvidia-fatbinaryloader", ""}, [2]string{"libnvidia-compiler", ""})
	case era < 500:
		libs = append(libs, [2]string{"libnvidia-allocator", "1"}, [2]string{"libnvidia-compiler", ""})
	default:
		libs = append(libs, [2]string{"libnvidia-allocator", "1"}, [2]string{"libnvidia-nvvm", "4"},
			[2]string{"libcudadebugger", "1"}, [2]string{"libnvidia-pkcs11", ""}, [2]string{"libnvidia-pkcs11-openssl3", ""})
	}
	if era >= 550 {
		libs = append(libs, [2]string{"libnvidia-gpucomp", ""})
	}
	var out []node
	for _, l := range libs {
		out = append(out, driverLib(d, l[0], version, l[1])...)
	}
	return out
}

// graphicsLibs are driver files outside the compute and utility set, which
// the probe must leave alone in shared folders.
func graphicsLibs(d, version string) []node {
	var out []node
	out = append(out, driverLib(d, "libnvidia-glcore", version, "")...)
	out = append(out, driverLib(d, "libnvidia-eglcore", version, "")...)
	out = append(out, driverLib(d, "libGLX_nvidia", version, "0")...)
	return out
}

// system is what a shared folder holds besides the driver.
func system(libDir, binDir string) []node {
	return []node{
		lib(path.Join(libDir, "libc.so.6"), "libc.so.6"),
		lib(path.Join(libDir, "libz.so.1.2.11"), "libz.so.1"),
		link(path.Join(libDir, "libz.so.1"), "libz.so.1.2.11"),
		lib(path.Join(libDir, "libstdc++.so.6.0.30"), "libstdc++.so.6"),
		link(path.Join(libDir, "libstdc++.so.6"), "libstdc++.so.6.0.30"),
		executable(path.Join(binDir, "ls")),
		executable(path.Join(binDir, "bash")),
		file("/etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"),
		file("/etc/os-release", "ID=fake\n"),
	}
}

// without drops the files of one library.
func without(nodes []node, base string) []node {
	var out []node
	for _, n := range nodes {
		if !strings.HasPrefix(path.Base(n.path), base+".so") {
			out = append(out, n)
		}
	}
	return out
}

func concat(parts ...[]node) []node {
	var out []node
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// libsFor builds libraries of another machine (elf.EM_AARCH64, elf.EM_386).
func libsFor(m elf.Machine, nodes []node) []node {
	out := append([]node(nil), nodes...)
	for i := range out {
		if out[i].kind == kindLib {
			out[i].machine = m
		}
	}
	return out
}

// alternative links name through /etc/alternatives to target, as Debian's
// update-alternatives does.
func alternative(name, alt, target string) []node {
	return []node{link(name, "/etc/alternatives/"+alt), link("/etc/alternatives/"+alt, target)}
}

// containerdToolkitDefault is containerd's configuration (version 2, the
// CRI plugin at io.containerd.grpc.v1.cri) with the NVIDIA container
// toolkit as the default runtime, as `nvidia-ctk runtime configure
// --runtime=containerd --set-as-default` and the EKS accelerated AMIs write it.
func containerdToolkitDefault(binary string) string {
	return `version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "nvidia"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
        privileged_without_host_devices = false
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
          BinaryName = "` + binary + `"
          SystemdCgroup = true
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
`
}

// BottlerocketContainerdConfig is the head of Bottlerocket's containerd
// configuration for its NVIDIA variants, as its template renders it: the
// default runtime nvidia runs nvidia-oci.
const BottlerocketContainerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
enable_selinux = true

[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
base_runtime_spec = "/etc/containerd/cri-base.json"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
SystemdCgroup = true
BinaryName = "nvidia-oci"
`

// BottlerocketNvidiaHooks is Bottlerocket's nvidia-oci-hooks-json, the
// hooks shimpei has oci-add-hooks add for nvidia-oci.
const BottlerocketNvidiaHooks = `{
  "hooks": {
    "prestart": [
      {
        "path": "/usr/bin/nvidia-container-runtime-hook",
        "args": ["nvidia-container-runtime-hook", "prestart"]
      }
    ],
    "poststart": [
    ]
  }
}
`

// AL2023ContainerdConfig is the NVIDIA part of what nodeadm writes on the
// EKS AL2023 NVIDIA AMI (containerd 2, configuration version 3).
const AL2023ContainerdConfig = `version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[plugins.'io.containerd.cri.v1.runtime'.containerd]
default_runtime_name = 'nvidia'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
base_runtime_spec = '/etc/containerd/base-runtime-spec.json'
runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
BinaryName = '/usr/bin/nvidia-container-runtime'
SystemdCgroup = true
`

// OpenShiftCRIOConfig is the part of OpenShift's CRI-O configuration that
// names the hook folders, runc the default runtime.
const OpenShiftCRIOConfig = `[crio.runtime]
default_runtime = "runc"
hooks_dir = [
"/etc/containers/oci/hooks.d",
"/run/containers/oci/hooks.d",
"/usr/share/containers/oci/hooks.d",
]
`

// OperatorOCIHook is the hook the toolkit's installer writes for CRI-O in
// hook mode (pkg/config/ocihook), with the operator's install folder.
const OperatorOCIHook = `{"version":"1.0.0","hook":{"path":"/usr/local/nvidia/toolkit/nvidia-container-runtime-hook","args":["nvidia-container-runtime-hook","prestart"],"env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/toolkit"]},"when":{"always":true,"commands":[".*"]},"stages":["prestart"]}
`

// containerdRunc is a containerd configuration with the toolkit registered
// but runc the default: pods get the driver only with runtimeClassName nvidia.
const containerdRunc = `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
`

// cdiSpec is the head of what `nvidia-ctk cdi generate` writes.
func cdiSpec(version, libDir string) string {
	return `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: ` + libDir + `/libcuda.so.` + version + `
    containerPath: ` + libDir + `/libcuda.so.` + version + `
    options: [ro, nosuid, nodev, bind]
`
}

// Layouts returns every layout, by name.
func Layouts() map[string]Layout {
	layouts := []Layout{
		{
			Name:          "ubuntu1604-nvidia384",
			Description:   "Ubuntu 16.04 nvidia-384 package: /usr/lib/nvidia-384 and its bin folder, libcuda loose in /usr/lib/x86_64-linux-gnu",
			DriverVersion: Version384,
			LDConf:        []string{"/usr/lib/nvidia-384", x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				without(computeLibs("/usr/lib/nvidia-384", Version384, 384), "libcuda"),
				graphicsLibs("/usr/lib/nvidia-384", Version384),
				[]node{dir("/usr/lib/nvidia-384/xorg"), lib("/usr/lib/nvidia-384/libGL.so.1.0.0", "libGL.so.1")},
				binaries("/usr/lib/nvidia-384/bin", Version384),
				// The libcuda1-384 package put libcuda beside the system's libraries.
				driverLib(x8664LibDir, "libcuda", Version384, "1"),
				[]node{link("/usr/bin/nvidia-smi", "/usr/lib/nvidia-384/bin/nvidia-smi")},
			),
		},
		{
			Name:          "centos7",
			Description:   "CentOS 7: the management libraries in /usr/lib64/nvidia, the compute libraries and binaries loose in /usr/lib64 and /usr/bin",
			DriverVersion: Version460,
			LDConf:        []string{"/usr/lib64/nvidia", "/usr/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				driverLib("/usr/lib64/nvidia", "libnvidia-ml", Version460, "1"),
				driverLib("/usr/lib64/nvidia", "libnvidia-cfg", Version460, "1"),
				graphicsLibs("/usr/lib64/nvidia", Version460),
				driverLib("/usr/lib64", "libcuda", Version460, "1"),
				driverLib("/usr/lib64", "libnvidia-ptxjitcompiler", Version460, "1"),
				driverLib("/usr/lib64", "libnvidia-opencl", Version460, "1"),
				driverLib("/usr/lib64", "libnvidia-allocator", Version460, "1"),
				driverLib("/usr/lib64", "libnvidia-compiler", Version460, ""),
				binaries("/usr/bin", Version460),
			),
		},
		{
			Name:          "gke-cos",
			Description:   "GKE Container-Optimized OS: everything in /home/kubernetes/bin/nvidia/{lib64,bin}, not in the loader's cache; another device plugin than GKE's (NVIDIA's, or the test cluster's own), so the probe plans the mounts",
			DriverVersion: Version535,
			LDConf:        []string{"/lib64", "/usr/lib64"},
			nodes:         gkeCOS(),
		},
		{
			Name:          "gke-cos-device-plugin",
			Description:   "GKE Container-Optimized OS as GKE runs it: the driver in /home/kubernetes/bin/nvidia, and GKE's nvidia-gpu-device-plugin registered with the kubelet (its socket) and running (its process); its Allocate answer mounts that folder at /usr/local/nvidia: the device plugin injects the driver",
			Source:        "GoogleCloudPlatform/container-engine-accelerators: cmd/nvidia_gpu/nvidia_gpu.go (--host-path /home/kubernetes/bin/nvidia, --container-path /usr/local/nvidia, socket nvidiaGPU-<unix time>.sock), pkg/gpu/nvidia/beta_plugin.go (Allocate returns the mounts), cmd/nvidia_gpu/device-plugin.yaml (command, /var/lib/kubelet/device-plugins at /device-plugin), Dockerfile (/usr/bin/nvidia-gpu-device-plugin)",
			DriverVersion: Version535,
			LDConf:        []string{"/lib64", "/usr/lib64"},
			nodes: concat(
				gkeCOS(),
				[]node{
					socket(devicePlugins + "/kubelet.sock"),
					socket(devicePlugins + "/nvidiaGPU-1718000000.sock"),
					file(devicePlugins+"/kubelet_internal_checkpoint", `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["nvidia0"]}},"Checksum":1}`),
					file("/proc/1/comm", "systemd\n"),
					file("/proc/1/cmdline", "/sbin/init\x00"),
					file("/proc/2741/comm", "nvidia-gpu-devi\n"),
					file("/proc/2741/cmdline", "/usr/bin/nvidia-gpu-device-plugin\x00-logtostderr\x00--enable-container-gpu-metrics\x00--enable-health-monitoring\x00"),
					// COS keeps /var on its stateful partition; the plugin's
					// container has the kubelet's folder at /device-plugin.
					file("/proc/1/mountinfo", COSInitMounts),
					file("/proc/2741/mountinfo", "1200 1100 0:123 / / rw,relatime - overlay overlay rw\n1210 1200 8:1 /var/lib/kubelet/device-plugins /device-plugin rw,nosuid,nodev,relatime - ext4 /dev/sda1 rw\n1212 1200 8:1 /home/kubernetes/bin/nvidia /usr/local/nvidia ro,nosuid,nodev,relatime - ext4 /dev/sda1 rw\n"),
				},
			),
		},
		{
			Name:          "ubuntu2204-packages",
			Description:   "Ubuntu 22.04 distribution packages: everything loose in /usr/lib/x86_64-linux-gnu and /usr/bin, merged /usr (/lib -> usr/lib)",
			DriverVersion: Version550,
			LDConf:        []string{"/lib/x86_64-linux-gnu", x8664LibDir},
			nodes: concat(
				[]node{link("/lib", "usr/lib"), link("/bin", "usr/bin")},
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version550, 550),
				graphicsLibs(x8664LibDir, Version550),
				binaries("/usr/bin", Version550),
			),
		},
		{
			Name:          "usr-local-nvidia",
			Description:   "the GPU test machine: driver 580.159.04 in /usr/local/nvidia/{lib64,bin}, loose duplicates in /usr/lib",
			DriverVersion: Version580,
			LDConf:        []string{localNvidia + "/lib64", x8664LibDir, "/usr/lib"},
			nodes:         usrLocalNvidia(),
		},
		{
			Name:          "hostile-escape",
			Description:   "usr-local-nvidia plus symlinks that try to leave the host root or point at system files",
			DriverVersion: Version580,
			LDConf:        []string{localNvidia + "/lib64", x8664LibDir},
			nodes: concat(usrLocalNvidia(), []node{
				link(x8664LibDir+"/libnvidia-opencl.so."+Version580, "/etc/passwd"),
				link(x8664LibDir+"/libnvidia-cfg.so."+Version580, "../../../../../../../../../../etc/shadow"),
				link(x8664LibDir+"/libcuda.so."+Version580, "../../../../../../../../../../usr/lib/x86_64-linux-gnu/libc.so.6"),
				link("/usr/bin/nvidia-smi", "../../../../../../../../etc/passwd"),
				link("/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-debugdump"),
				link(x8664LibDir+"/libnvidia-allocator.so."+Version580, "libnvidia-allocator.so."+Version580),
			}),
		},
		{
			Name:          "hostile-two-versions",
			Description:   "Ubuntu with nvidia-384 and nvidia-390 side by side; the loader's cache and /usr/bin point at 390",
			DriverVersion: Version390,
			LDConf:        []string{"/usr/lib/nvidia-390", x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				computeLibs("/usr/lib/nvidia-384", Version384, 384),
				binaries("/usr/lib/nvidia-384/bin", Version384),
				computeLibs("/usr/lib/nvidia-390", Version390, 390),
				binaries("/usr/lib/nvidia-390/bin", Version390),
				[]node{link("/usr/bin/nvidia-smi", "/usr/lib/nvidia-390/bin/nvidia-smi")},
			),
		},
		{
			Name:          "hostile-unversioned",
			Description:   "loose driver files plus libraries with no version suffix (CUDA stubs, hand copies) that must not be mounted",
			DriverVersion: Version550,
			LDConf:        []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version550, 550),
				binaries("/usr/bin", Version550),
				[]node{
					lib("/usr/local/cuda/lib64/stubs/libcuda.so", "libcuda.so.1"),
					lib(x8664LibDir+"/libnvidia-tls.so", "libnvidia-tls.so"),
					lib(x8664LibDir+"/libnvidia-encode.so.1", "libnvidia-encode.so.1"),
					lib(x8664LibDir+"/libcudadebugger.so.1.2", "libcudadebugger.so.1"),
				},
			),
		},
		{
			Name:        "hostile-stubs-only",
			Description: "only unversioned copies of libcuda and libnvidia-ml, as left by a CUDA toolkit install without a driver",
			LDConf:      []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				[]node{
					lib(x8664LibDir+"/libcuda.so.1", "libcuda.so.1"),
					link(x8664LibDir+"/libcuda.so", "libcuda.so.1"),
					lib(x8664LibDir+"/libnvidia-ml.so.1", "libnvidia-ml.so.1"),
				},
			),
		},
		{
			Name:          "gpu-operator",
			Description:   "the NVIDIA GPU operator's driver container: its root, libc and all, at /run/nvidia/driver; nothing of the driver in the host's own folders or cache",
			DriverVersion: Version550,
			LDConf:        []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				system(gpuOperator+x8664LibDir, gpuOperator+"/usr/bin"),
				computeLibs(gpuOperator+x8664LibDir, Version550, 550),
				graphicsLibs(gpuOperator+x8664LibDir, Version550),
				binaries(gpuOperator+"/usr/bin", Version550),
			),
		},

		{
			Name:          "ubuntu2404-nvidia-driver-570",
			Description:   "Ubuntu 24.04 nvidia-driver-570: libnvidia-compute-570 loose in /usr/lib/x86_64-linux-gnu, nvidia-utils-570 in /usr/bin, the :i386 compute libraries in /usr/lib/i386-linux-gnu (in the loader cache, 32-bit)",
			Source:        "Ubuntu nvidia-graphics-drivers-570 (libnvidia-compute-570.install: usr/lib/x86_64-linux-gnu; nvidia-utils-570: usr/bin)",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"},
			nodes: concat(
				[]node{link("/lib", "usr/lib"), link("/bin", "usr/bin")},
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version570, 570),
				graphicsLibs(x8664LibDir, Version570),
				libsFor(elf.EM_386, computeLibs("/usr/lib/i386-linux-gnu", Version570, 450)),
				binaries("/usr/bin", Version570),
			),
		},
		{
			Name:          "ubuntu2204-nvidia-driver-535-server",
			Description:   "Ubuntu 22.04 nvidia-driver-535-server (the -server flavour for data-center GPUs): same folders as the desktop packages, plus libnvidia-nscq for NVSwitch systems",
			Source:        "Ubuntu nvidia-graphics-drivers-535-server (libnvidia-compute-535-server, libnvidia-nscq-535, nvidia-utils-535-server)",
			DriverVersion: Version535Server,
			LDConf:        []string{"/usr/lib/x86_64-linux-gnu"},
			nodes: concat(
				[]node{link("/lib", "usr/lib")},
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version535Server, 535),
				driverLib(x8664LibDir, "libnvidia-nscq", Version535Server, "2"),
				binaries("/usr/bin", Version535Server),
			),
		},
		{
			Name:          "debian12-nvidia-driver",
			Description:   "Debian 12 nvidia-driver: the libraries in /usr/lib/x86_64-linux-gnu/nvidia/current, reached from the loader's folder through /etc/alternatives; nvidia-smi in /usr/lib/nvidia/current behind an alternative; MPS in /usr/bin and /usr/sbin",
			Source:        "Debian nvidia-graphics-drivers (libcuda1.install.in: #LIBDIR#/#PRIVATE#/ = usr/lib/x86_64-linux-gnu/nvidia/current; nvidia-alternative.postinst.in: slaves /usr/lib/<triplet>/libcuda.so.1, /usr/bin/nvidia-smi; nvidia-smi.install.in: usr/lib/nvidia/current; nvidia-cuda-mps.install)",
			DriverVersion: Version535Debian,
			LDConf:        []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"},
			nodes:         debian(),
		},
		{
			Name:          "rhel9-nvidia-repo",
			Description:   "RHEL / Rocky / Alma 9 with NVIDIA's CUDA repository (nvidia-driver-cuda-libs, libnvidia-ml, nvidia-driver-cuda): loose in /usr/lib64 and /usr/bin, plus the versioned files an older 550 driver left behind; the loader's links point at 570",
			Source:        "NVIDIA yum-packaging-nvidia-driver nvidia-driver.spec (cp -a libcuda*.so* libnv*.so* %{_libdir}; install nvidia-{debugdump,smi,cuda-mps-control,cuda-mps-server} %{_bindir})",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib64"},
			nodes: concat(
				[]node{link("/lib64", "usr/lib64"), link("/bin", "usr/bin")},
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/usr/lib64", Version570, 570),
				graphicsLibs("/usr/lib64", Version570),
				// Leftovers of 550: versioned files only, no links.
				[]node{lib("/usr/lib64/libcuda.so."+Version550Old, "libcuda.so.1"), lib("/usr/lib64/libnvidia-ml.so."+Version550Old, "libnvidia-ml.so.1"), lib("/usr/lib64/libnvidia-ptxjitcompiler.so."+Version550Old, "libnvidia-ptxjitcompiler.so.1")},
				binaries("/usr/bin", Version570),
			),
		},
		{
			Name:          "amazonlinux2-eks-gpu",
			Description:   "Amazon Linux 2 EKS accelerated AMI: NVIDIA's RPMs in /usr/lib64 and /usr/bin, and the NVIDIA container toolkit as containerd's default runtime: the runtime injects the driver",
			Source:        "Amazon EKS user guide, accelerated AMIs (NVIDIA drivers; nvidia-container-runtime as the default runtime); containerd configuration as nvidia-ctk writes it",
			DriverVersion: Version550,
			LDConf:        []string{"/usr/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/usr/lib64", Version550, 550),
				binaries("/usr/bin", Version550),
				[]node{file("/etc/containerd/config.toml", containerdToolkitDefault("/usr/bin/nvidia-container-runtime")), executable("/usr/bin/nvidia-container-runtime")},
			),
		},
		{
			Name:          "amazonlinux2023-eks-nvidia",
			Description:   "Amazon Linux 2023 EKS NVIDIA AMI: NVIDIA's RPMs (nvidia-driver-cuda and its libraries) in /usr/lib64 and /usr/bin, the toolkit installed from NVIDIA's repository, and nodeadm's containerd 2 configuration (version 3) with the toolkit as the default runtime: the runtime injects the driver",
			Source:        "awslabs/amazon-eks-ami templates/al2023/provisioners/install-nvidia-driver.sh (dnf install nvidia-driver-cuda, nvidia-container-toolkit); nodeadm/internal/containerd/runtime_config_nvidia.go and nodeadm/test/e2e/cases/containerdv2-runtime-config-nvidia/expected-containerd-configv3.toml; NVIDIA/yum-packaging-nvidia-driver nvidia-driver.spec (%files cuda-libs: %{_libdir})",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib64"},
			nodes: concat(
				[]node{link("/lib64", "usr/lib64")},
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/usr/lib64", Version570, 570),
				binaries("/usr/bin", Version570),
				[]node{
					file("/etc/os-release", "NAME=\"Amazon Linux\"\nVERSION=\"2023\"\nID=\"amzn\"\n"),
					file("/etc/containerd/config.toml", AL2023ContainerdConfig),
					executable("/usr/bin/nvidia-container-runtime"),
					executable("/usr/bin/nvidia-container-runtime-hook"),
				},
			),
		},
		{
			Name:          "sles15-nvidia-compute-g06",
			Description:   "SUSE Linux Enterprise 15 with NVIDIA's repository (nvidia-compute-G06, nvidia-compute-utils-G06): /usr/lib64 and /usr/bin, and the -32bit package's libraries in /usr/lib (ELF32, never planned)",
			Source:        "NVIDIA's SUSE repository packages nvidia-compute-G06 (%{_libdir}), nvidia-compute-G06-32bit (/usr/lib), nvidia-compute-utils-G06 (%{_bindir})",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib64", "/usr/lib"},
			nodes: concat(
				[]node{link("/lib64", "usr/lib64")},
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/usr/lib64", Version570, 570),
				libsFor(elf.EM_386, computeLibs("/usr/lib", Version570, 450)),
				binaries("/usr/bin", Version570),
			),
		},
		{
			Name:          "bottlerocket-nvidia",
			Description:   "Bottlerocket aws-k8s-*-nvidia: the Tesla driver in /usr/lib/nvidia/tesla (in ld.so.conf.d) and /usr/libexec/nvidia/tesla/bin; containerd's default runtime nvidia runs nvidia-oci, a link to shimpei, which adds the toolkit's prestart hook from /etc/shimpei/nvidia-oci-hooks.json: the toolkit injects the driver, under Bottlerocket's own runtime name",
			Source:        "bottlerocket-os/bottlerocket-core-kit packages/kmod-6.1-nvidia/kmod-6.1-nvidia.spec, nvidia-ld.so.conf.in, nvidia-tmpfiles.conf.in; packages/containerd/containerd-config-toml_k8s_nvidia_containerd_sock; packages/nvidia-container-toolkit/nvidia-container-toolkit.spec, nvidia-oci-hooks-json, nvidia-container-toolkit-config-k8s; sources/shimpei/src/main.rs",
			DriverVersion: VersionBottlerocket,
			LDConf:        []string{"/usr/lib", "/usr/lib/nvidia/tesla"},
			nodes: concat(
				[]node{link("/lib", "usr/lib"), link("/lib64", "usr/lib")},
				system("/usr/lib", "/usr/bin"),
				computeLibs("/usr/lib/nvidia/tesla", VersionBottlerocket, 535),
				binaries("/usr/libexec/nvidia/tesla/bin", VersionBottlerocket),
				[]node{
					file("/etc/os-release", "NAME=Bottlerocket\nID=bottlerocket\nVARIANT_ID=aws-k8s-1.33-nvidia\n"),
					file("/etc/ld.so.conf.d/nvidia-tesla.conf", "/usr/lib/nvidia/tesla/\n"),
					file("/usr/share/factory/nvidia/tesla/nvidia-path.env", "NVIDIA_PATH=/usr/libexec/nvidia/tesla/bin\n"),
					dir("/run/nvidia"),
					file("/etc/containerd/config.toml", BottlerocketContainerdConfig),
					executable("/usr/bin/shimpei"),
					link("/usr/bin/nvidia-oci", "shimpei"),
					executable("/usr/bin/oci-add-hooks"),
					executable("/usr/bin/runc"),
					file("/etc/shimpei/nvidia-oci-hooks.json", BottlerocketNvidiaHooks),
					executable("/usr/bin/nvidia-container-runtime-hook"),
					executable("/usr/bin/nvidia-container-cli"),
					file("/etc/nvidia-container-runtime/config.toml", "accept-nvidia-visible-devices-as-volume-mounts = true\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n\n[nvidia-container-cli]\nroot = \"/\"\npath = \"/usr/bin/nvidia-container-cli\"\nenvironment = []\nldconfig = \"@/sbin/ldconfig\"\n"),
				},
			),
		},
		{
			Name:          "talos-nvidia-extension",
			Description:   "Talos with the nonfree-kmod-nvidia and nvidia-container-toolkit system extensions: the driver installed with --opengl-prefix=/usr/local (libraries in /usr/local/lib, programs in /usr/local/bin, /usr/bin/nvidia-smi a link), its own glibc's loader cache under /usr/local/etc, and the CDI spec the extension's nvidia-cdi-gen service writes to /run/cdi",
			Source:        "siderolabs/extensions nvidia-gpu/nvidia-container-toolkit (nvidia-pkgs pkg.yaml: nvidia-installer --opengl-prefix=/rootfs/usr/local --utility-prefix=/rootfs/usr/local, ln -s /usr/local/bin/nvidia-smi /rootfs/usr/bin; nvidia-cdi-gen.yaml: nvidia-ctk cdi generate --output /run/cdi/nvidia.yaml)",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/local/lib"},
			CacheDir:      "/usr/local/etc",
			nodes: concat(
				computeLibs("/usr/local/lib", Version570, 570),
				graphicsLibs("/usr/local/lib", Version570),
				binaries("/usr/local/bin", Version570),
				[]node{link("/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi"), file("/run/cdi/nvidia.yaml", cdiSpec(Version570, "/usr/local/lib"))},
			),
		},
		{
			Name:          "flatcar-nvidia",
			Description:   "Flatcar's nvidia.service: the driver in /opt/nvidia/<version>/{lib64,bin}, /opt/nvidia/current a link to it, /opt/bin/nvidia-smi a link through current, /opt/nvidia/current/lib64 in ld.so.conf.d; the previous driver's folder left behind",
			Source:        "Flatcar docs, Using NVIDIA GPUs on Flatcar (nvidia.service, NVIDIA_DRIVER_VERSION=570.181); its installer's /etc/ld.so.conf.d/nvidia.conf (/opt/nvidia/current/lib64) and /opt/bin links",
			DriverVersion: Version570Short,
			LDConf:        []string{"/usr/lib64", "/opt/nvidia/current/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/opt/nvidia/"+Version570Short+"/lib64", Version570Short, 570),
				binaries("/opt/nvidia/"+Version570Short+"/bin", Version570Short),
				computeLibs("/opt/nvidia/"+Version550+"/lib64", Version550, 550),
				binaries("/opt/nvidia/"+Version550+"/bin", Version550),
				[]node{link("/opt/nvidia/current", Version570Short)},
				[]node{link("/opt/bin/nvidia-smi", "/opt/nvidia/current/bin/nvidia-smi")},
			),
		},
		{
			Name:          "nixos",
			Description:   "NixOS (hardware.nvidia): /run/opengl-driver a link to a buildEnv whose lib/ links each file into the nvidia-x11 store path; nvidia-smi in the package's -bin output, linked from /run/current-system/sw/bin; no loader cache",
			Source:        "nixpkgs nvidia-x11 (builder.sh installs into $out/lib and $bin/bin; addOpenGLRunpath points programs at /run/opengl-driver/lib)",
			DriverVersion: Version565,
			CacheDir:      "none",
			nodes:         nixos(),
		},
		{
			Name:          "gpu-operator-toolkit",
			Description:   "the GPU operator with its toolkit as containerd's default runtime (CONTAINERD_SET_AS_DEFAULT): driver container root at /run/nvidia/driver, the runtime in /usr/local/nvidia/toolkit; the runtime injects the driver",
			Source:        "NVIDIA gpu-operator toolkit container (nvidia-ctk runtime configure, BinaryName /usr/local/nvidia/toolkit/nvidia-container-runtime)",
			DriverVersion: Version550,
			LDConf:        []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				system(gpuOperator+x8664LibDir, gpuOperator+"/usr/bin"),
				computeLibs(gpuOperator+x8664LibDir, Version550, 550),
				binaries(gpuOperator+"/usr/bin", Version550),
				[]node{file("/etc/containerd/config.toml", containerdToolkitDefault("/usr/local/nvidia/toolkit/nvidia-container-runtime"))},
			),
		},
		{
			Name:          "gpu-operator-openshift",
			Description:   "RHCOS with the GPU operator on OpenShift: the driver container's root (RHEL, /usr/lib64) at /run/nvidia/driver, the toolkit in /usr/local/nvidia/toolkit, and CRI-O given the driver by the toolkit's OCI hook, which the operator writes to /run/containers/oci/hooks.d, a folder of CRI-O's hooks_dir on OpenShift: the hook injects the driver",
			Source:        "NVIDIA/gpu-operator assets/state-container-toolkit/0500_daemonset.yaml (crio-hooks: host /run/containers/oci/hooks.d at the toolkit's /usr/share/containers/oci/hooks.d) and controllers/object_controls.go (CRIO_CONFIG_MODE=hook; the host folder moved to /usr/share/containers/oci/hooks.d only off OpenShift); NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk-installer/container/runtime/crio/crio.go (oci-nvidia-hook.json) and pkg/config/ocihook/oci-hook.go (when.always)",
			DriverVersion: Version550,
			LDConf:        []string{"/usr/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				system(gpuOperator+"/usr/lib64", gpuOperator+"/usr/bin"),
				computeLibs(gpuOperator+"/usr/lib64", Version550, 550),
				binaries(gpuOperator+"/usr/bin", Version550),
				[]node{
					file("/etc/os-release", "NAME=\"Red Hat Enterprise Linux CoreOS\"\nID=\"rhcos\"\n"),
					file("/etc/crio/crio.conf.d/00-default", OpenShiftCRIOConfig),
					executable("/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"),
					file("/run/containers/oci/hooks.d/oci-nvidia-hook.json", OperatorOCIHook),
					file("/run/nvidia/validations/driver-ready", "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n"),
				},
			),
		},
		{
			Name:          "ubuntu2404-arm64-gh200",
			Description:   "Ubuntu 24.04 arm64 on GH200 / GB200 (nvidia-driver-570-server for arm64): aarch64 ELF files in /usr/lib/aarch64-linux-gnu, loader cache entries of the AArch64 kind",
			Source:        "Ubuntu nvidia-graphics-drivers-570-server arm64 (libnvidia-compute-570-server: usr/lib/aarch64-linux-gnu); NVIDIA's ubuntu2404/sbsa repository",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib/aarch64-linux-gnu"},
			nodes: libsFor(elf.EM_AARCH64, concat(
				[]node{link("/lib", "usr/lib")},
				system("/usr/lib/aarch64-linux-gnu", "/usr/bin"),
				computeLibs("/usr/lib/aarch64-linux-gnu", Version570, 570),
				driverLib("/usr/lib/aarch64-linux-gnu", "libnvidia-nscq", Version570, "2"),
				binaries("/usr/bin", Version570),
			)),
		},
		{
			Name:          "run-installer",
			Description:   "NVIDIA's .run installer on Ubuntu: libraries in /usr/lib/x86_64-linux-gnu with its GL loaders and egl-wayland (own version 1.1.13), the 32-bit compatibility libraries in /usr/lib/i386-linux-gnu, programs and nvidia-uninstall in /usr/bin",
			Source:        "NVIDIA Linux driver README, Installed components (libraries to /usr/lib/<triplet> or /usr/lib64, 32-bit compatibility to /usr/lib32 or /usr/lib/i386-linux-gnu, utilities to /usr/bin)",
			DriverVersion: Version580Run,
			LDConf:        []string{x8664LibDir, "/usr/lib/i386-linux-gnu"},
			nodes: concat(
				[]node{link("/lib", "usr/lib")},
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version580Run, 580),
				graphicsLibs(x8664LibDir, Version580Run),
				driverLib(x8664LibDir, "libnvidia-egl-wayland", "1.1.13", "1"),
				libsFor(elf.EM_386, computeLibs("/usr/lib/i386-linux-gnu", Version580Run, 450)),
				binaries("/usr/bin", Version580Run),
				[]node{executable("/usr/bin/nvidia-uninstall"), executable("/usr/bin/nvidia-installer")},
			),
		},
		{
			Name:          "ubuntu-cdi",
			Description:   "Ubuntu packages with a CDI spec for nvidia.com/gpu in /etc/cdi (nvidia-ctk cdi generate) and runc as containerd's default runtime: the runtime applies the spec",
			Source:        "NVIDIA container toolkit docs, CDI support (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)",
			DriverVersion: Version575,
			LDConf:        []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version575, 575),
				binaries("/usr/bin", Version575),
				[]node{file("/etc/cdi/nvidia.yaml", cdiSpec(Version575, x8664LibDir)), file("/etc/containerd/config.toml", containerdRunc)},
			),
		},
		{
			Name:          "crio-toolkit",
			Description:   "RHEL with CRI-O and the toolkit as CRI-O's default runtime in a drop-in: the runtime injects the driver",
			Source:        "NVIDIA container toolkit docs, configuring CRI-O (nvidia-ctk runtime configure --runtime=crio --set-as-default: /etc/crio/crio.conf.d/99-nvidia.toml)",
			DriverVersion: Version570,
			LDConf:        []string{"/usr/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				computeLibs("/usr/lib64", Version570, 570),
				binaries("/usr/bin", Version570),
				[]node{
					file("/etc/crio/crio.conf", "[crio.runtime]\ndefault_runtime = \"crun\"\n"),
					file("/etc/crio/crio.conf.d/99-nvidia.conf", "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\nruntime_type = \"oci\"\n"),
				},
			),
		},
		{
			Name:          "docker-cri-dockerd",
			Description:   "Ubuntu packages with Docker (reached by the kubelet through cri-dockerd) whose default-runtime is nvidia: the runtime injects the driver",
			Source:        "NVIDIA container toolkit docs, configuring Docker (nvidia-ctk runtime configure --runtime=docker --set-as-default: /etc/docker/daemon.json)",
			DriverVersion: Version550,
			LDConf:        []string{x8664LibDir},
			nodes: concat(
				system(x8664LibDir, "/usr/bin"),
				computeLibs(x8664LibDir, Version550, 550),
				binaries("/usr/bin", Version550),
				[]node{
					file("/etc/docker/daemon.json", `{"default-runtime": "nvidia", "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}`+"\n"),
					executable("/usr/bin/cri-dockerd"),
				},
			),
		},
		{
			Name:        "no-driver",
			Description: "a node without any NVIDIA driver",
			LDConf:      []string{x8664LibDir},
			nodes:       system(x8664LibDir, "/usr/bin"),
		},
	}
	out := make(map[string]Layout, len(layouts))
	for _, l := range layouts {
		out[l.Name] = l
	}
	return out
}

// debian lays out Debian's nvidia-driver packages: the private folder
// nvidia/current, reached through alternatives.
// gkeCOS is GKE's Container-Optimized OS with the driver its installer puts
// in /home/kubernetes/bin/nvidia.
// COSInitMounts is the mount table of a Container-Optimized OS node's init
// (/proc/1/mountinfo), in part: its read-only root, and /var and /home bound
// from the stateful partition.
const COSInitMounts = "21 1 254:0 / / ro,relatime shared:1 - ext2 /dev/root ro\n" +
	"24 21 8:1 / /mnt/stateful_partition rw,nosuid,nodev,relatime shared:9 - ext4 /dev/sda1 rw,commit=30\n" +
	"27 21 8:1 /var /var rw,nosuid,nodev,relatime shared:9 - ext4 /dev/sda1 rw,commit=30\n" +
	"30 21 8:1 /home /home rw,nosuid,nodev,relatime shared:9 - ext4 /dev/sda1 rw,commit=30\n"

func gkeCOS() []node {
	return concat(
		system("/usr/lib64", "/usr/bin"),
		computeLibs(kubernetesCOS+"/lib64", Version535, 535),
		graphicsLibs(kubernetesCOS+"/lib64", Version535),
		binaries(kubernetesCOS+"/bin", Version535),
		[]node{executable(kubernetesCOS + "/bin/nvidia-installer")},
	)
}

func debian() []node {
	const private = x8664LibDir + "/nvidia/current"
	const bins = "/usr/lib/nvidia/current"
	v := Version535Debian
	nodes := concat(
		[]node{link("/lib", "usr/lib"), link("/bin", "usr/bin"), link("/sbin", "usr/sbin")},
		system(x8664LibDir, "/usr/bin"),
		computeLibs(private, v, 535),
		graphicsLibs(private, v),
		binariesNamed(bins, v, "nvidia-smi", "nvidia-debugdump"),
		[]node{file(bins+"/nvidia-smi.1.gz", "man\n"), executable(bins + "/nvidia-bug-report.sh"), lib(bins+"/nvidia_drv.so", "nvidia_drv.so")},
		binariesNamed("/usr/bin", v, "nvidia-cuda-mps-control", "nvidia-persistenced"),
		binariesNamed("/usr/sbin", v, "nvidia-cuda-mps-server"),
		alternative("/usr/bin/nvidia-smi", "nvidia--nvidia-smi", bins+"/nvidia-smi"),
		alternative("/usr/bin/nvidia-debugdump", "nvidia--nvidia-debugdump", bins+"/nvidia-debugdump"),
	)
	for _, so := range []string{"libcuda.so.1", "libcuda.so", "libcudadebugger.so.1", "libnvidia-allocator.so.1", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4", "libnvidia-nvvm.so." + v, "libnvidia-opencl.so.1", "libnvidia-ptxjitcompiler.so.1"} {
		nodes = append(nodes, alternative(x8664LibDir+"/"+so, "nvidia--"+so+"-x86_64-linux-gnu", private+"/"+so)...)
	}
	return nodes
}

// nixos lays out a NixOS host: everything in the store, reached through
// profile links.
func nixos() []node {
	const (
		drivers = "/nix/store/9r2x1v0c6l2b4y7i6y8m2q2d3cjq5q0a-graphics-drivers"
		pkg     = "/nix/store/1b7l2m3k4j5h6g7f8d9s0a1q2w3e4r5t-nvidia-x11-" + Version565 + "-6.6.63"
		bin     = "/nix/store/6y7u8i9o0p1a2s3d4f5g6h7j8k9l0z1x-nvidia-x11-" + Version565 + "-6.6.63-bin"
		mesa    = "/nix/store/0q9w8e7r6t5y4u3i2o1p0a9s8d7f6g5h-mesa-24.2.8-drivers"
		glibc   = "/nix/store/2w3e4r5t6y7u8i9o0p1a2s3d4f5g6h7j-glibc-2.40-36"
	)
	nodes := concat(
		[]node{lib(glibc+"/lib/libc.so.6", "libc.so.6"), lib(mesa+"/lib/libGLX_mesa.so.0.0.0", "libGLX_mesa.so.0")},
		computeLibs(pkg+"/lib", Version565, 565),
		graphicsLibs(pkg+"/lib", Version565),
		binaries(bin+"/bin", Version565),
		[]node{link("/run/opengl-driver", drivers), link(drivers+"/lib/libGLX_mesa.so.0", mesa+"/lib/libGLX_mesa.so.0.0.0")},
		[]node{executable("/nix/store/3e4r5t6y7u8i9o0p1a2s3d4f5g6h7j8k-coreutils-9.5/bin/ls"), link("/run/current-system/sw/bin/ls", "/nix/store/3e4r5t6y7u8i9o0p1a2s3d4f5g6h7j8k-coreutils-9.5/bin/ls")},
	)
	// buildEnv links each file of each package into the profile.
	for _, n := range concat(computeLibs(pkg+"/lib", Version565, 565), graphicsLibs(pkg+"/lib", Version565)) {
		nodes = append(nodes, link(drivers+"/lib/"+path.Base(n.path), n.path))
	}
	for _, b := range driverBinaries {
		nodes = append(nodes, link("/run/current-system/sw/bin/"+b, bin+"/bin/"+b))
	}
	return nodes
}

func usrLocalNvidia() []node {
	return concat(
		[]node{link("/lib", "usr/lib")},
		system(x8664LibDir, "/usr/bin"),
		computeLibs(localNvidia+"/lib64", Version580, 580),
		graphicsLibs(localNvidia+"/lib64", Version580),
		// Not a driver file, but the folder is the driver's own: mounted whole anyway.
		[]node{lib(localNvidia+"/lib64/libOpenCL.so.1.0.0", "libOpenCL.so.1"), file(localNvidia+"/lib64/README.txt", "driver\n")},
		binaries(localNvidia+"/bin", Version580),
		driverLib("/usr/lib", "libcuda", Version580, "1"),
		driverLib("/usr/lib", "libnvidia-ml", Version580, "1"),
		driverLib("/usr/lib", "libnvidia-ptxjitcompiler", Version580, "1"),
	)
}

// Names returns the layout names, sorted.
func Names() []string {
	var names []string
	for n := range Layouts() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Build writes the named layout into root, which should be empty.
func Build(root, name string) (Layout, error) {
	l, ok := Layouts()[name]
	if !ok {
		return Layout{}, fmt.Errorf("failed to build fake root: unknown layout %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return l, l.Build(root)
}

// Build writes the layout into root.
func (l Layout) Build(root string) error {
	for _, n := range l.nodes {
		p := filepath.Join(root, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("failed to create folder for %q: %w", n.path, err)
		}
		var err error
		switch n.kind {
		case kindLib:
			m := n.machine
			if m == 0 {
				m = elf.EM_X86_64
			}
			err = os.WriteFile(p, SharedObjectFor(m, n.soname), n.mode)
		case kindFile:
			err = os.WriteFile(p, []byte(n.data), n.mode)
		case kindDir:
			err = os.MkdirAll(p, n.mode)
		case kindSocket:
			err = syscall.Mknod(p, syscall.S_IFSOCK|uint32(n.mode), 0)
		case kindLink:
			if err = os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				break
			}
			err = os.Symlink(n.target, p)
		}
		if err != nil {
			return fmt.Errorf("failed to create %q: %w", n.path, err)
		}
	}
	cacheDir := l.CacheDir
	switch cacheDir {
	case "":
		cacheDir = "/etc"
	case "none":
		return nil
	}
	if err := os.MkdirAll(filepath.Join(root, cacheDir), 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", cacheDir, err)
	}
	if err := os.WriteFile(filepath.Join(root, cacheDir, "ld.so.conf"), []byte(strings.Join(l.LDConf, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("failed to write ld.so.conf: %w", err)
	}
	entries, err := l.cacheEntries(root)
	if err != nil {
		return err
	}
	data, err := ldcache.Encode(entries, ldcache.FormatNew)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, cacheDir, "ld.so.cache"), data, 0o644); err != nil {
		return fmt.Errorf("failed to write ld.so.cache: %w", err)
	}
	return nil
}

// cacheEntries does what ldconfig does for the layout: every ELF file with a
// SONAME in a configured folder, and every link there named as the SONAME of
// the file it leads to (as alternatives links are), is indexed as
// <folder>/<soname>, one entry per SONAME and folder, folders in configured
// order, flagged with the file's architecture.
func (l Layout) cacheEntries(root string) ([]ldcache.Entry, error) {
	var entries []ldcache.Entry
	seen := map[string]bool{}
	for _, d := range l.LDConf {
		des, err := os.ReadDir(filepath.Join(root, d))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("failed to list %q: %w", d, err)
		}
		for _, de := range des {
			if !strings.HasPrefix(de.Name(), "lib") || !strings.Contains(de.Name(), ".so") {
				continue
			}
			target := path.Join(d, de.Name())
			if de.Type()&os.ModeSymlink != 0 {
				if target = rootedResolve(root, target); target == "" {
					continue
				}
			} else if !de.Type().IsRegular() {
				continue
			}
			soname, machine, err := readELF(filepath.Join(root, target))
			if err != nil || soname == "" {
				continue
			}
			if de.Type()&os.ModeSymlink != 0 && de.Name() != soname {
				continue
			}
			// The real folder of a linked folder (/lib -> usr/lib) is indexed once.
			real := rootedResolve(root, d)
			if real == "" || seen[real+"/"+soname] {
				continue
			}
			seen[real+"/"+soname] = true
			flags := int32(ld64)
			switch machine {
			case elf.EM_AARCH64:
				flags = ldcache.FlagELFLibc6 | ldcache.FlagAArch64Lib64
			case elf.EM_386:
				flags = ldcache.FlagELFLibc6
			}
			entries = append(entries, ldcache.Entry{Key: soname, Value: path.Join(d, soname), Flags: flags})
		}
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key })
	return entries, nil
}

// rootedResolve follows links in p as the host would, with root as its /;
// "" when p does not exist.
func rootedResolve(root, p string) string {
	real, err := hostroot.Resolve(root, p)
	if err != nil {
		return ""
	}
	return real
}

func readELF(p string) (string, elf.Machine, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return "", f.Machine, err
	}
	return names[0], f.Machine, nil
}

func readSONAME(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return "", err
	}
	return names[0], nil
}
