//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

// gpuInjectorStatus runs `gpu-injector status` as a user does, with the
// admin kubeconfig, and returns its output and exit status.
func gpuInjectorStatus(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), testEnv.Binary, append([]string{"status", "--kubeconfig", testEnv.Kubeconfig}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("failed to run gpu-injector status: %v", err)
	}
	return o.String(), e.String(), code
}

func statusReport(t *testing.T, args ...string) (*status.Report, int) {
	t.Helper()
	out, errOut, code := gpuInjectorStatus(t, append(args, "-o", "json")...)
	if code != status.ExitOK && code != status.ExitAttention {
		t.Fatalf("gpu-injector status -o json exited %d; stderr:\n%s", code, errOut)
	}
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("failed to decode gpu-injector status -o json: %v\n%s", err, out)
	}
	return &r, code
}

// TestStatus: `gpu-injector status` shows an operator, against the real
// cluster, the webhook (and that the API server reaches it, by a dry-run GPU
// pod the webhook injects), the probes, every GPU node, the pools, the
// opted-in namespaces and recent layout mismatches; it flags a namespace
// whose Pod Security level refuses the injected hostPath, and a webhook
// scaled to zero, with exit status 3.
func TestStatus(t *testing.T) {
	ns := newNamespace(t, true)

	t.Run("every section", func(t *testing.T) {
		out, errOut, code := gpuInjectorStatus(t, "--dry-run-namespace", ns)
		t.Logf("gpu-injector status (exit %d):\n%s", code, out)
		// Other tests share the cluster and may have left, for example, a
		// LayoutMismatch Event of the last hour: 3 is allowed, 1 is not.
		if code != status.ExitOK && code != status.ExitAttention {
			t.Fatalf("exit %d; stderr:\n%s", code, errOut)
		}
		want := []string{"WEBHOOK", "gpu-injector/" + "gpu-injector-webhook", "ready", "CA bundle set",
			"in " + ns + ": the API server reaches the webhook, which injected layout",
			"nodeSelector " + layout.LabelFingerprint + "=",
			"PROBE", "GPU NODES", "POOLS", "OPTED-IN NAMESPACES", ns, "LAYOUT MISMATCH EVENTS (last hour)"}
		for _, n := range testEnv.Nodes {
			want = append(want, n.Name)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q", w)
			}
		}
		if strings.Contains(out, "\x1b[") {
			t.Errorf("colour on a pipe:\n%q", out)
		}

		r, _ := statusReport(t, "--dry-run-namespace", ns)
		if r.Webhook.Ready == 0 || r.Webhook.Ready != r.Webhook.Desired {
			t.Errorf("webhook %d/%d ready, want all", r.Webhook.Ready, r.Webhook.Desired)
		}
		if d := r.Webhook.DryRun; d.Outcome != status.DryRunInjected || d.Fingerprint == "" || len(d.HostPaths) == 0 {
			t.Errorf("dry run %+v, want an injected layout with hostPaths", d)
		}
		if r.Probe.DaemonSet == "" || r.Probe.Ready != r.Probe.Desired {
			t.Errorf("probe %+v, want every pod ready", r.Probe)
		}
		nodes := map[string]status.NodeStatus{}
		for _, n := range r.Nodes {
			nodes[n.Name] = n
		}
		for _, n := range testEnv.Nodes {
			got, ok := nodes[n.Name]
			switch {
			case !ok:
				t.Errorf("GPU node %s is not listed", n.Name)
			case got.State == "" || got.Fingerprint == "" && got.State == layout.StateReady:
				t.Errorf("node %s: %+v, want its probe's state and fingerprint", n.Name, got)
			}
		}
	})

	t.Run("a baseline namespace is flagged", func(t *testing.T) {
		baseline := newNamespace(t, true)
		patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"baseline"}}}`
		if _, err := client().CoreV1().Namespaces().Patch(testContext(t), baseline, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("failed to label %s baseline: %v", baseline, err)
		}
		r, code := statusReport(t, "--dry-run-namespace", ns)
		if code != status.ExitAttention {
			t.Errorf("exit %d, want %d", code, status.ExitAttention)
		}
		var found bool
		for _, n := range r.Namespaces {
			if n.Name == baseline {
				found = true
				if n.Enforce != "baseline" || !strings.Contains(n.Refused, "GPU pods will be refused") {
					t.Errorf("namespace %+v, want it flagged", n)
				}
			}
		}
		if !found {
			t.Fatalf("namespace %s is not listed: %+v", baseline, r.Namespaces)
		}
		if !strings.Contains(strings.Join(r.Attention, "\n"), "namespace "+baseline+" enforces Pod Security \"baseline\"") {
			t.Errorf("attention does not name %s: %v", baseline, r.Attention)
		}
		// The flag is true: the API server refuses the injected pod there.
		dr, _ := statusReport(t, "--dry-run-namespace", baseline)
		if dr.Webhook.DryRun.Outcome != status.DryRunDenied || !strings.Contains(dr.Webhook.DryRun.Message, "hostPath") {
			t.Errorf("dry run in %s: %+v, want Pod Security's hostPath refusal", baseline, dr.Webhook.DryRun)
		}
	})

	t.Run("webhook scaled to zero", func(t *testing.T) {
		if err := testEnv.StopWebhook(); err != nil {
			t.Fatalf("failed to stop the webhook: %v", err)
		}
		t.Cleanup(func() {
			if err := testEnv.StartWebhook(context.Background()); err != nil {
				t.Errorf("failed to restart the webhook: %v", err)
			}
		})
		out, errOut, code := gpuInjectorStatus(t, "--dry-run-namespace", ns)
		t.Logf("gpu-injector status (exit %d):\n%s", code, out)
		if code != status.ExitAttention {
			t.Errorf("exit %d, want %d; stderr:\n%s", code, status.ExitAttention, errOut)
		}
		for _, w := range []string{"0/0 ready", "the API server CANNOT REACH the webhook", "NEEDS ATTENTION", "has 0 ready replicas"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q", w)
			}
		}
	})
}
