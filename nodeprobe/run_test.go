package nodeprobe

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

func TestRunOnce(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := Run(context.Background(), []string{"--once", "--host-root", root, "-o", format, "--node-name", "gpu-1"}, &stdout, &stderr)
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, stderr.String())
			}
			var node NodeObject
			if err := yaml.UnmarshalStrict(stdout.Bytes(), &node); err != nil {
				t.Fatalf("output is not a Node: %v\n%s", err, stdout.String())
			}
			if node.APIVersion != "v1" || node.Kind != "Node" || node.Metadata.Name != "gpu-1" {
				t.Errorf("header %+v", node)
			}
			if node.Metadata.Labels[layout.LabelState] != layout.StateReady || node.Metadata.Labels[layout.LabelDriverVersion] != "580.159.04" {
				t.Errorf("labels %v", node.Metadata.Labels)
			}
			if node.Metadata.Annotations[AnnotationVersionSource] != string(SourceFileNames) {
				t.Errorf("the output does not say the version came from file names: %v", node.Metadata.Annotations)
			}
			p, err := layout.Decode(node.Metadata.Annotations[layout.AnnotationLayout])
			if err != nil {
				t.Fatal(err)
			}
			if p.Fingerprint() != node.Metadata.Labels[layout.LabelFingerprint] {
				t.Error("fingerprint label does not match the layout")
			}
			for k := range node.Metadata.Labels {
				if !strings.HasPrefix(k, layout.Prefix) {
					t.Errorf("foreign label %s", k)
				}
			}
		})
	}
}

func TestRunOnceNotReady(t *testing.T) {
	root, _ := buildRoot(t, "no-driver")
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), []string{"--once", "--host-root", root, "--node-name", "cpu-1"}, &stdout, &stderr)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), string(ConditionNoDriver)) {
		t.Fatalf("Run = %v, want ErrNotReady naming the condition", err)
	}
	if !strings.Contains(stdout.String(), "gpu-injector.io/state: no-driver") {
		t.Errorf("the no-driver state is not printed:\n%s", stdout.String())
	}
}

func TestRunFlagErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"unknown flag":       {"--nope"},
		"bad output":         {"--once", "-o", "xml"},
		"no node name":       {"--node-name="},
		"bad interval":       {"--once", "--interval", "0s"},
		"stray argument":     {"--once", "extra"},
		"malformed duration": {"--interval", "soon"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			err := Run(context.Background(), args, io.Discard, io.Discard)
			if !errors.Is(err, ErrUsage) {
				t.Errorf("Run(%q) = %v, want ErrUsage", args, err)
			}
		})
	}
	if err := Run(context.Background(), []string{"-h"}, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v, want flag.ErrHelp", err)
	}
	if err := Run(context.Background(), []string{"--once", "--config", "/does/not/exist"}, io.Discard, io.Discard); err == nil || errors.Is(err, ErrUsage) {
		t.Errorf("missing config = %v, want a plain error", err)
	}
}

