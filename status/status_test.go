package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

var now = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// stubDryRun answers the dry run as a test says.
type stubDryRun struct {
	pod      *corev1.Pod
	warnings []string
	err      error
	asked    string
}

func (s *stubDryRun) DryRunPod(_ context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
	s.asked = ns
	if s.err != nil {
		return nil, s.warnings, s.err
	}
	if s.pod != nil {
		return s.pod, s.warnings, nil
	}
	return pod, s.warnings, nil
}

func injectedPod(fp string) *corev1.Pod {
	p := DryRunPod()
	p.Annotations = map[string]string{layout.AnnotationInjected: fmt.Sprintf(`{"fingerprint":%q,"driverVersion":"550.54.14","containers":["gpu"]}`, fp)}
	p.Spec.NodeSelector = map[string]string{layout.LabelFingerprint: fp}
	p.Spec.Volumes = []corev1.Volume{{Name: "nvidia-lib", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/lib/nvidia-550"}}}}
	return p
}

const ns = "gpu-injector"

func webhookDeployment(desired, ready int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-webhook", Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "webhook"}},
		Spec: appsv1.DeploymentSpec{Replicas: &desired, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "webhook", Args: []string{"webhook", "--webhook-configuration-name=gpu-injector", "--pool-memory-name=gpu-injector-pools"}}},
			Volumes:    []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpu-injector-config"}}}}},
		}}},
		Status: appsv1.DeploymentStatus{ReadyReplicas: ready},
	}
}

func probeDaemonSet(desired, ready int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-nodeprobe", Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "nodeprobe"}},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: desired, NumberReady: ready, NumberAvailable: ready},
	}
}

func webhookConfiguration() *admissionregistrationv1.MutatingWebhookConfiguration {
	fail := admissionregistrationv1.Fail
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector", Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector"}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "pods.gpu-injector.io", FailurePolicy: &fail,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte("ca")}}},
	}
}

func configMap(yaml string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-config", Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector"}}, Data: map[string]string{configKey: yaml}}
}

