package nodeprobe

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

func TestDaemonWritesTheLayoutForThePlugin(t *testing.T) {
	root, l := buildRoot(t, "usr-local-nvidia")
	dir := t.TempDir()
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	d := &daemon{
		opts:    &Options{NodeName: "gpu-1", StateDir: dir},
		probe:   ProbeOptions{HostRoot: root, OpenNVML: openWith(fakeNVML(l.DriverVersion, 13000, h100))},
		client:  c,
		log:     nodeagent.NewLogger(io.Discard, 0),
		metrics: newMetrics(),
	}
	if err := d.once(context.Background(), d.log); err != nil {
		t.Fatal(err)
	}
	plan, _, err := statedir.ReadLayout(dir)
	if err != nil || plan == nil {
		t.Fatalf("ReadLayout = %v, %v", plan, err)
	}
	node, _ := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if published, _ := layout.Decode(node.Annotations[layout.AnnotationLayout]); !reflect.DeepEqual(*plan, published) {
		t.Errorf("layout.json %+v, the node's layout %+v", *plan, published)
	}
	st, err := os.Stat(filepath.Join(dir, statedir.LayoutFile))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("layout.json: %v, mode %v, want 0644", err, st.Mode())
	}

	// The driver is gone (an upgrade in progress): the plugin must not use the old plan.
	d.probe.HostRoot, _ = buildRoot(t, "no-driver")
	d.probe.OpenNVML = noNVML
	if err := d.once(context.Background(), d.log); err != nil {
		t.Fatal(err)
	}
	plan, none, err := statedir.ReadLayout(dir)
	if err != nil || plan != nil || none.State == layout.StateReady || none.State == "" || none.Reason == "" {
		t.Errorf("after the driver went: plan %v, record %+v, %v", plan, none, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the state folder holds %d entries, want layout.json alone (no temporary files)", len(entries))
	}

	// A probe that cannot publish a result (the driver library changed
	// under it) leaves no plan behind either.
	d.writeState(d.log, &Result{}, ErrNVMLReload)
	if plan, none, err := statedir.ReadLayout(dir); err != nil || plan != nil || none.State != layout.StateError {
		t.Errorf("after a reload: plan %v, record %+v, %v", plan, none, err)
	}
}

// TestDaemonPublishesThePluginLabel runs the real loop: the label follows
// the plugin's file, its heartbeat and its protocol, without a probe between.
func TestDaemonPublishesThePluginLabel(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	dir := t.TempDir()
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1",
		Labels: map[string]string{layout.LabelNRIPlugin: "v0", "kubernetes.io/hostname": "gpu-1"}}})
	// Heartbeats are judged on the daemon's clock, which stands still.
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	d := &daemon{
		opts:       &Options{NodeName: "gpu-1", Interval: time.Hour, HealthAddr: "0", MetricsAddr: "0", StateDir: dir},
		probe:      ProbeOptions{HostRoot: root, OpenNVML: noNVML},
		client:     c,
		log:        nodeagent.NewLogger(io.Discard, 0),
		metrics:    newMetrics(),
		pluginPoll: 10 * time.Millisecond,
		clock:      clk,
	}
	label := func() (string, bool) {
		n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels["kubernetes.io/hostname"] != "gpu-1" {
			t.Fatalf("a label that is not the probe's changed: %v", n.Labels)
		}
		v, ok := n.Labels[layout.LabelNRIPlugin]
		return v, ok
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	probes := func() uint64 {
		var m dto.Metric
		if err := d.metrics.duration.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	writePlugin := func(p statedir.Plugin) {
		t.Helper()
		if err := statedir.WritePlugin(dir, p); err != nil {
			t.Fatal(err)
		}
	}
	stopDaemon := startDaemonStoppable(t, d)
	defer func() { stopDaemon() }()
	// A label left by an earlier probe, with no plugin now, goes at the first probe.
	waitFor("the first probe", func() bool { _, ok := label(); return d.ready.Load() && !ok })
	before := probes()

	now := clk.Now().UTC()
	writePlugin(statedir.Plugin{Protocol: layout.NRIProtocol, RuntimeName: "containerd", RuntimeVersion: "v2.1.4", RegisteredAt: now, Heartbeat: now})
	waitFor("the label", func() bool { v, _ := label(); return v == layout.NRIProtocol })

	// A plugin killed without removing its file: the heartbeat goes stale.
	writePlugin(statedir.Plugin{Protocol: layout.NRIProtocol, RegisteredAt: now, Heartbeat: now.Add(-statedir.HeartbeatTimeout - time.Second)})
	waitFor("a stale heartbeat to remove the label", func() bool { _, ok := label(); return !ok })

	writePlugin(statedir.Plugin{Protocol: layout.NRIProtocol, RegisteredAt: now, Heartbeat: clk.Now().UTC()})
	waitFor("the label again", func() bool { _, ok := label(); return ok })

	// The plugin stopped: its file is gone.
	if err := statedir.RemovePlugin(dir); err != nil {
		t.Fatal(err)
	}
	waitFor("the label to go with the file", func() bool { _, ok := label(); return !ok })

	// Each change republished the last result; none probed again.
	if got := probes() - before; got != 0 {
		t.Errorf("%d probes after the first, want none", got)
	}

	// The probe stops while the plugin is registered: the label goes with it.
	writePlugin(statedir.Plugin{Protocol: layout.NRIProtocol, RegisteredAt: now, Heartbeat: clk.Now().UTC()})
	waitFor("the label before the stop", func() bool { _, ok := label(); return ok })
	stopDaemon()
	if _, ok := label(); ok {
		t.Error("the label outlived the probe")
	}

	// A plugin of another marker protocol serves pods this webhook does not mark.
	writePlugin(statedir.Plugin{Protocol: "v9", Heartbeat: clk.Now().UTC()})
	before = probes()
	stopDaemon = startDaemonStoppable(t, d)
	waitFor("the probe after the restart", func() bool { return probes() > before })
	time.Sleep(50 * time.Millisecond)
	if _, ok := label(); ok {
		t.Error("labelled for a plugin of another protocol")
	}
}

func TestPluginRecordRegistered(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		p    *statedir.Plugin
		want bool
	}{
		"none":            {nil, false},
		"fresh":           {&statedir.Plugin{Protocol: layout.NRIProtocol, Heartbeat: now.Add(-10 * time.Second)}, true},
		"stale":           {&statedir.Plugin{Protocol: layout.NRIProtocol, Heartbeat: now.Add(-31 * time.Second)}, false},
		"from the future": {&statedir.Plugin{Protocol: layout.NRIProtocol, Heartbeat: now.Add(time.Hour)}, false},
		"other protocol":  {&statedir.Plugin{Protocol: "v2", Heartbeat: now}, false},
	} {
		if got := tc.p.Registered(now); got != tc.want {
			t.Errorf("%s: Registered = %v, want %v", name, got, tc.want)
		}
	}
}

// startDaemonStoppable runs d's loop until the returned function is called
// (at most once; later calls do nothing).
func startDaemonStoppable(t *testing.T, d *daemon) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run = %v", err)
		}
	}
}
