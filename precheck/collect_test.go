package precheck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

const release = "gpu-injector"

// stubDryRun answers the dry run as a test says: a fake clientset runs no
// admission.
type stubDryRun struct {
	pod      *corev1.Pod
	warnings []string
	err      error
	asked    []string
	// noAccount refuses this many tries first, as the API server does in a
	// namespace that has no default ServiceAccount yet.
	noAccount int
}

func (s *stubDryRun) DryRunPod(_ context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
	s.asked = append(s.asked, ns)
	if s.noAccount > 0 {
		s.noAccount--
		return nil, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", fmt.Errorf(`error looking up service account %s/default: serviceaccount "default" not found`, ns))
	}
	if s.err != nil {
		return nil, s.warnings, s.err
	}
	if s.pod != nil {
		return s.pod, s.warnings, nil
	}
	return pod, s.warnings, nil
}

func injectedPod() *corev1.Pod {
	p := status.DryRunPod()
	p.Annotations = map[string]string{layout.AnnotationInjected: `{"runtime":"nri","containers":["gpu"]}`, layout.AnnotationRuntimeInject: "gpu"}
	return p
}

// release is the chart's webhook Deployment and its configuration.
func releaseObjects(configYAML string) []runtime.Object {
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-webhook", Namespace: release,
			Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "webhook"}},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "webhook"}},
			Volumes:    []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpu-injector-config"}}}}},
		}}},
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-config", Namespace: release}, Data: map[string]string{"config.yaml": configYAML}}
	return []runtime.Object{dep, cm}
}

