package nodeprobe

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the part of go-nvml the probe calls. Both nvml.Interface and
// go-nvml's mock.Interface satisfy it. Each method maps to one C symbol; the
// list is in docs/nodeprobe.md and must stay small, because stand-in
// libraries for simulated nodes implement exactly that list.
type NVML interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// NVMLState names the outcome of reading NVML.
type NVMLState string

const (
	NVMLOK NVMLState = "OK"
	// NVMLLibraryNotFound: no libnvidia-ml.so.1 on the host, or it would not load.
	NVMLLibraryNotFound NVMLState = "LibraryNotFound"
	// NVMLLibraryInvalid: the file loads but lacks a symbol the probe calls;
	// calling it anyway would kill the process, so it is never called.
	NVMLLibraryInvalid NVMLState = "LibraryInvalid"
	// NVMLDriverNotLoaded: the library is there but the kernel module is not.
	NVMLDriverNotLoaded NVMLState = "DriverNotLoaded"
	// NVMLVersionMismatch: the library and the loaded kernel module differ,
	// typically after a driver upgrade without a reboot.
	NVMLVersionMismatch NVMLState = "DriverLibraryVersionMismatch"
	// NVMLNoPermission: the process may not open the GPU device nodes.
	NVMLNoPermission NVMLState = "NoPermission"
	// NVMLNoDevices: NVML works and sees no GPU.
	NVMLNoDevices NVMLState = "NoDevices"
	// NVMLTimeout: a call did not return within the probe's limit (a
	// wedged driver); see NVMLWatch.
	NVMLTimeout NVMLState = "Timeout"
	// NVMLGPULost: NVML reports a GPU fallen off the bus or in need of a
	// reset (ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED).
	NVMLGPULost NVMLState = "GPULost"
	// NVMLError is any other NVML failure.
	NVMLError NVMLState = "Error"
)

// GPU is what the probe reads of one device.
type GPU struct {
	Product           string `json:"product"`
	MemoryMiB         uint64 `json:"memoryMiB"`
	ComputeCapability string `json:"computeCapability"`
	MIGEnabled        bool   `json:"migEnabled"`
}

// NVMLFacts is what NVML reports about the node.
type NVMLFacts struct {
	DriverVersion     string `json:"driverVersion"`
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	GPUs              []GPU  `json:"gpus"`
}

// NVMLResult is the outcome of ReadNVML: State is NVMLOK with Facts, or a
// named failure with Message.
type NVMLResult struct {
	State   NVMLState  `json:"state"`
	Message string     `json:"message,omitempty"`
	Facts   *NVMLFacts `json:"facts,omitempty"`
}

// returnName names an NVML return code without calling into the library:
// go-nvml's Return.Error calls nvmlErrorString once a library is loaded,
// which would add a symbol that stand-in libraries must then provide.
func returnName(r nvml.Return) string {
	switch r {
	case nvml.SUCCESS:
		return "SUCCESS"
	case nvml.ERROR_UNINITIALIZED:
		return "ERROR_UNINITIALIZED"
	case nvml.ERROR_INVALID_ARGUMENT:
		return "ERROR_INVALID_ARGUMENT"
	case nvml.ERROR_NOT_SUPPORTED:
		return "ERROR_NOT_SUPPORTED"
	case nvml.ERROR_NO_PERMISSION:
		return "ERROR_NO_PERMISSION"
	case nvml.ERROR_NOT_FOUND:
		return "ERROR_NOT_FOUND"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "ERROR_DRIVER_NOT_LOADED"
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "ERROR_LIBRARY_NOT_FOUND"
	case nvml.ERROR_FUNCTION_NOT_FOUND:
		return "ERROR_FUNCTION_NOT_FOUND"
	case nvml.ERROR_GPU_IS_LOST:
		return "ERROR_GPU_IS_LOST"
	case nvml.ERROR_RESET_REQUIRED:
		return "ERROR_RESET_REQUIRED"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "ERROR_LIB_RM_VERSION_MISMATCH"
	case nvml.ERROR_INSUFFICIENT_SIZE:
		return "ERROR_INSUFFICIENT_SIZE"
	case nvml.ERROR_UNKNOWN:
		return "ERROR_UNKNOWN"
	}
	return fmt.Sprintf("NVML error %d", int32(r))
}

// gpuLost reports the return codes that mean a GPU stopped working until a
// reset or a reboot: the driver's own verdict on a wedged GPU.
func gpuLost(r nvml.Return) bool {
	return r == nvml.ERROR_GPU_IS_LOST || r == nvml.ERROR_RESET_REQUIRED
}

// ReadNVML initializes NVML, reads the driver and device facts, and shuts it
// down again. Failures become named states; it never panics on a bad library.
// It waits on NVML as long as NVML takes: NVMLWatch bounds it.
func ReadNVML(lib NVML) NVMLResult { return readNVML(lib, func(string) {}) }

