//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-injector/gpu-injector/e2e/env"
)

// probeClient talks to the cluster with a node's probe token: the chart's
// probe service account, bound to a pod on that node.
func probeClient(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("failed to load %s: %v", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("failed to create a client: %v", err)
	}
	return cs
}

func mergePatch(t *testing.T, field string, kv map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{field: kv}})
	if err != nil {
		t.Fatalf("failed to encode patch: %v", err)
	}
	return b
}

// TestProbeNodeRestriction: the chart's ValidatingAdmissionPolicy, with the
// probe's real node-bound tokens. RBAC lets the probe patch any Node; the
// policy narrows that to its own Node and to gpu-injector.io/ keys.
func TestProbeNodeRestriction(t *testing.T) {
	self, other := testEnv.Node("ubuntu-k80"), testEnv.Node("centos-p100")
	probe := probeClient(t, self.ProbeKubeconfig())

	// A probe token bound to no pod carries no node-name claim.
	unbound := filepath.Join(t.TempDir(), "unbound.kubeconfig")
	if err := testEnv.TokenKubeconfig(testContext(t), testEnv.ProbeSA, nil, unbound); err != nil {
		t.Fatalf("failed to make an unbound token: %v", err)
	}

	for name, tc := range map[string]struct {
		client  kubernetes.Interface
		node    string
		field   string
		key     string
		allowed bool
		message string
	}{
		"own node, our label":             {client: probe, node: self.Name, field: "labels", key: "gpu-injector.io/e2e-policy", allowed: true},
		"own node, our annotation":        {client: probe, node: self.Name, field: "annotations", key: "gpu-injector.io/e2e-policy", allowed: true},
		"another node, our label":         {client: probe, node: other.Name, field: "labels", key: "gpu-injector.io/e2e-policy", message: "the gpu-injector probe may only change its own Node"},
		"own node, foreign label":         {client: probe, node: self.Name, field: "labels", key: "example.com/e2e-policy", message: "the gpu-injector probe may only change labels under gpu-injector.io/"},
		"own node, foreign annotation":    {client: probe, node: self.Name, field: "annotations", key: "e2e-policy", message: "the gpu-injector probe may only change annotations under gpu-injector.io/"},
		"own node, kubernetes.io label":   {client: probe, node: self.Name, field: "labels", key: "node-role.kubernetes.io/control-plane", message: "may only change labels under gpu-injector.io/"},
		"token bound to no pod, our node": {client: probeClient(t, unbound), node: self.Name, field: "labels", key: "gpu-injector.io/e2e-policy", message: "the gpu-injector probe may only change its own Node"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			_, err := tc.client.CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, mergePatch(t, tc.field, map[string]any{tc.key: "x"}), metav1.PatchOptions{})
			if tc.allowed {
				if err != nil {
					t.Fatalf("patch refused: %v", err)
				}
				// And it may take its own key away again.
				if _, err := tc.client.CoreV1().Nodes().Patch(ctx, tc.node, types.MergePatchType, mergePatch(t, tc.field, map[string]any{tc.key: nil}), metav1.PatchOptions{}); err != nil {
					t.Fatalf("removing the key was refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Cleanup(func() {
					_, _ = client().CoreV1().Nodes().Patch(context.Background(), tc.node, types.MergePatchType, mergePatch(t, tc.field, map[string]any{tc.key: nil}), metav1.PatchOptions{})
				})
				t.Fatalf("patch of %s %s on %s was allowed, want it denied", tc.field, tc.key, tc.node)
			}
			if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
				t.Errorf("error %v (%T), want Forbidden", err, err)
			}
			if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q, want the policy's message %q", err, tc.message)
			}
			n, err := client().CoreV1().Nodes().Get(ctx, tc.node, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("failed to get node: %v", err)
			}
			if _, ok := n.Labels[tc.key]; ok {
				t.Errorf("label %s reached node %s", tc.key, tc.node)
			}
			if _, ok := n.Annotations[tc.key]; ok {
				t.Errorf("annotation %s reached node %s", tc.key, tc.node)
			}
		})
	}
}