func gpuNode(name, state, reason string, gpus int64, labels map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if state != "" {
		n.Labels[layout.LabelState] = state
	}
	if reason != "" {
		n.Annotations[layout.AnnotationStateReason] = reason
	}
	if state == layout.StateReady {
		n.Labels[layout.LabelFingerprint] = "fp-" + name
		n.Labels[layout.LabelDriverVersion] = "550.54.14"
	}
	for k, v := range labels {
		n.Labels[k] = v
	}
	if gpus > 0 {
		n.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return n
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func optedIn(enforce string) map[string]string {
	l := map[string]string{layout.LabelInject: layout.InjectEnabled}
	if enforce != "" {
		l[labelEnforce] = enforce
	}
	return l
}

// healthy is a cluster where nothing needs attention.
func healthy() []runtime.Object {
	return []runtime.Object{
		webhookDeployment(2, 2), probeDaemonSet(2, 2), webhookConfiguration(), configMap(""),
		gpuNode("gpu-a", layout.StateReady, "", 4, nil),
		gpuNode("cpu-a", layout.StateNoDriver, "", 0, nil),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		namespace("ml", optedIn("privileged")),
		namespace("other", nil),
	}
}

func collect(t *testing.T, dr DryRunner, objs ...runtime.Object) *Report {
	t.Helper()
	c := &Collector{Client: fake.NewClientset(objs...), DryRun: dr, Now: func() time.Time { return now }}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return r
}

func TestHealthy(t *testing.T) {
	dr := &stubDryRun{pod: injectedPod("fp-gpu-a")}
	r := collect(t, dr, healthy()...)
	if len(r.Attention) != 0 || exitStatus(r) != ExitOK {
		t.Fatalf("attention %v, exit %d; want none, 0", r.Attention, exitStatus(r))
	}
	if r.Webhook.Namespace != ns || r.Webhook.Ready != 2 || r.Webhook.Desired != 2 || r.Webhook.Configuration != "gpu-injector" || r.Webhook.FailurePolicy != "Fail" || !r.Webhook.CABundle {
		t.Errorf("webhook %+v", r.Webhook)
	}
	if r.Probe.DaemonSet != "gpu-injector-nodeprobe" || r.Probe.Ready != 2 {
		t.Errorf("probe %+v", r.Probe)
	}
	var names []string
	for _, n := range r.Nodes {
		names = append(names, n.Name)
	}
	if got := strings.Join(names, ","); got != "cpu-a,gpu-a" {
		t.Errorf("GPU nodes %s, want cpu-a,gpu-a (a node without layout, state or GPUs is no GPU node)", got)
	}
	if dr.asked != "ml" {
		t.Errorf("dry run in %q, want ml", dr.asked)
	}
	d := r.Webhook.DryRun
	if d.Outcome != DryRunInjected || d.Fingerprint != "fp-gpu-a" || d.DriverVersion != "550.54.14" || len(d.HostPaths) != 1 || d.NodeSelector[layout.LabelFingerprint] != "fp-gpu-a" {
		t.Errorf("dry run %+v", d)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WEBHOOK", "gpu-injector/gpu-injector-webhook  2/2 ready", "failurePolicy Fail, CA bundle set",
		"in ml: the API server reaches the webhook, which injected layout fp-gpu-a (driver 550.54.14)", "hostPath /usr/lib/nvidia-550",
		"nodeSelector gpu-injector.io/layout-fingerprint=fp-gpu-a", "PROBE", "2 desired, 2 ready, 2 available",
		"GPU NODES", "gpu-a  ready", "POOLS", "none remembered (no ConfigMap gpu-injector/gpu-injector-pools)",
		"OPTED-IN NAMESPACES", "ml         privileged", "LAYOUT MISMATCH EVENTS (last hour)", "OK: nothing needs attention"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Errorf("colour without Color:\n%s", out.String())
	}
}

func TestAttention(t *testing.T) {
	withObjs := func(replace func([]runtime.Object) []runtime.Object) []runtime.Object { return replace(healthy()) }
	tests := map[string]struct {
		objs   []runtime.Object
		dryRun *stubDryRun
		want   string
	}{
		"webhook scaled to zero": {
			objs: withObjs(func(o []runtime.Object) []runtime.Object { o[0] = webhookDeployment(2, 0); return o }),
			want: "has 0 ready replicas",
		},
		"webhook unreachable": {
			dryRun: &stubDryRun{err: apierrors.NewInternalError(errors.New(`Internal error occurred: failed calling webhook "pods.gpu-injector.io": failed to call webhook: Post "https://gpu-injector-webhook.gpu-injector.svc:443/mutate-v1-pod?timeout=5s": no endpoints available for service "gpu-injector-webhook"`))},
			want:   "the API server cannot reach the webhook",
		},
		"webhook denies": {
			dryRun: &stubDryRun{err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`admission webhook "pods.gpu-injector.io" denied the request: no ready GPU node layout fits this pod`))},
			want:   "is denied: ",
		},
		"admitted unchanged": {
			dryRun: &stubDryRun{pod: DryRunPod()},
			want:   "admitted without injection",
		},
		"no configuration": {
			objs: withObjs(func(o []runtime.Object) []runtime.Object { return append(o[:2], o[3:]...) }),
			want: "no MutatingWebhookConfiguration",
		},
		"probe pods not ready": {
			objs: withObjs(func(o []runtime.Object) []runtime.Object { o[1] = probeDaemonSet(3, 1); return o }),
			want: "1 of 3 pods ready",
		},
		"node in error": {
			objs: append(healthy(), gpuNode("gpu-b", layout.StateError, "DriverFilesNotAllowed: /srv/nvidia is not in the allowlist", 8, nil)),
			want: "node gpu-b: probe state error: DriverFilesNotAllowed",
		},
		"node wedged": {
			objs: append(healthy(), gpuNode("gpu-b", layout.StateWedged, "NVMLTimeout: nvmlInit did not return in 30s", 8, nil)),
			want: "node gpu-b: driver wedged",
		},
		"GPUs without a probe": {
			objs: append(healthy(), gpuNode("gpu-b", "", "", 8, nil)),
			want: "advertises 8 GPUs but no probe published a state",
		},
		"baseline namespace": {
			objs: append(healthy(), namespace("ml-baseline", optedIn("baseline"))),
			want: "namespace ml-baseline enforces Pod Security \"baseline\": " + refusedMessage,
		},
		"layout mismatch": {
			objs: append(healthy(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "ml"}, Reason: pools.ReasonLayoutMismatch,
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "train-0"}, Count: 2, LastTimestamp: metav1.NewTime(now.Add(-10 * time.Minute)),
				Message: "pinned to pool a with layout x, landed on node n publishing y"}),
			want: "1 LayoutMismatch Events in the last hour",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs := tc.objs
			if objs == nil {
				objs = healthy()
			}
			dr := tc.dryRun
			if dr == nil {
				dr = &stubDryRun{pod: injectedPod("fp-gpu-a")}
			}
			r := collect(t, dr, objs...)
			if exitStatus(r) != ExitAttention {
				t.Fatalf("exit %d, want %d", exitStatus(r), ExitAttention)
			}
			all := strings.Join(r.Attention, "\n")
			if !strings.Contains(all, tc.want) {
				t.Errorf("attention lacks %q:\n%s", tc.want, all)
			}
			var out bytes.Buffer
			if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "NEEDS ATTENTION") || !strings.Contains(out.String(), tc.want) {
				t.Errorf("table does not say %q:\n%s", tc.want, out.String())
			}
		})
	}
}