func TestDaemonOnce(t *testing.T) {
	root, l := buildRoot(t, "gke-cos")
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gke-1"}})
	d := &daemon{
		opts:    &options{nodeName: "gke-1"},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: openWith(fakeNVML(l.DriverVersion, 12020, h100))},
		client:  c,
		log:     newLogger(io.Discard, 0),
		metrics: newMetrics(),
	}
	health := httptest.NewServer(d.healthMux())
	defer health.Close()
	status := func(p string) int {
		resp, err := http.Get(health.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status("/healthz") != 200 || status("/readyz") != 503 {
		t.Fatal("before the first probe: want healthy and not ready")
	}
	for range 3 {
		if err := d.once(context.Background(), d.log); err != nil {
			t.Fatal(err)
		}
	}
	if status("/readyz") != 200 {
		t.Error("not ready after a published probe")
	}
	metrics := httptest.NewServer(promHandler(d.metrics))
	defer metrics.Close()
	resp, err := http.Get(metrics.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"gpu_injector_probe_node_writes_total 1", "gpu_injector_probe_duration_seconds_count 3"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	node, _ := c.CoreV1().Nodes().Get(context.Background(), "gke-1", metav1.GetOptions{})
	if node.Labels[layout.LabelState] != layout.StateReady {
		t.Errorf("node labels %v", node.Labels)
	}
}

func TestDaemonRefusesASecondLibrary(t *testing.T) {
	d := &daemon{}
	dir := t.TempDir()
	// A folder is not a library: refused as unusable, and nothing is pinned.
	if _, err := d.openNVML(dir); err == nil || errors.Is(err, ErrNVMLReload) || d.nvmlPath != "" {
		t.Fatalf("openNVML(folder) = %v, pinned %q", err, d.nvmlPath)
	}
	d.nvmlPath = "/usr/lib/libnvidia-ml.so.575.57.08"
	if _, err := d.openNVML(dir); !errors.Is(err, ErrNVMLReload) {
		t.Errorf("openNVML of a different file = %v, want ErrNVMLReload", err)
	}
}

// TestDaemonLoop runs the real loop: one probe at start, one per SIGHUP,
// none in between with a long interval, and a clean stop.
func TestDaemonLoop(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	gets := func() int {
		n := 0
		for _, a := range c.Actions() {
			if a.GetVerb() == "get" {
				n++
			}
		}
		return n
	}
	d := &daemon{
		opts:    &options{nodeName: "gpu-1", interval: time.Hour, healthAddr: "127.0.0.1:0", metricsAddr: "0", hostRoot: root},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: noNVML},
		client:  c,
		log:     newLogger(io.Discard, 0),
		metrics: newMetrics(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	waitFor := func(what string, ok func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the first probe", func() bool { return d.ready.Load() && gets() == 1 })
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the SIGHUP probe", func() bool { return gets() == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run = %v", err)
	}
	if n := len(patches(c)); n != 1 {
		t.Errorf("%d patches for two equal probes, want 1", n)
	}
}

func TestHangLimit(t *testing.T) {
	for interval, want := range map[time.Duration]time.Duration{
		10 * time.Second: 2*time.Minute + 10*time.Second,
		time.Minute:      3 * time.Minute,
		5 * time.Minute:  15 * time.Minute,
	} {
		if got := hangLimit(interval); got != want {
			t.Errorf("hangLimit(%s) = %s, want %s", interval, got, want)
		}
	}
}

// TestDaemonHealthzFailsWhenAProbeHangs runs the real loop with an NVML that
// never returns from its open, as nvmlInit on a wedged GPU: /healthz must
// fail once the hang limit passes, and recover when the probe finishes.
func TestDaemonHealthzFailsWhenAProbeHangs(t *testing.T) {
	root, l := buildRoot(t, "usr-local-nvidia")
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var offset atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	var hangOnce sync.Once
	d := &daemon{
		opts: &options{nodeName: "gpu-1", interval: time.Minute, healthAddr: "0", metricsAddr: "0", hostRoot: root},
		probe: ProbeOptions{HostRoot: root, OpenNVML: func(string) (NVML, error) {
			hangOnce.Do(func() {
				close(entered)
				<-release
			})
			return fakeNVML(l.DriverVersion, 13000, h100), nil
		}},
		client:  c,
		log:     newLogger(io.Discard, 0),
		metrics: newMetrics(),
		now:     func() time.Time { return base.Add(time.Duration(offset.Load())) },
	}
	health := httptest.NewServer(d.healthMux())
	defer health.Close()
	get := func(p string) (int, string) {
		resp, err := http.Get(health.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz before start = %d, want 200", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-entered
	for at, want := range map[time.Duration]int{time.Minute: 200, 3 * time.Minute: 200, 3*time.Minute + time.Second: 503} {
		offset.Store(int64(at))
		if code, body := get("/healthz"); code != want {
			t.Errorf("healthz %s into a hung probe = %d %q, want %d", at, code, body, want)
		}
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Errorf("readyz during the first, hung probe = %d, want 503", code)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for !d.ready.Load() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the released probe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("healthz after the probe finished = %d %q, want 200", code, body)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("readyz after the probe published = %d, want 200", code)
	}
}

// TestDaemonLibraryVanishes: a libnvidia-ml removed between discovery and
// open yields a published state, not a probe error that keeps the old layout.
func TestDaemonLibraryVanishes(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	d := &daemon{}
	var opened string
	res, err := Probe(ProbeOptions{HostRoot: root, OpenNVML: func(p string) (NVML, error) {
		opened = p
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		return d.openNVML(p)
	}})
	if err != nil {
		t.Fatalf("Probe = %v, want a result", err)
	}
	if opened == "" || res.NVML.State != NVMLLibraryNotFound {
		t.Errorf("NVML state %q (%s) after %q vanished, want %s", res.NVML.State, res.NVML.Message, opened, NVMLLibraryNotFound)
	}
	if d.nvmlPath != "" {
		t.Errorf("a vanished library was pinned: %q", d.nvmlPath)
	}
	if _, err := Desired(res); err != nil {
		t.Errorf("Desired: %v", err)
	}
}
