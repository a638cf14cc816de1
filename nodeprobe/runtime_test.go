package nodeprobe

import (
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestDetectRuntimeInjection covers the configuration files as real nodes
// have them, besides the fake roots: the toolkit registered but not the
// default, k3s, containerd 1's inline default runtime, runc's binary replaced,
// a CDI spec of another vendor, broken and oversized files, and links that try
// to leave the host root.
func TestDetectRuntimeInjection(t *testing.T) {
	for name, tc := range map[string]struct {
		files    map[string]string
		links    map[string]string
		sockets  []string
		want     string
		libs     []string // the library paths of a device-plugin node
		evidence string
		note     string
	}{
		"nothing": {want: ""},
		"toolkit registered, runc the default": {files: map[string]string{"/etc/containerd/config.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
`}, want: ""},
		"no default named: runc": {files: map[string]string{"/etc/containerd/config.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
`}, want: ""},
		"runc's binary replaced by the toolkit": {files: map[string]string{"/etc/containerd/config.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
`}, want: layout.RuntimeToolkit, evidence: `"runc"`},
		"k3s with --default-runtime nvidia": {files: map[string]string{"/var/lib/rancher/k3s/agent/etc/containerd/config.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia".options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
`}, want: layout.RuntimeToolkit, evidence: "k3s"},
		"containerd 1 inline default runtime": {files: map[string]string{"/etc/containerd/config.toml": `[plugins.cri.containerd.default_runtime]
  runtime_type = "io.containerd.runtime.v1.linux"
  runtime_engine = "/usr/bin/nvidia-container-runtime"
`}, want: layout.RuntimeToolkit},
		"toolkit in CDI mode is the toolkit": {files: map[string]string{"/etc/containerd/config.toml": `version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "nvidia-cdi"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia-cdi.options]
  BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi"
`, "/etc/cdi/nvidia.yaml": "kind: nvidia.com/gpu\ndevices:\n- name: all\n"}, want: layout.RuntimeToolkit},
		"a drop-in overrides the main file": {files: map[string]string{
			"/etc/containerd/config.toml":         "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
			"/etc/containerd/conf.d/50-runc.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n",
		}, want: ""},
		"broken TOML is a note":    {files: map[string]string{"/etc/containerd/config.toml": "[plugins\nnot toml"}, want: "", note: "config.toml"},
		"oversized file is a note": {files: map[string]string{"/etc/containerd/config.toml": strings.Repeat("#", maxConfigBytes+1)}, want: "", note: "not a regular file under"},
		"config linked out of the root": {
			// outside.toml is written beside the root, where a link
			// followed on this machine instead of the host would land.
			links: map[string]string{"/etc/containerd/config.toml": "../../../outside.toml", "/etc/crio/crio.conf": "/../../outside.toml"},
			want:  "",
		},
		"CRI-O hook always on": {files: map[string]string{"/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": `{"version": "1.0.0", "hook": {"path": "/usr/bin/nvidia-container-toolkit", "args": ["nvidia-container-toolkit", "prestart"]}, "when": {"always": true, "commands": [".*"]}, "stages": ["prestart"]}`},
			want: layout.RuntimeToolkit, evidence: "OCI hook"},
		"hook only on annotation": {files: map[string]string{"/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json": `{"version": "1.0.0", "hook": {"path": "/usr/bin/nvidia-container-toolkit"}, "when": {"annotations": {"^nvidia": ".*"}}, "stages": ["prestart"]}`},
			want: ""},
		// Bottlerocket: containerd runs nvidia-oci, a link to shimpei,
		// which adds the hooks of /etc/shimpei/nvidia-oci-hooks.json.
		"Bottlerocket's nvidia-oci adds the toolkit's hook": {files: bottlerocket(fakeroot.BottlerocketNvidiaHooks),
			links: map[string]string{"/usr/bin/nvidia-oci": "shimpei"},
			want:  layout.RuntimeToolkit, evidence: "/etc/shimpei/nvidia-oci-hooks.json: prestart hook /usr/bin/nvidia-container-runtime-hook"},
		"shimpei adding another hook": {files: bottlerocket(`{"hooks": {"prestart": [{"path": "/usr/bin/ecs-hook"}]}}`),
			links: map[string]string{"/usr/bin/nvidia-oci": "shimpei"}, want: ""},
		"shimpei without its hooks file": {files: without(bottlerocket(""), "/etc/shimpei/nvidia-oci-hooks.json"),
			links: map[string]string{"/usr/bin/nvidia-oci": "shimpei"}, want: ""},
		"shimpei's hooks file broken": {files: bottlerocket("{"),
			links: map[string]string{"/usr/bin/nvidia-oci": "shimpei"}, want: "", note: "/etc/shimpei/nvidia-oci-hooks.json"},
		"a runtime named nvidia-oci that is not shimpei": {files: merge(bottlerocket(fakeroot.BottlerocketNvidiaHooks), map[string]string{"/usr/bin/nvidia-oci": "#!/bin/sh\n"}), want: ""},
		"nvidia-oci linked out of the root": {files: bottlerocket(fakeroot.BottlerocketNvidiaHooks),
			links: map[string]string{"/usr/bin/nvidia-oci": "../../../outside/shimpei"}, want: ""},
		// OpenShift: the GPU operator writes the hook where CRI-O's
		// hooks_dir on OpenShift names it.
		"the GPU operator's hook on OpenShift": {files: map[string]string{"/run/containers/oci/hooks.d/oci-nvidia-hook.json": fakeroot.OperatorOCIHook},
			want: layout.RuntimeToolkit, evidence: "OCI hook /run/containers/oci/hooks.d/oci-nvidia-hook.json runs /usr/local/nvidia/toolkit/nvidia-container-runtime-hook"},
		"a hook in a folder CRI-O's hooks_dir names": {files: map[string]string{
			"/etc/crio/crio.conf.d/10-hooks.conf":        "[crio.runtime]\nhooks_dir = [\"/opt/oci/hooks\"]\n",
			"/opt/oci/hooks/oci-nvidia-hook.json":        fakeroot.OperatorOCIHook,
			"/opt/oci/other/oci-nvidia-hook-unused.json": fakeroot.OperatorOCIHook,
		}, want: layout.RuntimeToolkit, evidence: "OCI hook /opt/oci/hooks/oci-nvidia-hook.json"},
		"a hook in a folder nothing names": {files: map[string]string{"/opt/oci/hooks/oci-nvidia-hook.json": fakeroot.OperatorOCIHook}, want: ""},
		"docker without cri-dockerd":       {files: map[string]string{"/etc/docker/daemon.json": `{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}`}, want: ""},
		"CDI spec in /var/run/cdi through /var/run -> /run": {
			files: map[string]string{"/run/cdi/nvidia.json": `{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}]}`},
			links: map[string]string{"/var/run": "../run"},
			want:  layout.RuntimeCDI, evidence: "/run/cdi/nvidia.json: 1 nvidia.com/gpu devices"},
		"CDI spec of another vendor": {files: map[string]string{"/etc/cdi/amd.yaml": "kind: amd.com/gpu\ndevices:\n- name: \"0\"\n"}, want: ""},
		"CDI spec without devices":   {files: map[string]string{"/etc/cdi/nvidia.yaml": "kind: nvidia.com/gpu\ndevices: []\n"}, want: ""},
		"CDI spec that is not YAML":  {files: map[string]string{"/etc/cdi/nvidia.yaml": "kind: [\n"}, want: "", note: "/etc/cdi/nvidia.yaml"},
		// GKE's device plugin: its socket where the probe may list the
		// kubelet's folder, its process where it may not (non-root).
		"GKE's device plugin socket": {sockets: []string{dp + "/kubelet.sock", dp + "/nvidiaGPU-1718000000.sock"},
			want: layout.RuntimeDevicePlugin, evidence: "socket /var/lib/kubelet/device-plugins/nvidiaGPU-1718000000.sock", libs: []string{"/usr/local/nvidia/lib64"}},
		"GKE's device plugin socket and its host folder": {sockets: []string{dp + "/nvidiaGPU-1718000000.sock"}, files: map[string]string{"/home/kubernetes/bin/nvidia/bin/nvidia-smi": ""},
			want: layout.RuntimeDevicePlugin, evidence: "mounts exists: /home/kubernetes/bin/nvidia", libs: []string{"/usr/local/nvidia/lib64"}},
		"GKE's device plugin process": {files: onGKE(gkePlugin("2741", "/usr/bin/nvidia-gpu-device-plugin", "-logtostderr", "--enable-container-gpu-metrics", "--enable-health-monitoring")),
			want: layout.RuntimeDevicePlugin, evidence: "process 2741, /usr/bin/nvidia-gpu-device-plugin): its Allocate answer mounts host /home/kubernetes/bin/nvidia at /usr/local/nvidia", libs: []string{"/usr/local/nvidia/lib64"}},
		"GKE's device plugin process with its folders set": {files: onGKE(gkePlugin("99", "/usr/bin/nvidia-gpu-device-plugin", "-v", "3", "--enable-health-monitoring", "-host-path=/var/lib/nvidia", "--container-path", "/usr/local/nvidia/lib64")),
			want: layout.RuntimeDevicePlugin, evidence: "mounts host /var/lib/nvidia at /usr/local/nvidia/lib64", libs: []string{"/usr/local/nvidia/lib64/lib64"}},
		// The flag's folder as the host gives it; the probe checks it
		// against the configuration before it publishes it.
		"GKE's device plugin process with another container path": {sockets: []string{dp + "/nvidiaGPU-1718000000.sock"}, files: onGKE(gkePlugin("99", "/usr/bin/nvidia-gpu-device-plugin", "--container-path=/opt/nvidia")),
			want: layout.RuntimeDevicePlugin, libs: []string{"/opt/nvidia/lib64"}},
		// Any pod's processes show in the host's /proc: one posing as the
		// plugin where GKE's installer wrote no driver folder is ignored.
		"a process posing as GKE's device plugin": {files: gkePlugin("4242", "/usr/bin/nvidia-gpu-device-plugin", "--container-path=/opt/nvidia"), want: ""},
		// On a node with GKE's driver folder (a GKE node running another
		// device plugin), any pod could run a program of the plugin's name:
		// only one with the kubelet's device plugin folder mounted counts.
		"a pod's process posing as GKE's device plugin": {files: onGKE(merge(gkeProcess("4242", "/usr/bin/nvidia-gpu-device-plugin", "--container-path=/opt/nvidia"),
			map[string]string{"/proc/4242/mountinfo": podMounts})),
			want: "", note: "process 4242 runs /usr/bin/nvidia-gpu-device-plugin without the kubelet's /var/lib/kubelet/device-plugins mounted"},
		"a process with a folder of the same name on its own filesystem": {files: onGKE(merge(gkeProcess("4242", "/usr/bin/nvidia-gpu-device-plugin"),
			map[string]string{"/proc/4242/mountinfo": podMounts + "1500 1300 0:99 /var/lib/kubelet/device-plugins /device-plugin rw - tmpfs tmpfs rw\n"})),
			want: ""},
		"a process with the node's pod folder mounted": {files: onGKE(merge(gkeProcess("4242", "/usr/bin/nvidia-gpu-device-plugin"),
			map[string]string{"/proc/4242/mountinfo": podMounts + "1500 1300 8:1 /var/lib/kubelet /device-plugin rw - ext4 /dev/sda1 rw\n"})),
			want: ""},
		"the host's mounts unreadable": {files: merge(gkePlugin("2741", "/usr/bin/nvidia-gpu-device-plugin"), map[string]string{"/home/kubernetes/bin/nvidia/bin/nvidia-smi": ""}),
			want: "", note: "the host's mounts are unreadable"},
		"a mount point with an escaped space": {files: onGKE(merge(gkeProcess("7", "/usr/bin/nvidia-gpu-device-plugin"),
			map[string]string{"/proc/7/mountinfo": "1210 1200 8:1 /var/lib/kubelet/device-plugins /device\\040plugin rw - ext4 /dev/sda1 rw\n"})),
			want: layout.RuntimeDevicePlugin, libs: []string{"/usr/local/nvidia/lib64"}},
		"two processes of the plugin that disagree": {files: onGKE(merge(gkePlugin("7", "/usr/bin/nvidia-gpu-device-plugin"), gkePlugin("8", "/usr/bin/nvidia-gpu-device-plugin", "--container-path=/opt/nvidia"))),
			want: layout.RuntimeDevicePlugin, libs: []string{"/usr/local/nvidia/lib64"}},
		"the toolkit wins over GKE's device plugin": {sockets: []string{dp + "/nvidiaGPU-1718000000.sock"}, files: map[string]string{"/etc/containerd/config.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n"},
			want: layout.RuntimeToolkit},
		"GKE's device plugin wins over a CDI spec": {sockets: []string{dp + "/nvidiaGPU-1718000000.sock"}, files: map[string]string{"/etc/cdi/nvidia.yaml": "kind: nvidia.com/gpu\ndevices:\n- name: all\n"},
			want: layout.RuntimeDevicePlugin, libs: []string{"/usr/local/nvidia/lib64"}},
		"NVIDIA's device plugin mounts no driver": {sockets: []string{dp + "/kubelet.sock", dp + "/nvidia-gpu.sock", dp + "/nvidia-mig-1g.10gb.sock", dp + "/nvidia-gpu.shared.sock"},
			files: gkeProcess("311", "/usr/bin/nvidia-device-plugin", "--pass-device-specs"), want: ""},
		"our own device plugin":                       {sockets: []string{dp + "/kubelet.sock", dp + "/fake-nvidia-com-gpu.sock"}, want: ""},
		"a regular file named as GKE's socket":        {files: map[string]string{dp + "/nvidiaGPU-1718000000.sock": ""}, want: ""},
		"a socket named nearly as GKE's":              {sockets: []string{dp + "/nvidiaGPU-latest.sock", dp + "/nvidiaGPU-1718000000.sock.bak", dp + "/xnvidiaGPU-1.sock"}, want: ""},
		"a link named as GKE's socket":                {sockets: []string{"/run/plugin.sock"}, links: map[string]string{dp + "/nvidiaGPU-1718000000.sock": "/run/plugin.sock"}, want: ""},
		"GKE's driver folder alone":                   {files: map[string]string{"/home/kubernetes/bin/nvidia/bin/nvidia-smi": ""}, want: ""},
		"the plugin's short name, another program":    {files: gkeProcess("12", "/opt/bin/nvidia-gpu-device-plugin-wrapper"), want: ""},
		"the plugin's name as an argument only":       {files: gkeProcess("12", "/bin/sh", "/usr/bin/nvidia-gpu-device-plugin"), want: ""},
		"device plugin folder linked out of the root": {links: map[string]string{"/var/lib/kubelet": "../../../outside/kubelet"}, want: ""},
		"a process linked out of the root":            {links: map[string]string{"/proc/2741": "../../outside/proc/2741"}, want: ""},
		"containerd imports a drop-in":                {files: map[string]string{"/etc/containerd/config.toml": "version = 2\nimports = [\"/etc/containerd/extra/*.toml\"]\n", "/etc/containerd/extra/nvidia.toml": "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n"}, want: layout.RuntimeToolkit},
	} {
		t.Run(name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			// Beside the root, where a link followed on this machine
			// would land: GKE's socket and process.
			mknodSocket(t, filepath.Dir(root), "/outside/kubelet/device-plugins/nvidiaGPU-1718000000.sock")
			for p, data := range gkeProcess("2741", "/usr/bin/nvidia-gpu-device-plugin") {
				write(t, filepath.Join(filepath.Dir(root), "outside"), p, data)
			}
			write(t, filepath.Dir(root), "/outside.toml", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\n")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			for p, data := range tc.files {
				write(t, root, p, data)
			}
			for _, p := range tc.sockets {
				mknodSocket(t, root, p)
			}
			for p, target := range tc.links {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
			r := DetectRuntimeInjection(root)
			if r.Kind != tc.want {
				t.Errorf("kind %q, want %q (evidence %v, notes %v)", r.Kind, tc.want, r.Evidence, r.Notes)
			}
			if r.Kind == layout.RuntimeDevicePlugin && tc.libs == nil {
				t.Fatal("a device-plugin case without its library paths")
			}
			if !slices.Equal(r.LibraryPaths, tc.libs) {
				t.Errorf("library paths %q, want %q", r.LibraryPaths, tc.libs)
			}
			if tc.evidence != "" && !strings.Contains(strings.Join(r.Evidence, "\n"), tc.evidence) {
				t.Errorf("evidence %v lacks %q", r.Evidence, tc.evidence)
			}
			if tc.note != "" && !strings.Contains(strings.Join(r.Notes, "\n"), tc.note) {
				t.Errorf("notes %v lack %q", r.Notes, tc.note)
			}
		})
	}
}

// TestProbeDevicePluginLibraryPaths: the folder GKE's device plugin mounts the
// libraries at comes from its command line on the host; one outside the
// configuration's container paths is left out with a note, and the node stays
// ready as a device-plugin node whose pods get no LD_LIBRARY_PATH.
func TestProbeDevicePluginLibraryPaths(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want []string
		note string
	}{
		"the default":               {want: []string{"/usr/local/nvidia/lib64"}},
		"another container path":    {args: []string{"--container-path", "/opt/nvidia"}, want: []string{}, note: `library path "/opt/nvidia/lib64" of the device-plugin injection left out`},
		"a relative container path": {args: []string{"--container-path=../../usr"}, want: []string{}, note: `"../../usr/lib64"`},
		"the container root":        {args: []string{"--container-path=/"}, want: []string{}, note: `"/lib64"`},
	} {
		t.Run(name, func(t *testing.T) {
			root, l := buildRoot(t, "gke-cos-device-plugin")
			write(t, root, "/proc/2741/cmdline", strings.Join(append([]string{"/usr/bin/nvidia-gpu-device-plugin", "-logtostderr"}, tc.args...), "\x00")+"\x00")
			res := probeRoot(t, root, noNVML)
			if !res.Ready() || res.Plan.RuntimeInjection != layout.RuntimeDevicePlugin || res.Plan.DriverVersion != l.DriverVersion {
				t.Fatalf("got %s %+v", res.Reason(), res.Plan)
			}
			// An empty list, not null, as in every plan the probe publishes.
			if !slices.Equal(res.Plan.LibraryPaths, tc.want) || res.Plan.LibraryPaths == nil {
				t.Errorf("library paths %#v, want %#v", res.Plan.LibraryPaths, tc.want)
			}
			if tc.note != "" && !strings.Contains(strings.Join(res.Notes, "\n"), tc.note) {
				t.Errorf("notes %q lack %q", res.Notes, tc.note)
			}
		})
	}
}

