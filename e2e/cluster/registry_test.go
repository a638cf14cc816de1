//go:build e2e

package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestRegistryPull proves, on each runtime (containerd 1.6's CRI registry
// config_path, 2.x's cri.v1.images one, CRI-O's registries.conf), that a pod
// pulls from the cluster's registry over plain HTTP through that file alone: an image
// pushed there and never imported runs with pullPolicy IfNotPresent, and
// the kubelet's event says it pulled it. The same image named at the
// registry's bridge address (Cluster.RegistryPodHost), the name a webhook
// in a pod reads it by, is pulled too: that host is a second plain-HTTP
// registry to each runtime's file.
func TestRegistryPull(t *testing.T) {
	for _, rt := range []Runtime{RuntimeDebian, RuntimeNRI, RuntimeCRIO} {
		t.Run(string(rt), func(t *testing.T) {
			ctx := t.Context()
			c, err := Start(ctx, Options{
				NodeName:      "registry-node-1",
				Runtime:       rt,
				Registry:      true,
				KeepOnFailure: os.Getenv("KEEP_CLUSTER") != "",
				Logger:        testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
			})
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					c.MarkFailed()
				}
				if err := c.Stop(); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
			if c.RegistryHost == "" {
				t.Fatal("RegistryHost is empty with Options.Registry")
			}
			// The pause program as an image, pushed and not imported.
			tarPath, err := buildPause(ctx, filepath.Join(t.TempDir(), "pause"), "gpu-injector.local/pause:push")
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(tarPath, nil)
			if err != nil {
				t.Fatal(err)
			}
			ref := c.RegistryHost + "/e2e/pause:v1"
			tag, err := name.NewTag(ref)
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
				t.Fatalf("push %s: %v", ref, err)
			}
			if c.RegistryPodHost == "" {
				t.Fatal("RegistryPodHost is empty with Options.Registry")
			}
			podRef := c.RegistryPodHost + "/e2e/pause:v1"
			pods := map[string]string{"pulled": ref, "pulled-bridge": podRef}
			for pod, ref := range pods {
				if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "default"},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name: "pause", Image: ref, ImagePullPolicy: corev1.PullIfNotPresent,
					}}},
				}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for pod, ref := range pods {
				waitPulled(ctx, t, c, rt, pod, ref)
			}
		})
	}
}

// waitPulled waits for the pod to run and for the kubelet's event that it
// pulled ref.
func waitPulled(ctx context.Context, t *testing.T, c *Cluster, rt Runtime, name, ref string) {
	t.Helper()
	last := &corev1.Pod{}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s from %s not running: %v; status %+v\n%s log:\n%s", name, ref, err, last.Status, rt, tailFile(c.LogPath(RuntimeProcess(rt)), 30))
	}
	events, err := c.Clientset.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Pulled"})
	if err != nil {
		t.Fatal(err)
	}
	pulled := false
	for _, ev := range events.Items {
		pulled = pulled || strings.HasPrefix(ev.Message, `Successfully pulled image "`+ref+`"`)
	}
	if !pulled {
		t.Errorf("no event says the kubelet pulled %s for %s: %+v", ref, name, events.Items)
	}
}
