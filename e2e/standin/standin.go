// Package standin builds and installs a stand-in NVIDIA driver: real ELF
// libraries and a stub nvidia-smi, compiled with gcc, that report a chosen
// driver version and say in every answer that they are not a GPU driver. The
// end-to-end tests install it into a node's root in one of the classic layouts,
// so the probe, the webhook and the kubelet handle the same files they would on
// a GPU node. docs/standin-driver.md describes what it exports.
package standin

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

//go:embed csrc/*.c csrc/*.h
var sources embed.FS

// Cache builds each driver version once and installs it as often as asked.
// The zero value is not usable: set Dir to a folder the Cache may own, such
// as t.TempDir(). A Cache is safe for concurrent use.
type Cache struct {
	Dir string

	mu    sync.Mutex
	built map[string]string
}

// Install builds the stand-in of a driver version in a temporary folder and
// installs it under root in the given layout; see Cache.Install.
func Install(root string, layout Layout, version string) error {
	dir, err := os.MkdirTemp("", "gpu-injector-standin-")
	if err != nil {
		return fmt.Errorf("failed to create a build folder: %w", err)
	}
	defer os.RemoveAll(dir)
	c := &Cache{Dir: dir}
	return c.Install(root, layout, version)
}

// Build compiles the stand-in of a driver version, once per Cache, and returns
// the folder that holds libcuda.so.<version>, libnvidia-ml.so.<version>,
// libnvidia-ptxjitcompiler.so.<version> and nvidia-smi.
func (c *Cache) Build(version string) (string, error) {
	cuda, err := CUDADriverVersion(version)
	if err != nil {
		return "", err
	}
	if c.Dir == "" {
		return "", errors.New("failed to build the stand-in driver: Cache.Dir is empty")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if dir, ok := c.built[version]; ok {
		return dir, nil
	}
	dir := filepath.Join(c.Dir, version)
	if err := build(dir, version, cuda); err != nil {
		return "", err
	}
	if c.built == nil {
		c.built = map[string]string{}
	}
	c.built[version] = dir
	return dir, nil
}

func build(dir, version string, cuda int) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("failed to clear build folder %q: %w", dir, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return fmt.Errorf("failed to create build folder %q: %w", src, err)
	}
	names, err := fs.Glob(sources, "csrc/*")
	if err != nil {
		return fmt.Errorf("failed to list the stand-in sources: %w", err)
	}
	for _, n := range names {
		b, err := sources.ReadFile(n)
		if err != nil {
			return fmt.Errorf("failed to read embedded source %q: %w", n, err)
		}
		if err := os.WriteFile(filepath.Join(src, path.Base(n)), b, 0o644); err != nil {
			return fmt.Errorf("failed to write source %q: %w", n, err)
		}
	}
	defs := []string{
		"-DSTANDIN_DRIVER_VERSION=\"" + version + "\"",
		"-DSTANDIN_CUDA_DRIVER_VERSION=" + strconv.Itoa(cuda),
	}
	common := append([]string{"-std=gnu11", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"}, defs...)
	for _, lib := range libraries {
		args := append(append([]string(nil), common...),
			"-fPIC", "-shared",
			"-Wl,-soname,"+lib+sonameTail,
			// go-nvml binds each function at its first call and keeps that
			// binding; a library unmapped by dlclose would leave the Go
			// process calling into freed memory on its next Init.
			"-Wl,-z,nodelete",
			"-Wl,-z,defs",
			"-o", filepath.Join(dir, lib+".so."+version),
			filepath.Join(src, lib+".c"),
			// The real libraries link these besides libc (NEEDED): an
			// image without them must fail here as it fails on a GPU.
			"-Wl,--no-as-needed", "-l:libpthread.so.0", "-l:libdl.so.2", "-lm", "-l:librt.so.1", "-Wl,--as-needed")
		if err := gcc(args...); err != nil {
			return err
		}
	}
	// Linked against the versioned file, recorded as NEEDED libnvidia-ml.so.1
	// through its SONAME, with no rpath: it needs the injected library path.
	args := append(append([]string(nil), common...),
		"-o", filepath.Join(dir, NvidiaSMI),
		filepath.Join(src, NvidiaSMI+".c"),
		filepath.Join(dir, LibNVML+".so."+version))
	return gcc(args...)
}

// compiler honours CC like make does, so a cross or hardened toolchain can be used.
func compiler() string {
	if cc := os.Getenv("CC"); cc != "" {
		return cc
	}
	return "gcc"
}

func gcc(args ...string) error {
	cmd := exec.Command(compiler(), args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("failed to compile the stand-in driver (%s %s): %w\n%s", compiler(), strings.Join(args, " "), err, out.String())
	}
	return nil
}

// Install writes the stand-in driver of a version under root (a folder the
// caller owns, standing for a node's /) in the given layout: the files of
// Files, a /etc/ld.so.conf.d entry where the real packaging registers one,
// and, when running as root, a fresh /etc/ld.so.cache made by `ldconfig -r`
// (it needs chroot). Installing another version of the same layout over it
// repoints the SONAME links; call Remove for the old version to complete an
// upgrade. Every file is replaced by rename, so a reader never sees half a file.
func (c *Cache) Install(root string, layout Layout, version string) error {
	entries, err := Files(layout, version)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(root) {
		return fmt.Errorf("failed to install the stand-in driver: root %q is not an absolute path", root)
	}
	dir, err := c.Build(version)
	if err != nil {
		return err
	}
	for _, e := range entries {
		dst := filepath.Join(root, filepath.FromSlash(e.Path))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("failed to create folder of %q: %w", dst, err)
		}
		switch e.Kind {
		case KindLibrary:
			err = copyFile(filepath.Join(dir, path.Base(e.Path)), dst, 0o644)
		case KindBinary:
			err = copyFile(filepath.Join(dir, NvidiaSMI), dst, 0o755)
		case KindSONAMELink:
			err = replaceSymlink(e.Target, dst)
		}
		if err != nil {
			return err
		}
	}
	if err := writeLDConf(root, layout, version); err != nil {
		return err
	}
	return refreshLDCache(root)
}

// Remove deletes the files Install created for a version, except SONAME
// links that now point to another version, then the folders this left empty.
func Remove(root string, layout Layout, version string) error {
	return RemoveReplaced(root, layout, version, "")
}

// RemoveReplaced is Remove of the version an upgrade to next replaced: the
// files next installed at the same paths (nvidia-smi, whose name carries no
// version) are next's, and stay, as a package upgrade leaves them.
func RemoveReplaced(root string, layout Layout, version, next string) error {
	entries, err := Files(layout, version)
	if err != nil {
		return err
	}
	kept := map[string]bool{}
	if next != "" {
		nextEntries, err := Files(layout, next)
		if err != nil {
			return err
		}
		for _, e := range nextEntries {
			kept[e.Path] = e.Kind != KindSONAMELink
		}
	}
	var dirs []string
	for _, e := range entries {
		if kept[e.Path] {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(e.Path))
		if e.Kind == KindSONAMELink {
			target, err := os.Readlink(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("failed to read link %q: %w", p, err)
			}
			if target != e.Target {
				continue
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("failed to remove %q: %w", p, err)
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	// Deepest first, so nvidia-<major>/bin goes before nvidia-<major>.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		// A folder that still holds files is not ours to remove.
		_ = os.Remove(d)
	}
	conf := filepath.Join(root, ldConfFile(layout))
	if b, err := os.ReadFile(conf); err == nil && string(b) == ldConfContent(layout, version) {
		if err := os.Remove(conf); err != nil {
			return fmt.Errorf("failed to remove %q: %w", conf, err)
		}
	}
	return refreshLDCache(root)
}

func ldConfContent(layout Layout, version string) string {
	spec, major, err := lookup(layout, version)
	if err != nil || len(spec.ldConf) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("# gpu-injector stand-in driver (" + Notice + ")\n")
	for _, d := range spec.ldConf {
		b.WriteString(spec.expand(d, major) + "\n")
	}
	return b.String()
}

func writeLDConf(root string, layout Layout, version string) error {
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(filepath.Join(etc, "ld.so.conf.d"), 0o755); err != nil {
		return fmt.Errorf("failed to create %q: %w", etc, err)
	}
	// Only created when missing: a real root's own file is never touched.
	main := filepath.Join(etc, "ld.so.conf")
	if _, err := os.Stat(main); errors.Is(err, fs.ErrNotExist) {
		if err := writeFile(main, []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
			return err
		}
	}
	content := ldConfContent(layout, version)
	if content == "" {
		return nil
	}
	return writeFile(filepath.Join(root, ldConfFile(layout)), []byte(content), 0o644)
}

// refreshLDCache rebuilds root's /etc/ld.so.cache the way the driver's
// package scripts do, so a probe reading the cache sees the layout. ldconfig
// -r chroots, which needs root; without it the root is left with no cache,
// and a probe must find the driver by its folders alone.
func refreshLDCache(root string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	// -X: the links are Install's to make; ldconfig only writes the cache.
	out, err := exec.Command(ldconfig, "-X", "-r", root).CombinedOutput()
	if err != nil {
		return fmt.Errorf("failed to run ldconfig -r %q: %w\n%s", root, err, out)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("failed to read %q: %w", src, err)
	}
	return writeFile(dst, b, mode)
}

func writeFile(dst string, b []byte, mode os.FileMode) error {
	tmp := dst + ".standin-tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("failed to write %q: %w", tmp, err)
	}
	// WriteFile's mode is masked by the umask; the driver's modes are not.
	if err := os.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("failed to set mode of %q: %w", tmp, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("failed to move %q into place: %w", dst, err)
	}
	return nil
}

func replaceSymlink(target, dst string) error {
	tmp := dst + ".standin-tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("failed to remove stale %q: %w", tmp, err)
	}
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("failed to create link %q: %w", tmp, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("failed to move link %q into place: %w", dst, err)
	}
	return nil
}

// Fault is a fault switch of the stand-in NVML: a file in the folder of its
// libnvidia-ml that changes its answers while it exists. A file, not an
// environment variable, because the process that loads the library (a probe
// in a pod, with the node's root mounted) does not share the test's
// environment, but sees the node's files.
type Fault string

const (
	// FaultHang makes every NVML call but nvmlErrorString block while the
	// file exists, as a call into a wedged kernel module never returns
	// (polled every 100 ms); removing it lets the calls go on and answer.
	FaultHang Fault = "gpu-injector-standin-hang"
	// FaultGPULost makes nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByUUID
	// and every call on a device answer NVML_ERROR_GPU_IS_LOST (15), as for a
	// GPU fallen off the bus.
	FaultGPULost Fault = "gpu-injector-standin-gpu-lost"
)

// SetFault turns a fault of the stand-in installed under root on (creates
// the switch file beside its libnvidia-ml) or off (removes it).
func SetFault(root string, layout Layout, version string, f Fault, on bool) error {
	if f != FaultHang && f != FaultGPULost {
		return fmt.Errorf("failed to set fault %q: not a stand-in fault", f)
	}
	lib, err := NVMLPath(layout, version)
	if err != nil {
		return err
	}
	p := filepath.Join(root, path.Dir(lib), string(f))
	if !on {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("failed to turn fault %s off: %w", f, err)
		}
		return nil
	}
	if err := os.WriteFile(p, []byte("gpu-injector stand-in fault switch ("+Notice+"): remove this file to end the fault\n"), 0o644); err != nil {
		return fmt.Errorf("failed to turn fault %s on: %w", f, err)
	}
	return nil
}
