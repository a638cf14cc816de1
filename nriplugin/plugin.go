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
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// Results of CreateContainer, the values of the containers counter's label.
const (
	ResultUnmarked       = "unmarked"
	ResultBadMarker      = "bad-marker"
	ResultNotListed      = "not-listed"
	ResultNoGPU          = "no-gpu"
	ResultNoLayout       = "no-layout"
	ResultRuntimeInjects = "runtime-injects"
	ResultTargetMounted  = "target-mounted"
	ResultInjected       = "injected"
)

// Results lists every result, so the counter shows each from the start.
var Results = []string{ResultUnmarked, ResultBadMarker, ResultNotListed, ResultNoGPU, ResultNoLayout,
	ResultRuntimeInjects, ResultTargetMounted, ResultInjected}

// mountOptions are those of a read-only hostPath volume as containerd's CRI
// gives it (rbind, rprivate, ro), plus nosuid and nodev: a driver folder
// needs neither. runc binds first and applies ro, nosuid and nodev in a
// remount, which works for a file as for a folder.
var mountOptions = []string{"rbind", "rprivate", "ro", "nosuid", "nodev"}

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
// only when a marked GPU container would start without its driver.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	marker, ok := pod.GetAnnotations()[layout.AnnotationRuntimeInject]
	if !ok {
		p.count(ResultUnmarked)
		return nil, nil, nil
	}
	log := p.Log.WithValues("pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName())
	names, err := layout.ParseRuntimeMarker(marker)
	if err != nil {
		log.Info("ignoring a runtime injection marker that does not parse", "error", err.Error())
		p.count(ResultBadMarker)
		return nil, nil, nil
	}
	listed := false
	for _, n := range names {
		if n == ctr.GetName() {
			listed = true
			break
		}
	}
	if !listed {
		p.count(ResultNotListed)
		return nil, nil, nil
	}
	// The marker is the pod author's word; a GPU device node is the kubelet's.
	if !hasGPUDevice(ctr) {
		log.Info("not injecting the driver: the marker names a container that has no NVIDIA GPU device")
		p.count(ResultNoGPU)
		return nil, nil, nil
	}
	lp, err := p.currentPlan()
	if err != nil {
		p.count(ResultNoLayout)
		log.Info("refusing to create a GPU container without its driver", "error", err.Error())
		return nil, nil, fmt.Errorf("gpu-injector: container %q of pod %s/%s was admitted for runtime injection of the NVIDIA driver, but %w; the kubelet retries",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	plan, mounts := lp.plan, lp.mounts
	if plan.RuntimeInjection != "" {
		log.V(1).Info("not injecting the driver: the node injects it already", "runtimeInjection", plan.RuntimeInjection)
		p.count(ResultRuntimeInjects)
		return nil, nil, nil
	}
	if dst, m, hit := mountedTarget(ctr.GetMounts(), plan.Mounts); hit {
		log.Info("not injecting the driver: the container mounts a path of the plan already", "containerMount", dst, "planMount", m)
		p.count(ResultTargetMounted)
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{Mounts: make([]*api.Mount, len(mounts))}
	for i, m := range mounts {
		// A copy: the adjustment is marshalled while other calls use the plan.
		adj.Mounts[i] = &api.Mount{Source: m.Source, Destination: m.Destination, Type: m.Type, Options: m.Options}
	}
	log.V(1).Info("injecting the driver", "driverVersion", plan.DriverVersion, "fingerprint", lp.fingerprint, "mounts", len(mounts))
	p.count(ResultInjected)
	return adj, nil, nil
}

func (p *Plugin) count(result string) {
	if p.Count != nil {
		p.Count(result)
	}
}

// hasGPUDevice reports whether the container has a /dev/nvidia<N> device,
// which only the kubelet puts there (a device plugin's Allocate answer, CDI
// or DRA): /dev/nvidiactl, /dev/nvidia-uvm and the like come with any driver
// installation and prove no GPU was allocated.
func hasGPUDevice(ctr *api.Container) bool {
	for _, d := range ctr.GetLinux().GetDevices() {
		if isGPUDevicePath(d.GetPath()) {
			return true
		}
	}
	return false
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
	mounts := make([]*api.Mount, len(plan.Mounts))
	for i, m := range plan.Mounts {
		mounts[i] = &api.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: mountOptions}
	}
	return loadedPlan{plan: plan, mounts: mounts, fingerprint: plan.Fingerprint()}, nil
}
