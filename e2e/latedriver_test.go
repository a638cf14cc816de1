//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// lateDriverLimit is how soon a driver installed while the probe runs must
// serve GPU pods: the probe's watch, not its 5-minute interval.
const lateDriverLimit = 15 * time.Second

// TestDriverArrivesLater: the kubelet node's stand-in driver is removed and
// the probe, told nothing, takes the node out of ready; then the driver is
// installed again while the probe pod runs, as a driver installer does after
// the node joined, again with no signal. Within 15 s the node publishes its
// layout and the webhook serves it, and a GPU pod is injected with it.
func TestDriverArrivesLater(t *testing.T) {
	kn := testEnv.KubeletNode()
	version := kn.DriverVersion
	fp := currentFingerprint(t, kn.Name)
	probe, err := testEnv.ProbePod(testContext(t))
	if err != nil {
		t.Fatalf("failed to find the probe pod: %v", err)
	}
	restarts := kn.ProbeRestarts()

	if err := testEnv.RemoveDriver(kn.Name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if kn.DriverVersion == "" {
			if err := testEnv.InstallDriver(kn.Name, version); err != nil {
				t.Errorf("failed to put the driver back: %v", err)
			}
		}
		if _, err := testEnv.WaitProbed(context.Background()); err != nil {
			t.Errorf("nodes not ready again after the test: %v", err)
		}
	})
	// The removal is seen by the same watch: no signal, well inside the interval.
	var gone *corev1.Node
	waitFor(t, lateDriverLimit, "node "+kn.Name+" to leave state ready", func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		gone = n
		return n.Labels[layout.LabelState] != layout.StateReady, nil
	})
	t.Logf("driver removed: state %s, reason %q", gone.Labels[layout.LabelState], gone.Annotations[layout.AnnotationStateReason])

	if err := testEnv.InstallDriver(kn.Name, version); err != nil {
		t.Fatal(err)
	}
	installed := time.Now()
	ctx, cancel := context.WithTimeout(testContext(t), lateDriverLimit)
	defer cancel()
	fps, err := testEnv.WaitProbed(ctx)
	if err != nil {
		t.Fatalf("the node did not publish its layout within %s of the driver's install: %v", lateDriverLimit, err)
	}
	if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{kn.Name: fps[kn.Name]}); err != nil {
		t.Fatalf("the webhook did not serve the layout within %s of the driver's install: %v", lateDriverLimit, err)
	}
	t.Logf("driver installed: node ready and its layout served %s later", time.Since(installed).Round(100*time.Millisecond))
	if fps[kn.Name] != fp {
		t.Errorf("fingerprint %s after the driver came back, want %s (the same driver)", fps[kn.Name], fp)
	}
	now, err := testEnv.ProbePod(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != probe.UID || kn.ProbeRestarts() != restarts {
		t.Errorf("the probe pod was replaced or restarted (%s -> %s, restarts %d -> %d): the watch should need neither", probe.UID, now.UID, restarts, kn.ProbeRestarts())
	}

	ns := newNamespace(t, true)
	p := createPod(t, ns, gpuPod("after-late-driver", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: kn.Accelerator}}))
	assertInjected(t, p, kn)
	if got, err := client().CoreV1().Nodes().Get(testContext(t), kn.Name, metav1.GetOptions{}); err == nil && got.Labels[layout.LabelFingerprint] != p.Spec.NodeSelector[layout.LabelFingerprint] {
		t.Errorf("pod pinned to %s, node publishes %s", p.Spec.NodeSelector[layout.LabelFingerprint], got.Labels[layout.LabelFingerprint])
	}
}
