//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/precheck"
	"github.com/gpu-injector/gpu-injector/status"
)

// gpuInjectorPrecheck runs `gpu-injector precheck` as a user does and
// returns its output and exit status.
func gpuInjectorPrecheck(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return gpuInjector(t, append([]string{"precheck"}, args...)...)
}

// precheckReport is `gpu-injector precheck -o json`'s report and exit
// status.
func precheckReport(t *testing.T, args ...string) (*precheck.Report, int) {
	t.Helper()
	return jsonReport[precheck.Report](t, append([]string{"precheck"}, args...)...)
}

// pluginNode labels an API-only node whose layout no other node publishes
// as the probe does once gpu-injector's NRI plugin registers (the suite's
// runtime has no NRI), so that the webhook's index sees a layout all of
// whose nodes run the plugin; the label goes when the test ends. The other
// node returned has a layout of mounts too, and no plugin: hostPath
// delivery. That node's probe removes the label at its next interval, as
// it owns the key: relabel puts it back, before each look.
func pluginNode(t *testing.T) (plugin, hostPath string, relabel func()) {
	t.Helper()
	count := map[string]int{}
	fps := map[string]string{}
	mounts := map[string]bool{}
	for _, n := range testEnv.Nodes {
		fps[n.Name] = currentFingerprint(t, n.Name)
		count[fps[n.Name]]++
		plan, err := layout.Decode(nodeAnnotation(t, n.Name, layout.AnnotationLayout))
		mounts[n.Name] = err == nil && plan.RuntimeInjection == ""
	}
	for _, n := range testEnv.Nodes {
		switch {
		case !mounts[n.Name]:
		case plugin == "" && !n.Kubelet && count[fps[n.Name]] == 1:
			plugin = n.Name
		case hostPath == "":
			hostPath = n.Name
		}
	}
	if plugin == "" || hostPath == "" {
		t.Fatalf("no API-only node with a layout of mounts of its own, and another with mounts, among %v", fps)
	}
	label := func(value any) {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{layout.LabelNRIPlugin: value}}})
		if _, err := client().CoreV1().Nodes().Patch(testContext(t), plugin, "application/merge-patch+json", b, metav1.PatchOptions{}); err != nil {
			t.Fatalf("failed to label %s: %v", plugin, err)
		}
	}
	t.Cleanup(func() { label(nil) })
	return plugin, hostPath, func() { label(layout.NRIProtocol) }
}

