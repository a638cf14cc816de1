package inject_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// honestCluster is 16 nodes of 8 GPUs publishing one layout, and one node
// of another layout that claims gpus GPUs and driver version liar.
func honestCluster(gpus int64, liar string) ([]corev1.Node, layout.Plan) {
	honest := gputest.Plan("550.54.15")
	var nodes []corev1.Node
	for i := range 16 {
		nodes = append(nodes, *gputest.Node(fmt.Sprintf("gpu-%02d", i), honest, 8, nil))
	}
	nodes = append(nodes, *gputest.Node("lying", gputest.Plan(liar), gpus, nil))
	return nodes, honest
}

// TestLyingNodeCannotSteer: a node can publish a layout of its own with any
// GPU count and driver version; an unconstrained GPU pod still goes to the
// layout the honest nodes publish, under every policy that ranks.
func TestLyingNodeCannotSteer(t *testing.T) {
	cases := map[string]struct {
		policy config.LayoutPolicy
		gpus   int64
		driver string
	}{
		"most GPUs, 256 claimed":      {config.LayoutPolicyMostGPUs, 256, "560.35.03"},
		"newest driver, 999.0 on one": {config.LayoutPolicyNewestDriver, 1, "999.0"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			cfg.LayoutPolicy = tc.policy
			nodes, honest := honestCluster(tc.gpus, tc.driver)
			layouts := clustertest.LayoutsOf(cfg, nodes)
			res := Mutate(Input{Pod: gputest.Pod("nvidia.com/gpu", nil), Layouts: layouts}, cfg)
			if res.Decision != DecisionInjected {
				t.Fatalf("decision %s: %s", res.Decision, res.Reason)
			}
			if res.Layout.Fingerprint != honest.Fingerprint() {
				t.Errorf("pinned to layout %s (driver %s), want the honest nodes' %s", res.Layout.Fingerprint, res.Layout.Plan.DriverVersion, honest.Fingerprint())
			}
		})
	}
}

// TestLoneLayoutStillServes: a layout one node publishes is used where no
// established layout fits the pod, as before.
func TestLoneLayoutStillServes(t *testing.T) {
	cfg := config.Default()
	nodes, _ := honestCluster(8, "560.35.03")
	layouts := clustertest.LayoutsOf(cfg, nodes)
	pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "lying"}
	})
	res := Mutate(Input{Pod: pod, Layouts: layouts}, cfg)
	if res.Decision != DecisionInjected || res.Layout.Plan.DriverVersion != "560.35.03" {
		t.Fatalf("decision %s: %s", res.Decision, res.Reason)
	}
}

// TestGPUsPerNodeBounded: among established layouts, a node weighs at most
// ranking.maxGPUsPerNode GPUs: three nodes claiming 256 each do not outweigh
// sixteen honest 8-GPU nodes (3 x 16 < 128).
func TestGPUsPerNodeBounded(t *testing.T) {
	cfg := config.Default()
	nodes, honest := honestCluster(256, "560.35.03")
	liar := gputest.Plan("560.35.03")
	for _, name := range []string{"lying-2", "lying-3"} {
		nodes = append(nodes, *gputest.Node(name, liar, 256, nil))
	}
	res := Mutate(Input{Pod: gputest.Pod("nvidia.com/gpu", nil), Layouts: clustertest.LayoutsOf(cfg, nodes)}, cfg)
	if res.Decision != DecisionInjected || res.Layout.Fingerprint != honest.Fingerprint() {
		t.Fatalf("decision %s (%s), want the honest nodes' layout %s", res.Decision, res.Reason, honest.Fingerprint())
	}
}
