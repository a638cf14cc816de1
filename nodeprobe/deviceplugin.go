package nodeprobe

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// GKE's NVIDIA device plugin (GoogleCloudPlatform/container-engine-accelerators,
// cmd/nvidia_gpu/nvidia_gpu.go and pkg/gpu/nvidia/beta_plugin.go) answers
// every Allocate with the GPU's device nodes and a read-only mount of its
// --host-path (default /home/kubernetes/bin/nvidia) at its --container-path
// (default /usr/local/nvidia), so the kubelet puts the driver into every
// container that gets an nvidia.com/gpu. Mounts of our own would land on the
// same paths.
const (
	// devicePluginDir is the kubelet's device plugin folder, the hostPath
	// GKE's DaemonSet mounts at /device-plugin.
	devicePluginDir = "/var/lib/kubelet/device-plugins"
	// gkePluginBinary is the name of the plugin's program: its image
	// (Dockerfile) installs /usr/bin/nvidia-gpu-device-plugin, which its
	// DaemonSet runs (cmd/nvidia_gpu/device-plugin.yaml).
	gkePluginBinary = "nvidia-gpu-device-plugin"
	// gkeHostPath and gkeContainerPath are its flags' defaults.
	gkeHostPath      = "/home/kubernetes/bin/nvidia"
	gkeContainerPath = "/usr/local/nvidia"
	// maxCmdlineBytes bounds a process's command line the probe reads.
	maxCmdlineBytes = 64 << 10
)

// gkePluginSocket is the socket it registers with the kubelet:
// fmt.Sprintf("%s-%d.sock", "nvidiaGPU", time.Now().Unix()), unchanged since
// 2017. NVIDIA's k8s-device-plugin listens on nvidia-<resource>.sock
// (nvidia-gpu.sock), which mounts no driver folder and does not match.
var gkePluginSocket = regexp.MustCompile(`^nvidiaGPU-[0-9]+\.sock$`)

// gkeComm is the kernel's name of its process: the binary's name cut to
// 15 bytes (TASK_COMM_LEN).
var gkeComm = gkePluginBinary[:15]

// gkeDevicePlugin reports GKE's device plugin on the node, from either of
// two things the host shows: its socket, and its process. The socket is in a
// folder the kubelet creates with mode 0750 for root, which a probe running
// as a user other than root cannot list; the host's /proc shows every
// process's name and command line to any user, so the process is how such a
// probe sees the plugin (and the folders it mounts).
//
// It also returns the folder the plugin's mount puts the driver's libraries
// in, its --container-path's lib64 (the installer writes lib64 and bin there):
// the plugin sets no LD_LIBRARY_PATH, so an image that does not set it itself
// finds no libcuda.so.1 unless the webhook adds that folder.
func (h hostFS) gkeDevicePlugin(notes *[]string) ([]string, string) {
	var out []string
	if real, err := h.resolve(devicePluginDir); err == nil {
		if des, err := h.readDir(real); err != nil {
			*notes = append(*notes, err.Error())
		} else {
			for _, de := range des {
				// Only a socket: the plugin makes its own with
				// net.Listen, so a link or a file of that name is
				// something else's.
				if de.Type()&fs.ModeSocket != 0 && gkePluginSocket.MatchString(de.Name()) {
					out = append(out, fmt.Sprintf("GKE's device plugin socket %s: its Allocate answer mounts the driver folder into every container that gets a GPU", path.Join(real, de.Name())))
				}
			}
		}
	}
	hostPath, containerPath := "", ""
	procs := h.gkePluginProcesses()
	// Any pod's processes show in the host's /proc, so a process named like
	// the plugin proves nothing by itself: a pod could pose as it and leave
	// the node's GPU pods without their driver mounts. It counts only where
	// GKE's driver installer wrote its folder, which no unprivileged pod can
	// make on the host.
	if len(procs) > 0 {
		if _, fi, err := h.stat(gkeHostPath); err != nil || !fi.IsDir() {
			*notes = append(*notes, fmt.Sprintf("process %s runs %s, but %s (where GKE's driver installer puts the driver) is not a folder on this host: not taken for GKE's device plugin", procs[0].pid, procs[0].binary, gkeHostPath))
			procs = nil
		}
	}
	for i, p := range procs {
		out = append(out, fmt.Sprintf("GKE's device plugin runs (process %s, %s): its Allocate answer mounts host %s at %s", p.pid, p.binary, p.hostPath, p.containerPath))
		if i > 0 && (p.hostPath != hostPath || p.containerPath != containerPath) {
			// Two that disagree: one of them is not the plugin the kubelet
			// uses, and nothing here tells which.
			*notes = append(*notes, "processes of GKE's device plugin disagree on --host-path or --container-path: the defaults are assumed")
			hostPath, containerPath = gkeHostPath, gkeContainerPath
			break
		}
		hostPath, containerPath = p.hostPath, p.containerPath
	}
	if len(out) == 0 {
		return nil, ""
	}
	// Only the socket seen (the process hidden from the probe): the flags'
	// defaults, which GKE's DaemonSet keeps.
	if hostPath == "" {
		hostPath, containerPath = gkeHostPath, gkeContainerPath
	}
	if _, fi, err := h.stat(hostPath); err == nil && fi.IsDir() {
		out = append(out, fmt.Sprintf("the folder GKE's device plugin mounts exists: %s", hostPath))
	}
	return out, path.Join(containerPath, "lib64")
}

