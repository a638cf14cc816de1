package nodeprobe

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
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
	// maxMountinfoBytes bounds what the probe reads of a process's mount
	// table: a node's init has a few lines per running container.
	maxMountinfoBytes = 16 << 20
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
// process's name, command line and mounts to any user, so the process is
// how such a probe sees the plugin (and the folders it mounts).
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
	// GKE's driver installer wrote its folder, and only with the kubelet's
	// device plugin folder mounted, where a device plugin must make its
	// socket: a pod gets that mount only through a hostPath volume of the
	// folder, with which it could make the socket too.
	if len(procs) > 0 {
		if _, fi, err := h.stat(gkeHostPath); err != nil || !fi.IsDir() {
			*notes = append(*notes, fmt.Sprintf("process %s runs %s, but %s (where GKE's driver installer puts the driver) is not a folder on this host: not taken for GKE's device plugin", procs[0].pid, procs[0].binary, gkeHostPath))
			procs = nil
		}
	}
	if len(procs) > 0 {
		procs = h.holdingDevicePluginDir(procs, notes)
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
		comm, err := h.readFile(path.Join("/proc", pid, "comm"), 64)
		if err != nil || strings.TrimSpace(string(comm)) != gkeComm {
			continue
		}
		cmdline, err := h.readFile(path.Join("/proc", pid, "cmdline"), maxCmdlineBytes)
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

// holdingDevicePluginDir keeps the processes that have the host's kubelet
// device plugin folder mounted: a mount of the filesystem that holds it,
// rooted at the folder, as the host's init sees the folder. The kernel
// writes both mount tables (/proc/<pid>/mountinfo, readable by any user),
// so no process can claim a mount it does not have.
func (h hostFS) holdingDevicePluginDir(procs []gkePluginProcess, notes *[]string) []gkePluginProcess {
	want, err := h.mountOf("/proc/1/mountinfo", devicePluginDir)
	if err != nil {
		*notes = append(*notes, fmt.Sprintf("the host's mounts are unreadable (%v): no process is taken for GKE's device plugin", err))
		return nil
	}
	var out []gkePluginProcess
	for _, p := range procs {
		held := false
		err := h.eachMount(path.Join("/proc", p.pid, "mountinfo"), func(m mountEntry) bool {
			held = m.device == want.device && m.root == want.root
			return !held
		})
		if err != nil || !held {
			*notes = append(*notes, fmt.Sprintf("process %s runs %s without the kubelet's %s mounted: not taken for GKE's device plugin", p.pid, p.binary, devicePluginDir))
			continue
		}
		out = append(out, p)
	}
	return out
}

// mountEntry is a line of a mountinfo file (proc_pid_mountinfo(5)): the
// filesystem's device, the folder of that filesystem the mount shows, and
// where.
type mountEntry struct {
	device, root, mountPoint string
}

// mountOf returns the filesystem and folder of it that the mount table in
// file shows at p: the last mount of the longest mount point that holds p,
// as the kernel's lookup of p finds it, rooted at p.
func (h hostFS) mountOf(file, p string) (mountEntry, error) {
	var found mountEntry
	ok := false
	err := h.eachMount(file, func(m mountEntry) bool {
		var rel string
		switch {
		case m.mountPoint == p:
		case m.mountPoint == "/":
			rel = p
		case strings.HasPrefix(p, m.mountPoint+"/"):
			rel = p[len(m.mountPoint):]
		default:
			return true
		}
		if !ok || len(m.mountPoint) >= len(found.mountPoint) {
			found, ok = mountEntry{device: m.device, root: path.Join(m.root, rel), mountPoint: m.mountPoint}, true
		}
		return true
	})
	if err == nil && !ok {
		err = fmt.Errorf("no mount holds %s", p)
	}
	return found, err
}

// eachMount calls fn with each line of a mountinfo file until it returns
// false. Parsed here, not by moby/sys/mountinfo: it fails the whole table on
// one malformed line and caps a line at 64 KiB, where any line that is no
// mount is skipped and an overlay's line may be longer.
func (h hostFS) eachMount(file string, fn func(mountEntry) bool) error {
	f, err := h.openFile(file, noLimit)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxMountinfoBytes))
	// An overlay's line lists every layer of its image.
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// ID, parent ID, major:minor, root, mount point, options, ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if !fn(mountEntry{device: fields[2], root: unescapeMountField(fields[3]), mountPoint: unescapeMountField(fields[4])}) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("failed to read %q: %w", file, bare(err))
	}
	return nil
}

// unescapeMountField undoes the kernel's octal escapes of space, tab,
// newline and backslash in a mountinfo path (\040, \011, \012, \134).
func unescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && '0' <= s[i+1] && s[i+1] <= '3' && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
