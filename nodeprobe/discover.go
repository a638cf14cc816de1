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

// Known folders, in order of preference. A '*' matches one path element.
// The NVIDIA GPU operator's driver container publishes its root at
// /run/nvidia/driver; its folders come last, as the host's own driver wins.
var (
	libraryFolders = []string{
		"/usr/local/nvidia/lib64", "/home/kubernetes/bin/nvidia/lib64",
		"/usr/lib/nvidia-*", "/usr/lib/nvidia", "/usr/lib64/nvidia",
		"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
		"/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/lib",
		"/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib64",
	}
	binaryFolders = []string{
		"/usr/local/nvidia/bin", "/home/kubernetes/bin/nvidia/bin",
		"/usr/lib/nvidia-*/bin", "/usr/lib/nvidia/bin", "/usr/lib64/nvidia/bin",
		"/usr/bin", "/bin",
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
func Discover(root string) (*Files, error) {
	h := hostFS{root: root}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("failed to read host root %q: %w", root, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("failed to read host root %q: not a folder", root)
	}
	f := &Files{}
	if data, err := h.readFile("/etc/ld.so.cache"); err == nil {
		c, err := ldcache.Parse(data)
		if err != nil {
			f.Skipped = append(f.Skipped, fmt.Sprintf("/etc/ld.so.cache: %v", err))
		} else {
			f.Cache = c
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		f.Skipped = append(f.Skipped, fmt.Sprintf("/etc/ld.so.cache: %v", err))
	}

	libDirs := h.expandFolders(libraryFolders)
	if f.Cache != nil {
		// Folders from ld.so.conf that no list knows, such as /opt/nvidia/lib.
		var extra []string
		for _, e := range f.Cache.Entries {
			if base, _, _ := strings.Cut(e.Key, ".so"); isDriverLibrary(base) && path.IsAbs(e.Value) {
				extra = append(extra, path.Dir(e.Value))
			}
		}
		libDirs = appendNew(libDirs, h.expandFolders(extra)...)
	}
	seenLib := map[string]bool{}
	for _, d := range libDirs {
		f.scanLibraries(h, d, seenLib)
	}
	seenBin := map[string]bool{}
	for _, d := range h.expandFolders(binaryFolders) {
		f.scanBinaries(h, d, seenBin)
	}
	return f, nil
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
		if so := readSONAME(h.osPath(l.Path)); so != "" {
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

// readSONAME returns the DT_SONAME of an ELF file, or "" when it has none or
// is not ELF.
func readSONAME(file string) string {
	e, err := elf.Open(file)
	if err != nil {
		return ""
	}
	defer e.Close()
	names, err := e.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return ""
	}
	return names[0]
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
