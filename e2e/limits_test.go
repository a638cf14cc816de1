//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/config"
)

// manyContainersPod is a GPU pod of n one-GPU containers.
func manyContainersPod(name string, n int) *corev1.Pod {
	p := gpuPod(name, podOpts{resource: gpu})
	c := p.Spec.Containers[0]
	p.Spec.Containers = make([]corev1.Container, n)
	for i := range p.Spec.Containers {
		p.Spec.Containers[i] = *c.DeepCopy()
		p.Spec.Containers[i].Name = fmt.Sprintf("cuda-%d", i)
	}
	return p
}

// webhookRSS is a webhook pod's process_resident_memory_bytes, or -1 when
// its metrics cannot be read.
func webhookRSS(hc *http.Client, p corev1.Pod) float64 {
	return webhookMetric(hc, p, "process_resident_memory_bytes")
}

// TestManyContainersDenied: pods of hundreds of GPU containers, sent at once
// through the real API server, are denied with the webhook's message (the
// limit, and how to split the pod), and every webhook replica stays within
// the chart's memory limit, without a restart.
func TestManyContainersDenied(t *testing.T) {
	ns := newNamespace(t, true)
	containers := 4 * config.DefaultMaxGPUContainers
	restarts := map[string]int32{}
	for _, p := range readyWebhookPods(t) {
		restarts[p.Name] = p.Status.ContainerStatuses[0].RestartCount
	}

	const senders = 20
	var wg sync.WaitGroup
	errs := make([]error, senders)
	start := time.Now()
	for i := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = client().CoreV1().Pods(ns).Create(testContext(t), manyContainersPod(fmt.Sprintf("many-%d", i), containers), metav1.CreateOptions{})
		}()
	}
	wg.Wait()
	t.Logf("%d pods of %d GPU containers answered in %s", senders, containers, time.Since(start))
	for i, err := range errs {
		if err == nil {
			t.Errorf("pod many-%d of %d GPU containers was admitted", i, containers)
			continue
		}
		for _, want := range []string{`admission webhook "pods.gpu-injector.io" denied the request`, "limits.maxGPUContainers", "split it"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("pod many-%d: %v; want %q", i, err, want)
			}
		}
	}

	hc := &http.Client{Timeout: 5 * time.Second}
	for _, p := range readyWebhookPods(t) {
		limit := p.Spec.Containers[0].Resources.Limits.Memory().Value()
		rss := webhookRSS(hc, p)
		t.Logf("webhook %s: resident %.1f MiB, limit %.1f MiB", p.Name, rss/(1<<20), float64(limit)/(1<<20))
		if rss < 0 || limit == 0 || rss > float64(limit) {
			t.Errorf("webhook %s: resident memory %.0f bytes, limit %d", p.Name, rss, limit)
		}
		if was, ok := restarts[p.Name]; ok && p.Status.ContainerStatuses[0].RestartCount != was {
			t.Errorf("webhook %s restarted (%d to %d restarts)", p.Name, was, p.Status.ContainerStatuses[0].RestartCount)
		}
	}
}
