// Package nriplugin is gpu-injector's NRI plugin: it runs beside the node
// probe and, when the container runtime creates a container that the webhook
// marked and that the kubelet gave a GPU, adds the node's driver mounts from
// the probe's current plan. Pod Security never sees those mounts, so GPU pods
// run in baseline namespaces. docs/runtime-injection.md is its reference page.
package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/cudareq"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// Results of CreateContainer, the values of the containers counter's label.
const (
	ResultUnmarked  = "unmarked"
	ResultBadMarker = "bad-marker"
	ResultNotListed = "not-listed"
	ResultNoGPU     = "no-gpu"
	// ResultNotGPUDevice is a container whose /dev/nvidia<N> is no GPU: a
	// block device (a raw block volume's devicePath) or another major.
	ResultNotGPUDevice   = "not-gpu-device"
	ResultNoLayout       = "no-layout"
	ResultRuntimeInjects = "runtime-injects"
	ResultTargetMounted  = "target-mounted"
	// ResultCUDAUnsatisfied and ResultCUDAInvalid are containers refused for
	// the NVIDIA_REQUIRE_* of their environment: the node's driver does not
	// satisfy it, or it cannot be read.
	ResultCUDAUnsatisfied = "cuda-unsatisfied"
	ResultCUDAInvalid     = "cuda-invalid"
	ResultInjected        = "injected"
)

// Results lists every result, so the counter shows each from the start.
var Results = []string{ResultUnmarked, ResultBadMarker, ResultNotListed, ResultNoGPU, ResultNotGPUDevice, ResultNoLayout,
	ResultRuntimeInjects, ResultTargetMounted, ResultCUDAUnsatisfied, ResultCUDAInvalid, ResultInjected}

// nvidiaMajor is the major number of the character devices of NVIDIA's
// kernel module, /dev/nvidia<N> and /dev/nvidiactl (the kernel's
// Documentation/admin-guide/devices.txt: 195 char, Nvidia graphics devices).
const nvidiaMajor = 195

// Mount options: those of a read-only hostPath volume as containerd's CRI
// gives it (rbind, rprivate, ro), plus nosuid and nodev, which a driver folder
// never needs. runc binds first and applies ro, nosuid and nodev in a
// remount, which works for a file as for a folder, but only on the mount it
// made: a mount below the host path (a filesystem mounted inside a driver
// folder) comes along with rbind as writable as it is on the host.
// So the driver is read-only all the way down in one of two ways:
//
//   - rro where the kernel has mount_setattr(2) (Linux 5.12): runc 1.1 and
//     later make every mount of the tree read-only, as containerd does for a
//     hostPath volume with recursiveReadOnly. A runtime that does not know
//     the option passes it to mount(2) as data, which a bind ignores: the
//     top stays read-only, as before;
//   - bind, not rbind, on older kernels: the container gets no mount from
//     below the host path at all. A driver whose files lie on such a mount
//     then lacks them, and fails to load, rather than be writable.
var (
	recursiveReadOnlyOptions = []string{"rbind", "rprivate", "ro", "rro", "nosuid", "nodev"}
	noSubmountOptions        = []string{"bind", "rprivate", "ro", "nosuid", "nodev"}
)

// envLibraryPath is the variable the plugin merges the plan's library
// folders into.
const envLibraryPath = "LD_LIBRARY_PATH"

// ErrNoLayout wraps the refusal of a marked GPU container while the node has
// no usable plan: the container is not created, and the kubelet retries.
var ErrNoLayout = errors.New("no usable driver layout on this node")

// Plugin holds what CreateContainer needs. It is safe for concurrent use.
type Plugin struct {
	// StateDir is the folder shared with the probe (statedir).
	StateDir string
	// Rules are the configuration's, the webhook's own: a plan that breaks
	// them is not used.
	Rules layout.Rules
	Log   logr.Logger
	// Count is called with each CreateContainer's result; nil counts nothing.
	Count func(result string)
	// LDLibraryPath is the configuration's ldLibraryPath: how the plan's
	// library folders join the container's LD_LIBRARY_PATH; empty means
	// Append.
	LDLibraryPath config.LDLibraryPath
	// RecursiveReadOnly mounts the driver with rro (KernelHasRecursiveReadOnly);
	// false binds it without what is mounted below.
	RecursiveReadOnly bool

	mu    sync.Mutex
	cache planCache
}

// planCache is the last LayoutFile read, kept while the file is unchanged.
type planCache struct {
	key fileKey
	loadedPlan
	err error
}

// loadedPlan is a usable plan with what each injection needs of it, worked
// out once per file version.
type loadedPlan struct {
	plan        *layout.Plan
	mounts      []*api.Mount
	fingerprint string
}

