package standin

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

// nvmlHelperEnv makes the test binary act as a probe reading one stand-in
// NVML library and printing what it saw. A fresh process per library is
// needed because go-nvml binds C symbols for the life of a process.
const nvmlHelperEnv = "GPU_INJECTOR_STANDIN_NVML_HELPER"

// probeHelperEnv makes the test binary read one stand-in NVML library with
// the node probe's own code and print the probe's result.
const probeHelperEnv = "GPU_INJECTOR_STANDIN_PROBE_HELPER"

// watchHelperEnv makes the test binary read one stand-in NVML library as
// the probe's agent does, through an NVMLWatch with a short limit: it prints
// the first reading, then, once a stuck reading returned, the next one.
const watchHelperEnv = "GPU_INJECTOR_STANDIN_WATCH_HELPER"

func TestMain(m *testing.M) {
	if lib := os.Getenv(nvmlHelperEnv); lib != "" {
		os.Exit(nvmlHelper(lib))
	}
	if lib := os.Getenv(watchHelperEnv); lib != "" {
		os.Exit(watchHelper(lib))
	}
	if lib := os.Getenv(probeHelperEnv); lib != "" {
		if err := json.NewEncoder(os.Stdout).Encode(nodeprobe.ReadNVML(nodeprobe.OpenNVML(lib))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if cacheDir != "" {
		os.RemoveAll(cacheDir)
	}
	os.Exit(code)
}

type nvmlFacts struct {
	DriverVersion     string
	NVMLVersion       string
	CUDADriverVersion int
	Count             int
	Devices           []deviceFacts
	InitAgain         string
}

type deviceFacts struct {
	Name          string
	UUID          string
	MemoryTotal   uint64
	MemoryTotalV2 uint64
	CCMajor       int
	CCMinor       int
	MIGCurrent    int
}

func nvmlHelper(lib string) int {
	facts, err := readNVML(lib)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(facts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func check(what string, ret nvml.Return) error {
	if ret != nvml.SUCCESS {
		return fmt.Errorf("failed to %s: %s", what, nvml.ErrorString(ret))
	}
	return nil
}

// readNVML makes the calls the node probe makes, through the same library.
func readNVML(lib string) (nvmlFacts, error) {
	var f nvmlFacts
	n := nvml.New(nvml.WithLibraryPath(lib))
	if err := check("init NVML", n.Init()); err != nil {
		return f, err
	}
	var ret nvml.Return
	if f.DriverVersion, ret = n.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return f, check("get driver version", ret)
	}
	if f.NVMLVersion, ret = n.SystemGetNVMLVersion(); ret != nvml.SUCCESS {
		return f, check("get NVML version", ret)
	}
	if f.CUDADriverVersion, ret = n.SystemGetCudaDriverVersion_v2(); ret != nvml.SUCCESS {
		return f, check("get CUDA driver version", ret)
	}
	if f.Count, ret = n.DeviceGetCount(); ret != nvml.SUCCESS {
		return f, check("get device count", ret)
	}
	for i := 0; i < f.Count; i++ {
		d, ret := n.DeviceGetHandleByIndex(i)
		if err := check("get device handle", ret); err != nil {
			return f, err
		}
		var df deviceFacts
		if df.Name, ret = d.GetName(); ret != nvml.SUCCESS {
			return f, check("get name", ret)
		}
		if df.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
			return f, check("get UUID", ret)
		}
		mem, ret := d.GetMemoryInfo()
		if err := check("get memory", ret); err != nil {
			return f, err
		}
		df.MemoryTotal = mem.Total
		mem2, ret := d.GetMemoryInfo_v2()
		if err := check("get memory v2", ret); err != nil {
			return f, err
		}
		df.MemoryTotalV2 = mem2.Total
		if df.CCMajor, df.CCMinor, ret = d.GetCudaComputeCapability(); ret != nvml.SUCCESS {
			return f, check("get compute capability", ret)
		}
		if df.MIGCurrent, _, ret = d.GetMigMode(); ret != nvml.SUCCESS {
			return f, check("get MIG mode", ret)
		}
		f.Devices = append(f.Devices, df)
	}
	if err := check("shut NVML down", n.Shutdown()); err != nil {
		return f, err
	}
	// A probe that runs in a loop inits and shuts down again and again.
	if err := check("init NVML again", n.Init()); err != nil {
		return f, err
	}
	if f.InitAgain, ret = n.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return f, check("get driver version after a second init", ret)
	}
	return f, check("shut NVML down", n.Shutdown())
}

var (
	cacheOnce sync.Once
	cache     *Cache
	cacheDir  string
)

// sharedCache builds each version once for the whole test binary.
func sharedCache(t *testing.T) *Cache {
	t.Helper()
	cacheOnce.Do(func() {
		dir, err := os.MkdirTemp("", "standin-test-")
		if err != nil {
			t.Fatalf("failed to create cache folder: %v", err)
		}
		cacheDir = dir
		cache = &Cache{Dir: dir}
	})
	if cache == nil {
		t.Fatal("no build cache")
	}
	return cache
}

// One version per layout, so a library that ignored its build version, or a
// test that loaded the wrong file, shows up as a mismatch.
var layoutVersions = map[Layout]string{
	UbuntuNvidia:   "384.130",
	CentOS7:        "390.116",
	GKE:            "418.67",
	UsrLocalNvidia: "580.159.04",
	Distro:         "535.104.05",
}

func TestLayoutVersionsCoverEveryLayout(t *testing.T) {
	for _, l := range Layouts() {
		if _, ok := layoutVersions[l]; !ok {
			t.Errorf("layout %q has no test version", l)
		}
	}
}

func TestFiles(t *testing.T) {
	tests := map[string]struct {
		layout  Layout
		version string
		want    []string
		notWant []string
	}{
		"ubuntu folder follows the driver major": {
			layout: UbuntuNvidia, version: "390.116",
			want: []string{
				"/usr/lib/nvidia-390/libcuda.so.390.116", "/usr/lib/nvidia-390/libcuda.so.1",
				"/usr/lib/nvidia-390/libnvidia-ml.so.390.116", "/usr/lib/nvidia-390/libnvidia-ml.so.1",
				"/usr/lib/nvidia-390/libnvidia-ptxjitcompiler.so.390.116",
				"/usr/lib/nvidia-390/bin/nvidia-smi",
				"/usr/lib/x86_64-linux-gnu/libcuda.so.390.116", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
			},
			notWant: []string{"/usr/lib/nvidia-384/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"},
		},
		"centos7": {
			layout: CentOS7, version: "384.130",
			want: []string{
				"/usr/lib64/nvidia/libnvidia-ml.so.384.130", "/usr/lib64/nvidia/libcuda.so.1",
				"/usr/lib64/libcuda.so.384.130", "/usr/bin/nvidia-smi",
			},
			notWant: []string{"/usr/lib64/libnvidia-ml.so.1"},
		},
		"gke": {
			layout: GKE, version: "418.67",
			want: []string{"/home/kubernetes/bin/nvidia/lib64/libcuda.so.418.67", "/home/kubernetes/bin/nvidia/bin/nvidia-smi"},
		},
		"usr-local-nvidia with loose copies": {
			layout: UsrLocalNvidia, version: "580.159.04",
			want: []string{
				"/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", "/usr/local/nvidia/bin/nvidia-smi",
				"/usr/lib/libnvidia-ml.so.580.159.04", "/usr/lib/libcuda.so.1",
			},
		},
		"distro": {
			layout: Distro, version: "535.104.05",
			want: []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", "/usr/bin/nvidia-smi"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			entries, err := Files(tc.layout, tc.version)
			if err != nil {
				t.Fatalf("Files: %v", err)
			}
			var paths []string
			for _, e := range entries {
				paths = append(paths, e.Path)
				if e.Kind == KindSONAMELink && e.Target != e.Component+".so."+tc.version {
					t.Errorf("link %s points to %q, want %q", e.Path, e.Target, e.Component+".so."+tc.version)
				}
			}
			for _, w := range tc.want {
				if !slices.Contains(paths, w) {
					t.Errorf("missing %s in %v", w, paths)
				}
			}
			for _, w := range tc.notWant {
				if slices.Contains(paths, w) {
					t.Errorf("unexpected %s", w)
				}
			}
		})
	}
}