func TestQuiet(t *testing.T) {
	tests := map[string]struct {
		objs []runtime.Object
		why  string
	}{
		"old layout mismatch": {
			objs: append(healthy(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "ml"}, Reason: pools.ReasonLayoutMismatch,
				LastTimestamp: metav1.NewTime(now.Add(-2 * time.Hour))}),
			why: "an Event older than an hour is history",
		},
		"other events": {
			objs: append(healthy(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e1", Namespace: "ml"}, Reason: "Scheduled", LastTimestamp: metav1.NewTime(now)}),
			why:  "only LayoutMismatch Events count",
		},
		"baseline with the NRI plugin": {
			objs: append(healthy(), namespace("ml-baseline", optedIn("baseline")),
				gpuNode("gpu-nri", layout.StateReady, "", 1, map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol})),
			why: "a node injects at the runtime, so the pod needs no hostPath",
		},
		"excluded namespace": {
			objs: append(healthy(), namespace("kube-public", optedIn("restricted"))),
			why:  "the configuration excludes it: the webhook never injects there",
		},
		"no-driver CPU node": {
			objs: append(healthy(), gpuNode("cpu-b", layout.StateNoDriver, "", 0, nil)),
			why:  "a CPU node's probe says no-driver",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, tc.objs...)
			if len(r.Attention) != 0 {
				t.Errorf("%s, yet attention: %v", tc.why, r.Attention)
			}
		})
	}
}