// fileKey tells one version of a file from another without reading it: the
// probe replaces the file by a rename, so a new version is a new inode.
type fileKey struct {
	ino   uint64
	size  int64
	mtime time.Time
}

// CreateContainer decides a container's driver mounts. It runs inside every
// container creation on the node, so the common case (an unmarked pod) costs
// one map lookup; it never fails a container over what a pod's author wrote,
// only when a marked GPU container would start without its driver, or with a
// driver its image says is too old for it.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	marker, ok := pod.GetAnnotations()[layout.AnnotationRuntimeInject]
	if !ok {
		p.count(ResultUnmarked)
		return nil, nil, nil
	}
	log := p.Log.WithValues("pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName())
	if result := markedGPU(log, marker, ctr); result != "" {
		p.count(result)
		return nil, nil, nil
	}
	lp, err := p.currentPlan()
	if err != nil {
		p.count(ResultNoLayout)
		log.Info("refusing to create a GPU container without its driver", "error", err.Error())
		return nil, nil, fmt.Errorf("gpu-injector: container %q of pod %s/%s was admitted for runtime injection of the NVIDIA driver, but %w; the kubelet retries",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	plan := lp.plan
	if plan.RuntimeInjection != "" {
		return p.nodeInjects(log, ctr, plan), nil, nil
	}
	if dst, m, hit := mountedTarget(ctr.GetMounts(), plan.Mounts); hit {
		log.Info("not injecting the driver: the container mounts a path of the plan already", "containerMount", dst, "planMount", m)
		p.count(ResultTargetMounted)
		return nil, nil, nil
	}
	if result, err := checkRequirements(ctr.GetEnv(), plan); err != nil {
		log.Info("refusing to create a GPU container over its CUDA requirement", "error", err.Error())
		p.count(result)
		return nil, nil, fmt.Errorf("gpu-injector: container %q of pod %s/%s %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	return p.inject(log, ctr, lp), nil, nil
}

// markedGPU says whether ctr is a GPU container that the runtime injection
// marker of its pod names: "" when it is, else the result to count, with
// why logged.
func markedGPU(log logr.Logger, marker string, ctr *api.Container) string {
	names, err := layout.ParseRuntimeMarker(marker)
	if err != nil {
		log.Info("ignoring a runtime injection marker that does not parse", "error", err.Error())
		return ResultBadMarker
	}
	if !slices.Contains(names, ctr.GetName()) {
		// A marked pod's GPU container the marker does not name was added
		// after gpu-injector's admission, by a later plugin.
		if gpu, _ := gpuDevice(ctr); gpu {
			log.Info("not injecting the driver: the runtime injection marker does not name this GPU container, which a plugin after gpu-injector's admission added", "marker", marker)
		}
		return ResultNotListed
	}
	// The marker is the pod author's word; a GPU device node is the kubelet's.
	if gpu, other := gpuDevice(ctr); !gpu {
		if other != nil {
			log.Info("not injecting the driver: the container's NVIDIA GPU device path holds another device",
				"device", other.GetPath(), "type", other.GetType(), "major", other.GetMajor(), "minor", other.GetMinor())
			return ResultNotGPUDevice
		}
		log.Info("not injecting the driver: the marker names a container that has no NVIDIA GPU device")
		return ResultNoGPU
	}
	return ""
}

// nodeInjects is the adjustment of a container on a node whose own runtime
// or device plugin mounts the driver: GKE's device plugin leaves
// LD_LIBRARY_PATH unset, so the plan's library folders (none for the toolkit
// or CDI) still join it.
func (p *Plugin) nodeInjects(log logr.Logger, ctr *api.Container, plan *layout.Plan) *api.ContainerAdjustment {
	log.V(1).Info("not injecting the driver: the node injects it already", "runtimeInjection", plan.RuntimeInjection)
	p.count(ResultRuntimeInjects)
	if libs, set := libraryPath(ctr.GetEnv(), plan.LibraryPaths, p.LDLibraryPath); set {
		adj := &api.ContainerAdjustment{}
		adj.AddEnv(envLibraryPath, libs)
		return adj
	}
	return nil
}

// inject is the adjustment that mounts the plan's driver into ctr and
// joins its library folders to LD_LIBRARY_PATH.
func (p *Plugin) inject(log logr.Logger, ctr *api.Container, lp loadedPlan) *api.ContainerAdjustment {
	plan, mounts := lp.plan, lp.mounts
	adj := &api.ContainerAdjustment{Mounts: make([]*api.Mount, len(mounts))}
	for i, m := range mounts {
		// A copy: the adjustment is marshalled while other calls use the plan.
		adj.Mounts[i] = &api.Mount{Source: m.Source, Destination: m.Destination, Type: m.Type, Options: m.Options}
	}
	libs, set := libraryPath(ctr.GetEnv(), plan.LibraryPaths, p.LDLibraryPath)
	if set {
		adj.AddEnv(envLibraryPath, libs)
	}
	log.V(1).Info("injecting the driver", "driverVersion", plan.DriverVersion, "fingerprint", lp.fingerprint, "mounts", len(mounts),
		"ldLibraryPath", libs)
	p.count(ResultInjected)
	return adj
}

// libraryPath is the container's LD_LIBRARY_PATH, from its whole
// environment as the runtime has it (the image's ENV, then the pod's env),
// with the plan's library folders merged as the webhook merges them into a
// pod's env: only those missing, after the container's own (Append) or before
// them (Prepend). ok is false when nothing changes, or with Off.
func libraryPath(env, libs []string, mode config.LDLibraryPath) (value string, ok bool) {
	if mode == config.LDLibraryPathOff || len(libs) == 0 {
		return "", false
	}
	old := ""
	for _, kv := range env {
		// containerd keeps one entry per name; should there be two, the
		// adjustment replaces the first.
		if v, found := strings.CutPrefix(kv, envLibraryPath+"="); found {
			old = v
			break
		}
	}
	have := strings.Split(old, ":")
	var missing []string
	for _, l := range libs {
		if !slices.Contains(have, l) && !slices.Contains(missing, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) == 0 {
		return "", false
	}
	add := strings.Join(missing, ":")
	switch {
	case old == "":
		return add, true
	case mode == config.LDLibraryPathPrepend:
		return add + ":" + old, true
	}
	return old + ":" + add, true
}

// checkRequirements refuses a container whose environment requires of the
// driver (NVIDIA_REQUIRE_CUDA and the other NVIDIA_REQUIRE_*) what the
// plan's driver does not offer, as NVIDIA's container toolkit does
// (cudareq). The error completes a sentence that names the container, and
// says what would let it run.
func checkRequirements(env []string, plan *layout.Plan) (result string, err error) {
	vars, _, err := cudareq.FromEnv(env)
	if err != nil {
		return ResultCUDAInvalid, fmt.Errorf("has more requirements of the driver than gpu-injector checks (%w); keep at most %d of them, or set %s=true to skip the check",
			err, cudareq.MaxVars, cudareq.EnvDisable)
	}
	node := cudareq.Node{Driver: plan.DriverVersion, CUDA: plan.CUDADriverVersion}
	cuda := plan.CUDADriverVersion
	if cuda == "" {
		cuda = "unknown"
	}
	for _, v := range vars {
		err := cudareq.Check(v.Value, node)
		if err == nil {
			continue
		}
		stated := fmt.Sprintf("%s=%q", v.Name, layout.Truncate(v.Value, 200))
		var unsatisfied *cudareq.UnsatisfiedError
		if !errors.As(err, &unsatisfied) {
			return ResultCUDAInvalid, fmt.Errorf("requires of the driver %s, which NVIDIA's container toolkit cannot read either: %w; correct it, or set %s=true to skip the check",
				stated, err, cudareq.EnvDisable)
		}
		where := fmt.Sprintf("select nodes by %s or %s", layout.LabelCUDADriverVersionNumber, layout.LabelDriverVersion)
		// Parse fails only over the size limit, where Check did already.
		req, _ := cudareq.Parse(v.Value)
		if gt, ok := req.AffinityGt(); ok {
			where = fmt.Sprintf("nodeAffinity %s Gt %d selects them", layout.LabelCUDADriverVersionNumber, gt)
		}
		return ResultCUDAUnsatisfied, fmt.Errorf("requires of the driver %s (%w), which this node's NVIDIA driver %s (CUDA %s) does not satisfy; run it on a node whose driver does (%s), or set %s=true to skip the check",
			stated, err, plan.DriverVersion, cuda, where, cudareq.EnvDisable)
	}
	return "", nil
}

func (p *Plugin) count(result string) {
	if p.Count != nil {
		p.Count(result)
	}
}

// gpuDevice reports whether the container has an NVIDIA GPU: a character
// device of NVIDIA's major at /dev/nvidia<N>, which only the kubelet puts
// there (a device plugin's Allocate answer, CDI or DRA). /dev/nvidiactl,
// /dev/nvidia-uvm and the like come with any driver installation and prove
// no GPU was allocated. A pod's author can put a raw block volume at that
// path (volumeDevices, which Pod Security's restricted level allows): other
// is the first device at such a path that is no GPU, when there is no GPU.
func gpuDevice(ctr *api.Container) (gpu bool, other *api.LinuxDevice) {
	for _, d := range ctr.GetLinux().GetDevices() {
		if !isGPUDevicePath(d.GetPath()) {
			continue
		}
		if d.GetType() == "c" && d.GetMajor() == nvidiaMajor {
			return true, nil
		}
		if other == nil {
			other = d
		}
	}
	return false, other
}

func isGPUDevicePath(p string) bool {
	const prefix = "/dev/nvidia"
	if len(p) <= len(prefix) || p[:len(prefix)] != prefix {
		return false
	}
	for _, c := range p[len(prefix):] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// mountedTarget finds a container mount that a plan mount would meet: the
// same destination, one inside a folder the plan mounts, or one that a plan
// mount lies inside (a hand-written hostPath of the driver folder). Two
// mounts there would shadow one another, so the container gets none of ours.
func mountedTarget(ctrMounts []*api.Mount, plan []layout.Mount) (string, string, bool) {
	for _, cm := range ctrMounts {
		d := path.Clean(cm.GetDestination())
		for _, m := range plan {
			if d == m.ContainerPath || under(m.ContainerPath, d) || (m.Kind == layout.KindDirectory && under(d, m.ContainerPath)) {
				return d, m.ContainerPath, true
			}
		}
	}
	return "", "", false
}

// under reports whether p lies strictly below folder dir.
func under(p, dir string) bool {
	if dir == "/" {
		return p != "/"
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}

// currentPlan returns the probe's plan and its mounts, read again only when
// the file changed: a stat per marked GPU container.
func (p *Plugin) currentPlan() (loadedPlan, error) {
	file := filepath.Join(p.StateDir, statedir.LayoutFile)
	st, err := os.Stat(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return loadedPlan{}, fmt.Errorf("%w: the probe has published no layout yet", ErrNoLayout)
		}
		return loadedPlan{}, fmt.Errorf("%w: failed to read the probe's layout: %w", ErrNoLayout, err)
	}
	key := fileKey{size: st.Size(), mtime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		key.ino = uint64(sys.Ino)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cache.key == key && key != (fileKey{}) {
		return p.cache.loadedPlan, p.cache.err
	}
	lp, err := p.loadPlan()
	if err != nil {
		p.Log.Info("the probe's layout is not usable", "error", err.Error())
	} else {
		p.Log.Info("loaded the probe's layout", "driverVersion", lp.plan.DriverVersion, "fingerprint", lp.fingerprint,
			"mounts", len(lp.mounts), "runtimeInjection", lp.plan.RuntimeInjection)
	}
	p.cache = planCache{key: key, loadedPlan: lp, err: err}
	return lp, err
}

func (p *Plugin) loadPlan() (loadedPlan, error) {
	plan, none, err := statedir.ReadLayout(p.StateDir)
	if err != nil {
		return loadedPlan{}, fmt.Errorf("%w: %w", ErrNoLayout, err)
	}
	if plan == nil {
		reason := none.State
		if none.Reason != "" {
			reason += ": " + none.Reason
		}
		return loadedPlan{}, fmt.Errorf("%w (state %s)", ErrNoLayout, layout.Truncate(reason, 512))
	}
	// The probe checked the plan with the same file, but the rules are the
	// trust boundary wherever a plan is used, as in the webhook.
	if errs := plan.Validate(p.Rules); len(errs) > 0 {
		return loadedPlan{}, fmt.Errorf("%w: the probe's layout breaks the host path rules: %w", ErrNoLayout, errs.ToAggregate())
	}
	options := noSubmountOptions
	if p.RecursiveReadOnly {
		options = recursiveReadOnlyOptions
	}
	mounts := make([]*api.Mount, len(plan.Mounts))
	for i, m := range plan.Mounts {
		mounts[i] = &api.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: options}
	}
	return loadedPlan{plan: plan, mounts: mounts, fingerprint: plan.Fingerprint()}, nil
}

// KernelHasRecursiveReadOnly reports whether the running kernel has
// mount_setattr(2), which the rro mount option needs: Linux 5.12, the test
// containerd makes before it offers recursive read-only mounts. The release
// is read rather than the call tried, since the plugin's seccomp profile may
// refuse a call the kernel has.
func KernelHasRecursiveReadOnly() (bool, string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, ""
	}
	release := unix.ByteSliceToString(u.Release[:])
	return kernelAtLeast(release, 5, 12), release
}

// kernelAtLeast reports whether a kernel release ("6.8.0-45-generic") is
// major.minor or later; false for one it cannot read.
func kernelAtLeast(release string, major, minor int) bool {
	ma, rest, _ := strings.Cut(release, ".")
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	x, err1 := strconv.Atoi(ma)
	y, err2 := strconv.Atoi(rest[:end])
	if err1 != nil || err2 != nil {
		return false
	}
	return x > major || x == major && y >= minor
}
