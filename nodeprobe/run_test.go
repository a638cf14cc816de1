package nodeprobe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
)

func TestRunOnce(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := Once(Options{NodeName: "gpu-1", Probe: ProbeOptions{HostRoot: root}, Log: nodeagent.NewLogger(&stderr, 0)}, format, &stdout)
			if err != nil {
				t.Fatalf("Once: %v\n%s", err, stderr.String())
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
	err := Once(Options{NodeName: "cpu-1", Probe: ProbeOptions{HostRoot: root}, Log: nodeagent.NewLogger(&stderr, 0)}, "yaml", &stdout)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), string(ConditionNoDriver)) {
		t.Fatalf("Once = %v, want ErrNotReady naming the condition", err)
	}
	if !strings.Contains(stdout.String(), "gpu-injector.io/state: no-driver") {
		t.Errorf("the no-driver state is not printed:\n%s", stdout.String())
	}
}

func TestDaemonOnce(t *testing.T) {
	root, l := buildRoot(t, "gke-cos")
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gke-1"}})
	d := &daemon{
		opts:    &Options{NodeName: "gke-1"},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: openWith(fakeNVML(l.DriverVersion, 12020, h100))},
		client:  c,
		log:     nodeagent.NewLogger(io.Discard, 0),
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
		opts:    &Options{NodeName: "gpu-1", Interval: time.Hour, HealthAddr: "127.0.0.1:0", MetricsAddr: "0"},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: noNVML},
		client:  c,
		log:     nodeagent.NewLogger(io.Discard, 0),
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
	for _, tc := range []struct {
		interval, nvml, want time.Duration
	}{
		{10 * time.Second, DefaultNVMLTimeout, 2*time.Minute + 40*time.Second},
		{time.Minute, DefaultNVMLTimeout, 3*time.Minute + 30*time.Second},
		{5 * time.Minute, DefaultNVMLTimeout, 15 * time.Minute},
		{5 * time.Minute, 10 * time.Minute, 17 * time.Minute},
	} {
		if got := hangLimit(tc.interval, tc.nvml); got != tc.want {
			t.Errorf("hangLimit(%s, %s) = %s, want %s", tc.interval, tc.nvml, got, tc.want)
		}
	}
}

// TestDaemonHealthzFailsWhenAProbeHangs runs the real loop with an API
// server that never answers the probe's GET: /healthz must fail once the hang
// limit passes, and recover when the probe finishes.
func TestDaemonHealthzFailsWhenAProbeHangs(t *testing.T) {
	root, l := buildRoot(t, "usr-local-nvidia")
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	entered, release := make(chan struct{}), make(chan struct{})
	var hangOnce sync.Once
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		hangOnce.Do(func() {
			close(entered)
			<-release
		})
		return false, nil, nil
	})
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fake := clocktesting.NewFakePassiveClock(base)
	d := &daemon{
		opts:    &Options{NodeName: "gpu-1", Interval: time.Minute, HealthAddr: "0", MetricsAddr: "0"},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: openWith(fakeNVML(l.DriverVersion, 13000, h100))},
		client:  c,
		log:     nodeagent.NewLogger(io.Discard, 0),
		metrics: newMetrics(),
		clock:   fake,
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
	limit := hangLimit(time.Minute, DefaultNVMLTimeout)
	for at, want := range map[time.Duration]int{time.Minute: 200, limit: 200, limit + time.Second: 503} {
		fake.SetTime(base.Add(at))
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

// wedgeDaemon is a daemon on a fake usr-local-nvidia root whose NVML blocks
// in nvmlInit until release, with a short NVML limit.
func wedgeDaemon(t *testing.T, c *fake.Clientset, timeout time.Duration) (d *daemon, inits *atomic.Int32, release func()) {
	t.Helper()
	root, _ := buildRoot(t, "usr-local-nvidia")
	lib, inits, release := blockingNVML(t, "nvmlInit")
	d = &daemon{
		opts:    &Options{NodeName: "gpu-1", Interval: time.Hour, HealthAddr: "0", MetricsAddr: "0"},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: openWith(lib), NVMLWatch: &NVMLWatch{Timeout: timeout}},
		client:  c,
		log:     nodeagent.NewLogger(io.Discard, 0),
		metrics: newMetrics(),
	}
	return d, inits, release
}

func startDaemon(t *testing.T, d *daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run = %v", err)
		}
	})
}

