package nodeprobe

import (
	"context"
	"io"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

func TestDaemonPublishesTheStaleDriverRecord(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	dir := t.TempDir()
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
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
	annotation := func() (layout.StaleDriver, bool) {
		t.Helper()
		n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := n.Annotations[layout.AnnotationStaleDriver]
		if !ok {
			return layout.StaleDriver{}, false
		}
		s, err := layout.DecodeStaleDriver(v)
		if err != nil {
			t.Fatalf("the annotation does not decode: %v", err)
		}
		return s, true
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
	write := func(s *layout.StaleDriver, heartbeat time.Time) {
		t.Helper()
		if err := statedir.WritePlugin(dir, statedir.Plugin{Protocol: layout.NRIProtocol, RegisteredAt: heartbeat, Heartbeat: heartbeat, StaleDriver: s}); err != nil {
			t.Fatal(err)
		}
	}
	stop := startDaemonStoppable(t, d)
	defer func() { stop() }()
	waitFor("the first probe", d.ready.Load)

	stale := &layout.StaleDriver{Containers: 2, StaleContainers: 1, StalePods: 1, Pods: []string{"ml/train"}}
	write(stale, clk.Now().UTC())
	waitFor("the stale pod on the node", func() bool { s, ok := annotation(); return ok && s.StalePods == 1 && s.Pods[0] == "ml/train" })

	write(&layout.StaleDriver{Containers: 1}, clk.Now().UTC())
	waitFor("the restarted pod gone from the node", func() bool { s, ok := annotation(); return ok && s.StalePods == 0 && s.Containers == 1 })

	// A plugin that stopped says nothing true any longer.
	write(stale, clk.Now().UTC().Add(-statedir.HeartbeatTimeout-time.Second))
	waitFor("the annotation to go with the plugin", func() bool { _, ok := annotation(); return !ok })
}
