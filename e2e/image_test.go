//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

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

// TestImageNotPullable: a release whose image the registry does not have
// (a mirror not copied yet, a wrong tag) fails `helm install --wait`, and
// what docs/troubleshooting.md tells a user to run names the image and the
// registry's answer: the Failed events of the release's first pod, the
// install hook's. A second release, in a namespace of its own, with the image
// values of the first but a tag that was never pushed; uninstalled at the end.
// The namespace is made first, with its default service account, which the
// hook's pod runs as. Uninstalled without hooks, as the docs tell a user.
func TestImageNotPullable(t *testing.T) {
	const release = "gpu-injector-badimage"
	ns := newNamespace(t, false)
	bad := testEnv.Cluster.RegistryHost + "/" + env.ImageName + ":not-pushed"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// --no-hooks, as docs/troubleshooting.md says: the uninstall hook
		// runs the image that cannot be pulled, and nothing ran to clean up.
		if out, err := testEnv.HelmCommand(ctx, "uninstall", release, "-n", ns, "--no-hooks", "--wait", "--timeout", "90s"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		_ = testEnv.Clientset.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	out, err := testEnv.HelmCommand(t.Context(), "install", release, testEnv.ChartRef(), "--version", env.ChartVersion, "--plain-http",
		"-n", ns, "--wait", "--timeout", "40s",
		"--set-string", `nodeprobe.nodeSelector.nvidia\.com/gpu\.present=true`,
		"--set", "image.repository="+testEnv.Cluster.RegistryHost+"/"+env.ImageName, "--set", "image.tag=not-pushed")
	if err == nil {
		t.Fatalf("helm install --wait of an image the registry lacks succeeded:\n%s", out)
	}
	t.Logf("helm install --wait failed as it should: %s", strings.TrimSpace(out))
	// The kubelet records the event on its own schedule, which may end after
	// helm's.
	found, failed := "", 0
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events, err := testEnv.Clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=Failed"})
		if err != nil {
			return false, nil
		}
		failed = len(events.Items)
		for _, ev := range events.Items {
			hook := strings.HasPrefix(ev.InvolvedObject.Name, release+"-validate-")
			if hook && strings.HasPrefix(ev.Message, `Failed to pull image "`+bad+`"`) && strings.Contains(ev.Message, "not found") {
				found = ev.InvolvedObject.Name + ": " + ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		pods, _ := testEnv.Clientset.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		var states []string
		for _, p := range pods.Items {
			states = append(states, p.Name+" "+string(p.Status.Phase)+" on "+p.Spec.NodeName)
		}
		t.Errorf("no Failed event of the hook's pod %s-validate-... that names %s and the registry's \"not found\" in %s (%d Failed events; pods: %v)", release, bad, ns, failed, states)
		return
	}
	t.Logf("Failed %s", found)
}