// healthyCluster has the example's nodes that deliver, and namespaces
// whose levels let them.
func healthyCluster(t *testing.T, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	for _, name := range []string{"gpu-nri", "gpu-toolkit", "gpu-hostpath"} {
		n := exampleNode(t, name)
		objs = append(objs, &n)
	}
	objs = append(objs,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml", Labels: map[string]string{layout.LabelInject: layout.InjectEnabled, labelEnforce: "privileged"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	return fake.NewClientset(objs...)
}

func collect(t *testing.T, c *Collector) *Report {
	t.Helper()
	c.Clock, c.RetryEvery = fixed, time.Millisecond
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return r
}

// TestOnlineHealthy: the release's configuration read from its ConfigMap,
// a dry-run pod the webhook marked: nothing needs attention.
func TestOnlineHealthy(t *testing.T) {
	dr := &stubDryRun{pod: injectedPod()}
	r := collect(t, &Collector{Client: healthyCluster(t, releaseObjects("")...), DryRun: dr})
	if len(r.Attention) != 0 {
		t.Errorf("attention %q, want none", r.Attention)
	}
	if r.Webhook.Outcome != WebhookOK || !strings.Contains(r.Webhook.Message, "in ml came back injected: marked for gpu-injector's NRI plugin") {
		t.Errorf("webhook %+v", r.Webhook)
	}
	if r.Config.Source != "the release's ConfigMap in "+release || r.Offline {
		t.Errorf("config from %q, offline %v", r.Config.Source, r.Offline)
	}
	if got := byName(r); got["gpu-nri"].Delivery != DeliveryNRI || got["gpu-toolkit"].Delivery != DeliveryNodeRuntime || got["gpu-hostpath"].Delivery != DeliveryHostPath {
		t.Errorf("nodes %+v", r.Nodes)
	}
	// The release's configuration decides: with HostPath the plugin's node
	// gets volumes too.
	r = collect(t, &Collector{Client: healthyCluster(t, releaseObjects("driverDelivery: HostPath")...), DryRun: &stubDryRun{pod: injectedPod()}})
	if n := byName(r)["gpu-nri"]; n.Delivery != DeliveryHostPath || r.Config.DriverDelivery != "HostPath" {
		t.Errorf("under the release's HostPath: %+v", n)
	}
	// A configuration given wins, and no release is looked for.
	r = collect(t, &Collector{Client: healthyCluster(t), DryRun: &stubDryRun{pod: injectedPod()}, Config: parseConfig(t, "driverDelivery: HostPath"), ConfigSource: "file cfg.yaml"})
	if r.Config.Source != "file cfg.yaml" || byName(r)["gpu-nri"].Delivery != DeliveryHostPath {
		t.Errorf("config %+v", r.Config)
	}
}

// TestOnlineWebhook: the API server's answer to the dry run, reported with
// its message.
func TestOnlineWebhook(t *testing.T) {
	for name, tc := range map[string]struct {
		dr      *stubDryRun
		outcome string
		says    string
	}{
		"unreachable": {dr: &stubDryRun{err: errors.New(`Internal error occurred: failed calling webhook "pods.gpu-injector.io": failed to call webhook: Post "https://gpu-injector-webhook.gpu-injector.svc:443/mutate-v1-pod?timeout=5s": no endpoints available for service "gpu-injector-webhook"`)},
			outcome: WebhookFailed, says: `the API server CANNOT REACH the webhook: Internal error occurred: failed calling webhook "pods.gpu-injector.io"`},
		"denied": {dr: &stubDryRun{err: errors.New(`admission webhook "pods.gpu-injector.io" denied the request: gpu-injector: no ready GPU node layout fits this pod`)},
			outcome: WebhookFailed, says: "in ml was DENIED: admission webhook"},
		"a warning of the webhook": {dr: &stubDryRun{warnings: []string{"gpu-injector: no ready GPU node layout fits this pod (...); admitted without the NVIDIA driver"}},
			outcome: WebhookOK, says: "came back with the webhook's warning: no ready GPU node layout fits"},
		"unchanged": {dr: &stubDryRun{warnings: []string{"would violate PodSecurity"}}, outcome: WebhookFailed, says: "admitted without gpu-injector's change"},
		"another error": {dr: &stubDryRun{err: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC"))},
			outcome: WebhookFailed, says: "could not be created: "},
	} {
		t.Run(name, func(t *testing.T) {
			r := collect(t, &Collector{Client: healthyCluster(t, releaseObjects("")...), DryRun: tc.dr})
			w := r.Webhook
			if w.Outcome != tc.outcome || !strings.Contains(w.Message, tc.says) {
				t.Errorf("webhook %+v, want %s saying %q", w, tc.outcome, tc.says)
			}
			if failed := tc.outcome == WebhookFailed; failed != (len(r.Attention) == 1) || failed && !strings.HasPrefix(r.Attention[0], "webhook: ") {
				t.Errorf("attention %q", r.Attention)
			}
		})
	}
}

// TestOnlineDryRunNamespace: the pod is tried where it is told, again while
// that namespace has no ServiceAccount yet; else in a namespace no check
// refused, and not at all without one.
func TestOnlineDryRunNamespace(t *testing.T) {
	dr := &stubDryRun{pod: injectedPod(), noAccount: 2}
	r := collect(t, &Collector{Client: healthyCluster(t), DryRun: dr, Namespace: release, DryRunNamespace: "helm-test", Config: parseConfig(t, "")})
	if r.Webhook.Outcome != WebhookOK || len(dr.asked) != 3 || dr.asked[2] != "helm-test" {
		t.Errorf("webhook %+v after %v", r.Webhook, dr.asked)
	}

	baseline := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "aaa", Labels: map[string]string{layout.LabelInject: layout.InjectEnabled, labelEnforce: "baseline"}}}
	dr = &stubDryRun{pod: injectedPod()}
	r = collect(t, &Collector{Client: healthyCluster(t, baseline), DryRun: dr, Config: parseConfig(t, "")})
	if len(dr.asked) != 1 || dr.asked[0] != "ml" {
		t.Errorf("tried in %v, want ml, where no node is refused", dr.asked)
	}
	if len(r.Attention) != 1 || !strings.Contains(r.Attention[0], "namespace aaa enforces Pod Security \"baseline\"") {
		t.Errorf("attention %q", r.Attention)
	}

	dr = &stubDryRun{}
	nodes := exampleNode(t, "gpu-nri")
	r = collect(t, &Collector{Client: fake.NewClientset(&nodes), DryRun: dr, Config: parseConfig(t, "")})
	if r.Webhook.Outcome != WebhookSkipped || len(dr.asked) != 0 || len(r.Attention) != 0 || !strings.Contains(strings.Join(r.Notes, "\n"), "no namespace is opted in") {
		t.Errorf("webhook %+v, notes %q, attention %q", r.Webhook, r.Notes, r.Attention)
	}
}