func TestInvalidInput(t *testing.T) {
	tests := map[string]struct {
		root    string
		layout  Layout
		version string
		want    string
	}{
		"unknown layout":         {root: t.TempDir(), layout: "windows", version: "384.130", want: "unknown layout"},
		"quote in version":       {root: t.TempDir(), layout: GKE, version: `384.130"`, want: "invalid driver version"},
		"path in version":        {root: t.TempDir(), layout: GKE, version: "384/../130", want: "invalid driver version"},
		"empty version":          {root: t.TempDir(), layout: GKE, version: "", want: "invalid driver version"},
		"older than any CUDA":    {root: t.TempDir(), layout: GKE, version: "340.108", want: "older than"},
		"relative root":          {root: "host", layout: GKE, version: "384.130", want: "not an absolute path"},
		"version with no branch": {root: t.TempDir(), layout: GKE, version: "384", want: "invalid driver version"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := sharedCache(t).Install(tc.root, tc.layout, tc.version)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestCUDADriverVersion(t *testing.T) {
	tests := map[string]struct {
		version string
		want    int
	}{
		"384 is CUDA 9.0":    {"384.130", 9000},
		"390 is CUDA 9.1":    {"390.116", 9010},
		"418 is CUDA 10.1":   {"418.67", 10010},
		"535 is CUDA 12.2":   {"535.104.05", 12020},
		"580 is CUDA 13.0":   {"580.159.04", 13000},
		"newer keeps latest": {"610.10", 13000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := CUDADriverVersion(tc.version)
			if err != nil || got != tc.want {
				t.Fatalf("CUDADriverVersion(%q) = %d, %v; want %d", tc.version, got, err, tc.want)
			}
		})
	}
}

// TestInstall installs every layout and checks the files are what a real
// driver installs: ELF objects with the right SONAME, links, a tool that
// needs the library path, and an ld.so.cache that lists them.
func TestInstall(t *testing.T) {
	for layout, version := range layoutVersions {
		t.Run(string(layout), func(t *testing.T) {
			root := t.TempDir()
			if err := sharedCache(t).Install(root, layout, version); err != nil {
				t.Fatalf("Install: %v", err)
			}
			entries, err := Files(layout, version)
			if err != nil {
				t.Fatalf("Files: %v", err)
			}
			for _, e := range entries {
				p := filepath.Join(root, e.Path)
				switch e.Kind {
				case KindSONAMELink:
					target, err := os.Readlink(p)
					if err != nil || target != e.Target {
						t.Errorf("link %s = %q, %v; want %q", e.Path, target, err, e.Target)
					}
					if _, err := os.Stat(p); err != nil {
						t.Errorf("link %s dangles: %v", e.Path, err)
					}
				case KindLibrary:
					checkELF(t, p, e.Component+sonameTail, "")
				case KindBinary:
					checkELF(t, p, "", LibNVML+sonameTail)
					fi, err := os.Stat(p)
					if err != nil || fi.Mode().Perm() != 0o755 {
						t.Errorf("binary %s: %v, mode %v", e.Path, err, fi.Mode())
					}
				}
			}
			checkNvidiaSMI(t, root, layout, version, entries)
			checkLDCache(t, root, entries)
		})
	}
}

func checkELF(t *testing.T, p, wantSONAME, wantNeeded string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Errorf("%s is not an ELF file: %v", p, err)
		return
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 {
		t.Errorf("%s: machine %v", p, f.Machine)
	}
	if wantSONAME != "" {
		soname, err := f.DynString(elf.DT_SONAME)
		if err != nil || len(soname) != 1 || soname[0] != wantSONAME {
			t.Errorf("%s: SONAME %v (%v), want %s", p, soname, err, wantSONAME)
		}
	}
	if wantNeeded != "" {
		needed, err := f.ImportedLibraries()
		if err != nil || !slices.Contains(needed, wantNeeded) {
			t.Errorf("%s: NEEDED %v (%v), want %s", p, needed, err, wantNeeded)
		}
		for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
			if v, _ := f.DynString(tag); len(v) > 0 {
				t.Errorf("%s: has %v %v; it must depend on the injected library path", p, tag, v)
			}
		}
	}
}

func checkNvidiaSMI(t *testing.T, root string, layout Layout, version string, entries []Entry) {
	t.Helper()
	nvmlPath, err := NVMLPath(layout, version)
	if err != nil {
		t.Fatalf("NVMLPath: %v", err)
	}
	var smi string
	for _, e := range entries {
		if e.Kind == KindBinary {
			smi = filepath.Join(root, e.Path)
		}
	}
	libDir := filepath.Join(root, filepath.Dir(nvmlPath))

	cmd := exec.Command(smi)
	cmd.Env = []string{"LD_LIBRARY_PATH=" + libDir}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nvidia-smi with the library path: %v\n%s", err, out)
	}
	cuda, _ := CUDADriverVersion(version)
	for _, want := range []string{
		"NVIDIA-SMI stand-in | Driver Version: " + version,
		fmt.Sprintf("CUDA Version: %d.%d", cuda/1000, cuda%1000/10),
		Notice,
		"GPU 1: " + ProductName + " | 16384MiB | compute capability 8.0",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("nvidia-smi output lacks %q:\n%s", want, out)
		}
	}

	cmd = exec.Command(smi)
	cmd.Env = []string{}
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "libnvidia-ml.so.1: cannot open shared object file") {
		t.Errorf("nvidia-smi without the library path: err %v, output %s; want a loader error", err, out)
	}
}