// readNVML is ReadNVML, calling step with each NVML call's name before
// making it, so a watch can say which call did not return.
func readNVML(lib NVML, step func(call string)) NVMLResult {
	step("nvmlInit")
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return initFailed(ret)
	}
	defer func() {
		step("nvmlShutdown")
		lib.Shutdown()
	}()
	facts := &NVMLFacts{}
	step("nvmlSystemGetDriverVersion")
	v, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return callFailed("nvmlSystemGetDriverVersion", ret)
	}
	facts.DriverVersion = strings.TrimSpace(v)
	step("nvmlSystemGetCudaDriverVersion")
	if cuda, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && cuda > 0 {
		// NVML encodes 12.4 as 12040.
		facts.CUDADriverVersion = fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10)
	}
	step("nvmlDeviceGetCount")
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return callFailed("nvmlDeviceGetCount", ret)
	}
	if n == 0 {
		return NVMLResult{State: NVMLNoDevices, Message: "NVML sees no GPU", Facts: facts}
	}
	for i := range n {
		g, failed := readGPU(lib, i, step)
		if failed != nil {
			return *failed
		}
		facts.GPUs = append(facts.GPUs, g)
	}
	return NVMLResult{State: NVMLOK, Facts: facts}
}

// initFailed names the state of an NVML that failed to initialize.
func initFailed(ret nvml.Return) NVMLResult {
	state := NVMLError
	switch {
	case ret == nvml.ERROR_LIBRARY_NOT_FOUND:
		state = NVMLLibraryNotFound
	case ret == nvml.ERROR_DRIVER_NOT_LOADED:
		state = NVMLDriverNotLoaded
	case ret == nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		state = NVMLVersionMismatch
	case ret == nvml.ERROR_NO_PERMISSION:
		state = NVMLNoPermission
	case gpuLost(ret):
		state = NVMLGPULost
	}
	return NVMLResult{State: state, Message: "nvmlInit failed: " + returnName(ret)}
}

// callFailed names the state of an NVML call that failed once NVML was up.
func callFailed(call string, ret nvml.Return) NVMLResult {
	state := NVMLError
	if gpuLost(ret) {
		state = NVMLGPULost
	}
	return NVMLResult{State: state, Message: call + " failed: " + returnName(ret)}
}

// readGPU reads the facts of the GPU of index i; failed is the result of a
// call that failed, nil when none did.
func readGPU(lib NVML, i int, step func(call string)) (g GPU, failed *NVMLResult) {
	call := func(name string) string {
		c := fmt.Sprintf("%s(%d)", name, i)
		step(c)
		return c
	}
	fail := func(c string, ret nvml.Return) (GPU, *NVMLResult) {
		r := callFailed(c, ret)
		return GPU{}, &r
	}
	c := call("nvmlDeviceGetHandleByIndex")
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return fail(c, ret)
	}
	c = call("nvmlDeviceGetName")
	if g.Product, ret = dev.GetName(); ret != nvml.SUCCESS {
		return fail(c, ret)
	}
	c = call("nvmlDeviceGetMemoryInfo")
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail(c, ret)
	}
	g.MemoryMiB = mem.Total >> 20
	c = call("nvmlDeviceGetCudaComputeCapability")
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return fail(c, ret)
	}
	g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	// GPUs without MIG answer NOT_SUPPORTED: that is "disabled", not an error.
	c = call("nvmlDeviceGetMigMode")
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return fail(c, ret)
	}
	return g, nil
}

// NVMLSymbols are the C functions the probe makes go-nvml call. go-nvml
// also looks up (dlsym) a list of versioned names at Init and falls back when
// they are absent, which is harmless; but a missing function that is then
// called is a fatal "symbol lookup error" of the whole process.
var NVMLSymbols = []string{
	"nvmlInit_v2", "nvmlShutdown",
	"nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
	"nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
	"nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMigMode",
}

// CheckNVMLLibrary reads a library file's dynamic symbol table, without
// loading it, and checks that it defines every symbol in NVMLSymbols: a
// broken or fake file becomes a state instead of a crash in the loader.
func CheckNVMLLibrary(libraryPath string) NVMLResult {
	f, err := elf.Open(libraryPath)
	if err != nil {
		return NVMLResult{State: NVMLLibraryNotFound, Message: fmt.Sprintf("failed to read %s: %v", libraryPath, err)}
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return NVMLResult{State: NVMLLibraryInvalid, Message: fmt.Sprintf("failed to read the symbols of %s: %v", libraryPath, err)}
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if t := elf.ST_TYPE(s.Info); s.Section != elf.SHN_UNDEF && (t == elf.STT_FUNC || t == elf.STT_GNU_IFUNC) {
			defined[s.Name] = true
		}
	}
	var missing []string
	for _, s := range NVMLSymbols {
		if !defined[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		return NVMLResult{State: NVMLLibraryInvalid, Message: fmt.Sprintf("%s lacks %s", libraryPath, strings.Join(missing, ", "))}
	}
	return NVMLResult{State: NVMLOK}
}

// OpenNVML returns go-nvml bound to one library file.
func OpenNVML(libraryPath string) NVML {
	return nvml.New(nvml.WithLibraryPath(libraryPath))
}
