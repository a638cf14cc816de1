//go:build e2e

// Package e2e is gpu-injector's end-to-end suite: one real local cluster
// with a real kubelet, the chart's objects applied, and the real binary
// running as the webhook and as one probe per node (package env). Every test
// talks to that cluster through its API, or through the real kubectl where
// what a user sees matters. docs/e2e.md says what each test proves.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

// testEnv is the one environment every test shares; TestMain owns it.
var testEnv *env.Env

// The suite's runtime, Debian's containerd, has no NRI, and its tests check
// hostPath delivery: the plugin, on by default, is turned off so that no NRI
// socket the host may have decides how pods get the driver.
func TestMain(m *testing.M) {
	os.Exit(env.RunSuite(m, "e2e", env.Options{
		ChartValues:   []string{"runtimeInjection.enabled=false"},
		KeepOnFailure: true,
	}, func(e *env.Env) { testEnv = e }))
}

// Resource names a classic GPU pod asks for.
const (
	gpu       corev1.ResourceName = "nvidia.com/gpu"
	legacyGPU corev1.ResourceName = "alpha.kubernetes.io/nvidia-gpu"
)

// Timeouts: a pod on the kubelet node runs in seconds; the margins are for a
// busy two-core machine.
const (
	apiTimeout = 30 * time.Second
	runTimeout = 2 * time.Minute
)

func client() kubernetes.Interface { return testEnv.Clientset }

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// newNamespace creates a namespace for one test, opted in to injection when
// inject is set, and waits for its default service account (pods need it).
func newNamespace(t *testing.T, inject bool) string {
	t.Helper()
	ctx := testContext(t)
	prefix := nonName.ReplaceAllString(strings.ToLower(t.Name()), "-")
	if len(prefix) > 40 {
		prefix = prefix[len(prefix)-40:]
	}
	prefix = strings.Trim(prefix, "-") + "-"
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if inject {
		ns.Labels = map[string]string{layout.LabelInject: layout.InjectEnabled}
	}
	created, err := client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create namespace: %v", err)
	}
	waitDefaultServiceAccount(t, created.Name, apiTimeout)
	return created.Name
}

// waitDefaultServiceAccount waits for the controller manager to give ns its
// default service account: until then the API server refuses every pod
// there that names no service account of its own, a Job's too.
func waitDefaultServiceAccount(t *testing.T, ns string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "default service account in "+ns, func(ctx context.Context) (bool, error) {
		_, err := client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// waitFor polls cond every 250ms until it holds, fails the test when cond
// returns an error or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, cond); err != nil {
		t.Fatalf("failed waiting %s for %s: %v", timeout, what, err)
	}
}

// podOpts shape gpuPod.
type podOpts struct {
	resource     corev1.ResourceName
	nodeSelector map[string]string
	command      []string
}

// gpuPod is what a user writes: an image without the driver, a GPU limit,
// maybe a node selector; nothing about driver paths.
func gpuPod(name string, o podOpts) *corev1.Pod {
	cmd := o.command
	if cmd == nil {
		cmd = []string{workloads.CUDACheck}
	}
	c := corev1.Container{
		Name:            "cuda",
		Image:           env.WorkloadImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         cmd,
		SecurityContext: restrictedContext(),
	}
	if o.resource != "" {
		c.Resources.Limits = corev1.ResourceList{o.resource: resource.MustParse("1")}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			NodeSelector:                 o.nodeSelector,
			AutomountServiceAccountToken: ptr(false),
			Containers:                   []corev1.Container{c},
		},
	}
}

// restrictedContext: the workloads need no privilege to use the injected
// driver, whose files are world-readable.
func restrictedContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr(true),
		RunAsUser:                ptr(int64(65532)),
		AllowPrivilegeEscalation: ptr(false),
		ReadOnlyRootFilesystem:   ptr(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func createPod(t *testing.T, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := client().CoreV1().Pods(ns).Create(testContext(t), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create pod %s/%s: %v", ns, p.Name, err)
	}
	// Pods bound to API-only nodes never terminate by themselves (no kubelet)
	// and would keep holding those nodes' GPUs: delete them at once.
	t.Cleanup(func() {
		_ = client().CoreV1().Pods(ns).Delete(context.Background(), created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	})
	return created
}

// waitPodDone waits until the pod has Succeeded or Failed and returns it.
func waitPodDone(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, runTimeout, "pod "+ns+"/"+name+" to finish", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	return pod
}

// waitBound waits until the scheduler bound the pod and returns it.
func waitBound(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, apiTimeout, "pod "+ns+"/"+name+" to be bound", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Spec.NodeName != "", nil
	})
	return pod
}

// podLog is a container's log, fetched through the API server from the kubelet.
func podLog(t *testing.T, ns, pod, container string) string {
	t.Helper()
	b, err := client().CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(testContext(t))
	if err != nil {
		t.Fatalf("failed to read the log of %s/%s[%s]: %v", ns, pod, container, err)
	}
	return string(b)
}

// injected decodes the pod's injection record; ok is false on an untouched pod.
func injected(t *testing.T, p *corev1.Pod) (rec layout.Injected, ok bool) {
	t.Helper()
	v, ok := p.Annotations[layout.AnnotationInjected]
	if !ok {
		return rec, false
	}
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		t.Fatalf("failed to decode %s=%q: %v", layout.AnnotationInjected, v, err)
	}
	return rec, true
}