// TestProbeNodeRestrictionStatus: the policy on nodes/status, with the
// probe's real node-bound token: its own Node's GPUDriverWedged condition and
// nothing else of any Node's status.
func TestProbeNodeRestrictionStatus(t *testing.T) {
	self, other := testEnv.Node("ubuntu-k80"), testEnv.Node("centos-p100")
	probe := probeClient(t, self.ProbeKubeconfig())
	const (
		ownNode = "the gpu-injector probe may only change its own Node"
		status  = "the gpu-injector probe may only change the GPUDriverWedged condition of a Node's status"
	)
	// An admin takes away what a test put there; the probe of the node would
	// otherwise find the condition and keep it, as False.
	removeCondition := func(node string) {
		_, _ = client().CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType,
			[]byte(`{"status":{"conditions":[{"type":"GPUDriverWedged","$patch":"delete"}]}}`), metav1.PatchOptions{}, "status")
	}
	for name, tc := range map[string]struct {
		node    string
		patch   string
		message string // "": allowed
	}{
		"own node, the wedged condition": {node: self.Name,
			patch: `{"status":{"conditions":[{"type":"GPUDriverWedged","status":"False","reason":"E2EPolicy","message":"set by the e2e policy test"}]}}`},
		"another node, the wedged condition": {node: other.Name, message: ownNode,
			patch: `{"status":{"conditions":[{"type":"GPUDriverWedged","status":"False","reason":"E2EPolicy","message":"set by the e2e policy test"}]}}`},
		"own node, the kubelet's Ready condition": {node: self.Name, message: status,
			patch: `{"status":{"conditions":[{"type":"Ready","message":"changed by the e2e policy test"}]}}`},
		"own node, another status field": {node: self.Name, message: status,
			patch: `{"status":{"nodeInfo":{"bootID":"e2e-policy"}}}`},
		"own node, our label through the status": {node: self.Name, message: status,
			patch: `{"metadata":{"labels":{"gpu-injector.io/e2e-policy":"x"}}}`},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			t.Cleanup(func() { removeCondition(tc.node) })
			_, err := probe.CoreV1().Nodes().Patch(ctx, tc.node, types.StrategicMergePatchType, []byte(tc.patch), metav1.PatchOptions{}, "status")
			if tc.message == "" {
				if err != nil {
					t.Fatalf("status patch refused: %v", err)
				}
				n, err := client().CoreV1().Nodes().Get(ctx, tc.node, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, c := range n.Status.Conditions {
					found = found || c.Type == "GPUDriverWedged"
				}
				if !found {
					t.Errorf("the condition did not reach node %s: %+v", tc.node, n.Status.Conditions)
				}
				return
			}
			if err == nil {
				t.Fatalf("status patch %s on %s was allowed, want it denied", tc.patch, tc.node)
			}
			if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q, want the policy's message %q", err, tc.message)
			}
		})
	}
}

// TestChartServerDryRun: every object the chart renders with its defaults
// (in-cluster webhook Deployment, Service, PDB, probe DaemonSet, certificate
// Secret, RBAC, webhook configuration, policy, the install hook's Job and
// ConfigMap) passes a server-side dry-run
// apply on the suite's API server: schema, defaulting, validation and admission.
func TestChartServerDryRun(t *testing.T) {
	objs, err := env.RenderChart(testContext(t), testEnv.RepoRoot, testEnv.Helm)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		t.Run(fmt.Sprintf("%s %s", o.GetKind(), o.GetName()), func(t *testing.T) {
			if err := testEnv.Applier.Apply(testContext(t), o, true); err != nil {
				t.Fatal(err)
			}
		})
	}
	var missing []string
	for _, k := range []string{"Deployment", "DaemonSet", "PodDisruptionBudget", "Service", "ServiceAccount", "ClusterRole",
		"ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Secret", "MutatingWebhookConfiguration", "Job",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if !kinds[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the default render lacks %v; rendered kinds: %v", missing, kinds)
	}
}
