package gpunodes

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// TestPolicySwitch: the binding is open while every known GPU node delivers
// the driver at the runtime (the plugin's), closes within an interval of a
// node that only hostPath volumes serve or of a wedged driver, and opens when
// that node leaves; nothing is written before the index has listed the nodes,
// and a binding closed by an upgrade is opened again at the next resync.
func TestPolicySwitch(t *testing.T) {
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	const name = "gpu-injector-runtime"
	// As the chart renders it, with the API server's defaults.
	rendered := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name,
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: PolicyOffSelector(),
				ObjectSelector: &metav1.LabelSelector{}, MatchPolicy: ptr.To(admissionregistrationv1.Equivalent)}}}
	c := fake.NewClientBuilder().WithObjects(rendered.DeepCopy()).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	sw := NewPolicySwitch(cfg, idx, c, c, name, logr.Discard())
	sw.Clock = clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sw.Start(ctx) }()
	defer func() { cancel(); <-done }()

	read := func() *admissionregistrationv1.MutatingAdmissionPolicyBinding {
		b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	exists := func() bool {
		b := read()
		if b.Spec.PolicyName != name || b.Spec.MatchResources.ObjectSelector == nil || b.Spec.MatchResources.MatchPolicy == nil {
			t.Fatalf("the switch changed more than the namespaceSelector: %+v", b.Spec)
		}
		switch {
		case PolicyBindingOpen(b):
			return true
		case PolicyBindingClosed(b):
			return false
		}
		t.Fatalf("the binding is neither open nor closed: %+v", b.Spec.MatchResources.NamespaceSelector)
		return false
	}
	// await steps the clock one interval at a time until the binding is
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
		t.Fatalf("%s: the binding is open %v, want %v", what, exists(), want)
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

	if err := c.Update(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: read().ObjectMeta, Spec: rendered.Spec}); err != nil {
		t.Fatal(err)
	}
	clk.Step(sw.Resync)
	await("closed by an upgrade", true)

	wedged := func(n *corev1.Node) {
		nri(n)
		n.Labels[layout.LabelState] = layout.StateWedged
	}
	idx.Update(gputest.Node("gpu-1", plan, 8, wedged))
	await("the driver wedged", false)
	idx.Update(gputest.Node("gpu-1", plan, 8, nri))
	await("the driver answers again", true)
}

// TestPolicySwitchSet: no binding is nothing to switch (the API server serves
// no policy), and a selector the switch did not write is replaced by the
// wanted one, not taken for either.
func TestPolicySwitchSet(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default()
	sw := NewPolicySwitch(cfg, NewIndex(cfg, logr.Discard()), fake.NewClientBuilder().Build(), fake.NewClientBuilder().Build(), "gpu-injector-runtime", logr.Discard())
	if err := sw.Set(ctx, true); err != nil {
		t.Fatalf("no binding: %v", err)
	}

	edited := &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-runtime"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: "gpu-injector-runtime",
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}}}}
	for _, on := range []bool{false, true} {
		c := fake.NewClientBuilder().WithObjects(edited.DeepCopy()).Build()
		sw := NewPolicySwitch(cfg, NewIndex(cfg, logr.Discard()), c, c, "gpu-injector-runtime", logr.Discard())
		if err := sw.Set(ctx, on); err != nil {
			t.Fatal(err)
		}
		b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		if err := c.Get(ctx, types.NamespacedName{Name: "gpu-injector-runtime"}, b); err != nil {
			t.Fatal(err)
		}
		if got := PolicyBindingOpen(b); got != on || PolicyBindingClosed(b) == on {
			t.Errorf("set %v over an edited selector: the binding's selector is %+v", on, b.Spec.MatchResources.NamespaceSelector)
		}
	}
}