type gkePluginProcess struct {
	pid, binary, hostPath, containerPath string
}

// gkePluginProcesses finds GKE's device plugin among the host's processes:
// a short name of its binary's, then a command line that runs it. Other
// processes' command lines are not read.
func (h hostFS) gkePluginProcesses() []gkePluginProcess {
	des, err := h.readDir("/proc")
	if err != nil {
		return nil
	}
	var out []gkePluginProcess
	for _, de := range des {
		pid := de.Name()
		if !de.IsDir() || strings.Trim(pid, "0123456789") != "" {
			continue
		}
		// Processes come and go between the listing and the read: a
		// missing file is no news.
		comm, err := h.readBounded(path.Join("/proc", pid, "comm"), 64)
		if err != nil || strings.TrimSpace(string(comm)) != gkeComm {
			continue
		}
		cmdline, err := h.readBounded(path.Join("/proc", pid, "cmdline"), maxCmdlineBytes)
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		if path.Base(args[0]) != gkePluginBinary {
			continue
		}
		p := gkePluginProcess{pid: pid, binary: args[0], hostPath: gkeHostPath, containerPath: gkeContainerPath}
		if v, ok := goFlag(args[1:], "host-path"); ok {
			p.hostPath = v
		}
		if v, ok := goFlag(args[1:], "container-path"); ok {
			p.containerPath = v
		}
		out = append(out, p)
	}
	return out
}

// gkeBoolFlags are the plugin's flags that take no separate value (its own,
// and glog's): every other flag written without "=" takes the next argument.
var gkeBoolFlags = []string{"enable-container-gpu-metrics", "enable-health-monitoring", "publish-driver-version", "logtostderr", "alsologtostderr"}

// goFlag returns the last value of a string flag as Go's flag package parses
// it: -name=v, --name=v, -name v or --name v, up to the first argument that is
// not a flag or a lone "--".
func goFlag(args []string, name string) (string, bool) {
	value, found := "", false
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			break
		}
		n, v, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if !hasValue && !slices.Contains(gkeBoolFlags, n) {
			if i+1 >= len(args) {
				break
			}
			i++
			v = args[i]
		}
		if n == name {
			value, found = v, true
		}
	}
	return value, found
}

// readBounded reads at most limit bytes of a host file: /proc files have no
// size to check beforehand.
func (h hostFS) readBounded(p string, limit int64) ([]byte, error) {
	real, err := h.resolve(p)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(h.osPath(real))
	if err != nil {
		return nil, fmt.Errorf("failed to open %q: %w", p, bare(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("failed to read %q: %w", p, bare(err))
	}
	return data, nil
}