// TestProbeIgnoreRuntimeInjection: with detection off, a runtime-injected
// node gets mounts like any other.
func TestProbeIgnoreRuntimeInjection(t *testing.T) {
	root, l := buildRoot(t, "amazonlinux2-eks-gpu")
	res, err := Probe(ProbeOptions{HostRoot: root, OpenNVML: noNVML, IgnoreRuntimeInjection: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Ready() || res.Plan.RuntimeInjection != "" || len(res.Plan.Mounts) == 0 || res.Plan.DriverVersion != l.DriverVersion {
		t.Fatalf("got %s %+v", res.Reason(), res.Plan)
	}
}

// TestProbeNoDriverNeedsNoDevice: a node with an NVIDIA GPU on its PCI bus
// but no driver is an error to fix, not a CPU node.
func TestProbeNoDriverNeedsNoDevice(t *testing.T) {
	for name, tc := range map[string]struct {
		vendor, class string
		want          Condition
	}{
		"NVIDIA 3D controller": {"0x10de", "0x030200", ConditionDriverFilesNotFound},
		"NVIDIA VGA":           {"0x10de\n", "0x030000\n", ConditionDriverFilesNotFound},
		"NVIDIA NVSwitch":      {"0x10de", "0x068000", ConditionNoDriver},
		"another vendor's GPU": {"0x1002", "0x030000", ConditionNoDriver},
	} {
		t.Run(name, func(t *testing.T) {
			root, _ := buildRoot(t, "no-driver")
			write(t, root, "/sys/bus/pci/devices/0000:41:00.0/vendor", tc.vendor)
			write(t, root, "/sys/bus/pci/devices/0000:41:00.0/class", tc.class)
			res := probeRoot(t, root, noNVML)
			if res.Condition != tc.want {
				t.Errorf("condition %s (%s), want %s", res.Condition, res.Message, tc.want)
			}
			if tc.want == ConditionDriverFilesNotFound && !strings.Contains(res.Message, "0000:41:00.0") {
				t.Errorf("message %q does not name the GPU", res.Message)
			}
		})
	}
	root, _ := buildRoot(t, "no-driver")
	write(t, root, "/proc/driver/nvidia/version", "")
	if res := probeRoot(t, root, noNVML); res.Condition == ConditionNoDriver {
		t.Errorf("/proc/driver/nvidia exists but the node is %s", res.Condition)
	}
}

// dp is the kubelet's device plugin folder.
const dp = "/var/lib/kubelet/device-plugins"

// gkeProcess is a host process in /proc: its short name as the kernel cuts
// it, and its command line.
// onGKE adds to files what GKE's driver installer writes on the host, and
// the host's mount table.
func onGKE(files map[string]string) map[string]string {
	return merge(files, map[string]string{"/home/kubernetes/bin/nvidia/bin/nvidia-smi": "", "/proc/1/mountinfo": fakeroot.COSInitMounts})
}

// gkePlugin is GKE's device plugin's process: gkeProcess with the kubelet's
// device plugin folder mounted at /device-plugin, as its DaemonSet has it.
func gkePlugin(pid string, args ...string) map[string]string {
	return merge(gkeProcess(pid, args...), map[string]string{"/proc/" + pid + "/mountinfo": podMounts +
		"1210 1200 8:1 /var/lib/kubelet/device-plugins /device-plugin rw,nosuid,nodev,relatime - ext4 /dev/sda1 rw\n"})
}

// podMounts are a pod's container's mounts: its image, an emptyDir and the
// files the kubelet writes for it, all of the node's filesystem.
const podMounts = "1200 1100 0:123 / / rw,relatime - overlay overlay rw\n" +
	"1201 1200 8:1 /var/lib/kubelet/pods/0c6b/volumes/kubernetes.io~empty-dir/cache /cache rw,nosuid,nodev - ext4 /dev/sda1 rw\n" +
	"1202 1200 8:1 /var/lib/kubelet/pods/0c6b/etc-hosts /etc/hosts rw,nosuid,nodev - ext4 /dev/sda1 rw\n"

func merge(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

func gkeProcess(pid string, args ...string) map[string]string {
	comm := path.Base(args[0])
	if len(comm) > 15 {
		comm = comm[:15]
	}
	return map[string]string{
		"/proc/" + pid + "/comm":    comm + "\n",
		"/proc/" + pid + "/cmdline": strings.Join(args, "\x00") + "\x00",
	}
}

// mknodSocket makes a socket's inode, as a listening server leaves it.
func mknodSocket(t *testing.T, root, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(root, p), syscall.S_IFSOCK|0o755, 0); err != nil {
		t.Fatal(err)
	}
}

// TestGoFlag: the plugin's flags read from its command line as Go's flag
// package reads them.
func TestGoFlag(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
		ok   bool
	}{
		"unset":                     {args: []string{"-logtostderr"}},
		"one dash, equals":          {args: []string{"-host-path=/a"}, want: "/a", ok: true},
		"two dashes, next argument": {args: []string{"--logtostderr", "--host-path", "/a"}, want: "/a", ok: true},
		"the last wins":             {args: []string{"-host-path=/a", "-host-path", "/b"}, want: "/b", ok: true},
		"another flag's value":      {args: []string{"-gpu-config", "-host-path=/a"}},
		"after a non-flag":          {args: []string{"x", "-host-path=/a"}},
		"after --":                  {args: []string{"--", "-host-path=/a"}},
		"no value":                  {args: []string{"-host-path"}},
		"a bool flag then it":       {args: []string{"--enable-health-monitoring", "-host-path=/a"}, want: "/a", ok: true},
	} {
		t.Run(name, func(t *testing.T) {
			if got, ok := goFlag(tc.args, "host-path"); got != tc.want || ok != tc.ok {
				t.Errorf("goFlag(%q) = %q, %v; want %q, %v", tc.args, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func write(t *testing.T, root, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestProbeTalosWithoutCDISpec: before the extension's service has written
// its CDI spec, Talos' driver is found in /usr/local (no /etc/ld.so.cache).
func TestProbeTalosWithoutCDISpec(t *testing.T) {
	root, l := buildRoot(t, "talos-nvidia-extension")
	if err := os.Remove(filepath.Join(root, "run/cdi/nvidia.yaml")); err != nil {
		t.Fatal(err)
	}
	res := probeRoot(t, root, noNVML)
	if !res.Ready() || res.Plan.RuntimeInjection != "" || res.Plan.DriverVersion != l.DriverVersion {
		t.Fatalf("got %s %+v", res.Reason(), res.Plan)
	}
	for _, m := range res.Plan.Mounts {
		if !strings.HasPrefix(m.HostPath, "/usr/local/lib/") && !strings.HasPrefix(m.HostPath, "/usr/local/bin/") {
			t.Errorf("mount of %s", m.HostPath)
		}
	}
}

// bottlerocket is Bottlerocket's containerd configuration and shimpei, with
// hooks as its nvidia-oci hooks file.
func bottlerocket(hooks string) map[string]string {
	return map[string]string{
		"/etc/containerd/config.toml":        fakeroot.BottlerocketContainerdConfig,
		"/usr/bin/shimpei":                   "",
		"/etc/shimpei/nvidia-oci-hooks.json": hooks,
	}
}

func without(m map[string]string, key string) map[string]string {
	delete(m, key)
	return m
}
