package nodeprobe

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/gpu-injector/gpu-injector/nodeprobe/ldcache"
)

// Bounds of the host files the probe reads whole: they come from the node.
const (
	// maxLDCacheBytes bounds /etc/ld.so.cache: a distribution's is 10 to
	// 200 KiB, one of a host with every library of a big desktop under 1 MiB;
	// parsing costs up to 5 times the file (ldcache.Parse).
	maxLDCacheBytes = 4 << 20
	// maxSysfsBytes bounds a one-line /sys or /proc file (a PCI vendor, the
	// kernel module's version).
	maxSysfsBytes = 4 << 10
)

// DriverLibraries are the base names of the driver's compute and utility
// libraries: what CUDA, OpenCL and NVML programs load (the set NVIDIA's
// container toolkit mounts for the compute and utility capabilities). Graphics
// and video libraries are left out on purpose.
var DriverLibraries = []string{
	"libcuda", "libcudadebugger",
	"libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq",
	"libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libnvidia-gpucomp",
	"libnvidia-opencl", "libnvidia-allocator", "libnvidia-compiler",
	"libnvidia-fatbinaryloader", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
	"libnvidia-sandboxutils",
}

// RequiredLibraries must be found for a layout to be usable.
var RequiredLibraries = []string{"libcuda", "libnvidia-ml"}

// DriverBinaries are the driver's utility and compute programs.
var DriverBinaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

// Known folders, in order of preference, a fallback behind the evidence (see
// Discover). A '*' matches one path element. The NVIDIA GPU operator's driver
// container publishes its root at /run/nvidia/driver; its folders come last,
// as the host's own driver wins.
var (
	libraryFolders = []string{
		"/usr/local/nvidia/lib64", "/home/kubernetes/bin/nvidia/lib64",
		"/usr/lib/nvidia-*", "/usr/lib/nvidia", "/usr/lib64/nvidia",
		"/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/lib/aarch64-linux-gnu/nvidia/current",
		"/usr/lib/nvidia/tesla", "/opt/nvidia/current/lib64", "/run/opengl-driver/lib",
		"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
		"/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/lib",
		"/usr/local/lib64", "/usr/local/lib",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib/aarch64-linux-gnu",
		"/run/nvidia/driver/usr/lib64",
	}
	binaryFolders = []string{
		"/usr/local/nvidia/bin", "/home/kubernetes/bin/nvidia/bin",
		"/usr/lib/nvidia-*/bin", "/usr/lib/nvidia/bin", "/usr/lib64/nvidia/bin",
		"/usr/libexec/nvidia/tesla/bin", "/opt/nvidia/current/bin",
		"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/opt/bin", "/usr/local/bin",
		"/run/current-system/sw/bin",
		"/run/nvidia/driver/usr/bin",
	}
)

// versionRE is a driver version as it ends a library file name: 580.159.04,
// 384.130. A SONAME suffix (.1, .4) is not a version.
var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// Library is one driver library file.
type Library struct {
	// Name is the versioned file name, libcuda.so.580.159.04.
	Name    string `json:"name"`
	Base    string `json:"base"`
	Version string `json:"version"`
	// Path is the host path of the real file, links resolved.
	Path string `json:"path"`
	// SONAMEs are the other names programs load it by (libcuda.so.1).
	SONAMEs []string `json:"sonames,omitempty"`
}

// Binary is one driver program.
type Binary struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Files is everything driver-like found under a host root, of every version.
type Files struct {
	Libraries []Library `json:"libraries"`
	Binaries  []Binary  `json:"binaries"`
	// Cache is the host's ld.so.cache, nil when it is missing or unreadable.
	Cache *ldcache.Cache `json:"-"`
	// Skipped are names that looked like driver files but were not used, with why.
	Skipped []string `json:"skipped,omitempty"`
	// Evidence says which folders the host itself points at, and how: the
	// loader cache's entries and the links behind them.
	Evidence []string `json:"evidence,omitempty"`

	h hostFS
	// machine is the host's ELF machine, from its loader cache; 0 when unknown.
	machine  elf.Machine
	libDirs  []string
	seenLib  map[string]bool
	evidence map[string]bool
}

