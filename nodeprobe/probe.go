package nodeprobe

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// Condition names the outcome of a probe. Ready publishes a layout; every
// other condition publishes the error state with the condition as the start
// of the reason.
type Condition string

const (
	ConditionReady Condition = "Ready"
	// ConditionNoDriver: no NVIDIA device, kernel module or driver library:
	// not a GPU node. Published as the no-driver state, not an error.
	ConditionNoDriver Condition = "NoDriver"
	// ConditionHostRootUnreadable: the host root folder cannot be read.
	ConditionHostRootUnreadable Condition = "HostRootUnreadable"
	// ConditionDriverNotLoaded: NVML says no kernel module, and none is visible.
	ConditionDriverNotLoaded Condition = "DriverNotLoaded"
	// ConditionDriverLibraryVersionMismatch: NVML's library and the loaded
	// kernel module differ (an upgrade without reboot); CUDA would fail too.
	ConditionDriverLibraryVersionMismatch Condition = "DriverLibraryVersionMismatch"
	// ConditionNoDevices: the driver works and there is no GPU.
	ConditionNoDevices Condition = "NoDevices"
	// ConditionNVMLError: any other NVML failure.
	ConditionNVMLError Condition = "NVMLError"
	// ConditionDriverWedged: an NVML call did not return within the limit.
	// Published as the wedged state.
	ConditionDriverWedged Condition = "DriverWedged"
	// ConditionGPULost: NVML reports a GPU lost or in need of a reset.
	// Published as the wedged state.
	ConditionGPULost Condition = "GPULost"
	// ConditionDriverFilesNotFound: no versioned driver library at all.
	ConditionDriverFilesNotFound Condition = "DriverFilesNotFound"
	// ConditionDriverFilesNotAllowed: the driver's files are in folders the
	// host path allowlist does not cover.
	ConditionDriverFilesNotAllowed Condition = "DriverFilesNotAllowed"
	// ConditionDriverVersionAmbiguous: several versions on disk, nothing says which runs.
	ConditionDriverVersionAmbiguous Condition = "DriverVersionAmbiguous"
	// ConditionDriverVersionMismatch: the running driver's files are not on disk.
	ConditionDriverVersionMismatch Condition = "DriverVersionMismatch"
	// ConditionRequiredLibraryMissing: libcuda or libnvidia-ml of the version is missing.
	ConditionRequiredLibraryMissing Condition = "RequiredLibraryMissing"
	// ConditionPlanInvalid: the plan breaks the configured rules.
	ConditionPlanInvalid Condition = "PlanInvalid"
)

// VersionSource says where the driver version came from.
type VersionSource string

const (
	SourceNVML VersionSource = "NVML"
	// SourceKernelModule: /sys/module/nvidia/version or /proc/driver/nvidia/version.
	SourceKernelModule VersionSource = "KernelModule"
	// SourceFileNames: the only version that the library file names carry.
	SourceFileNames VersionSource = "FileNames"
	// SourceLoaderCache: the version of the libcuda.so.1 the host's loader picks.
	SourceLoaderCache VersionSource = "LoaderCache"
)

// ProbeOptions configure one probe.
type ProbeOptions struct {
	// HostRoot is where the host's / is mounted.
	HostRoot string
	// NVMLLibrary overrides the library file (a path on this machine).
	NVMLLibrary string
	Config      *config.Configuration
	// OpenNVML binds NVML to a library file; nil means go-nvml. It may
	// return an error to refuse a library (see Run).
	OpenNVML func(path string) (NVML, error)
	// IgnoreRuntimeInjection plans mounts even where the container runtime
	// injects the driver itself.
	IgnoreRuntimeInjection bool
	// NVMLWatch bounds the time spent in NVML; nil means a watch of its own
	// with DefaultNVMLTimeout. An agent keeps one for its life, so that a
	// call stuck in one probe is not made again by the next (see NVMLWatch).
	NVMLWatch *NVMLWatch
}

