//go:build e2e

package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
)

// TestInstallRefusesBadConfiguration: `helm install` with a configuration the binary
// refuses fails before anything of the release exists. The chart renders it; its
// pre-install hook Job runs `gpu-injector config validate` on it, in a namespace that
// enforces Pod Security's restricted level, and exits 1 with the binary's message.
// Helm 3.18 and later print that message with their error; older ones name the failed
// Job, whose log holds it. A second release in a namespace of its own, with the
// environment's image values; uninstalled at the end.
func TestInstallRefusesBadConfiguration(t *testing.T) {
	const release = "gpu-injector-badconfig"
	ns := release
	hook := release + "-validate"
	// The line is that of the file the chart renders, which the values shape.
	want := regexp.MustCompile(`hostPaths\.extraAllowlist\[0\]\.path: Forbidden: on line [0-9]+; it would allow the system folder /usr/lib whole; allow it only with filesOnly: true, or name the driver's own folder`)
	cs := testEnv.Clientset
	_, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// The failed release is recorded; its hook's Job and ConfigMap go with the namespace.
		if out, err := testEnv.HelmCommand(ctx, "uninstall", release, "-n", ns, "--wait", "--timeout", "90s"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	args := []string{"install", release, testEnv.ChartRef(), "--version", env.ChartVersion, "--plain-http", "-n", ns, "--timeout", "2m",
		"--set-string", `nodeprobe.nodeSelector.nvidia\.com/gpu\.present=true`}
	for _, s := range append(testEnv.HelmValues(), "config.hostPaths.extraAllowlist[0].path=/usr/lib") {
		args = append(args, "--set", s)
	}
	out, err := testEnv.HelmCommand(t.Context(), args...)
	if err == nil {
		t.Fatalf("helm install of a configuration the binary refuses succeeded:\n%s", out)
	}
	t.Logf("helm install failed as it should:\n%s", strings.TrimSpace(out))
	if !strings.Contains(out, "failed pre-install") || !strings.Contains(out, hook) {
		t.Errorf("helm's error does not name the pre-install hook %s", hook)
	}
	if utilversion.MustParseSemantic(cluster.HelmVersion).AtLeast(utilversion.MustParseSemantic("v3.18.0")) && !want.MatchString(out) {
		t.Errorf("helm %s prints hook output, yet not the binary's message %q", cluster.HelmVersion, want)
	}

	// The hook ran, was admitted under restricted, and refused with the binary's message.
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "job-name=" + hook})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d pods of Job %s, want 1 (no retry)", len(pods.Items), hook)
	}
	pod := pods.Items[0]
	var term *corev1.ContainerStateTerminated
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == "validate" {
			term = c.State.Terminated
		}
	}
	if term == nil || term.ExitCode != 1 || !want.MatchString(term.Message) {
		t.Errorf("the hook's container ended %+v: want exit 1 and the binary's message %q", term, want)
	}
	logs, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "validate"}).DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), "invalid configuration:\n  ") || !want.MatchString(string(logs)) {
		t.Errorf("kubectl logs job/%s says %q, want the binary's message %q", hook, logs, want)
	}

	// Nothing of the release was installed: its workloads, its webhook configuration and
	// its ConfigMap are all absent.
	deployments, err := cs.AppsV1().Deployments(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	daemonSets, err := cs.AppsV1().DaemonSets(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(deployments.Items)+len(daemonSets.Items) != 0 {
		t.Errorf("%d Deployments and %d DaemonSets in %s, want none", len(deployments.Items), len(daemonSets.Items), ns)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), release, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("MutatingWebhookConfiguration %s: %v, want not found", release, err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), release+"-config", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s-config: %v, want not found", release, err)
	}
}