// TestPrecheck: `gpu-injector precheck` against the suite's cluster says
// how each GPU node delivers the driver (the NRI plugin on the node that
// has it, hostPath volumes on one without), that the API server reaches the
// webhook (a dry-run GPU pod came back injected), and flags a namespace
// whose Pod Security level refuses the hostPath volumes, with exit status 3;
// from `kubectl get nodes,ns -o yaml` it says the same offline; with the
// webhook scaled to zero it says the API server cannot reach it.
func TestPrecheck(t *testing.T) {
	ns := newNamespace(t, true)
	plugin, hostPath, relabel := pluginNode(t)
	baseline := newNamespace(t, true)
	patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"baseline"}}}`
	if _, err := client().CoreV1().Namespaces().Patch(testContext(t), baseline, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("failed to label %s baseline: %v", baseline, err)
	}
	online := []string{"--kubeconfig", testEnv.Kubeconfig, "--dry-run-namespace", ns}

	var live *precheck.Report
	t.Run("online", func(t *testing.T) {
		relabel()
		out, errOut, code := gpuInjectorPrecheck(t, online...)
		t.Logf("gpu-injector precheck (exit %d):\n%s", code, out)
		if code != status.ExitAttention {
			t.Errorf("exit %d, want %d (the baseline namespace); stderr:\n%s", code, status.ExitAttention, errOut)
		}
		for _, w := range []string{"CONFIGURATION  the release's ConfigMap in " + env.Namespace, "GPU NODES", "DEVICE PLUGIN", "WEBHOOK        ok: a dry-run GPU pod in " + ns, "OPTED-IN NAMESPACES", baseline, "NEEDS ATTENTION"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q", w)
			}
		}
		relabel()
		live, _ = precheckReport(t, online...)
		checkPrecheck(t, live, plugin, hostPath, baseline)
		if live.Webhook.Outcome != precheck.WebhookOK || live.Webhook.DryRun == nil || live.Webhook.DryRun.Namespace != ns {
			t.Errorf("webhook %+v, want the dry run in %s injected", live.Webhook, ns)
		}
	})

	t.Run("offline", func(t *testing.T) {
		if live == nil {
			t.Skip("the online check failed")
		}
		relabel()
		nodesAndNamespaces, errOut, err := kubectl(t, "", "get", "nodes,ns", "-o", "yaml")
		if err != nil {
			t.Fatalf("kubectl get nodes,ns: %v\n%s", err, errOut)
		}
		file := filepath.Join(t.TempDir(), "nodes-and-namespaces.yaml")
		if err := os.WriteFile(file, []byte(nodesAndNamespaces), 0o644); err != nil {
			t.Fatal(err)
		}
		r, code := precheckReport(t, "-f", file, "--config", testEnv.ConfigFile, "--namespace", env.Namespace)
		if code != status.ExitAttention || r.Webhook.Outcome != precheck.WebhookSkipped || !r.Offline {
			t.Errorf("exit %d, webhook %+v; want 3 and the webhook skipped offline", code, r.Webhook)
		}
		checkPrecheck(t, r, plugin, hostPath, baseline)
		for i, n := range r.Nodes {
			if i >= len(live.Nodes) || live.Nodes[i].Name != n.Name || live.Nodes[i].Delivery != n.Delivery {
				t.Errorf("offline node %s delivers %s; online said %+v", n.Name, n.Delivery, live.Nodes)
			}
		}
	})

	t.Run("webhook scaled to zero", func(t *testing.T) {
		if err := testEnv.StopWebhook(); err != nil {
			t.Fatalf("failed to stop the webhook: %v", err)
		}
		t.Cleanup(func() {
			if err := testEnv.StartWebhook(testContext(t)); err != nil {
				t.Errorf("failed to restart the webhook: %v", err)
			}
		})
		r, code := precheckReport(t, online...)
		if code != status.ExitAttention || r.Webhook.Outcome != precheck.WebhookFailed || !strings.Contains(r.Webhook.Message, "the API server CANNOT REACH the webhook") {
			t.Errorf("exit %d, webhook %+v; want 3 and the API server's message", code, r.Webhook)
		}
		if !slices.ContainsFunc(r.Attention, func(a string) bool { return strings.HasPrefix(a, "webhook: the API server CANNOT REACH") }) {
			t.Errorf("attention %q does not name the unreachable webhook", r.Attention)
		}
	})
}

// checkPrecheck: the node with the plugin gets the driver from it, the one
// without from hostPath volumes, every simulated node is listed, and the
// baseline namespace refuses the hostPath node but not the plugin's.
func checkPrecheck(t *testing.T, r *precheck.Report, plugin, hostPath, baseline string) {
	t.Helper()
	nodes := map[string]precheck.NodeCheck{}
	for _, n := range r.Nodes {
		nodes[n.Name] = n
	}
	for _, n := range testEnv.Nodes {
		if _, ok := nodes[n.Name]; !ok {
			t.Errorf("GPU node %s is not listed", n.Name)
		}
	}
	if n := nodes[plugin]; n.Delivery != precheck.DeliveryNRI {
		t.Errorf("node %s with the plugin: %+v, want %s", plugin, n, precheck.DeliveryNRI)
	}
	if n := nodes[hostPath]; n.Delivery != precheck.DeliveryHostPath {
		t.Errorf("node %s without the plugin: %+v, want %s", hostPath, n, precheck.DeliveryHostPath)
	}
	var found bool
	for _, ns := range r.Namespaces {
		if ns.Name != baseline {
			continue
		}
		found = true
		if !slices.Contains(ns.Refused, hostPath) || slices.Contains(ns.Refused, plugin) {
			t.Errorf("baseline namespace %+v, want %s refused and %s not", ns, hostPath, plugin)
		}
	}
	if !found {
		t.Errorf("namespace %s is not listed: %+v", baseline, r.Namespaces)
	}
	if !slices.ContainsFunc(r.Attention, func(a string) bool {
		return strings.HasPrefix(a, "namespace "+baseline+" enforces Pod Security \"baseline\"")
	}) {
		t.Errorf("attention %q does not name %s", r.Attention, baseline)
	}
}