// hostPaths are the pod's hostPath volumes, by volume name.
func hostPaths(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// currentFingerprint reads the layout fingerprint a node publishes now.
func currentFingerprint(t *testing.T, node string) string {
	t.Helper()
	n, err := client().CoreV1().Nodes().Get(testContext(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("failed to get node %s: %v", node, err)
	}
	fp := n.Labels[layout.LabelFingerprint]
	if fp == "" {
		t.Fatalf("node %s publishes no %s", node, layout.LabelFingerprint)
	}
	return fp
}

// assertInjected checks everything the webhook promises on a mutated pod:
// the record, the fingerprint selector, read-only hostPath mounts of that
// node's layout, and LD_LIBRARY_PATH.
func assertInjected(t *testing.T, p *corev1.Pod, node *env.Node) {
	t.Helper()
	fp := currentFingerprint(t, node.Name)
	rec, ok := injected(t, p)
	if !ok {
		t.Fatalf("pod %s was not mutated: no %s annotation; annotations %v", p.Name, layout.AnnotationInjected, p.Annotations)
	}
	if rec.Fingerprint != fp || rec.DriverVersion != node.DriverVersion {
		t.Errorf("injection record %+v, want fingerprint %s and driver %s of node %s", rec, fp, node.DriverVersion, node.Name)
	}
	if got := p.Spec.NodeSelector[layout.LabelFingerprint]; got != fp {
		t.Errorf("nodeSelector %s=%q, want %q", layout.LabelFingerprint, got, fp)
	}
	plan, err := layout.Decode(nodeAnnotation(t, node.Name, layout.AnnotationLayout))
	if err != nil {
		t.Fatalf("failed to decode the layout of %s: %v", node.Name, err)
	}
	want := map[string]bool{}
	for _, m := range plan.Mounts {
		want[m.HostPath] = true
	}
	got := hostPaths(p)
	for _, hp := range got {
		if !want[hp] {
			t.Errorf("injected hostPath %s is not in node %s's layout", hp, node.Name)
		}
		delete(want, hp)
	}
	for hp := range want {
		t.Errorf("layout hostPath %s of node %s was not injected", hp, node.Name)
	}
	c := p.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		if _, isHost := got[m.Name]; isHost && !m.ReadOnly {
			t.Errorf("mount %s at %s is not read-only", m.Name, m.MountPath)
		}
	}
	if v, _ := envValue(c, "LD_LIBRARY_PATH"); !strings.Contains(v, "/usr/local/nvidia/lib64") {
		t.Errorf("LD_LIBRARY_PATH=%q, want it to name /usr/local/nvidia/lib64", v)
	}
}

// assertUntouched checks that the webhook left a pod as the user wrote it.
func assertUntouched(t *testing.T, p *corev1.Pod, want *corev1.Pod) {
	t.Helper()
	if _, ok := p.Annotations[layout.AnnotationInjected]; ok {
		t.Errorf("pod %s was mutated: %s=%s", p.Name, layout.AnnotationInjected, p.Annotations[layout.AnnotationInjected])
	}
	if hp := hostPaths(p); len(hp) > 0 {
		t.Errorf("pod %s got hostPath volumes %v", p.Name, hp)
	}
	if _, ok := p.Spec.NodeSelector[layout.LabelFingerprint]; ok || len(p.Spec.NodeSelector) != len(want.Spec.NodeSelector) {
		t.Errorf("pod %s nodeSelector %v, want %v", p.Name, p.Spec.NodeSelector, want.Spec.NodeSelector)
	}
	if v, ok := envValue(p.Spec.Containers[0], "LD_LIBRARY_PATH"); ok {
		t.Errorf("pod %s got LD_LIBRARY_PATH=%q", p.Name, v)
	}
}

func nodeAnnotation(t *testing.T, node, key string) string {
	t.Helper()
	n, err := client().CoreV1().Nodes().Get(testContext(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("failed to get node %s: %v", node, err)
	}
	return n.Annotations[key]
}

// gpuInjector runs `gpu-injector args...` as a user does and returns its
// output and exit status; a binary that cannot be started fails t.
func gpuInjector(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), testEnv.Binary, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("failed to run gpu-injector %s: %v", args[0], err)
	}
	return o.String(), e.String(), code
}

// jsonReport runs `gpu-injector args... -o json`, which must exit with
// status's codes for a report (all well, or something to act on), and
// decodes the report it prints.
func jsonReport[R any](t *testing.T, args ...string) (*R, int) {
	t.Helper()
	out, errOut, code := gpuInjector(t, append(args, "-o", "json")...)
	if code != status.ExitOK && code != status.ExitAttention {
		t.Fatalf("gpu-injector %s -o json exited %d; stderr:\n%s", args[0], code, errOut)
	}
	var r R
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("failed to decode gpu-injector %s -o json: %v\n%s", args[0], err, out)
	}
	return &r, code
}

// kubectl runs the real kubectl as admin; stdin may be empty.
func kubectl(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(testEnv.Kubectl, append([]string{"--kubeconfig", testEnv.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// waitEvent waits for an event on an object with that reason whose message
// contains want, and returns its message.
func waitEvent(t *testing.T, ns, object, reason, want string) string {
	t.Helper()
	var msg string
	sel := fields.Set{"involvedObject.name": object, "reason": reason}.AsSelector().String()
	waitFor(t, runTimeout, fmt.Sprintf("a %s event on %s/%s saying %q", reason, ns, object, want), func(ctx context.Context) (bool, error) {
		evs, err := client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, nil
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, want) {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}

func ptr[T any](v T) *T { return &v }
