//go:build e2e

package e2e

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
)

// TestImageFromRegistry: the chart, installed from the cluster's OCI
// registry, runs the image the kubelet pulled from that registry, as a user's
// cluster pulls a release: the chart's pods name the registry's image with
// pullPolicy IfNotPresent, their Events show the kubelet Pulling and Pulled
// it, and the running containers' image IDs are the registry's digests.
func TestImageFromRegistry(t *testing.T) {
	ctx := t.Context()
	ref := testEnv.ImageRef()
	pods, err := testEnv.Clientset.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + env.Release})
	if err != nil {
		t.Fatal(err)
	}
	chartPods := map[string]bool{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != testEnv.KubeletNode().Name || p.Status.Phase != corev1.PodRunning {
			continue
		}
		chartPods[p.Name] = true
		for _, c := range p.Spec.Containers {
			if c.Image != ref || c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("pod %s container %s: image %q pullPolicy %s, want %q IfNotPresent", p.Name, c.Name, c.Image, c.ImagePullPolicy, ref)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(cs.ImageID, testEnv.Cluster.RegistryHost+"/"+env.ImageName+"@sha256:") {
				t.Errorf("pod %s container %s runs image ID %q, not one from %s", p.Name, cs.Name, cs.ImageID, testEnv.Cluster.RegistryHost)
			}
		}
	}
	if len(chartPods) == 0 {
		t.Fatalf("no running pod of the chart on %s", testEnv.KubeletNode().Name)
	}
	events, err := testEnv.Clientset.CoreV1().Events(env.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		t.Fatal(err)
	}
	// The first pod on the node pulled it; the others found it present
	// (IfNotPresent), which is a Pulled event too.
	want := map[string]string{"Pulling": `Pulling image "` + ref + `"`, "Pulled": `Successfully pulled image "` + ref + `"`}
	seen := map[string]string{}
	for _, ev := range events.Items {
		if prefix, ok := want[ev.Reason]; ok && strings.HasPrefix(ev.Message, prefix) {
			seen[ev.Reason] = ev.InvolvedObject.Name + ": " + ev.Message
		}
	}
	for _, reason := range []string{"Pulling", "Pulled"} {
		if seen[reason] == "" {
			t.Errorf("no %s event %q in %s", reason, want[reason], env.Namespace)
		} else {
			t.Logf("%s %s", reason, seen[reason])
		}
	}
}
