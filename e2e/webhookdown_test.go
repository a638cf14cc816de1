//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
)

// TestWebhookDown: with the webhook process stopped, failurePolicy Fail
// refuses exactly the pods the webhook would have changed (GPU pods in
// opted-in namespaces) and nothing else: matchConditions keep other pods of
// that namespace away from the webhook, the namespaceSelector keeps other
// namespaces away. Once the webhook is back, it serves again (within a
// minute: the API server's route to new replicas may lag their readiness).
func TestWebhookDown(t *testing.T) {
	labelled := newNamespace(t, true)
	unlabelled := newNamespace(t, false)
	// Pods that need not run go to an API-only node, where they never start.
	onAPINode := map[string]string{env.LabelAccelerator: testEnv.Node("ubuntu-k80").Accelerator}

	if err := testEnv.StopWebhook(); err != nil {
		t.Fatalf("failed to stop the webhook: %v", err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := testEnv.StartWebhook(context.Background()); err != nil {
				t.Errorf("failed to restart the webhook: %v", err)
			}
		}
	})

	t.Run("GPU pod in a labelled namespace is refused", func(t *testing.T) {
		_, err := client().CoreV1().Pods(labelled).Create(testContext(t), gpuPod("gpu-while-down", podOpts{resource: gpu, nodeSelector: onAPINode}), metav1.CreateOptions{})
		if err == nil {
			t.Fatal("the pod was admitted while the webhook is down; failurePolicy Fail promises a refusal")
		}
		if want := `failed calling webhook "pods.gpu-injector.io"`; !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q, want %q", err, want)
		}
		t.Logf("API server said: %v", err)
	})

	t.Run("non-GPU pod in a labelled namespace is admitted", func(t *testing.T) {
		want := gpuPod("cpu-while-down", podOpts{nodeSelector: onAPINode})
		assertUntouched(t, createPod(t, labelled, want), want)
	})

	t.Run("GPU pod in an unlabelled namespace is admitted", func(t *testing.T) {
		want := gpuPod("gpu-unlabelled-while-down", podOpts{resource: gpu, nodeSelector: onAPINode})
		assertUntouched(t, createPod(t, unlabelled, want), want)
	})

	t.Run("after a restart the webhook serves again", func(t *testing.T) {
		if err := testEnv.StartWebhook(testContext(t)); err != nil {
			t.Fatalf("failed to restart the webhook: %v", err)
		}
		restarted = true
		// Ready replicas are not yet the API server's route to them: it may
		// still dial a replica that is gone, over an endpoint it has not
		// dropped or an HTTP/2 connection it has not yet found dead (its
		// health check takes up to 45 s), and refuse GPU pods meanwhile. So
		// the test waits, bounded, until the API server admits GPU pods three
		// times in a row, and logs how long that took after the replicas
		// were ready.
		ready, refused, inARow := time.Now(), 0, 0
		waitFor(t, time.Minute, "the API server to admit GPU pods through the restarted webhook, three in a row", func(ctx context.Context) (bool, error) {
			_, err := client().CoreV1().Pods(labelled).Create(ctx, gpuPod("gpu-after-restart", podOpts{resource: gpu, nodeSelector: onAPINode}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case err == nil:
				inARow++
				return inARow == 3, nil
			case strings.Contains(err.Error(), `failed calling webhook "pods.gpu-injector.io"`):
				refused, inARow = refused+1, 0
				t.Logf("refused %s after the replicas were ready: %v", time.Since(ready).Round(time.Millisecond), err)
				return false, nil
			default:
				return false, err
			}
		})
		t.Logf("the API server admitted through the webhook %s after its replicas were ready (%d refused before)", time.Since(ready).Round(time.Millisecond), refused)
		p := createPod(t, labelled, gpuPod("gpu-after-restart", podOpts{resource: gpu, nodeSelector: onAPINode}))
		assertInjected(t, p, testEnv.Node("ubuntu-k80"))
	})
}