func waitNode(t *testing.T, c *fake.Clientset, what string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
		if err == nil && ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; node labels %v, conditions %v", what, n.Labels, n.Status.Conditions)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wedgedCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == NodeConditionDriverWedged {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestDaemonMarksAWedgedDriver runs the real loop against an NVML whose
// nvmlInit never returns: within the NVML limit the node is wedged (state,
// reason, condition) while /healthz stays ok, so the liveness probe has no
// reason to restart the container; further probes make no second call; when
// the call returns the loop probes at once and the mark clears.
func TestDaemonMarksAWedgedDriver(t *testing.T) {
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	d, inits, release := wedgeDaemon(t, c, 100*time.Millisecond)
	health := httptest.NewServer(d.healthMux())
	defer health.Close()
	start := time.Now()
	startDaemon(t, d)

	n := waitNode(t, c, "the wedged state", func(n *corev1.Node) bool { return n.Labels[layout.LabelState] == layout.StateWedged })
	t.Logf("marked %s after the start, NVML limit 100ms", time.Since(start).Round(time.Millisecond))
	if r := n.Annotations[layout.AnnotationStateReason]; !strings.HasPrefix(r, "DriverWedged: NVML does not answer: nvmlInit has not returned within 100ms") {
		t.Errorf("state-reason %q", r)
	}
	if _, ok := n.Labels[layout.LabelFingerprint]; ok {
		t.Errorf("a wedged node keeps its fingerprint: %v", n.Labels)
	}
	if _, ok := n.Annotations[layout.AnnotationLayout]; ok {
		t.Error("a wedged node keeps its layout")
	}
	cond := wedgedCondition(n)
	if cond == nil || cond.Status != corev1.ConditionTrue || cond.Reason != string(ConditionDriverWedged) || !strings.Contains(cond.Message, "nvmlInit") {
		t.Errorf("condition %+v, want %s True with reason %s", cond, NodeConditionDriverWedged, ConditionDriverWedged)
	}
	if len(n.Status.Conditions) != 2 || !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
	}) {
		t.Errorf("the kubelet's conditions changed: %+v", n.Status.Conditions)
	}
	resp, err := http.Get(health.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !d.ready.Load() {
		t.Errorf("healthz %d, ready %v while wedged: want a live, ready probe that reports the wedge", resp.StatusCode, d.ready.Load())
	}
	metrics := httptest.NewServer(promHandler(d.metrics))
	defer metrics.Close()
	if body := httpBody(t, metrics.URL); !strings.Contains(body, "gpu_injector_probe_driver_wedged 1") {
		t.Error("metrics lack gpu_injector_probe_driver_wedged 1")
	}

	// Probes during the wedge: no second nvmlInit, no write.
	writes := len(patches(c))
	waitFor := func(what string, ok func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	gets := func() int {
		n := 0
		for _, a := range c.Actions() {
			if a.GetVerb() == "get" {
				n++
			}
		}
		return n
	}
	// Counted before the signal: the probe it asks for may come before this
	// goroutine runs again.
	before := gets()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the SIGHUP probe", func() bool { return gets() > before })
	if inits.Load() != 1 || len(patches(c)) != writes {
		t.Errorf("during the wedge: %d nvmlInit calls (want 1), %d writes (want %d)", inits.Load(), len(patches(c)), writes)
	}

	release()
	n = waitNode(t, c, "the mark to clear", func(n *corev1.Node) bool { return n.Labels[layout.LabelState] == layout.StateReady })
	if cond := wedgedCondition(n); cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != ReasonDriverAnswers {
		t.Errorf("condition after recovery %+v, want False with reason %s", cond, ReasonDriverAnswers)
	}
	if _, ok := n.Annotations[layout.AnnotationStateReason]; ok || n.Labels[layout.LabelFingerprint] == "" {
		t.Errorf("after recovery: labels %v annotations %v", n.Labels, n.Annotations)
	}
	waitFor("the gauge to drop", func() bool { return strings.Contains(httpBody(t, metrics.URL), "gpu_injector_probe_driver_wedged 0") })
}

// TestDaemonRestartKeepsTheMark: a probe restarted (liveness, eviction, a
// new pod) on a node whose driver is still wedged never publishes anything
// but the wedged state: the mark goes only when NVML answers.
func TestDaemonRestartKeepsTheMark(t *testing.T) {
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	first, _, _ := wedgeDaemon(t, c, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.run(ctx) }()
	waitNode(t, c, "the wedged state", func(n *corev1.Node) bool { return n.Labels[layout.LabelState] == layout.StateWedged })
	cancel()
	<-done
	marked := len(patches(c))

	second, inits, _ := wedgeDaemon(t, c, 50*time.Millisecond)
	startDaemon(t, second)
	deadline := time.Now().Add(10 * time.Second)
	for !second.ready.Load() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the restarted probe to publish")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if inits.Load() != 1 {
		t.Errorf("the restarted probe called nvmlInit %d times, want 1", inits.Load())
	}
	for _, p := range patches(c)[marked:] {
		if strings.Contains(string(p.GetPatch()), `"`+layout.LabelState+`"`) || strings.Contains(string(p.GetPatch()), `"False"`) {
			t.Errorf("the restarted probe, with NVML still hung, wrote %s", p.GetPatch())
		}
	}
	n, _ := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if n.Labels[layout.LabelState] != layout.StateWedged {
		t.Errorf("state %q after a restart on a wedged driver, want %s", n.Labels[layout.LabelState], layout.StateWedged)
	}
	if cond := wedgedCondition(n); cond == nil || cond.Status != corev1.ConditionTrue {
		t.Errorf("condition %+v after a restart on a wedged driver, want True", cond)
	}
}

func httpBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
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
