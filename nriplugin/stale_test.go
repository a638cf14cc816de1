package nriplugin

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
	"github.com/gpu-injector/gpu-injector/nriplugin/stale"
)

// mapDriverLibrary maps a file named like a driver library into this test's
// own process, as a GPU program maps libcuda, and returns a function that
// deletes it, as a driver upgrade does. The kernel then writes the mapping
// with " (deleted)" in this process's maps: the test reads the real /proc.
func mapDriverLibrary(t *testing.T) (deleteFile func()) {
	t.Helper()
	name := filepath.Join(t.TempDir(), "libnvidia-ml.so.550.54.15")
	if err := os.WriteFile(name, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return func() {
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStaleDriverScan(t *testing.T) {
	dir := t.TempDir()
	m := newMetrics()
	s := &server{opts: &Options{StateDir: dir, ProcRoot: "/proc"}, log: logr.Discard(), metrics: m, plugin: &Plugin{StateDir: dir, Log: logr.Discard()}}
	s.stale = &staleScanner{proc: stale.Proc{Root: "/proc"}, log: logr.Discard(), gauges: newStaleGauges(m.registry)}
	h := &handler{s: s, runtimeName: "containerd", runtimeVersion: "2.4.2"}
	if mask, _ := h.Configure(context.Background(), "", "containerd", "2.4.2"); !mask.IsSet(api.Event_POST_START_CONTAINER) || !mask.IsSet(api.Event_REMOVE_CONTAINER) {
		t.Fatalf("subscribed to %s, not to container starts and removals", mask.PrettyString())
	}

	self := uint32(os.Getpid())
	gpu := gpuContainer("trainer")
	gpu.Pid, gpu.PodSandboxId, gpu.State = self, "sandbox", api.ContainerState_CONTAINER_RUNNING
	cpu := gpuContainer("sidecar", "/dev/null")
	cpu.Pid, cpu.PodSandboxId, cpu.State = self, "sandbox", api.ContainerState_CONTAINER_RUNNING
	other := &api.PodSandbox{Id: "other", Name: "web", Namespace: "shop"}
	cpuPod := gpuContainer("web", "/dev/null")
	cpuPod.Id, cpuPod.Pid, cpuPod.PodSandboxId = "c-shop", self, "other"

	deleteLibrary := mapDriverLibrary(t)
	if _, err := h.Synchronize(context.Background(), []*api.PodSandbox{pod(""), other}, []*api.Container{gpu, cpu, cpuPod}); err != nil {
		t.Fatal(err)
	}
	record := func() layout.StaleDriver {
		t.Helper()
		s.setStaleDriver(s.stale.scan())
		p, err := statedir.ReadPlugin(dir)
		if err != nil || p == nil || p.StaleDriver == nil {
			t.Fatalf("plugin file %+v, %v: no stale driver record", p, err)
		}
		rec := *p.StaleDriver
		rec.CheckedAt = rec.CheckedAt.UTC()
		return rec
	}
	if got, want := record(), (layout.StaleDriver{Containers: 1}); !reflect.DeepEqual(withoutTime(got), want) {
		t.Errorf("before the upgrade: %+v, want %+v", got, want)
	}

	deleteLibrary()
	want := layout.StaleDriver{Containers: 1, StaleContainers: 1, StalePods: 1, Pods: []string{"ml/train"}}
	if got := record(); !reflect.DeepEqual(withoutTime(got), want) {
		t.Errorf("after the upgrade: %+v, want %+v", got, want)
	}
	if v := gaugeValue(t, s.stale.gauges.stalePods); v != 1 {
		t.Errorf("stale pods gauge %v, want 1", v)
	}
	if v := gaugeValue(t, s.stale.gauges.pods.WithLabelValues("ml", "train")); v != 1 {
		t.Errorf("the pod's series %v, want 1", v)
	}

	// The container is removed (the pod restarted): no longer stale.
	if err := h.RemoveContainer(context.Background(), pod(""), gpu); err != nil {
		t.Fatal(err)
	}
	if got, want := record(), (layout.StaleDriver{}); !reflect.DeepEqual(withoutTime(got), want) {
		t.Errorf("after the restart: %+v, want %+v", got, want)
	}
	if n := countSeries(s.stale.gauges.pods); n != 0 {
		t.Errorf("%d pod series left, want none", n)
	}
}

func TestStaleDriverForgetsExitedProcess(t *testing.T) {
	root := t.TempDir()
	st := &staleScanner{proc: stale.Proc{Root: root}, log: logr.Discard()}
	pidDir := filepath.Join(root, "42")
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := "42 (python) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n"
	if err := os.WriteFile(filepath.Join(pidDir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pidDir, "maps"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := gpuContainer("trainer")
	c.Pid, c.State = 42, api.ContainerState_CONTAINER_RUNNING
	st.track(pod(""), c)
	if rec := st.scan(); rec.Containers != 1 {
		t.Fatalf("scanned %d containers, want 1", rec.Containers)
	}
	// The pid is reused by another process: the container is gone.
	if err := os.WriteFile(filepath.Join(pidDir, "stat"), []byte("42 (sh) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rec := st.scan(); rec.Containers != 0 || len(st.ctrs) != 0 {
		t.Errorf("scanned %d containers, following %d; want none", rec.Containers, len(st.ctrs))
	}
}

func withoutTime(r layout.StaleDriver) layout.StaleDriver {
	r.CheckedAt = time.Time{}
	return r
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func countSeries(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
