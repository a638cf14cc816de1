//go:build e2e

package e2e

import (
	"context"
	"fmt"
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
		start := time.Now()
		_, err := client().CoreV1().Pods(labelled).Create(testContext(t), gpuPod("gpu-while-down", podOpts{resource: gpu, nodeSelector: onAPINode}), metav1.CreateOptions{})
		if took := time.Since(start); took >= webhookTimeout {
			t.Errorf("the refusal took %s: the API server's call hung until the webhook's timeout instead of finding no endpoint", took.Round(time.Millisecond))
		}
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
		// Ready replicas reach the API server's resolver through the
		// EndpointSlice controller and the API server's own informer, a
		// moment later. Until then the API server says "no endpoints
		// available" at once; that, and only that, is waited for (bounded,
		// logged). A call that hangs is a fault, not a lag.
		ready, refused, inARow := time.Now(), 0, 0
		waitFor(t, 30*time.Second, "the API server to admit GPU pods through the restarted webhook, three in a row", func(ctx context.Context) (bool, error) {
			start := time.Now()
			_, err := client().CoreV1().Pods(labelled).Create(ctx, gpuPod("gpu-after-restart", podOpts{resource: gpu, nodeSelector: onAPINode}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch took := time.Since(start); {
			case took >= webhookTimeout:
				return false, fmt.Errorf("a create took %s, %s after the replicas were ready: the API server's call to the webhook hung (%v)", took.Round(time.Millisecond), time.Since(ready).Round(time.Millisecond), err)
			case err == nil:
				inARow++
				return inARow == 3, nil
			case strings.Contains(err.Error(), "no endpoints available"):
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