func checkLDCache(t *testing.T, root string, entries []Entry) {
	t.Helper()
	cachePath := filepath.Join(root, "etc", "ld.so.cache")
	if os.Geteuid() != 0 {
		if _, err := os.Stat(cachePath); err == nil {
			t.Errorf("%s exists although ldconfig -r needs root", cachePath)
		}
		return
	}
	out, err := exec.Command("ldconfig", "-C", cachePath, "-p").CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig -p: %v\n%s", err, out)
	}
	// The cache lists SONAME links of folders the loader is configured for;
	// GKE's folder is not one, as on a COS node.
	var listed int
	for _, e := range entries {
		if e.Kind == KindSONAMELink && bytes.Contains(out, []byte("=> "+e.Path+"\n")) {
			listed++
		}
	}
	if listed == 0 && !strings.HasPrefix(entries[0].Path, "/home/kubernetes/") {
		t.Errorf("ld.so.cache lists none of the driver's libraries:\n%s", out)
	}
	if listed != 0 && strings.HasPrefix(entries[0].Path, "/home/kubernetes/") {
		t.Errorf("ld.so.cache of a GKE root lists driver libraries:\n%s", out)
	}
}

// TestNVMLThroughGoNVML loads each layout's stand-in libnvidia-ml.so.1 through
// go-nvml, as the probe does, and checks every value it reports.
func TestNVMLThroughGoNVML(t *testing.T) {
	for layout, version := range layoutVersions {
		t.Run(string(layout), func(t *testing.T) {
			root := t.TempDir()
			if err := sharedCache(t).Install(root, layout, version); err != nil {
				t.Fatalf("Install: %v", err)
			}
			nvmlPath, err := NVMLPath(layout, version)
			if err != nil {
				t.Fatalf("NVMLPath: %v", err)
			}
			facts := runNVMLHelper(t, filepath.Join(root, nvmlPath))
			cuda, _ := CUDADriverVersion(version)
			if facts.DriverVersion != version || facts.InitAgain != version {
				t.Errorf("driver version %q (again %q), want %q", facts.DriverVersion, facts.InitAgain, version)
			}
			if want := fmt.Sprintf("%d.%s", cuda/1000, version); facts.NVMLVersion != want {
				t.Errorf("NVML version %q, want %q", facts.NVMLVersion, want)
			}
			if facts.CUDADriverVersion != cuda {
				t.Errorf("CUDA driver version %d, want %d", facts.CUDADriverVersion, cuda)
			}
			if facts.Count != DeviceCount || len(facts.Devices) != DeviceCount {
				t.Fatalf("count %d with %d devices, want %d", facts.Count, len(facts.Devices), DeviceCount)
			}
			uuids := map[string]bool{}
			for i, d := range facts.Devices {
				if d.Name != ProductName {
					t.Errorf("device %d name %q, want %q", i, d.Name, ProductName)
				}
				if d.MemoryTotal != MemoryMiB<<20 || d.MemoryTotalV2 != MemoryMiB<<20 {
					t.Errorf("device %d memory %d / %d, want %d", i, d.MemoryTotal, d.MemoryTotalV2, MemoryMiB<<20)
				}
				if got := fmt.Sprintf("%d.%d", d.CCMajor, d.CCMinor); got != ComputeCapability {
					t.Errorf("device %d compute capability %s, want %s", i, got, ComputeCapability)
				}
				if d.MIGCurrent != 0 {
					t.Errorf("device %d MIG mode %d, want disabled", i, d.MIGCurrent)
				}
				if !strings.HasPrefix(d.UUID, "GPU-5354414e-442d-494e-") || uuids[d.UUID] {
					t.Errorf("device %d UUID %q is not a distinct stand-in UUID", i, d.UUID)
				}
				uuids[d.UUID] = true
			}
		})
	}
}

