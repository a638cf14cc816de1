package standin

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Layout names a classic way of installing the NVIDIA driver on a node.
type Layout string

const (
	// UbuntuNvidia is the Ubuntu nvidia-<major> packaging of the 384 era:
	// libraries and bin/ in /usr/lib/nvidia-<major>, and libcuda also loose
	// in /usr/lib/x86_64-linux-gnu (the libcuda1-<major> package).
	UbuntuNvidia Layout = "ubuntu-nvidia-384"
	// CentOS7 is NVIDIA's CentOS 7 packaging: libraries in /usr/lib64/nvidia,
	// libcuda also loose in /usr/lib64, nvidia-smi in /usr/bin.
	CentOS7 Layout = "centos7"
	// GKE is the Container-Optimized OS installer's /home/kubernetes/bin/nvidia.
	GKE Layout = "gke"
	// UsrLocalNvidia is /usr/local/nvidia/{lib64,bin}, with loose copies of the
	// libraries in /usr/lib, as on the project's reference GPU machine.
	UsrLocalNvidia Layout = "usr-local-nvidia"
	// Distro is a distribution package: everything loose in shared folders.
	Distro Layout = "distro"
)

// Layouts returns every layout Install knows, sorted.
func Layouts() []Layout {
	all := make([]Layout, 0, len(layoutSpecs))
	for l := range layoutSpecs {
		all = append(all, l)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return all
}

// What the stand-in reports through NVML, for tests that assert on it.
const (
	Notice            = "STAND-IN driver, not a real GPU"
	ProductName       = "Stand-in GPU (not real)"
	DeviceCount       = 2
	MemoryMiB         = 16384
	ComputeCapability = "8.0"
)

// UUID is the UUID the stand-in's NVML reports for GPU i (libnvidia-ml.c):
// what NVIDIA's device plugin puts in NVIDIA_VISIBLE_DEVICES.
func UUID(i int) string { return fmt.Sprintf("GPU-5354414e-442d-494e-0000-%012d", i) }

// Library and binary names of the stand-in driver.
const (
	LibCUDA    = "libcuda"
	LibNVML    = "libnvidia-ml"
	LibPTXJIT  = "libnvidia-ptxjitcompiler"
	NvidiaSMI  = "nvidia-smi"
	sonameTail = ".so.1"
)

var libraries = []string{LibCUDA, LibNVML, LibPTXJIT}

// EntryKind says what an Entry is on disk.
type EntryKind string

const (
	// KindLibrary is a versioned shared object, libX.so.<version>.
	KindLibrary EntryKind = "library"
	// KindSONAMELink is libX.so.1, a relative symlink to libX.so.<version>.
	KindSONAMELink EntryKind = "soname-link"
	// KindBinary is an executable.
	KindBinary EntryKind = "binary"
)

// Entry is one path that Install creates, relative to the root given to it
// but written as an absolute path, as the node would see it.
type Entry struct {
	Path string
	Kind EntryKind
	// Component is the library or binary name: LibCUDA, LibNVML, LibPTXJIT or NvidiaSMI.
	Component string
	// Target is the symlink target of a KindSONAMELink, relative to its folder.
	Target string
}

// layoutSpec places the driver. Folders may hold "{major}".
type layoutSpec struct {
	// libDirs get every library with its SONAME link; the first is where a
	// loader configured by ldConf finds them.
	libDirs []string
	// cudaOnlyDirs get only libcuda and its link, as extra packages install it.
	cudaOnlyDirs []string
	binDir       string
	// ldConf lists folders for /etc/ld.so.conf.d, as the real packaging
	// registers them with ldconfig; empty where the layout relies on the
	// loader's default folders or on LD_LIBRARY_PATH.
	ldConf []string
}

var layoutSpecs = map[Layout]layoutSpec{
	UbuntuNvidia: {
		libDirs:      []string{"/usr/lib/nvidia-{major}"},
		cudaOnlyDirs: []string{"/usr/lib/x86_64-linux-gnu"},
		binDir:       "/usr/lib/nvidia-{major}/bin",
		ldConf:       []string{"/usr/lib/nvidia-{major}"},
	},
	CentOS7: {
		libDirs:      []string{"/usr/lib64/nvidia"},
		cudaOnlyDirs: []string{"/usr/lib64"},
		binDir:       "/usr/bin",
		// CentOS's own ldconfig scans /usr/lib64 by default; Debian's does not,
		// so the folder is named to get the cache CentOS would have.
		ldConf: []string{"/usr/lib64/nvidia", "/usr/lib64"},
	},
	GKE: {
		libDirs: []string{"/home/kubernetes/bin/nvidia/lib64"},
		binDir:  "/home/kubernetes/bin/nvidia/bin",
	},
	UsrLocalNvidia: {
		libDirs: []string{"/usr/local/nvidia/lib64", "/usr/lib"},
		binDir:  "/usr/local/nvidia/bin",
	},
	Distro: {
		libDirs: []string{"/usr/lib/x86_64-linux-gnu"},
		binDir:  "/usr/bin",
		ldConf:  []string{"/usr/lib/x86_64-linux-gnu"},
	},
}

// versionRE admits the NVIDIA driver version formats (384.130, 580.159.04)
// and nothing that could escape a file name or a C string literal.
var versionRE = regexp.MustCompile(`^[0-9]{3,4}\.[0-9]{1,3}(\.[0-9]{1,3})?$`)

// cudaByMajor maps the first driver branch of each CUDA release to that
// release, as NVIDIA's release notes pair them (CUDA 9.0 came with 384).
var cudaByMajor = []struct{ major, cuda int }{
	{367, 8000}, {384, 9000}, {390, 9010}, {396, 9020}, {410, 10000}, {418, 10010},
	{440, 10020}, {450, 11000}, {455, 11010}, {460, 11020}, {465, 11030}, {470, 11040},
	{495, 11050}, {510, 11060}, {515, 11070}, {520, 11080}, {525, 12000}, {530, 12010},
	{535, 12020}, {545, 12030}, {550, 12040}, {555, 12050}, {560, 12060}, {565, 12070},
	{570, 12080}, {575, 12090}, {580, 13000},
}

func checkVersion(version string) (major int, err error) {
	if !versionRE.MatchString(version) {
		return 0, fmt.Errorf("invalid driver version %q: want digits like 384.130 or 580.159.04", version)
	}
	major, err = strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	if err != nil {
		return 0, fmt.Errorf("invalid driver version %q: %w", version, err)
	}
	return major, nil
}

// CUDADriverVersion is what the stand-in of a driver version reports as its
// CUDA driver version (cuDriverGetVersion, nvmlSystemGetCudaDriverVersion):
// major*1000 + minor*10, e.g. 9000 for 384.130 and 13000 for 580.159.04.
func CUDADriverVersion(version string) (int, error) {
	major, err := checkVersion(version)
	if err != nil {
		return 0, err
	}
	cuda := 0
	for _, c := range cudaByMajor {
		if major >= c.major {
			cuda = c.cuda
		}
	}
	if cuda == 0 {
		return 0, fmt.Errorf("invalid driver version %q: older than %d, which no CUDA release the stand-in knows supports", version, cudaByMajor[0].major)
	}
	return cuda, nil
}

func (s layoutSpec) expand(dir string, major int) string {
	return strings.ReplaceAll(dir, "{major}", strconv.Itoa(major))
}

func lookup(layout Layout, version string) (layoutSpec, int, error) {
	spec, ok := layoutSpecs[layout]
	if !ok {
		return layoutSpec{}, 0, fmt.Errorf("unknown layout %q, want one of %v", layout, Layouts())
	}
	major, err := checkVersion(version)
	if err != nil {
		return layoutSpec{}, 0, err
	}
	return spec, major, nil
}

// Files lists every driver file Install creates for a layout and version, in
// creation order: what a probe should find and a webhook should inject.
func Files(layout Layout, version string) ([]Entry, error) {
	spec, major, err := lookup(layout, version)
	if err != nil {
		return nil, err
	}
	var out []Entry
	addLib := func(dir, lib string) {
		real := lib + ".so." + version
		out = append(out,
			Entry{Path: path.Join(dir, real), Kind: KindLibrary, Component: lib},
			Entry{Path: path.Join(dir, lib+sonameTail), Kind: KindSONAMELink, Component: lib, Target: real})
	}
	for _, d := range spec.libDirs {
		for _, lib := range libraries {
			addLib(spec.expand(d, major), lib)
		}
	}
	for _, d := range spec.cudaOnlyDirs {
		addLib(spec.expand(d, major), LibCUDA)
	}
	out = append(out, Entry{Path: path.Join(spec.expand(spec.binDir, major), NvidiaSMI), Kind: KindBinary, Component: NvidiaSMI})
	return out, nil
}

// NVMLPath is the libnvidia-ml.so.1 of the layout's own driver folder, as an
// absolute path on the node; join it to the install root to load it.
func NVMLPath(layout Layout, version string) (string, error) {
	spec, major, err := lookup(layout, version)
	if err != nil {
		return "", err
	}
	return path.Join(spec.expand(spec.libDirs[0], major), LibNVML+sonameTail), nil
}

// ldConfFile is ours alone, so installing over a real root never overwrites
// a file that some package owns.
func ldConfFile(layout Layout) string {
	return "/etc/ld.so.conf.d/gpu-injector-standin-" + string(layout) + ".conf"
}