// Result is what a probe found.
type Result struct {
	Condition     Condition     `json:"condition"`
	Message       string        `json:"message,omitempty"`
	DriverVersion string        `json:"driverVersion,omitempty"`
	VersionSource VersionSource `json:"versionSource,omitempty"`
	// NVMLLibrary is the library file NVML was loaded from, on this machine.
	NVMLLibrary string     `json:"nvmlLibrary,omitempty"`
	NVML        NVMLResult `json:"nvml"`
	// Evidence is where the host pointed the probe: loader cache entries and
	// the links behind them, the NVML library's folder, runtime settings.
	Evidence []string     `json:"evidence,omitempty"`
	Plan     *layout.Plan `json:"plan,omitempty"`
	Notes    []string     `json:"notes,omitempty"`
}

// Ready reports whether the result carries a usable plan.
func (r Result) Ready() bool { return r.Condition == ConditionReady && r.Plan != nil }

// Wedged reports whether the driver is installed but does not work: NVML
// hangs, or reports a GPU lost.
func (r Result) Wedged() bool {
	return r.Condition == ConditionDriverWedged || r.Condition == ConditionGPULost
}

// Reason is the state-reason annotation value of a failed probe, in what
// layout.DecodeStateReason reads: a message may quote the host's file names.
func (r Result) Reason() string {
	reason := string(r.Condition)
	if r.Message != "" {
		reason += ": " + r.Message
	}
	return layout.OneLine(reason, layout.MaxStateReasonBytes)
}

// ErrNVMLReload is returned by an OpenNVML that refuses to load a second,
// different library into the process.
var ErrNVMLReload = errors.New("the NVML library changed")

// Probe reads NVML and the host's files and builds the plan. The error is
// only for conditions the caller cannot publish (ErrNVMLReload); every node
// problem is a Condition in the result.
func Probe(opts ProbeOptions) (out Result, err error) {
	cfg := opts.Config
	if cfg == nil {
		cfg = config.Default()
	}
	h := hostFS{root: opts.HostRoot}
	files, err := Discover(opts.HostRoot)
	if err != nil {
		return Result{Condition: ConditionHostRootUnreadable, Message: err.Error()}, nil
	}
	res := Result{Notes: append([]string(nil), files.Skipped...)}
	defer func() { out.Evidence = files.Evidence }()

	res.NVMLLibrary = nvmlLibrary(opts, files, h)
	if res.NVML, err = readNVMLLibrary(opts, res.NVMLLibrary); err != nil {
		return res, err
	}
	kernel := kernelModuleVersion(h)
	if c, msg := noDriver(files, h, kernel, res.NVML); c != "" {
		return res.fail(c, "%s", msg)
	}
	if c, msg := res.nvmlVersion(kernel); c != "" {
		return res.fail(c, "%s", msg)
	}
	if res.DriverVersion == "" {
		if c, msg := res.filesVersion(files, h, kernel); c != "" {
			return res.fail(c, "%s", msg)
		}
	}
	cuda := ""
	if res.NVML.Facts != nil {
		cuda = res.NVML.Facts.CUDADriverVersion
	}
	if !opts.IgnoreRuntimeInjection {
		if ri := DetectRuntimeInjection(opts.HostRoot); ri.Kind != "" {
			return res.runtimePlan(ri, files, cuda, cfg)
		}
	}
	return res.filesPlan(files, cuda, cfg)
}

// nvmlLibrary is the NVML library to read: the one the options name, else
// the one the host's loader would pick, else any of the host's.
func nvmlLibrary(opts ProbeOptions, files *Files, h hostFS) string {
	lib := opts.NVMLLibrary
	if lib == "" {
		if l, ok := files.cacheTarget(h, "libnvidia-ml.so.1"); ok {
			lib = h.osPath(l.Path)
		} else {
			for _, l := range files.Libraries {
				if l.Base == "libnvidia-ml" {
					lib = h.osPath(l.Path)
					break
				}
			}
		}
	}
	if rel, ok := strings.CutPrefix(lib, strings.TrimSuffix(opts.HostRoot, "/")+"/"); ok && opts.NVMLLibrary != "" {
		files.AddEvidence(path.Dir("/"+rel), "NVML library")
	}
	return lib
}