// TestNodeProbeReadsStandIn runs the node probe's own NVML code against each
// layout's stand-in, so the two cannot drift apart: a symbol the probe starts
// calling that the stand-in lacks fails here, not as a crash in the e2e suite.
func TestNodeProbeReadsStandIn(t *testing.T) {
	for layout, version := range layoutVersions {
		t.Run(string(layout), func(t *testing.T) {
			root := t.TempDir()
			if err := sharedCache(t).Install(root, layout, version); err != nil {
				t.Fatalf("Install: %v", err)
			}
			nvmlPath, err := NVMLPath(layout, version)
			if err != nil {
				t.Fatalf("NVMLPath: %v", err)
			}
			lib := filepath.Join(root, nvmlPath)
			if c := nodeprobe.CheckNVMLLibrary(lib); c.State != nodeprobe.NVMLOK {
				t.Fatalf("the probe rejects the stand-in: %s: %s", c.State, c.Message)
			}
			var res nodeprobe.NVMLResult
			if err := json.Unmarshal(runHelper(t, probeHelperEnv, lib), &res); err != nil {
				t.Fatalf("probe helper output: %v", err)
			}
			if res.State != nodeprobe.NVMLOK || res.Facts == nil {
				t.Fatalf("probe state %s: %s", res.State, res.Message)
			}
			cuda, _ := CUDADriverVersion(version)
			wantCUDA := fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10)
			if res.Facts.DriverVersion != version || res.Facts.CUDADriverVersion != wantCUDA {
				t.Errorf("probe read driver %q CUDA %q, want %q and %q", res.Facts.DriverVersion, res.Facts.CUDADriverVersion, version, wantCUDA)
			}
			want := nodeprobe.GPU{Product: ProductName, MemoryMiB: MemoryMiB, ComputeCapability: ComputeCapability}
			if len(res.Facts.GPUs) != DeviceCount {
				t.Fatalf("probe read %d GPUs, want %d", len(res.Facts.GPUs), DeviceCount)
			}
			for i, g := range res.Facts.GPUs {
				if g != want {
					t.Errorf("GPU %d: %+v, want %+v", i, g, want)
				}
			}
		})
	}
}

