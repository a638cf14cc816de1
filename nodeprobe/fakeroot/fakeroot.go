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

	"github.com/gpu-injector/gpu-injector/nodeprobe/ldcache"
)

// Driver versions of the layouts.
const (
	Version384    = "384.130"
	Version390    = "390.48"
	Version460    = "460.32.03"
	Version535    = "535.104.05"
	Version550    = "550.54.15"
	Version580    = "580.159.04"
	ld64          = ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64
	x8664LibDir   = "/usr/lib/x86_64-linux-gnu"
	localNvidia   = "/usr/local/nvidia"
	kubernetesCOS = "/home/kubernetes/bin/nvidia"
	gpuOperator   = "/run/nvidia/driver"
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
	nodes  []node
}

type nodeKind int

const (
	kindLib nodeKind = iota
	kindLink
	kindFile
	kindDir
)

type node struct {
	path   string
	kind   nodeKind
	soname string // kindLib
	target string // kindLink
	data   string // kindFile
	mode   os.FileMode
}

func lib(p, soname string) node  { return node{path: p, kind: kindLib, soname: soname, mode: 0o755} }
func link(p, target string) node { return node{path: p, kind: kindLink, target: target} }
func file(p, data string) node   { return node{path: p, kind: kindFile, data: data, mode: 0o644} }
func executable(p string) node {
	return node{path: p, kind: kindFile, data: "#!/bin/sh\necho " + path.Base(p) + "\n", mode: 0o755}
}
func dir(p string) node        { return node{path: p, kind: kindDir, mode: 0o755} }
func binaries(d string) []node { return binariesNamed(d, driverBinaries...) }
func binariesNamed(d string, names ...string) []node {
	var out []node
	for _, n := range names {
		out = append(out, executable(path.Join(d, n)))
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
				binaries("/usr/lib/nvidia-384/bin"),
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
				binaries("/usr/bin"),
			),
		},
		{
			Name:          "gke-cos",
			Description:   "GKE Container-Optimized OS: everything in /home/kubernetes/bin/nvidia/{lib64,bin}, not in the loader's cache",
			DriverVersion: Version535,
			LDConf:        []string{"/lib64", "/usr/lib64"},
			nodes: concat(
				system("/usr/lib64", "/usr/bin"),
				computeLibs(kubernetesCOS+"/lib64", Version535, 535),
				graphicsLibs(kubernetesCOS+"/lib64", Version535),
				binaries(kubernetesCOS+"/bin"),
				[]node{executable(kubernetesCOS + "/bin/nvidia-installer")},
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
				binaries("/usr/bin"),
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
				binaries("/usr/lib/nvidia-384/bin"),
				computeLibs("/usr/lib/nvidia-390", Version390, 390),
				binaries("/usr/lib/nvidia-390/bin"),
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
				binaries("/usr/bin"),
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
				binaries(gpuOperator+"/usr/bin"),
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

func usrLocalNvidia() []node {
	return concat(
		[]node{link("/lib", "usr/lib")},
		system(x8664LibDir, "/usr/bin"),
		computeLibs(localNvidia+"/lib64", Version580, 580),
		graphicsLibs(localNvidia+"/lib64", Version580),
		// Not a driver file, but the folder is the driver's own: mounted whole anyway.
		[]node{lib(localNvidia+"/lib64/libOpenCL.so.1.0.0", "libOpenCL.so.1"), file(localNvidia+"/lib64/README.txt", "driver\n")},
		binaries(localNvidia+"/bin"),
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
			err = os.WriteFile(p, SharedObject(n.soname), n.mode)
		case kindFile:
			err = os.WriteFile(p, []byte(n.data), n.mode)
		case kindDir:
			err = os.MkdirAll(p, n.mode)
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
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		return fmt.Errorf("failed to create /etc: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.conf"), []byte(strings.Join(l.LDConf, "\n")+"\n"), 0o644); err != nil {
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
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.cache"), data, 0o644); err != nil {
		return fmt.Errorf("failed to write ld.so.cache: %w", err)
	}
	return nil
}

// cacheEntries does what ldconfig does for the layout: every regular ELF file
// with a SONAME in a configured folder is indexed as <folder>/<soname>, one
// entry per SONAME and folder, folders in configured order.
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
			if !de.Type().IsRegular() || !strings.HasPrefix(de.Name(), "lib") || !strings.Contains(de.Name(), ".so") {
				continue
			}
			soname, err := readSONAME(filepath.Join(root, d, de.Name()))
			if err != nil || soname == "" {
				continue
			}
			// The real folder of a linked folder (/lib -> usr/lib) is indexed once.
			real, err := filepath.EvalSymlinks(filepath.Join(root, d))
			if err != nil {
				return nil, fmt.Errorf("failed to resolve %q: %w", d, err)
			}
			if seen[real+"/"+soname] {
				continue
			}
			seen[real+"/"+soname] = true
			entries = append(entries, ldcache.Entry{Key: soname, Value: path.Join(d, soname), Flags: ld64})
		}
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key })
	return entries, nil
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