// readNVMLLibrary is what NVML, loaded from lib, says of the driver and its
// GPUs. The error is ErrNVMLReload's kind: one the caller cannot publish.
func readNVMLLibrary(opts ProbeOptions, lib string) (NVMLResult, error) {
	if lib == "" {
		return NVMLResult{State: NVMLLibraryNotFound, Message: "no libnvidia-ml.so.1 under the host root"}, nil
	}
	if _, err := os.Stat(lib); err != nil {
		return NVMLResult{State: NVMLLibraryNotFound, Message: err.Error()}, nil
	}
	open := opts.OpenNVML
	if open == nil {
		open = func(p string) (NVML, error) {
			if c := CheckNVMLLibrary(p); c.State != NVMLOK {
				return nil, &nvmlUnusable{c}
			}
			return OpenNVML(p), nil
		}
	}
	watch := opts.NVMLWatch
	if watch == nil {
		watch = &NVMLWatch{}
	}
	nvmlRes, err := watch.Read(func() (NVML, error) { return open(lib) })
	var unusable *nvmlUnusable
	switch {
	case errors.As(err, &unusable):
		return unusable.result, nil
	case err != nil:
		return NVMLResult{}, err
	}
	return nvmlRes, nil
}

// noDriver says why a node with no driver library, no kernel module and no
// NVML to read fails the probe, or "" where something of a driver is there.
func noDriver(files *Files, h hostFS, kernel string, nvml NVMLResult) (Condition, string) {
	if len(files.Libraries) > 0 || kernel != "" || (nvml.State != NVMLLibraryNotFound && nvml.State != NVMLLibraryInvalid) {
		return "", ""
	}
	if dev := nvidiaDevice(h); dev != "" {
		return ConditionDriverFilesNotFound, fmt.Sprintf("%s, but no versioned driver library (%s.so.<version>) under the host root", dev, strings.Join(RequiredLibraries, ".so.<version>, "))
	}
	if !files.namesDriverLibrary() {
		return ConditionNoDriver, "no NVIDIA device, kernel module or driver library on this node"
	}
	return "", ""
}

// nvmlVersion takes the driver version from NVML's answer, or says why that
// answer fails the probe; a driver NVML cannot reach leaves the version to
// the files (filesVersion).
func (r *Result) nvmlVersion(kernel string) (Condition, string) {
	switch r.NVML.State {
	case NVMLOK:
		r.DriverVersion, r.VersionSource = r.NVML.Facts.DriverVersion, SourceNVML
	case NVMLVersionMismatch:
		return ConditionDriverLibraryVersionMismatch, fmt.Sprintf("%s (kernel module %s); reboot or reload the driver", r.NVML.Message, orUnknown(kernel))
	case NVMLNoDevices:
		r.DriverVersion, r.VersionSource = r.NVML.Facts.DriverVersion, SourceNVML
		return ConditionNoDevices, r.NVML.Message
	case NVMLError:
		return ConditionNVMLError, r.NVML.Message
	case NVMLTimeout:
		return ConditionDriverWedged, "NVML does not answer: " + r.NVML.Message
	case NVMLGPULost:
		return ConditionGPULost, "NVML reports a GPU lost: " + r.NVML.Message
	case NVMLDriverNotLoaded:
		if kernel == "" {
			return ConditionDriverNotLoaded, r.NVML.Message + " and no nvidia kernel module is visible"
		}
		// The module is loaded: this container lacks the device nodes.
		r.Notes = append(r.Notes, fmt.Sprintf("NVML: %s, but kernel module %s is loaded; is /dev/nvidiactl visible?", r.NVML.Message, kernel))
	}
	return "", ""
}