func watchHelper(lib string) int {
	returned := make(chan struct{}, 1)
	w := &nodeprobe.NVMLWatch{Timeout: time.Second, Returned: func() { returned <- struct{}{} }}
	open := func() (nodeprobe.NVML, error) { return nodeprobe.OpenNVML(lib), nil }
	enc := json.NewEncoder(os.Stdout)
	first, _ := w.Read(open)
	if err := enc.Encode(first); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if first.State == nodeprobe.NVMLTimeout {
		select {
		case <-returned:
		case <-time.After(time.Minute):
			fmt.Fprintln(os.Stderr, "the stuck NVML call did not return within a minute of the test's signal")
			return 1
		}
	}
	second, _ := w.Read(open)
	if err := enc.Encode(second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestFaults turns the stand-in's fault switches on and reads it as the probe
// does, through real go-nvml: with FaultHang the probe's watch reports the
// stuck nvmlInit at its limit and gets an answer once the switch is off; with
// FaultGPULost it reads NVML's lost-GPU code; with the switch off again, the
// driver is whole.
func TestFaults(t *testing.T) {
	const layout, version = GKE, "535.104.05"
	root := t.TempDir()
	if err := sharedCache(t).Install(root, layout, version); err != nil {
		t.Fatalf("Install: %v", err)
	}
	nvmlPath, err := NVMLPath(layout, version)
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, nvmlPath)
	probeRead := func() nodeprobe.NVMLResult {
		var res nodeprobe.NVMLResult
		if err := json.Unmarshal(runHelper(t, probeHelperEnv, lib), &res); err != nil {
			t.Fatalf("probe helper output: %v", err)
		}
		return res
	}

	t.Run("gpu lost", func(t *testing.T) {
		if err := SetFault(root, layout, version, FaultGPULost, true); err != nil {
			t.Fatal(err)
		}
		res := probeRead()
		if res.State != nodeprobe.NVMLGPULost || res.Message != "nvmlDeviceGetHandleByIndex(0) failed: ERROR_GPU_IS_LOST" {
			t.Errorf("with %s: %s %q, want %s from nvmlDeviceGetHandleByIndex(0)", FaultGPULost, res.State, res.Message, nodeprobe.NVMLGPULost)
		}
		if err := SetFault(root, layout, version, FaultGPULost, false); err != nil {
			t.Fatal(err)
		}
		if res := probeRead(); res.State != nodeprobe.NVMLOK {
			t.Errorf("with the switch off: %s %q, want OK", res.State, res.Message)
		}
	})

	t.Run("hang", func(t *testing.T) {
		if err := SetFault(root, layout, version, FaultHang, true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = SetFault(root, layout, version, FaultHang, false) })
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), watchHelperEnv+"="+lib)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		dec := json.NewDecoder(out)
		var first, second nodeprobe.NVMLResult
		if err := dec.Decode(&first); err != nil {
			t.Fatalf("first reading: %v\n%s", err, stderr.String())
		}
		if first.State != nodeprobe.NVMLTimeout || !strings.HasPrefix(first.Message, "nvmlInit has not returned within 1s (called at ") {
			t.Fatalf("with %s: %s %q, want %s naming nvmlInit", FaultHang, first.State, first.Message, nodeprobe.NVMLTimeout)
		}
		if err := SetFault(root, layout, version, FaultHang, false); err != nil {
			t.Fatal(err)
		}
		if err := dec.Decode(&second); err != nil {
			t.Fatalf("reading after the switch went off: %v\n%s", err, stderr.String())
		}
		if second.State != nodeprobe.NVMLOK || second.Facts == nil || second.Facts.DriverVersion != version {
			t.Errorf("after the switch went off: %s %q %+v, want OK with driver %s", second.State, second.Message, second.Facts, version)
		}
	})

	if err := SetFault(root, layout, "nope", FaultHang, true); err == nil {
		t.Error("SetFault with a bad version succeeded")
	}
	if err := SetFault(root, layout, version, Fault("other"), true); err == nil {
		t.Error("SetFault of an unknown fault succeeded")
	}
}

