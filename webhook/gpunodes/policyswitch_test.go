package gpunodes

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// TestPolicySwitch: the switch's ConfigMap exists while every known GPU node
// delivers the driver at the runtime (none at all, the plugin's, the
// toolkit's), goes within an interval of a node that only hostPath volumes
// serve, and comes back when that node leaves; nothing is written before the
// index has listed the nodes, and a ConfigMap deleted by hand is put back at
// the next resync.
func TestPolicySwitch(t *testing.T) {
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	c := fake.NewClientBuilder().Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	sw := NewPolicySwitch(cfg, idx, c, c, "gpu-injector", "gpu-injector-policy", logr.Discard())
	sw.Clock = clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sw.Start(ctx) }()
	defer func() { cancel(); <-done }()

	exists := func() bool {
		err := c.Get(ctx, types.NamespacedName{Namespace: "gpu-injector", Name: "gpu-injector-policy"}, &corev1.ConfigMap{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	// await steps the clock one interval at a time until the ConfigMap is
	// as wanted, or fails after a few intervals.
	await := func(what string, want bool) {
		t.Helper()
		for i := 0; i < 200; i++ {
			if exists() == want {
				return
			}
			if clk.HasWaiters() {
				clk.Step(sw.Interval)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s: the switch's ConfigMap exists %v, want %v", what, exists(), want)
	}

	time.Sleep(50 * time.Millisecond)
	if exists() {
		t.Fatal("the switch is on before the index listed the nodes")
	}
	nri := func(n *corev1.Node) { n.Labels[layout.LabelNRIPlugin] = layout.NRIProtocol }
	plan := gputest.Plan("580.95.05")
	if err := NewNodeStore(idx).Replace([]any{gputest.Node("gpu-1", plan, 8, nri)}, "1"); err != nil {
		t.Fatal(err)
	}
	await("the plugin's nodes", true)

	idx.Update(gputest.Node("rhel-1", gputest.Plan("550.54.15"), 8, nil))
	await("a node that only hostPath volumes serve", false)

	idx.Delete("rhel-1")
	await("that node gone", true)

	if err := c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-injector", Name: "gpu-injector-policy"}}); err != nil {
		t.Fatal(err)
	}
	clk.Step(sw.Resync)
	await("deleted by hand", true)

	wedged := func(n *corev1.Node) {
		nri(n)
		n.Labels[layout.LabelState] = layout.StateWedged
	}
	idx.Update(gputest.Node("gpu-1", plan, 8, wedged))
	await("the driver wedged", false)
	idx.Update(gputest.Node("gpu-1", plan, 8, nri))
	await("the driver answers again", true)
}

// TestPolicySwitchOff: a switch kept off deletes a ConfigMap an earlier
// release left, before the index has listed a node, and never creates one,
// even where every node takes the driver at the runtime.
func TestPolicySwitchOff(t *testing.T) {
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	key := types.NamespacedName{Namespace: "gpu-injector", Name: "gpu-injector-policy"}
	left := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	c := fake.NewClientBuilder().WithObjects(left).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	sw := NewPolicySwitch(cfg, idx, c, c, key.Namespace, key.Name, logr.Discard())
	sw.Clock, sw.Off = clk, true
	if sw.NeedLeaderElection() {
		t.Error("a switch kept off waits for a Lease: a replica that loses one exits")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sw.Start(ctx) }()
	defer func() { cancel(); <-done }()
	exists := func() bool {
		err := c.Get(ctx, key, &corev1.ConfigMap{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	for i := 0; exists(); i++ {
		if i == 200 {
			t.Fatal("the ConfigMap an earlier release left is still there")
		}
		time.Sleep(5 * time.Millisecond)
	}
	nri := func(n *corev1.Node) { n.Labels[layout.LabelNRIPlugin] = layout.NRIProtocol }
	if err := NewNodeStore(idx).Replace([]any{gputest.Node("gpu-1", gputest.Plan("580.95.05"), 8, nri)}, "1"); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if clk.HasWaiters() {
			clk.Step(sw.Resync)
		}
		time.Sleep(5 * time.Millisecond)
		if exists() {
			t.Fatal("a switch kept off turned on")
		}
	}
}
