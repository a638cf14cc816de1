package nriplugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nriplugin/stale"
)

// DefaultStaleDriverInterval is how often the plugin scans its node's GPU
// containers for deleted driver libraries: a driver upgrade is rare, and a
// pod on a deleted driver keeps running, so minutes are soon enough.
const DefaultStaleDriverInterval = time.Minute

// maxTracked bounds the GPU containers the plugin follows: a node has a few
// GPUs, each shared by a few containers at most.
const maxTracked = 4096

// staleScanner follows the node's running GPU containers as the runtime
// reports them through NRI (its list at registration, each start, each
// removal) and reads their processes' maps in the host's /proc.
type staleScanner struct {
	proc stale.Proc
	log  logr.Logger
	now  clock.PassiveClock

	mu   sync.Mutex
	ctrs map[string]*runningGPU

	gauges staleGauges
}

// runningGPU is one running GPU container: its first process, named for
// good by pid and start time.
type runningGPU struct {
	pod, name string
	pid       uint32
	start     uint64
}

type staleGauges struct {
	containers, staleContainers, stalePods, unreadable prometheus.Gauge
	pods                                               *prometheus.GaugeVec
}

func newStaleGauges(reg prometheus.Registerer) staleGauges {
	g := staleGauges{
		containers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpu_injector_stale_driver_scanned_containers",
			Help: "Running GPU containers on the node that the last stale driver scan read."}),
		staleContainers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpu_injector_stale_driver_containers",
			Help: "GPU containers on the node whose processes map a driver library deleted since they started: they run a driver the node no longer has."}),
		stalePods: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpu_injector_stale_driver_pods",
			Help: "Pods on the node with a GPU container on a deleted driver: restart them."}),
		unreadable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpu_injector_stale_driver_unreadable_containers",
			Help: "GPU containers whose processes' maps the plugin may not read (no ptrace-read access): unknown whether stale."}),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpu_injector_stale_driver_pod",
			Help: "1 for each pod (at most 20 per node) with a GPU container on a deleted driver."}, []string{"pod_namespace", "pod_name"}),
	}
	reg.MustRegister(g.containers, g.staleContainers, g.stalePods, g.unreadable, g.pods)
	return g
}

func (s *staleScanner) clock() time.Time { return wallclock.Or(s.now).Now() }

// track follows a container if it is a running GPU container: one with an
// NVIDIA GPU device (gpuDevice), whatever delivered its driver.
func (s *staleScanner) track(pod *api.PodSandbox, ctr *api.Container) {
	if gpu, _ := gpuDevice(ctr); !gpu || ctr.GetPid() == 0 {
		return
	}
	if ctr.GetState() == api.ContainerState_CONTAINER_STOPPED {
		return
	}
	start, err := s.proc.StartTime(ctr.GetPid())
	if err != nil {
		s.log.V(1).Info("not following a gpu container whose process cannot be read", "pod", pod.GetNamespace()+"/"+pod.GetName(),
			"container", ctr.GetName(), "pid", ctr.GetPid(), "error", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctrs == nil {
		s.ctrs = map[string]*runningGPU{}
	}
	if _, ok := s.ctrs[ctr.GetId()]; !ok && len(s.ctrs) >= maxTracked {
		return
	}
	s.ctrs[ctr.GetId()] = &runningGPU{pod: pod.GetNamespace() + "/" + pod.GetName(), name: ctr.GetName(), pid: ctr.GetPid(), start: start}
}

func (s *staleScanner) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ctrs, id)
}

// scan reads every followed container and returns the node's record; a
// container whose process is gone is forgotten.
func (s *staleScanner) scan() layout.StaleDriver {
	s.mu.Lock()
	ctrs := make(map[string]runningGPU, len(s.ctrs))
	for id, c := range s.ctrs {
		ctrs[id] = *c
	}
	s.mu.Unlock()

	rec := layout.StaleDriver{}
	var pods []string
	for id, c := range ctrs {
		f, err := s.proc.Scan(c.pid, c.start)
		if errors.Is(err, stale.ErrGone) {
			s.forget(id)
			continue
		}
		rec.Containers++
		if f.Unreadable != nil && !f.Stale() {
			rec.Unreadable++
			s.log.V(1).Info("cannot read a gpu container's maps", "pod", c.pod, "container", c.name, "error", f.Unreadable.Error())
			continue
		}
		if f.Stale() {
			rec.StaleContainers++
			if !slices.Contains(pods, c.pod) {
				pods = append(pods, c.pod)
			}
			s.log.Info("gpu container runs a deleted driver: restart its pod", "pod", c.pod, "container", c.name, "libraries", f.Deleted)
		}
	}
	slices.Sort(pods)
	rec.StalePods = len(pods)
	rec.Pods = pods[:min(len(pods), layout.MaxStalePods)]
	rec.CheckedAt = s.clock().UTC().Truncate(time.Second)
	s.setGauges(rec)
	return rec
}

func (s *staleScanner) setGauges(rec layout.StaleDriver) {
	g := s.gauges
	if g.pods == nil {
		return
	}
	g.containers.Set(float64(rec.Containers))
	g.staleContainers.Set(float64(rec.StaleContainers))
	g.stalePods.Set(float64(rec.StalePods))
	g.unreadable.Set(float64(rec.Unreadable))
	g.pods.Reset()
	for _, p := range rec.Pods {
		ns, name, _ := strings.Cut(p, "/")
		g.pods.WithLabelValues(ns, name).Set(1)
	}
}

// loop scans every interval until ctx ends, and hands each record to
// publish.
func (s *staleScanner) loop(ctx context.Context, interval time.Duration, publish func(layout.StaleDriver)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			publish(s.scan())
		}
	}
}