// filesVersion takes the driver version from what the host shows without
// NVML: the kernel module, the one version of the files, the loader's
// cache; or says why none tells.
func (r *Result) filesVersion(files *Files, h hostFS, kernel string) (Condition, string) {
	versions := files.Versions()
	if kernel != "" {
		r.DriverVersion, r.VersionSource = kernel, SourceKernelModule
	} else if len(versions) == 1 {
		r.DriverVersion, r.VersionSource = versions[0], SourceFileNames
	} else if l, ok := files.cacheTarget(h, "libcuda.so.1"); ok {
		r.DriverVersion, r.VersionSource = l.Version, SourceLoaderCache
	} else if len(versions) == 0 {
		return ConditionDriverFilesNotFound, fmt.Sprintf("no versioned driver library (%s.so.<version>) under the host root", strings.Join(RequiredLibraries, ".so.<version>, "))
	} else {
		return ConditionDriverVersionAmbiguous, fmt.Sprintf("driver files of versions %s and nothing tells which one runs (NVML: %s)", strings.Join(versions, ", "), r.NVML.State)
	}
	return "", ""
}

// runtimePlan is the plan of a node whose runtime injects the driver (ri).
// The runtime finds the files itself: mounting them again at the same paths
// would break the container.
func (r Result) runtimePlan(ri RuntimeInjection, files *Files, cuda string, cfg *config.Configuration) (Result, error) {
	files.Evidence = append(files.Evidence, ri.Evidence...)
	r.Notes = append(r.Notes, ri.Notes...)
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: r.DriverVersion, CUDADriverVersion: cuda, RuntimeInjection: ri.Kind, Mounts: []layout.Mount{}, LibraryPaths: []string{}}
	plan.LibraryPaths, r.Notes = allowedLibraryPaths(plan, ri.LibraryPaths, cfg, r.Notes)
	if errs := plan.Validate(cfg.Rules()); len(errs) > 0 {
		return r.fail(ConditionPlanInvalid, "%v", errs.ToAggregate())
	}
	sort.Strings(r.Notes)
	r.Condition, r.Plan = ConditionReady, &plan
	return r, nil
}

// filesPlan is the plan that mounts the files of the driver version found
// (BuildPlan).
func (r Result) filesPlan(files *Files, cuda string, cfg *config.Configuration) (Result, error) {
	if v := files.Versions(); !contains(v, r.DriverVersion) {
		if len(v) == 0 {
			return r.fail(ConditionDriverFilesNotFound, "the driver %s (from %s) has no library files under the host root", r.DriverVersion, r.VersionSource)
		}
		return r.fail(ConditionDriverVersionMismatch, "%s reports driver %s but the files under the host root are of %s", r.VersionSource, r.DriverVersion, strings.Join(v, ", "))
	}
	plan, notes, err := BuildPlan(files, r.DriverVersion, cuda, cfg)
	r.Notes = append(r.Notes, notes...)
	var pe *PlanError
	if errors.As(err, &pe) {
		return r.fail(pe.Condition, "%s", pe.Message)
	} else if err != nil {
		return r.fail(ConditionPlanInvalid, "%v", err)
	}
	sort.Strings(r.Notes)
	r.Condition, r.Plan = ConditionReady, &plan
	return r, nil
}

// nvmlUnusable is how an OpenNVML reports a library it refused to call.
type nvmlUnusable struct{ result NVMLResult }

func (e *nvmlUnusable) Error() string { return string(e.result.State) + ": " + e.result.Message }

func (r Result) fail(c Condition, format string, args ...any) (Result, error) {
	r.Condition, r.Message, r.Plan = c, fmt.Sprintf(format, args...), nil
	sort.Strings(r.Notes)
	return r, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// allowedLibraryPaths keeps the library paths of a runtime-injected plan that
// the configuration's container paths allow. A device plugin run with a
// --container-path outside them still injects the driver: the node stays
// ready, pinned as before, and a note says why its pods get no
// LD_LIBRARY_PATH, rather than the whole plan being refused.
func allowedLibraryPaths(plan layout.Plan, libs []string, cfg *config.Configuration, notes []string) ([]string, []string) {
	out := []string{}
	for _, lp := range libs {
		one := plan
		one.LibraryPaths = []string{lp}
		if errs := one.Validate(cfg.Rules()); len(errs) > 0 {
			notes = append(notes, fmt.Sprintf("library path %q of the %s injection left out, so pods there get no LD_LIBRARY_PATH: %v", lp, plan.RuntimeInjection, errs.ToAggregate()))
			continue
		}
		if !slices.Contains(out, lp) {
			out = append(out, lp)
		}
	}
	return out, notes
}
