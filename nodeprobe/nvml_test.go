package nodeprobe

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func TestReadNVML(t *testing.T) {
	withDevice := func(f func(d *mock.Device)) *mock.Interface {
		m := fakeNVML("580.159.04", 13000, h100)
		inner := m.DeviceGetHandleByIndexFunc
		m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
			d, ret := inner(i)
			f(d.(*mock.Device))
			return d, ret
		}
		return m
	}
	for name, tc := range map[string]struct {
		lib     *mock.Interface
		state   NVMLState
		message string
		gpus    []GPU
	}{
		"ok": {lib: fakeNVML("580.159.04", 13000, h100), state: NVMLOK,
			gpus: []GPU{{Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0"}}},
		"mig enabled": {lib: fakeNVML("580.159.04", 13000, mockGPU{name: "A100", memBytes: 1 << 30, major: 8, mig: nvml.SUCCESS}), state: NVMLOK,
			gpus: []GPU{{Product: "A100", MemoryMiB: 1024, ComputeCapability: "8.0", MIGEnabled: true}}},
		"library not found": {lib: initReturns(nvml.ERROR_LIBRARY_NOT_FOUND), state: NVMLLibraryNotFound, message: "ERROR_LIBRARY_NOT_FOUND"},
		"driver not loaded": {lib: initReturns(nvml.ERROR_DRIVER_NOT_LOADED), state: NVMLDriverNotLoaded, message: "ERROR_DRIVER_NOT_LOADED"},
		"version mismatch":  {lib: initReturns(nvml.ERROR_LIB_RM_VERSION_MISMATCH), state: NVMLVersionMismatch, message: "ERROR_LIB_RM_VERSION_MISMATCH"},
		"no permission":     {lib: initReturns(nvml.ERROR_NO_PERMISSION), state: NVMLNoPermission, message: "ERROR_NO_PERMISSION"},
		"unknown init code": {lib: initReturns(nvml.Return(777)), state: NVMLError, message: "NVML error 777"},
		"no devices":        {lib: fakeNVML("580.159.04", 13000), state: NVMLNoDevices},
		"count fails": {lib: func() *mock.Interface {
			m := fakeNVML("580.159.04", 13000, h100)
			m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			return m
		}(), state: NVMLError, message: "nvmlDeviceGetCount failed: ERROR_UNKNOWN"},
		"gpu lost": {lib: withDevice(func(d *mock.Device) {
			d.GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
		}), state: NVMLGPULost, message: "nvmlDeviceGetName(0) failed: ERROR_GPU_IS_LOST"},
		"mig query fails": {lib: withDevice(func(d *mock.Device) {
			d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
		}), state: NVMLError, message: "nvmlDeviceGetMigMode(0)"},
	} {
		t.Run(name, func(t *testing.T) {
			r := ReadNVML(tc.lib)
			if r.State != tc.state || !strings.Contains(r.Message, tc.message) {
				t.Errorf("ReadNVML = %s %q, want %s containing %q", r.State, r.Message, tc.state, tc.message)
			}
			if tc.gpus != nil && (r.Facts == nil || !reflect.DeepEqual(r.Facts.GPUs, tc.gpus)) {
				t.Errorf("GPUs = %+v, want %+v", r.Facts, tc.gpus)
			}
			// Shutdown follows every successful Init, and nothing else.
			inits, shutdowns := len(tc.lib.InitCalls()), len(tc.lib.ShutdownCalls())
			if tc.lib.InitFunc() == nvml.SUCCESS && shutdowns != inits {
				t.Errorf("%d Init, %d Shutdown", inits, shutdowns)
			}
		})
	}
}

func initReturns(ret nvml.Return) *mock.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return ret }}
}

func TestCUDAVersionFormat(t *testing.T) {
	for in, want := range map[int]string{13000: "13.0", 12040: "12.4", 12080: "12.8", 9020: "9.2", 11010: "11.1"} {
		r := ReadNVML(fakeNVML("1.2", in, h100))
		if r.Facts.CUDADriverVersion != want {
			t.Errorf("CUDA %d -> %q, want %q", in, r.Facts.CUDADriverVersion, want)
		}
	}
}

// standin is a C libnvidia-ml exporting exactly NVMLSymbols, the contract
// that simulated nodes rely on.
const standin = `
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { strncpy(v, "580.159.04", n); return 0; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { *d = (void *)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetName(void *d, char *name, unsigned int n) { strncpy(name, "NVIDIA H100 80GB HBM3", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) { m->total = 81559ULL << 20; m->free = m->total; m->used = 0; return 0; }
int nvmlDeviceGetCudaComputeCapability(void *d, int *major, int *minor) { *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetMigMode(void *d, unsigned int *cur, unsigned int *pend) { return 3; /* NOT_SUPPORTED */ }
`

// TestRealGoNVMLWithStandin loads a C library through the real go-nvml path
// in a child process (go-nvml binds its C symbols once per process, and a
// missing symbol kills the process, which must fail only this test).
func TestRealGoNVMLWithStandin(t *testing.T) {
	if lib := os.Getenv("NODEPROBE_STANDIN"); lib != "" {
		if c := CheckNVMLLibrary(lib); c.State != NVMLOK {
			t.Fatalf("CheckNVMLLibrary: %s %s", c.State, c.Message)
		}
		r := ReadNVML(OpenNVML(lib))
		want := &NVMLFacts{DriverVersion: "580.159.04", CUDADriverVersion: "13.0", GPUs: []GPU{
			{Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0"},
			{Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0"},
		}}
		if r.State != NVMLOK || !reflect.DeepEqual(r.Facts, want) {
			t.Fatalf("ReadNVML = %s %s %+v, want %+v", r.State, r.Message, r.Facts, want)
		}
		return
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("needs gcc to build the stand-in library: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "nvml.c")
	if err := os.WriteFile(src, []byte(standin), 0o644); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(dir, "libnvidia-ml.so.1")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", full, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealGoNVMLWithStandin$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NODEPROBE_STANDIN="+full)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child with the full stand-in: %v\n%s", err, out)
	}

	// One symbol short: the check must refuse it before go-nvml can crash.
	short := strings.Replace(standin, "nvmlDeviceGetMigMode", "nvmlDeviceGetMigModeX", 1)
	if err := os.WriteFile(src, []byte(short), 0o644); err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(dir, "partial.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", partial, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	if c := CheckNVMLLibrary(partial); c.State != NVMLLibraryInvalid || !strings.Contains(c.Message, "lacks nvmlDeviceGetMigMode") {
		t.Errorf("CheckNVMLLibrary(partial) = %s %q", c.State, c.Message)
	}
	if c := CheckNVMLLibrary(src); c.State != NVMLLibraryNotFound {
		t.Errorf("CheckNVMLLibrary(C source) = %s %q, want LibraryNotFound", c.State, c.Message)
	}
}
