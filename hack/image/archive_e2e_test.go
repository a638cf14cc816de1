//go:build e2e

package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// TestArchiveImports: the docker-archive of this machine's platform, which
// hack/gpu-cluster.sh carries to a GPU machine without a registry, imports
// into the local cluster's containerd (ctr images import) and runs there
// with pullPolicy Never: `gpu-injector version` prints the stamped version.
func TestArchiveImports(t *testing.T) {
	ctx := t.Context()
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	if _, err := Build(ctx, Options{Ref: testRef, Version: "v0.0.0-archive", Archive: tarPath}); err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{NodeName: "archive-node-1"})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	if err := c.ImportImage(ctx, tarPath); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "version", Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "gpu-injector", Image: testRef, ImagePullPolicy: corev1.PullNever, Args: []string{"version"},
		}}},
	}
	if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, "version", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	})
	if err != nil || phase != corev1.PodSucceeded {
		t.Fatalf("the imported image's pod: %v, phase %s", err, phase)
	}
	log, err := c.Clientset.CoreV1().Pods("default").GetLogs("version", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(log), "v0.0.0-archive") {
		t.Errorf("gpu-injector version in the imported image printed %q (%v)", log, err)
	}
}