// Versions returns the driver versions the libraries carry, sorted.
func (f *Files) Versions() []string {
	set := map[string]bool{}
	for _, l := range f.Libraries {
		set[l.Version] = true
	}
	var out []string
	for v := range set {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// parseLibraryName splits libcuda.so.580.159.04 into libcuda and 580.159.04;
// ok is false for anything that is not a versioned driver library.
func parseLibraryName(name string) (base, version string, ok bool) {
	base, version, found := strings.Cut(name, ".so.")
	if !found || !versionRE.MatchString(version) || !isDriverLibrary(base) {
		return "", "", false
	}
	return base, version, true
}

func isDriverLibrary(base string) bool {
	for _, b := range DriverLibraries {
		if base == b {
			return true
		}
	}
	return false
}

// Discover finds the driver files under a host root. It reads only, follows
// links only inside the root, and fails only when the root itself is unusable.
//
// Where the driver lives is what the host says first: every ld.so.cache entry
// of a driver library for the host's own architecture, and every folder on
// the chain of links behind it (alternatives, "current" links, a Nix profile)
// are listed before the known folders, which stay a fallback for hosts whose
// driver is not in the loader's cache (GKE, the GPU operator).
func Discover(root string) (*Files, error) {
	h := hostFS{root: root}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("failed to read host root %q: %w", root, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("failed to read host root %q: not a folder", root)
	}
	f := &Files{h: h, seenLib: map[string]bool{}, evidence: map[string]bool{}}
	if data, err := h.readFile("/etc/ld.so.cache", maxLDCacheBytes); err == nil {
		c, err := ldcache.Parse(data)
		if err != nil {
			f.Skipped = append(f.Skipped, fmt.Sprintf("/etc/ld.so.cache: %v", err))
		} else {
			f.Cache = c
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		f.Skipped = append(f.Skipped, fmt.Sprintf("/etc/ld.so.cache: %v", err))
	}

	var dirs []string
	if f.Cache != nil {
		arch := hostArch(f.Cache)
		switch arch {
		case ldcache.FlagX8664Lib64:
			f.machine = elf.EM_X86_64
		case ldcache.FlagAArch64Lib64:
			f.machine = elf.EM_AARCH64
		}
		for _, e := range f.Cache.Entries {
			base, _, _ := strings.Cut(e.Key, ".so")
			if !isDriverLibrary(base) || !path.IsAbs(e.Value) {
				continue
			}
			if e.Flags&ldcache.FlagTypeMask != ldcache.FlagELFLibc6 || e.Flags&ldcache.FlagRequiredMask != arch {
				// 32-bit compatibility copies (/usr/lib/i386-linux-gnu) and
				// foreign architectures are not what the node's programs load.
				continue
			}
			chain := h.linkChain(e.Value)
			f.Evidence = append(f.Evidence, "ld.so.cache: "+e.Key+" => "+strings.Join(chain, " -> "))
			for _, p := range chain {
				// Only folders that hold a driver library by name: not
				// /etc/alternatives, whose names are the alternatives'.
				if b, _, _ := strings.Cut(path.Base(p), ".so"); isDriverLibrary(b) {
					dirs = appendNew(dirs, path.Dir(p))
				}
			}
		}
	}
	for _, d := range h.expandFolders(dirs) {
		f.evidence[d] = true
	}
	for _, d := range appendNew(h.expandFolders(dirs), h.expandFolders(libraryFolders)...) {
		f.scanFolder(d)
	}
	seenBin := map[string]bool{}
	for _, d := range h.expandFolders(binaryFolders) {
		f.scanBinaries(h, d, seenBin)
	}
	return f, nil
}

// AddEvidence scans one more host folder that the host points at, such as
// the folder of the libnvidia-ml that NVML was loaded from.
func (f *Files) AddEvidence(dir, why string) {
	for _, d := range f.h.expandFolders([]string{dir}) {
		f.Evidence = append(f.Evidence, why+": "+d)
		f.evidence[d] = true
		f.scanFolder(d)
	}
}

func (f *Files) scanFolder(d string) {
	for _, x := range f.libDirs {
		if x == d {
			return
		}
	}
	f.libDirs = append(f.libDirs, d)
	f.scanLibraries(f.h, d, f.seenLib)
}

// hostArch is the architecture field of the cache entries the host's own
// programs use: that of libc.so.6 among 64-bit entries.
func hostArch(c *ldcache.Cache) int32 {
	for _, e := range c.Lookup("libc.so.6") {
		if a := e.Flags & ldcache.FlagRequiredMask; a == ldcache.FlagX8664Lib64 || a == ldcache.FlagAArch64Lib64 {
			return a
		}
	}
	for _, e := range c.Entries {
		if a := e.Flags & ldcache.FlagRequiredMask; a == ldcache.FlagX8664Lib64 || a == ldcache.FlagAArch64Lib64 {
			return a
		}
	}
	return 0
}

// expandFolders resolves patterns and links into real host folders, without
// duplicates, in the given order.
func (h hostFS) expandFolders(patterns []string) []string {
	var out []string
	for _, p := range patterns {
		// A pattern may sit in any element (/usr/lib/nvidia-*/bin), so expand
		// element by element.
		candidates := []string{"/"}
		for _, el := range strings.Split(strings.Trim(p, "/"), "/") {
			var next []string
			for _, c := range candidates {
				if !strings.ContainsAny(el, "*?[") {
					next = append(next, path.Join(c, el))
					continue
				}
				des, err := h.readDir(c)
				if err != nil {
					continue
				}
				for _, de := range des {
					if ok, _ := path.Match(el, de.Name()); ok {
						next = append(next, path.Join(c, de.Name()))
					}
				}
			}
			candidates = next
		}
		for _, c := range candidates {
			real, fi, err := h.stat(c)
			if err != nil || !fi.IsDir() {
				continue
			}
			out = appendNew(out, real)
		}
	}
	return out
}

func appendNew(list []string, items ...string) []string {
	for _, it := range items {
		found := false
		for _, l := range list {
			if l == it {
				found = true
				break
			}
		}
		if !found {
			list = append(list, it)
		}
	}
	return list
}

func (f *Files) scanLibraries(h hostFS, dir string, seen map[string]bool) {
	des, err := h.readDir(dir)
	if err != nil {
		f.Skipped = append(f.Skipped, err.Error())
		return
	}
	// aliases are the names in this folder that lead to each real file.
	aliases := map[string][]string{}
	type found struct {
		lib  Library
		name string
	}
	var libs []found
	for _, de := range des {
		name := de.Name()
		base, _, isLib := strings.Cut(name, ".so")
		if !isLib || !isDriverLibrary(base) {
			continue
		}
		p := path.Join(dir, name)
		real, fi, err := h.stat(p)
		if err != nil {
			if _, _, ok := parseLibraryName(name); ok {
				f.Skipped = append(f.Skipped, fmt.Sprintf("%s: %v", p, err))
			}
			continue
		}
		aliases[real] = append(aliases[real], name)
		b, v, ok := parseLibraryName(name)
		if !ok {
			continue
		}
		// The real file must carry the same versioned name: a link from a
		// driver name to anything else (/etc/passwd, libc) is not the driver.
		if rb, rv, rok := parseLibraryName(path.Base(real)); !rok || rb != b || rv != v {
			f.Skipped = append(f.Skipped, fmt.Sprintf("%s: resolves to %s, which is not %s", p, real, name))
			continue
		}
		if !fi.Mode().IsRegular() {
			f.Skipped = append(f.Skipped, fmt.Sprintf("%s: not a regular file", p))
			continue
		}
		if seen[real] {
			continue
		}
		seen[real] = true
		libs = append(libs, found{Library{Name: path.Base(real), Base: b, Version: v, Path: real}, name})
	}
	for _, fl := range libs {
		l := fl.lib
		so, class, machine := h.readELF(l.Path)
		if class == elf.ELFCLASS32 || (machine != 0 && f.machine != 0 && machine != f.machine) {
			// A 32-bit compatibility copy (SUSE and RHEL keep them in
			// /usr/lib) or another architecture's: not what the node's
			// programs load, whatever its name says.
			f.Skipped = append(f.Skipped, fmt.Sprintf("%s: ELF %s %s, not this host's", l.Path, class, machine))
			continue
		}
		if so != "" {
			if so != l.Name {
				l.SONAMEs = []string{so}
			}
		} else {
			// Not an ELF file we can read: trust the SONAME-style links beside it.
			for _, a := range aliases[l.Path] {
				if rest, ok := strings.CutPrefix(a, l.Base+".so."); ok && !strings.Contains(rest, ".") {
					l.SONAMEs = append(l.SONAMEs, a)
				}
			}
			sort.Strings(l.SONAMEs)
		}
		f.Libraries = append(f.Libraries, l)
	}
}

func (f *Files) scanBinaries(h hostFS, dir string, seen map[string]bool) {
	for _, name := range DriverBinaries {
		p := path.Join(dir, name)
		real, fi, err := h.stat(p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				f.Skipped = append(f.Skipped, fmt.Sprintf("%s: %v", p, err))
			}
			continue
		}
		if path.Base(real) != name || !fi.Mode().IsRegular() {
			f.Skipped = append(f.Skipped, fmt.Sprintf("%s: resolves to %s, which is not a regular file named %s", p, real, name))
			continue
		}
		if seen[real] {
			continue
		}
		seen[real] = true
		f.Binaries = append(f.Binaries, Binary{Name: name, Path: real})
	}
}

// readELF returns the DT_SONAME, class and machine of an ELF file; "" and
// zeros when it is not ELF.
func (h hostFS) readELF(p string) (string, elf.Class, elf.Machine) {
	// Read in pieces (headers, the dynamic section), never whole: no limit.
	f, err := h.openFile(p, noLimit)
	if err != nil {
		return "", 0, 0
	}
	defer f.Close()
	e, err := elf.NewFile(f)
	if err != nil {
		return "", 0, 0
	}
	names, err := e.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return "", e.Class, e.Machine
	}
	return names[0], e.Class, e.Machine
}

// cacheTarget returns the library the host's loader would load for soname,
// preferring entries for this machine's word size, as glibc does.
func (f *Files) cacheTarget(h hostFS, soname string) (Library, bool) {
	if f.Cache == nil {
		return Library{}, false
	}
	for _, e := range f.Cache.Lookup(soname) {
		if e.Flags&ldcache.FlagTypeMask != ldcache.FlagELFLibc6 {
			continue
		}
		real, err := h.resolve(e.Value)
		if err != nil {
			continue
		}
		for _, l := range f.Libraries {
			if l.Path == real {
				return l, true
			}
		}
	}
	return Library{}, false
}

// namesDriverLibrary reports whether the loader cache knows any driver
// library name at all, versioned or not (a CUDA toolkit's stubs): a node
// that was meant to have a driver.
func (f *Files) namesDriverLibrary() bool {
	if f.Cache == nil {
		return false
	}
	for _, e := range f.Cache.Entries {
		if b, _, _ := strings.Cut(e.Key, ".so"); isDriverLibrary(b) {
			return true
		}
	}
	return false
}

// nvidiaDevice names evidence of NVIDIA hardware or a driver's kernel side
// that needs no device access: the device nodes, the driver's /proc folder,
// or a PCI device of vendor 0x10de that is a display or 3D controller. ""
// when there is none (or /sys is not visible).
func nvidiaDevice(h hostFS) string {
	for _, p := range []string{"/dev/nvidiactl", "/proc/driver/nvidia"} {
		if _, _, err := h.stat(p); err == nil {
			return p + " exists"
		}
	}
	des, err := h.readDir("/sys/bus/pci/devices")
	if err != nil {
		return ""
	}
	for _, de := range des {
		dev := path.Join("/sys/bus/pci/devices", de.Name())
		vendor, err := h.readFile(dev+"/vendor", maxSysfsBytes)
		if err != nil || strings.TrimSpace(string(vendor)) != "0x10de" {
			continue
		}
		// Class 0x03xxxx: VGA, 3D or display controller; NVSwitches and
		// audio functions of the same vendor are not GPUs.
		if class, err := h.readFile(dev+"/class", maxSysfsBytes); err == nil && strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") {
			return "an NVIDIA GPU at PCI " + de.Name()
		}
	}
	return ""
}
