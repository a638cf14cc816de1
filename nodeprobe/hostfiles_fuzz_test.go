package nodeprobe

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe/hostroot"
)

// The probe reads a host it does not control: links anyone with root on the
// node may have set, the kernel module's version files, and any file named
// like a driver library. These targets fuzz those readers; each host file is
// written for real, as the readers take paths, not bytes.

// FuzzResolve resolves a fuzzed path through four links with fuzzed targets
// (dangling, looping, absolute, climbing with '..'). The answer must be a
// clean host path of something that exists and is no link, inside the root,
// resolve must be idempotent on it, and where the links cannot leave the
// root (no absolute target, no '..') it must agree with the OS's own
// filepath.EvalSymlinks.
func FuzzResolve(f *testing.F) {
	root := f.TempDir()
	for _, d := range []string{"usr/lib/nvidia", "d/e", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for _, p := range []string{"usr/lib/nvidia/libcuda.so.580.1", "etc/passwd", "d/e/f"} {
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			f.Fatal(err)
		}
	}
	links := []string{"l0", "usr/l1", "usr/lib/nvidia/libcuda.so.1", "d/e/l3"}
	h := hostFS{root: root}

	f.Add("/usr/lib/nvidia/libcuda.so.1", "usr/lib", "../..", "libcuda.so.580.1", "../../..")
	f.Add("/l0/nvidia/libcuda.so.1", "usr/lib", "/etc", "./libcuda.so.580.1", "f")
	f.Add("/d/e/l3/../e/f", "l0", "l1", "/l0", "/d/e/l3")
	f.Add("/usr/l1/passwd", "/", "../../../../../etc", "/proc/self/root", ".")
	f.Add("/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/l0/d", ".", "", "//", "e/../../l0")

	f.Fuzz(func(t *testing.T, p, t0, t1, t2, t3 string) {
		for i, target := range []string{t0, t1, t2, t3} {
			l := filepath.Join(root, links[i])
			if err := os.Remove(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if target == "" || len(target) > 1024 || strings.ContainsRune(target, 0) {
				continue // the kernel refuses such a link
			}
			if err := os.Symlink(target, l); err != nil {
				t.Fatal(err)
			}
		}
		if len(p) > 4096 || strings.ContainsRune(p, 0) {
			return
		}

		got, err := h.resolve(p)
		if !path.IsAbs(p) && err == nil {
			t.Fatalf("resolve(%q) = %q for a relative path", p, got)
		}
		if err != nil {
			if errors.Is(err, hostroot.ErrTooManyLinks) {
				return
			}
			if len(p) < 256 && !escapes(p, t0, t1, t2, t3) {
				if real, rerr := filepath.EvalSymlinks(h.osPath(p)); rerr == nil && path.IsAbs(p) {
					t.Fatalf("resolve(%q) failed (%v), the OS resolves it to %q", p, err, real)
				}
			}
			return
		}
		if !path.IsAbs(got) || path.Clean(got) != got {
			t.Fatalf("resolve(%q) = %q: not a clean absolute path", p, got)
		}
		osp := h.osPath(got)
		if osp != root && !strings.HasPrefix(osp, root+string(filepath.Separator)) {
			t.Fatalf("resolve(%q) = %q, outside the root", p, got)
		}
		fi, err := os.Lstat(osp)
		if err != nil || fi.Mode()&fs.ModeSymlink != 0 {
			t.Fatalf("resolve(%q) = %q, which is a link or missing (%v)", p, got, err)
		}
		if again, err := h.resolve(got); err != nil || again != got {
			t.Fatalf("resolve(%q) = %q, but resolve(%q) = %q, %v", p, got, got, again, err)
		}
		// The chain of links the probe reports as evidence ends where the
		// links lead (its '..' are lexical, hence only without them).
		if chain := h.linkChain(p); p == path.Clean(p) && !escapes(p, t0, t1, t2, t3) && len(chain) < hostroot.MaxSymlinks {
			for _, c := range chain {
				if !path.IsAbs(c) || path.Clean(c) != c {
					t.Fatalf("linkChain(%q) = %q: %q is not a clean absolute path", p, chain, c)
				}
			}
			if last := chain[len(chain)-1]; last != got {
				t.Fatalf("linkChain(%q) = %q ends elsewhere than resolve: %q", p, chain, got)
			}
		}
		if !escapes(p, t0, t1, t2, t3) {
			real, rerr := filepath.EvalSymlinks(h.osPath(p))
			if rerr != nil {
				// The OS refuses a trailing '/' after a file (ENOTDIR); the
				// resolver lets it pass, which reads the same file.
				if !errors.Is(rerr, syscall.ENOTDIR) {
					t.Fatalf("resolve(%q) = %q, the OS fails: %v", p, got, rerr)
				}
				return
			}
			if real != osp {
				t.Fatalf("resolve(%q) = %q, the OS resolves it to %q", p, got, real)
			}
		}
	})
}

// escapes: a '..' or an absolute link target could leave the root, where the
// OS and a resolver confined to the root rightly differ.
func escapes(p string, targets ...string) bool {
	for _, s := range append(targets, p) {
		if strings.Contains(s, "..") {
			return true
		}
	}
	for _, s := range targets {
		if strings.HasPrefix(s, "/") {
			return true
		}
	}
	return false
}

// FuzzKernelModuleVersion writes fuzzed /sys/module/nvidia/version and
// /proc/driver/nvidia/version files: the version read must be empty or a
// driver version (digits and dots) that one of the files states.
func FuzzKernelModuleVersion(f *testing.F) {
	root := f.TempDir()
	sys := filepath.Join(root, "sys/module/nvidia/version")
	proc := filepath.Join(root, "proc/driver/nvidia/version")
	for _, p := range []string{sys, proc} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	h := hostFS{root: root}
	f.Add("580.159.04\n", true, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Apr 29 12:34:56 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", true)
	f.Add("", false, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:19:20 UTC 2024\n", true)
	f.Add("garbage 1.2", true, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.130  Wed Mar 21 03:37:26 PDT 2018\nGCC version:  gcc version 5.4.0 20160609 (Ubuntu 5.4.0-6ubuntu1~16.04.9)", true)
	f.Add("", false, "", false)
	f.Fuzz(func(t *testing.T, sysData string, hasSys bool, procData string, hasProc bool) {
		for _, x := range []struct {
			path, data string
			exists     bool
		}{{sys, sysData, hasSys}, {proc, procData, hasProc}} {
			if !x.exists {
				if err := os.Remove(x.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(x.path, []byte(x.data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		v := kernelModuleVersion(h)
		if v == "" {
			return
		}
		if !versionRE.MatchString(v) {
			t.Fatalf("version %q is no driver version", v)
		}
		fromSys := hasSys && strings.TrimSpace(sysData) == v
		fromProc := hasProc && strings.Contains(" "+strings.Join(strings.Fields(procData), " ")+" ", " "+v+" ")
		if !fromSys && !fromProc {
			t.Fatalf("version %q is in neither file", v)
		}
		if hasSys && len(sysData) <= maxSysfsBytes && versionRE.MatchString(strings.TrimSpace(sysData)) && !fromSys {
			t.Fatalf("version %q, but /sys says %q and wins", v, sysData)
		}
	})
}

// FuzzReadELF reads arbitrary bytes named like a driver library: a hostile
// or truncated file must give "" or a name, never a panic or a hang; and
// the SONAME, class and machine of a well-formed shared object read back
// exactly.
func FuzzReadELF(f *testing.F) {
	h := hostFS{root: f.TempDir()}
	file := filepath.Join(h.root, "libcuda.so.580.1")
	f.Add(fakeroot.SharedObject("libcuda.so.1"), "libnvidia-ml.so.1")
	f.Add(fakeroot.SharedObject(""), "")
	f.Add([]byte("\x7fELF\x02\x01\x01"), "x")
	f.Fuzz(func(t *testing.T, data []byte, soname string) {
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, _, _ = h.readELF("/libcuda.so.580.1")
		if d := time.Since(start); d > time.Second {
			t.Fatalf("reading %d bytes took %v", len(data), d)
		}
		if soname == "" || strings.ContainsRune(soname, 0) {
			return
		}
		if err := os.WriteFile(file, fakeroot.SharedObject(soname), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, class, machine := h.readELF("/libcuda.so.580.1"); got != soname || class != elf.ELFCLASS64 || machine != elf.EM_X86_64 {
			t.Fatalf("SONAME %q read back as %q, %v, %v", soname, got, class, machine)
		}
	})
}

// FuzzRuntimeConfig writes one fuzzed container runtime configuration
// (containerd, CRI-O, an OCI hook, Docker behind cri-dockerd, a CDI spec)
// into an otherwise bare host: detection must not panic or hang, must name
// evidence for what it reports, report only what that kind of file can say
// (the toolkit, or CDI for a CDI spec), and give the same answer twice.
func FuzzRuntimeConfig(f *testing.F) {
	root := f.TempDir()
	files := []string{"/etc/containerd/config.toml", "/etc/crio/crio.conf", "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json", "/etc/docker/daemon.json", "/etc/cdi/nvidia.yaml"}
	for _, p := range append(files, "/usr/bin/cri-dockerd") {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/cri-dockerd"), nil, 0o755); err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n")
	f.Add(uint8(0), "version = 3\nimports = [\"/etc/containerd/*.toml\"]\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\ndefault_runtime_name = \"nvidia\"\n")
	f.Add(uint8(1), "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\n")
	f.Add(uint8(2), `{"version":"1.0.0","hook":{"path":"/usr/bin/nvidia-container-toolkit","args":["nvidia-container-toolkit","prestart"]},"when":{"always":true},"stages":["prestart"]}`)
	f.Add(uint8(1), "[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\", \"/run/containers/oci/hooks.d\", \"relative\", \"/\"]\n")
	f.Add(uint8(3), `{"default-runtime":"nvidia","runtimes":{"nvidia":{"path":"nvidia-container-runtime"}}}`)
	f.Add(uint8(4), "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n")
	f.Fuzz(func(t *testing.T, which uint8, data string) {
		chosen := int(which) % len(files)
		for i, p := range files {
			if i == chosen {
				if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Remove(filepath.Join(root, p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
		}
		start := time.Now()
		r := DetectRuntimeInjection(root)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("detection took %v", d)
		}
		switch {
		case r.Kind == "" && len(r.Evidence) == 0:
		case r.Kind == layout.RuntimeCDI && chosen == 4 && len(r.Evidence) > 0:
		case r.Kind == layout.RuntimeToolkit && chosen != 4 && len(r.Evidence) > 0:
		default:
			t.Fatalf("%s gave kind %q with evidence %q", files[chosen], r.Kind, r.Evidence)
		}
		if again := DetectRuntimeInjection(root); !reflect.DeepEqual(again, r) {
			t.Fatalf("two answers: %+v and %+v", r, again)
		}
	})
}

// FuzzShimpeiHooks: Bottlerocket's hooks file for its nvidia-oci runtime,
// which the probe reads to tell whether the runtime adds the toolkit's
// hook. Detection must not panic, must report the toolkit only for a file
// that names the toolkit's hook, with evidence, and answer the same twice.
func FuzzShimpeiHooks(f *testing.F) {
	root := f.TempDir()
	for p, data := range map[string]string{
		"/etc/containerd/config.toml": fakeroot.BottlerocketContainerdConfig,
		"/usr/bin/shimpei":            "",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink("shimpei", filepath.Join(root, "usr/bin/nvidia-oci")); err != nil {
		f.Fatal(err)
	}
	hooks := filepath.Join(root, "etc/shimpei/nvidia-oci-hooks.json")
	if err := os.MkdirAll(filepath.Dir(hooks), 0o755); err != nil {
		f.Fatal(err)
	}
	f.Add(fakeroot.BottlerocketNvidiaHooks)
	f.Add(`{"hooks":{"createRuntime":[{"path":"/usr/bin/nvidia-container-toolkit"}],"poststop":[{"path":"/x"}]}}`)
	f.Add(`{"hooks":{"prestart":[{"path":"/usr/bin/other-hook"}]}}`)
	f.Add(`{"hooks":{"prestart":null,"x":[{"path":1}]}}`)
	f.Add(`[`)
	f.Fuzz(func(t *testing.T, data string) {
		if err := os.WriteFile(hooks, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		r := DetectRuntimeInjection(root)
		var decoded any
		_ = json.Unmarshal([]byte(data), &decoded)
		switch {
		case r.Kind == "" && len(r.Evidence) == 0:
		case r.Kind == layout.RuntimeToolkit && len(r.Evidence) == 1 && strings.Contains(fmt.Sprint(decoded), "nvidia-container-"):
		default:
			t.Fatalf("hooks %q gave kind %q with evidence %q", data, r.Kind, r.Evidence)
		}
		if again := DetectRuntimeInjection(root); !reflect.DeepEqual(again, r) {
			t.Fatalf("two answers: %+v and %+v", r, again)
		}
	})
}

// FuzzGKEPluginProcess: a host process's comm, command line and mount
// table, which the probe reads to find GKE's device plugin.
func FuzzGKEPluginProcess(f *testing.F) {
	root := f.TempDir()
	dir := filepath.Join(root, "proc", "2741")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	// Where GKE's driver installer writes: a process counts only there.
	if err := os.MkdirAll(filepath.Join(root, "home/kubernetes/bin/nvidia"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "proc/1"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/1/mountinfo"), []byte(fakeroot.COSInitMounts), 0o644); err != nil {
		f.Fatal(err)
	}
	const held = "1200 1100 0:123 / / rw,relatime - overlay overlay rw\n1210 1200 8:1 /var/lib/kubelet/device-plugins /device-plugin rw,nosuid,nodev,relatime - ext4 /dev/sda1 rw\n"
	f.Add("nvidia-gpu-devi\n", "/usr/bin/nvidia-gpu-device-plugin\x00-logtostderr\x00--enable-health-monitoring\x00", held)
	f.Add("nvidia-gpu-devi\n", "/usr/bin/nvidia-gpu-device-plugin\x00-v\x003\x00-host-path=/var/lib/nvidia\x00--container-path\x00/usr/local/nvidia/lib64\x00", held)
	f.Add("nvidia-gpu-devi", "nvidia-gpu-device-plugin\x00--host-path\x00", "1 0 8:1 /var/lib/kubelet/device\\055plugins /x rw - ext4 /dev/sda1 rw")
	f.Add("nvidia-gpu-devi\n", "/usr/bin/nvidia-gpu-device-plugin\x00", "1200 1100 0:123 / / rw - overlay overlay rw\n1210 1200 0:99 /var/lib/kubelet/device-plugins /device-plugin rw - tmpfs tmpfs rw\n")
	f.Add("nvidia-device-p\n", "/usr/bin/nvidia-device-plugin\x00--pass-device-specs\x00", held)
	f.Add("", "\x00\x00", "")
	escape := regexp.MustCompile(`\\[0-3][0-7]{2}`)
	f.Fuzz(func(t *testing.T, comm, cmdline, mountinfo string) {
		// Lines the kernel writes are short; the scanner's 64 KiB limit on
		// one is not what this target is about.
		mountinfo = mountinfo[:min(len(mountinfo), 4<<10)]
		for name, data := range map[string]string{"comm": comm, "cmdline": cmdline, "mountinfo": mountinfo} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		r := DetectRuntimeInjection(root)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("detection took %v", d)
		}
		// Restated apart from the code: the kernel's short name of the
		// plugin, then a command line that runs a program of its name,
		// each within what the probe reads; and a mount of the filesystem
		// of the host's /var (8:1 in COSInitMounts) rooted at the kubelet's
		// device plugin folder, octal escapes undone.
		args := strings.Split(strings.TrimRight(cmdline, "\x00"), "\x00")
		want := len(comm) <= 64 && len(cmdline) <= maxCmdlineBytes &&
			strings.TrimSpace(comm) == "nvidia-gpu-devi" && path.Base(args[0]) == "nvidia-gpu-device-plugin"
		holds := false
		for _, line := range strings.Split(mountinfo, "\n") {
			fields := strings.Fields(line)
			unescaped := func(s string) string {
				return escape.ReplaceAllStringFunc(s, func(e string) string {
					n, _ := strconv.ParseUint(e[1:], 8, 8)
					return string([]byte{byte(n)})
				})
			}
			if len(fields) >= 5 && fields[2] == "8:1" && unescaped(fields[3]) == "/var/lib/kubelet/device-plugins" {
				holds = true
			}
		}
		want = want && holds
		switch {
		case !want && r.Kind == "" && len(r.Evidence) == 0:
		case want && r.Kind == layout.RuntimeDevicePlugin && len(r.Evidence) > 0 && strings.Contains(r.Evidence[0], "process 2741"):
		default:
			t.Fatalf("comm %q, command line %q, mounts %q gave kind %q with evidence %q", comm, cmdline, mountinfo, r.Kind, r.Evidence)
		}
		for _, flag := range []string{"host-path", "container-path"} {
			if v, ok := goFlag(args[1:], flag); ok && !strings.Contains(cmdline, v) {
				t.Fatalf("--%s %q is not in the command line %q", flag, v, cmdline)
			}
		}
		if again := DetectRuntimeInjection(root); !reflect.DeepEqual(again, r) {
			t.Fatalf("two answers: %+v and %+v", r, again)
		}
	})
}
