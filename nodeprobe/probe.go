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

	// NVML, from the library the host's loader would pick.
	res.NVMLLibrary = opts.NVMLLibrary
	if res.NVMLLibrary == "" {
		if l, ok := files.cacheTarget(h, "libnvidia-ml.so.1"); ok {
			res.NVMLLibrary = h.osPath(l.Path)
		} else {
			for _, l := range files.Libraries {
				if l.Base == "libnvidia-ml" {
					res.NVMLLibrary = h.osPath(l.Path)
					break
				}
			}
		}
	}
	if rel, ok := strings.CutPrefix(res.NVMLLibrary, strings.TrimSuffix(opts.HostRoot, "/")+"/"); ok && opts.NVMLLibrary != "" {
		files.AddEvidence(path.Dir("/"+rel), "NVML library")
	}
	if res.NVMLLibrary == "" {
		res.NVML = NVMLResult{State: NVMLLibraryNotFound, Message: "no libnvidia-ml.so.1 under the host root"}
	} else if _, err := os.Stat(res.NVMLLibrary); err != nil {
		res.NVML = NVMLResult{State: NVMLLibraryNotFound, Message: err.Error()}
	} else {
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
		nvmlRes, err := watch.Read(func() (NVML, error) { return open(res.NVMLLibrary) })
		var unusable *nvmlUnusable
		switch {
		case errors.As(err, &unusable):
			res.NVML = unusable.result
		case err != nil:
			return res, err
		default:
			res.NVML = nvmlRes
		}
	}

	kernel := kernelModuleVersion(h)
	if len(files.Libraries) == 0 && kernel == "" && (res.NVML.State == NVMLLibraryNotFound || res.NVML.State == NVMLLibraryInvalid) {
		if dev := nvidiaDevice(h); dev != "" {
			return res.fail(ConditionDriverFilesNotFound, "%s, but no versioned driver library (%s.so.<version>) under the host root", dev, strings.Join(RequiredLibraries, ".so.<version>, "))
		}
		if !files.namesDriverLibrary() {
			return res.fail(ConditionNoDriver, "no NVIDIA device, kernel module or driver library on this node")
		}
	}
	switch res.NVML.State {
	case NVMLOK:
		res.DriverVersion, res.VersionSource = res.NVML.Facts.DriverVersion, SourceNVML
	case NVMLVersionMismatch:
		return res.fail(ConditionDriverLibraryVersionMismatch, "%s (kernel module %s); reboot or reload the driver", res.NVML.Message, orUnknown(kernel))
	case NVMLNoDevices:
		res.DriverVersion, res.VersionSource = res.NVML.Facts.DriverVersion, SourceNVML
		return res.fail(ConditionNoDevices, "%s", res.NVML.Message)
	case NVMLError:
		return res.fail(ConditionNVMLError, "%s", res.NVML.Message)
	case NVMLTimeout:
		return res.fail(ConditionDriverWedged, "NVML does not answer: %s", res.NVML.Message)
	case NVMLGPULost:
		return res.fail(ConditionGPULost, "NVML reports a GPU lost: %s", res.NVML.Message)
	case NVMLDriverNotLoaded:
		if kernel == "" {
			return res.fail(ConditionDriverNotLoaded, "%s and no nvidia kernel module is visible", res.NVML.Message)
		}
		// The module is loaded: this container lacks the device nodes.
		res.Notes = append(res.Notes, fmt.Sprintf("NVML: %s, but kernel module %s is loaded; is /dev/nvidiactl visible?", res.NVML.Message, kernel))
	}
	if res.DriverVersion == "" {
		versions := files.Versions()
		if kernel != "" {
			res.DriverVersion, res.VersionSource = kernel, SourceKernelModule
		} else if len(versions) == 1 {
			res.DriverVersion, res.VersionSource = versions[0], SourceFileNames
		} else if l, ok := files.cacheTarget(h, "libcuda.so.1"); ok {
			res.DriverVersion, res.VersionSource = l.Version, SourceLoaderCache
		} else if len(versions) == 0 {
			return res.fail(ConditionDriverFilesNotFound, "no versioned driver library (%s.so.<version>) under the host root", strings.Join(RequiredLibraries, ".so.<version>, "))
		} else {
			return res.fail(ConditionDriverVersionAmbiguous, "driver files of versions %s and nothing tells which one runs (NVML: %s)", strings.Join(versions, ", "), res.NVML.State)
		}
	}
	cuda := ""
	if res.NVML.Facts != nil {
		cuda = res.NVML.Facts.CUDADriverVersion
	}
	if !opts.IgnoreRuntimeInjection {
		if ri := DetectRuntimeInjection(opts.HostRoot); ri.Kind != "" {
			// The runtime finds the files itself: mounting them again at
			// the same paths would break the container.
			files.Evidence = append(files.Evidence, ri.Evidence...)
			res.Notes = append(res.Notes, ri.Notes...)
			plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: res.DriverVersion, CUDADriverVersion: cuda, RuntimeInjection: ri.Kind, Mounts: []layout.Mount{}, LibraryPaths: []string{}}
			plan.LibraryPaths, res.Notes = allowedLibraryPaths(plan, ri.LibraryPaths, cfg, res.Notes)
			if errs := plan.Validate(cfg.Rules()); len(errs) > 0 {
				return res.fail(ConditionPlanInvalid, "%v", errs.ToAggregate())
			}
			sort.Strings(res.Notes)
			res.Condition, res.Plan = ConditionReady, &plan
			return res, nil
		}
	}
	if v := files.Versions(); !contains(v, res.DriverVersion) {
		if len(v) == 0 {
			return res.fail(ConditionDriverFilesNotFound, "the driver %s (from %s) has no library files under the host root", res.DriverVersion, res.VersionSource)
		}
		return res.fail(ConditionDriverVersionMismatch, "%s reports driver %s but the files under the host root are of %s", res.VersionSource, res.DriverVersion, strings.Join(v, ", "))
	}
	plan, notes, err := BuildPlan(files, res.DriverVersion, cuda, cfg)
	res.Notes = append(res.Notes, notes...)
	var pe *PlanError
	if errors.As(err, &pe) {
		return res.fail(pe.Condition, "%s", pe.Message)
	} else if err != nil {
		return res.fail(ConditionPlanInvalid, "%v", err)
	}
	sort.Strings(res.Notes)
	res.Condition, res.Plan = ConditionReady, &plan
	return res, nil
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
