package inject_test

import (
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
)

// TestSpreadPolicy: the Spread policy picks layouts in proportion to their
// GPUs over many requests, and the same seed always picks the same one.
func TestSpreadPolicy(t *testing.T) {
	cfg := config.Default()
	cfg.LayoutPolicy = config.LayoutPolicySpread
	nodes := gputest.LoadNodes(t, "testdata/nodes.yaml")
	layouts := clustertest.LayoutsOf(cfg, nodes)
	gpus := map[string]int64{}
	var total int64
	for _, l := range layouts {
		gpus[l.Fingerprint] = l.AllocatableGPUs
	}
	counts := map[string]int{}
	const n = 3000
	for i := 0; i < n; i++ {
		pod := benchPod(func(p *corev1.Pod) {
			// Tolerate the GKE taint so all three layouts fit.
			p.Spec.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}
		})
		res := Mutate(Input{Pod: pod, Layouts: layouts, Seed: Seed(string(rune(i)) + "-uid")}, cfg)
		if res.Decision != DecisionInjected {
			t.Fatalf("decision %s: %s", res.Decision, res.Reason)
		}
		counts[res.Layout.Fingerprint]++
	}
	for _, g := range gpus {
		total += g
	}
	if len(counts) != len(gpus) {
		t.Fatalf("spread over %d layouts, want all %d: %v", len(counts), len(gpus), counts)
	}
	for fp, c := range counts {
		want := float64(n) * float64(gpus[fp]) / float64(total)
		if d := float64(c) - want; d > 0.2*want || d < -0.2*want {
			t.Errorf("layout %s got %d pods, want about %.0f (%d of %d GPUs)", fp, c, want, gpus[fp], total)
		}
	}
	// Deterministic for a given seed.
	a := Mutate(Input{Pod: benchPod(nil), Layouts: layouts, Seed: 42}, cfg)
	b := Mutate(Input{Pod: benchPod(nil), Layouts: layouts, Seed: 42}, cfg)
	if a.Layout.Fingerprint != b.Layout.Fingerprint {
		t.Errorf("same seed, different layouts")
	}
}