func runNVMLHelper(t *testing.T, lib string) nvmlFacts {
	t.Helper()
	var f nvmlFacts
	out := runHelper(t, nvmlHelperEnv, lib)
	if err := json.Unmarshal(out, &f); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	return f
}

func runHelper(t *testing.T, env, lib string) []byte {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env+"="+lib)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("reading %s through go-nvml: %v\n%s", lib, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestUpgrade replaces one driver version by another the way a package
// upgrade does, and checks nothing of the old one is left to be found.
func TestUpgrade(t *testing.T) {
	root := t.TempDir()
	c := sharedCache(t)
	if err := c.Install(root, UbuntuNvidia, "384.130"); err != nil {
		t.Fatalf("Install 384: %v", err)
	}
	if err := c.Install(root, UbuntuNvidia, "390.116"); err != nil {
		t.Fatalf("Install 390: %v", err)
	}
	if err := RemoveReplaced(root, UbuntuNvidia, "384.130", "390.116"); err != nil {
		t.Fatalf("Remove 384: %v", err)
	}
	for _, gone := range []string{"/usr/lib/nvidia-384", "/usr/lib/x86_64-linux-gnu/libcuda.so.384.130"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Remove (err %v)", gone, err)
		}
	}
	target, err := os.Readlink(filepath.Join(root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
	if err != nil || target != "libcuda.so.390.116" {
		t.Errorf("shared libcuda.so.1 -> %q (%v), want the new version", target, err)
	}
	conf, err := os.ReadFile(filepath.Join(root, ldConfFile(UbuntuNvidia)))
	if err != nil || !strings.Contains(string(conf), "/usr/lib/nvidia-390\n") {
		t.Errorf("ld.so.conf.d entry %q (%v), want the new folder", conf, err)
	}
	nvmlPath, _ := NVMLPath(UbuntuNvidia, "390.116")
	if f := runNVMLHelper(t, filepath.Join(root, nvmlPath)); f.DriverVersion != "390.116" {
		t.Errorf("after the upgrade NVML reports %q", f.DriverVersion)
	}
	if err := Remove(root, UbuntuNvidia, "390.116"); err != nil {
		t.Fatalf("Remove 390: %v", err)
	}
	var left []string
	filepath.Walk(filepath.Join(root, "usr"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Errorf("files left after removing every version: %v", left)
	}
}

// TestUpgradeKeepsSharedPaths: where both versions install a file at the
// same path (GKE's bin/nvidia-smi), removing the replaced version leaves the
// new one's.
func TestUpgradeKeepsSharedPaths(t *testing.T) {
	root := t.TempDir()
	c := sharedCache(t)
	for _, v := range []string{"535.104.05", "550.54.15"} {
		if err := c.Install(root, GKE, v); err != nil {
			t.Fatalf("Install %s: %v", v, err)
		}
	}
	if err := RemoveReplaced(root, GKE, "535.104.05", "550.54.15"); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(root, "/home/kubernetes/bin/nvidia/bin/nvidia-smi")
	if _, err := os.Stat(smi); err != nil {
		t.Errorf("nvidia-smi gone after the upgrade: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "/home/kubernetes/bin/nvidia/lib64/libcuda.so.535.104.05")); !os.IsNotExist(err) {
		t.Errorf("the replaced libcuda is still there (err %v)", err)
	}
}

// TestPackageInstall covers the one-shot Install that builds in a temporary folder.
func TestPackageInstall(t *testing.T) {
	root := t.TempDir()
	if err := Install(root, GKE, "418.67"); err != nil {
		t.Fatalf("Install: %v", err)
	}
	checkELF(t, filepath.Join(root, "/home/kubernetes/bin/nvidia/lib64/libcuda.so.418.67"), "libcuda.so.1", "")
}
