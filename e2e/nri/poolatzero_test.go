//go:build e2e

package nri

import (
	"context"
	"encoding/json"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-injector/gpu-injector/layout"
)

// poolLabel is the pool label of TestPoolAtZero, as an autoscaler's
// (karpenter.sh/nodepool) names the pool a node belongs to.
const poolLabel = "e2e.gpu-injector.io/pool"

// TestPoolAtZero: a GPU pod for a pool with no node yet, in a cluster whose
// GPU nodes run the plugin, is admitted (no denial: runtime injection needs
// nothing of the node), marked, with no pin and no LD_LIBRARY_PATH, and
// stays Pending. Then a node with the plugin joins the pool, and the pod
// runs there with its driver. The environment has one kubelet node: it joins
// the pool by taking the pool's label, as a node an autoscaler adds carries
// it from the start.
func TestPoolAtZero(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")
	pool := map[string]string{poolLabel: ns}
	p := cudaPod("pool-at-zero")
	p.Spec.NodeSelector = pool
	created := createInjected(t, ns, p)
	assertRuntimeInjected(t, created, "cuda")
	if !maps.Equal(created.Spec.NodeSelector, pool) {
		t.Errorf("nodeSelector %v, want the pod's own %v: runtime injection pins nothing", created.Spec.NodeSelector, pool)
	}
	for _, e := range created.Spec.Containers[0].Env {
		if e.Name == "LD_LIBRARY_PATH" {
			t.Errorf("LD_LIBRARY_PATH=%q in the pod's spec: the plugin sets it from the container's environment", e.Value)
		}
	}
	poll(t, apiTimeout, "pod "+created.Name+" to be unschedulable", func(ctx context.Context) (bool, error) {
		got, err := client().CoreV1().Pods(ns).Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return got.Status.Phase == corev1.PodPending, nil
			}
		}
		return false, nil
	})

	kn := testEnv.KubeletNode()
	labelNode(t, kn.Name, poolLabel, ns)
	t.Cleanup(func() { labelNode(t, kn.Name, poolLabel, "") })
	done := waitDone(t, ns, created.Name)
	log := podLog(t, ns, created.Name, "cuda")
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s:\n%s", done.Status.Phase, log)
	}
	if done.Spec.NodeName != kn.Name {
		t.Errorf("ran on %s, want %s", done.Spec.NodeName, kn.Name)
	}
	if n, err := client().CoreV1().Nodes().Get(context.Background(), kn.Name, metav1.GetOptions{}); err != nil || n.Labels[layout.LabelNRIPlugin] != layout.NRIProtocol {
		t.Errorf("node %s lost %s while the pod ran (%v)", kn.Name, layout.LabelNRIPlugin, err)
	}
	assertSawDriver(t, log, kn.DriverVersion)
}

// labelNode sets a label of a node, or removes it when value is empty.
func labelNode(t *testing.T, node, key, value string) {
	t.Helper()
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client().CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("failed to label node %s %s=%q: %v", node, key, value, err)
	}
}