// TestOnlineReadErrors: a cluster that cannot be read is an error, not a
// report.
func TestOnlineReadErrors(t *testing.T) {
	for _, resource := range []string{"nodes", "namespaces"} {
		client := healthyCluster(t)
		client.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "", errors.New("RBAC"))
		})
		c := &Collector{Client: client, DryRun: &stubDryRun{}, Config: parseConfig(t, "")}
		if _, err := c.Collect(context.Background()); err == nil || !strings.Contains(err.Error(), "failed to list") {
			t.Errorf("%s forbidden: %v", resource, err)
		}
	}
}

// TestOnlineWithoutTheRelease: a user who may not read the release, or
// before the install, is checked against the defaults, and told so.
func TestOnlineWithoutTheRelease(t *testing.T) {
	client := healthyCluster(t)
	client.PrependReactor("list", "deployments", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "", errors.New("RBAC"))
	})
	r := collect(t, &Collector{Client: client, DryRun: &stubDryRun{pod: injectedPod()}, Namespace: release})
	if !strings.HasPrefix(r.Config.Source, "the defaults (failed to list the webhook Deployments") || r.Config.DriverDelivery != "PreferRuntime" {
		t.Errorf("config %+v, want the defaults and why", r.Config)
	}
	r = collect(t, &Collector{Client: healthyCluster(t), DryRun: &stubDryRun{pod: injectedPod()}})
	if !strings.Contains(r.Config.Source, "defaults assumed") {
		t.Errorf("before the install: config %+v, want the defaults, said", r.Config)
	}
}

// policyDryRun answers as an API server whose admission policy takes the
// modern pod: the webhook is asked only about the legacy one.
type policyDryRun struct {
	legacy *stubDryRun
}

func (p *policyDryRun) DryRunPod(ctx context.Context, ns string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
	if _, ok := pod.Spec.Containers[0].Resources.Limits[legacyResource]; ok {
		return p.legacy.DryRunPod(ctx, ns, pod)
	}
	out := injectedPod()
	out.Labels = map[string]string{layout.LabelAdmission: layout.AdmissionPolicy}
	return out, nil, nil
}

// TestOnlineAdmissionPolicy: where the chart's admission policy marks the
// dry-run pod, the webhook is asked with a pod only it takes.
func TestOnlineAdmissionPolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		legacy  *stubDryRun
		outcome string
		says    string
	}{
		"webhook up":   {legacy: &stubDryRun{pod: injectedPod()}, outcome: WebhookOK, says: "which only the webhook takes: a dry-run GPU pod in ml came back injected"},
		"webhook down": {legacy: &stubDryRun{err: errors.New(`Internal error occurred: failed calling webhook "pods.gpu-injector.io": no endpoints available`)}, outcome: WebhookFailed, says: "which only the webhook takes: the API server CANNOT REACH the webhook"},
	} {
		t.Run(name, func(t *testing.T) {
			r := collect(t, &Collector{Client: healthyCluster(t), DryRun: &policyDryRun{legacy: tc.legacy}, Config: parseConfig(t, "")})
			w := r.Webhook
			if w.Outcome != tc.outcome || !strings.Contains(w.Message, "the chart's MutatingAdmissionPolicy marked the dry-run GPU pod in ml") || !strings.Contains(w.Message, tc.says) {
				t.Errorf("webhook %+v, want %s saying %q", w, tc.outcome, tc.says)
			}
			if len(tc.legacy.asked) != 1 || tc.legacy.asked[0] != "ml" {
				t.Errorf("the legacy pod was tried in %v", tc.legacy.asked)
			}
		})
	}
}