func TestDryRunSkippedWithoutOptedInNamespace(t *testing.T) {
	objs := healthy()
	objs[7] = namespace("ml", nil)
	dr := &stubDryRun{}
	r := collect(t, dr, objs...)
	if r.Webhook.DryRun.Outcome != DryRunSkipped || dr.asked != "" {
		t.Errorf("dry run %+v (asked in %q), want skipped", r.Webhook.DryRun, dr.asked)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped: no namespace is labelled gpu-injector.io/inject=enabled", "none: GPU pods are injected nowhere"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDryRunPrefersNamespaceThatAllowsHostPath(t *testing.T) {
	objs := append(healthy(), namespace("aa-restricted", optedIn("restricted")))
	dr := &stubDryRun{pod: injectedPod("fp-gpu-a")}
	collect(t, dr, objs...)
	if dr.asked != "ml" {
		t.Errorf("dry run in %q, want ml: a restricted namespace would refuse the hostPath, hiding what the webhook did", dr.asked)
	}
}

func TestDryRunWarningsAndRuntimeMarker(t *testing.T) {
	p := DryRunPod()
	p.Annotations = map[string]string{layout.AnnotationInjected: `{"runtime":"nri","containers":["gpu"]}`, layout.AnnotationRuntimeInject: "gpu"}
	r := collect(t, &stubDryRun{pod: p, warnings: []string{"namespace ml enforces baseline"}}, healthy()...)
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"runtime injection by the node's NRI plugin", "gpu-injector.io/runtime-inject=gpu", "warning: namespace ml enforces baseline"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestClassify(t *testing.T) {
	tests := map[string]struct {
		err  error
		want string
	}{
		"timeout":            {err: context.DeadlineExceeded, want: DryRunUnreachable},
		"connection refused": {err: errors.New(`Internal error occurred: failed calling webhook "pods.gpu-injector.io": failed to call webhook: Post "https://10.0.0.1:443/mutate-v1-pod": dial tcp 10.0.0.1:443: connect: connection refused`), want: DryRunUnreachable},
		"pod security":       {err: errors.New(`pods "x" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "nvidia-lib")`), want: DryRunDenied},
		"rbac":               {err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "bob" cannot create resource "pods"`)), want: DryRunError},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := classify("ml", nil, nil, tc.err); got.Outcome != tc.want {
				t.Errorf("outcome %s, want %s", got.Outcome, tc.want)
			}
		})
	}
	// The chart's admission policy's mark says who answered.
	p := injectedPod("fp-gpu-a")
	if d := classify("ml", p, nil, nil); d.Policy {
		t.Errorf("a pod the webhook injected: %+v", d)
	}
	p.Labels = map[string]string{layout.LabelAdmission: layout.AdmissionPolicy}
	d := classify("ml", p, nil, nil)
	if !d.Policy || d.Outcome != DryRunInjected {
		t.Errorf("a pod the admission policy marked: %+v", d)
	}
	r := &Report{Webhook: WebhookStatus{DryRun: d}}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "admission policy marked it") || strings.Contains(s, "reaches the webhook") {
		t.Errorf("the policy's pod is told as the webhook's:\n%s", s)
	}
}

func TestPools(t *testing.T) {
	cfgYAML := "pinning:\n  nodeLabels: [pool]\n  rememberFor: 48h\n"
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "550.54.14",
		Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	pool := pools.Key(map[string]string{"pool": "a100"}, cfg.Pinning.NodeLabels)
	data, err := pools.EncodeMemory([]pools.Memory{{Pool: pool, Labels: map[string]string{"pool": "a100"}, Plan: plan, LastSeen: now.Add(-40 * time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	data["pool-0000"] = "not json"
	objs := healthy()
	objs[3] = configMap(cfgYAML)
	objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-pools", Namespace: ns}, Data: data})
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	if !r.Pools.Found || len(r.Pools.Pools) != 1 {
		t.Fatalf("pools %+v, want one", r.Pools)
	}
	p := r.Pools.Pools[0]
	if p.Pool != pool || p.Fingerprint != plan.Fingerprint() || !p.Expires.Equal(now.Add(8*time.Hour)) {
		t.Errorf("pool %+v, want %s, %s, expiring in 8h", p, pool, plan.Fingerprint())
	}
	if !strings.Contains(r.Pools.Note, "1 entries ignored") {
		t.Errorf("note %q, want the broken entry counted", r.Pools.Note)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now, Color: true}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{pool, "40h0m ago", "\x1b[33m8h0m\x1b[0m"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDeclaredPools: with no pool memory yet, the pools the configuration
// declares are listed as the webhook serves them: declared, never expiring.
func TestDeclaredPools(t *testing.T) {
	plan, err := layout.Encode(layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "550.54.14",
		Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}})
	if err != nil {
		t.Fatal(err)
	}
	cfgYAML := "pinning:\n  nodeLabels: [pool]\n  pools:\n  - pool: {pool: a100}\n    layout: '" + plan + "'\n"
	if _, err := config.Parse([]byte(cfgYAML)); err != nil {
		t.Fatal(err)
	}
	objs := healthy()
	objs[3] = configMap(cfgYAML)
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	if r.Pools.Found || len(r.Pools.Pools) != 1 || !r.Pools.Pools[0].Declared || r.Pools.Pools[0].Pool != "pool=a100" {
		t.Fatalf("pools %+v, want the declared one", r.Pools)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "pool=a100") || !strings.Contains(s, "declared") || !strings.Contains(s, "never") || strings.Contains(s, "none remembered") {
		t.Errorf("the declared pool is not listed:\n%s", s)
	}
}

func TestPoolMemoryWithoutPoolPinning(t *testing.T) {
	objs := append(healthy(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-pools", Namespace: ns}, Data: map[string]string{"pool-1": "{}"}})
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	if !r.Pools.Found || len(r.Pools.Pools) != 0 || !strings.Contains(r.Pools.Note, "pinning.nodeLabels is empty") {
		t.Errorf("pools %+v", r.Pools)
	}
}

func TestSeveralWebhooksNeedNamespace(t *testing.T) {
	other := webhookDeployment(1, 1)
	other.Namespace = "staging"
	c := &Collector{Client: fake.NewClientset(append(healthy(), other)...), DryRun: &stubDryRun{}}
	if _, err := c.Collect(context.Background()); err == nil || !strings.Contains(err.Error(), "pass --namespace") {
		t.Errorf("error %v, want one asking for --namespace", err)
	}
	c.Namespace = "staging"
	r, err := c.Collect(context.Background())
	if err != nil || r.Webhook.Namespace != "staging" {
		t.Errorf("with --namespace: %v, %+v", err, r)
	}
}

func TestWidthAndColour(t *testing.T) {
	objs := append(healthy(), gpuNode("gpu-b", layout.StateError, "DriverFilesNotAllowed: "+strings.Repeat("/usr/lib/x ", 30), 8, nil))
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now, Width: 100}); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if n := len([]rune(line)); n > 100 {
			t.Errorf("line of %d runes wider than 100: %q", n, line)
		}
	}
	out.Reset()
	if err := Render(&out, r, RenderOptions{Now: now, Color: true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "\x1b[31merror\x1b[0m") {
		t.Errorf("the error state is not red:\n%q", out.String())
	}
}

func TestOutputFormats(t *testing.T) {
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, healthy()...)
	var out bytes.Buffer
	if err := write(&out, r, Options{Output: "json"}); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatalf("json output does not decode: %v", err)
	}
	if back.Webhook.DryRun.Outcome != DryRunInjected || len(back.Nodes) != 2 {
		t.Errorf("json round trip %+v", back)
	}
	out.Reset()
	if err := write(&out, r, Options{Output: "yaml"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "outcome: injected") {
		t.Errorf("yaml output:\n%s", out.String())
	}
}

func TestDryRunNamespaceFlag(t *testing.T) {
	dr := &stubDryRun{pod: injectedPod("fp-gpu-a")}
	c := &Collector{Client: fake.NewClientset(healthy()...), DryRun: dr, DryRunNamespace: "team-b", Now: func() time.Time { return now }}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if dr.asked != "team-b" || r.Webhook.DryRun.Namespace != "team-b" {
		t.Errorf("dry run in %q, want team-b", dr.asked)
	}
}

// TestNodesWithoutPlugin: once runtime injection is in use, the report names
// the ready GPU nodes whose runtime has no gpu-injector NRI plugin; they need
// an operator only when driverDelivery: Runtime sends every GPU pod there
// marked for it.
func TestNodesWithoutPlugin(t *testing.T) {
	withPlugin := map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol}
	for name, tc := range map[string]struct {
		config    string
		nodes     []runtime.Object
		without   []string
		attention bool
	}{
		"no node has the plugin": {nodes: nil},
		"PreferRuntime, one node without": {
			nodes:   []runtime.Object{gpuNode("gpu-b", layout.StateReady, "", 4, withPlugin)},
			without: []string{"gpu-a"},
		},
		"Runtime, one node without": {
			config:    "driverDelivery: Runtime\n",
			nodes:     []runtime.Object{gpuNode("gpu-b", layout.StateReady, "", 4, withPlugin)},
			without:   []string{"gpu-a"},
			attention: true,
		},
		"Runtime, no node has the plugin": {
			config:    "driverDelivery: Runtime\n",
			without:   []string{"gpu-a"},
			attention: true,
		},
		"HostPath": {
			config: "driverDelivery: HostPath\n",
			nodes:  []runtime.Object{gpuNode("gpu-b", layout.StateReady, "", 4, withPlugin)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			objs := healthy()
			objs[3] = configMap(tc.config)
			r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, append(objs, tc.nodes...)...)
			if !slices.Equal(r.Plugin.Without, tc.without) {
				t.Errorf("without the plugin: %v, want %v", r.Plugin.Without, tc.without)
			}
			all := strings.Join(r.Attention, "\n")
			if got := strings.Contains(all, "without a registered gpu-injector NRI plugin"); got != tc.attention {
				t.Errorf("attention %v, want %v:\n%s", got, tc.attention, all)
			}
			var out bytes.Buffer
			if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
				t.Fatal(err)
			}
			if named := strings.Contains(out.String(), "without a registered NRI plugin"); named != (len(tc.without) > 0) {
				t.Errorf("table names nodes without the plugin: %v, want %v:\n%s", named, len(tc.without) > 0, out.String())
			}
		})
	}
}

// TestDryRunOnly: the helm test's check reads nothing but the dry run (its
// client here has no object at all, and a fake clientset answers every read
// of a missing one with NotFound), prints it, and says by its exit status
// whether the webhook mutated the pod.
func TestDryRunOnly(t *testing.T) {
	for name, tc := range map[string]struct {
		dr   *stubDryRun
		want int
		says string
	}{
		"injected":  {dr: &stubDryRun{pod: injectedPod("fp-gpu-a")}, want: ExitOK, says: "fingerprint: fp-gpu-a"},
		"unchanged": {dr: &stubDryRun{pod: DryRunPod()}, want: ExitAttention, says: "outcome: unchanged"},
		"denied": {dr: &stubDryRun{err: errors.New(`admission webhook "pods.gpu-injector.io" denied the request: no layout`)},
			want: ExitAttention, says: "outcome: denied"},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			c := &Collector{Client: client, DryRun: tc.dr, DryRunNamespace: "helm-test"}
			var out bytes.Buffer
			code, err := dryRunOnly(context.Background(), c, &out)
			if err != nil || code != tc.want {
				t.Fatalf("exit %d, %v; want %d", code, err, tc.want)
			}
			if !strings.Contains(out.String(), tc.says) || tc.dr.asked != "helm-test" {
				t.Errorf("dry run in %q printed:\n%s\nwant %q", tc.dr.asked, out.String(), tc.says)
			}
			if n := len(client.Actions()); n != 0 {
				t.Errorf("%d reads of the cluster besides the dry run: %v", n, client.Actions())
			}
		})
	}
	// The test's namespace, just created, has no default ServiceAccount yet.
	dr := &noServiceAccountYet{refusals: 3, stubDryRun: stubDryRun{pod: injectedPod("fp-gpu-a")}}
	c := &Collector{DryRun: dr, DryRunNamespace: "helm-test", RetryEvery: time.Millisecond}
	if code, err := dryRunOnly(context.Background(), c, io.Discard); err != nil || code != ExitOK || dr.refusals != -1 {
		t.Errorf("exit %d, %v, %d refusals left; want the pod tried again until admitted", code, err, dr.refusals)
	}
	if code, err := dryRunOnly(context.Background(), &Collector{DryRun: &stubDryRun{}}, io.Discard); err == nil || code != ExitUsage {
		t.Errorf("no namespace: exit %d, %v; want a usage error", code, err)
	}
}

type noServiceAccountYet struct {
	stubDryRun
	refusals int
}

func (s *noServiceAccountYet) DryRunPod(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
	s.refusals--
	if s.refusals >= 0 {
		return nil, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`error looking up service account helm-test/default: serviceaccount "default" not found`))
	}
	return s.stubDryRun.DryRunPod(ctx, ns, pod)
}

// TestBaselineNamespaceWithPoolsAtZero: with no GPU node yet, a baseline
// namespace's GPU pods are marked for the runtime of the node an autoscaler
// adds, not refused; under HostPath they would be.
func TestBaselineNamespaceWithPoolsAtZero(t *testing.T) {
	objs := []runtime.Object{
		webhookDeployment(2, 2), probeDaemonSet(0, 0), webhookConfiguration(), configMap(""),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		namespace("ml-baseline", optedIn("baseline")),
	}
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	for _, ns := range r.Namespaces {
		if ns.Refused != "" {
			t.Errorf("namespace %s flagged with no GPU node: %s", ns.Name, ns.Refused)
		}
	}
	objs[3] = configMap("apiVersion: config.gpu-injector.io/v1alpha1\nkind: InjectorConfiguration\ndriverDelivery: HostPath\n")
	r = collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	if len(r.Namespaces) != 1 || r.Namespaces[0].Refused != refusedMessage {
		t.Errorf("under HostPath, namespaces %+v, want ml-baseline refused", r.Namespaces)
	}
}
