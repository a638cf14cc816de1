//go:build e2e

package nri

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

// policyName is the chart's MutatingAdmissionPolicy of the environment's release.
const policyName = env.Release + "-runtime"

// webhookCalls is the API server's count of its calls to gpu-injector's webhook, every
// answer and rejection together.
func webhookCalls(t *testing.T) float64 {
	t.Helper()
	raw, err := client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("failed to read the API server's metrics: %v", err)
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_admission_webhook_request_total{") || !strings.Contains(line, `name="pods.gpu-injector.io"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("bad metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// createCounting creates a pod (server-side dry run when dryRun) and returns what the
// API server made of it and how many times it called the webhook meanwhile.
func createCounting(t *testing.T, ns string, p *corev1.Pod, dryRun bool) (*corev1.Pod, float64) {
	t.Helper()
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	before := webhookCalls(t)
	got, err := client().CoreV1().Pods(ns).Create(context.Background(), p.DeepCopy(), opts)
	if err != nil {
		t.Fatalf("failed to create pod %s: %v", p.Name, err)
	}
	return got, webhookCalls(t) - before
}

// runsWithDriver waits for a created CUDA pod to finish and checks that it loaded the
// node's driver.
func runsWithDriver(t *testing.T, ns string, p *corev1.Pod) {
	t.Helper()
	done := waitDone(t, ns, p.Name)
	log := podLog(t, ns, p.Name, p.Spec.Containers[0].Name)
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s %s:\n%s", p.Name, done.Status.Phase, log)
	}
	assertSawDriver(t, log, testEnv.KubeletNode().DriverVersion)
}

// upgrade runs helm upgrade of the release with the suite's values and sets; none: back
// to the installed values.
func upgrade(t *testing.T, sets ...string) {
	t.Helper()
	if err := testEnv.UpgradeChart(context.Background(), sets...); err != nil {
		t.Fatal(err)
	}
}

// webhookTakesLegacy creates a pod with a legacy limit, and checks that the webhook was
// called for it, renamed the limit and marked it for the NRI plugin.
func webhookTakesLegacy(t *testing.T, ns, name string, dryRun bool) *corev1.Pod {
	t.Helper()
	l, calls := createCounting(t, ns, legacyPod(name), dryRun)
	if calls < 1 {
		t.Errorf("the webhook was not called for a pod with a legacy limit")
	}
	assertRuntimeInjected(t, l, "cuda")
	if _, ok := l.Spec.Containers[0].Resources.Limits[legacyGPU]; ok {
		t.Errorf("the legacy limit was not renamed: %v", l.Spec.Containers[0].Resources.Limits)
	}
	return l
}

func legacyPod(name string) *corev1.Pod {
	p := cudaPod(name)
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{legacyGPU: p.Spec.Containers[0].Resources.Limits[gpu]}
	return p
}

func plainPod(name string) *corev1.Pod {
	p := cudaPod(name)
	p.Spec.NodeSelector = nil
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	return p
}

// TestAdmissionPolicy: with driverDelivery Runtime on 1.37, the chart's
// MutatingAdmissionPolicy (admission.policy auto) gives a modern GPU pod its change in
// the API server, which calls no webhook for it, and the pod runs with the node's
// driver; a legacy pod is the webhook's, which renames its resource and marks it; a pod
// without a GPU costs no call. With admission.policy=off (as on a cluster that does
// not serve the policy), the webhook does both, with the same result. On an API server
// that does not serve the policy (1.33 to 1.35), auto renders none and the webhook
// marks the modern pod (TestAdmissionPolicyNotServed runs such pods).
func TestAdmissionPolicy(t *testing.T) {
	waitPluginReady(t)
	served := servesPolicy(t)
	t.Cleanup(func() { upgrade(t) })
	upgrade(t, "config.driverDelivery=Runtime")
	ns := namespace(t, "restricted")

	t.Run("policy", func(t *testing.T) {
		if !served {
			assertNoPolicy(t)
			p, calls := createCounting(t, ns, cudaPod("modern"), true)
			assertWebhookMarked(t, p, calls)
			return
		}
		if _, err := client().AdmissionregistrationV1().MutatingAdmissionPolicies().Get(context.Background(), policyName, metav1.GetOptions{}); err != nil {
			t.Fatalf("the chart installed no MutatingAdmissionPolicy on an API server that serves the kind: %v", err)
		}
		// The API server loads a new policy from its informer: the first pods may get
		// neither the policy nor the webhook, whose matchConditions already leave them out.
		poll(t, apiTimeout, "the API server to apply the policy", func(ctx context.Context) (bool, error) {
			got, err := client().CoreV1().Pods(ns).Create(ctx, cudaPod("warm"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil && got.Annotations[layout.AnnotationRuntimeInject] != "", nil
		})
		p, calls := createCounting(t, ns, cudaPod("modern"), false)
		assertRuntimeInjected(t, p, "cuda")
		if calls != 0 {
			t.Errorf("the API server called the webhook %v times for a modern GPU pod the policy covers", calls)
		}
		if got, want := p.Annotations[layout.AnnotationInjected], `{"driverVersion":"","containers":["cuda"],"runtime":"nri"}`; got != want {
			t.Errorf("record %q, want %q", got, want)
		}
		if got := p.Labels[layout.LabelAdmission]; got != layout.AdmissionPolicy {
			t.Errorf("label %s is %q, want %q: the webhook's objectSelector would not leave the pod out", layout.LabelAdmission, got, layout.AdmissionPolicy)
		}
		runsWithDriver(t, ns, p)

		runsWithDriver(t, ns, webhookTakesLegacy(t, ns, "legacy", false))

		if _, calls := createCounting(t, ns, plainPod("web"), true); calls != 0 {
			t.Errorf("the webhook was called %v times for a pod without a GPU", calls)
		}

		// The policy's label written by the pod's author opts the pod out of the
		// webhook, as the annotation gpu-injector.io/inject: "false" does.
		forged := legacyPod("labelled-by-hand")
		forged.Labels = map[string]string{layout.LabelAdmission: layout.AdmissionPolicy}
		f, calls := createCounting(t, ns, forged, true)
		if calls != 0 {
			t.Errorf("the webhook was called %v times for a pod that carries the policy's label", calls)
		}
		if _, ok := f.Annotations[layout.AnnotationRuntimeInject]; ok {
			t.Errorf("a legacy pod labelled by hand was marked: %v", f.Annotations)
		}
	})

	t.Run("off", func(t *testing.T) {
		upgrade(t, "config.driverDelivery=Runtime", "admission.policy=off")
		_, err := client().AdmissionregistrationV1().MutatingAdmissionPolicies().Get(context.Background(), policyName, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("the policy is still there with admission.policy=off: %v", err)
		}
		// The API server may still hold the deleted policy a moment: wait until the
		// webhook is what marks a modern pod.
		poll(t, apiTimeout, "the webhook to take modern pods again", func(ctx context.Context) (bool, error) {
			got, calls := createCounting(t, ns, cudaPod("warm"), true)
			return calls >= 1 && got.Annotations[layout.AnnotationRuntimeInject] != "", nil
		})
		p, calls := createCounting(t, ns, cudaPod("modern-off"), false)
		if calls < 1 {
			t.Errorf("the webhook was not called for a modern GPU pod with admission.policy=off")
		}
		assertRuntimeInjected(t, p, "cuda")
		runsWithDriver(t, ns, p)
		webhookTakesLegacy(t, ns, "legacy-off", true)
		if _, calls := createCounting(t, ns, plainPod("web-off"), true); calls != 0 {
			t.Errorf("the webhook was called %v times for a pod without a GPU", calls)
		}
	})
}

// notServedFlags make a 1.36 or later API server one that does not serve
// MutatingAdmissionPolicy, as 1.33 to 1.35 do not by default: the kinds out of
// admissionregistration.k8s.io/v1 (so out of discovery, which helm reads), and the
// admission plugin off with them, as its feature gate is there. The kinds out with the
// plugin on leave the plugin's informers unsynced, and the API server refuses every
// write ("not yet ready to handle request"). /version still says the binary's release.
// The last flag is for the restart back: with it the API server stops in 2 s, where it
// otherwise waits for its clients' open connections up to the request timeout (60 s) and
// the launcher kills it after 30.
var notServedFlags = []string{
	"--feature-gates=MutatingAdmissionPolicy=false",
	"--runtime-config=admissionregistration.k8s.io/v1/mutatingadmissionpolicies=false,admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings=false",
	"--shutdown-send-retry-after=true",
}

// servesPolicy reports whether the API server lists admissionregistration.k8s.io/v1
// MutatingAdmissionPolicy in discovery.
func servesPolicy(t *testing.T) bool {
	t.Helper()
	rl, err := client().Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1")
	if err != nil {
		t.Fatalf("failed to discover admissionregistration.k8s.io/v1: %v", err)
	}
	for _, r := range rl.APIResources {
		if r.Kind == "MutatingAdmissionPolicy" {
			return true
		}
	}
	return false
}

// TestAdmissionPolicyNotServed: where the API server does not serve
// MutatingAdmissionPolicy (1.33 to 1.35; on a later release, the API server restarted
// without it, its /version unchanged), helm upgrade with runtime delivery and
// admission.policy auto renders no policy and no webhook condition on it, and the
// webhook gives a modern and a legacy GPU pod their change; both run with the node's
// driver.
func TestAdmissionPolicyNotServed(t *testing.T) {
	waitPluginReady(t)
	ctx := context.Background()
	if v, err := client().Discovery().ServerVersion(); err == nil {
		t.Logf("API server %s", v.GitVersion)
	}
	if servesPolicy(t) {
		// The default values install the policy on this API server, and helm refuses to
		// upgrade a release holding a kind the API server no longer serves: as a user
		// turning the kind off would, the release first drops it.
		upgrade(t, "admission.policy=off")
		t.Cleanup(func() {
			start := time.Now()
			upgrade(t, "admission.policy=off")
			if err := testEnv.Cluster.RestartAPIServer(ctx, 0); err != nil {
				t.Errorf("failed to bring the API server back with the policy: %v", err)
			} else if !servesPolicy(t) {
				t.Errorf("the API server restarted as it was serves no MutatingAdmissionPolicy")
			}
			upgrade(t)
			t.Logf("the API server restarted as it was, and the suite's values upgraded back, in %s", time.Since(start).Round(time.Millisecond))
		})
		start := time.Now()
		if err := testEnv.Cluster.RestartAPIServer(ctx, 0, notServedFlags...); err != nil {
			t.Fatal(err)
		}
		t.Logf("the API server restarted without MutatingAdmissionPolicy in %s", time.Since(start).Round(time.Millisecond))
		if servesPolicy(t) {
			t.Fatalf("the API server restarted with %v still serves MutatingAdmissionPolicy", notServedFlags)
		}
	}
	t.Cleanup(func() {
		start := time.Now()
		upgrade(t)
		t.Logf("helm upgrade back to the suite's values in %s", time.Since(start).Round(time.Millisecond))
	})
	start := time.Now()
	upgrade(t, "config.driverDelivery=Runtime")
	t.Logf("helm upgrade with runtime delivery, rolled out, in %s", time.Since(start).Round(time.Millisecond))

	assertNoPolicy(t)

	ns := namespace(t, "restricted")
	p, calls := createCounting(t, ns, cudaPod("modern"), false)
	assertWebhookMarked(t, p, calls)
	runsWithDriver(t, ns, p)
	runsWithDriver(t, ns, webhookTakesLegacy(t, ns, "legacy", false))
}

// assertNoPolicy checks that the release, on an API server that does not serve
// MutatingAdmissionPolicy, holds no policy and no switch of one, and that the webhook
// leaves out no pod by the policy's label: it must take every GPU pod.
func assertNoPolicy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	manifest, err := testEnv.HelmCommand(ctx, "get", "manifest", env.Release, "--namespace", env.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(manifest, "kind: MutatingAdmissionPolicy") {
		t.Errorf("the release holds a MutatingAdmissionPolicy the API server does not serve")
	}
	if strings.Contains(manifest, "--policy-binding-name") {
		t.Errorf("the webhook is told to switch a policy that is not there")
	}
	mwc, err := client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, env.Release, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("failed to read the webhook configuration: %v", err)
	}
	for _, wh := range mwc.Webhooks {
		if wh.ObjectSelector != nil && len(wh.ObjectSelector.MatchExpressions)+len(wh.ObjectSelector.MatchLabels) > 0 {
			t.Errorf("webhook %s leaves out the pods of a policy that is not there: objectSelector %v", wh.Name, wh.ObjectSelector)
		}
	}
}

// assertWebhookMarked checks that a modern GPU pod was the webhook's (calls: the API
// server's calls to it for the pod), marked for the plugin and not labelled as the
// policy's.
func assertWebhookMarked(t *testing.T, p *corev1.Pod, calls float64) {
	t.Helper()
	if calls < 1 {
		t.Errorf("the webhook was not called for a modern GPU pod")
	}
	if got := p.Labels[layout.LabelAdmission]; got != "" {
		t.Errorf("pod %s has label %s=%q with no policy on the API server", p.Name, layout.LabelAdmission, got)
	}
	assertRuntimeInjected(t, p, "cuda")
}

// setUnschedulable cordons (or uncordons) a node, as kubectl cordon does.
func setUnschedulable(t *testing.T, name string, cordoned bool) {
	t.Helper()
	patch := []byte(`{"spec":{"unschedulable":` + strconv.FormatBool(cordoned) + `}}`)
	if _, err := client().CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("failed to set node %s unschedulable=%v: %v", name, cordoned, err)
	}
}

// switchOn reports whether the webhook's switch of the policy is on: the policy's
// binding there and open (driverDelivery PreferRuntime).
func switchOn(ctx context.Context) (bool, error) {
	b, err := client().AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Get(ctx, policyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return gpunodes.PolicyBindingOpen(b), nil
}

// TestAdmissionPolicyByDefault: with the chart's default values (PreferRuntime) on 1.37,
// the MutatingAdmissionPolicy is installed, and the webhook's elected replica turns it on
// while every schedulable GPU node delivers the driver at the runtime: then a modern GPU
// pod costs no webhook call and runs with its driver. A schedulable node that only
// hostPath volumes serve (here an API-only node of another layout, uncordoned) turns it
// off, and the webhook decides again from the nodes; the test logs how long each switch
// takes, from the node's change to the API server's first pod admitted the new way. The
// switch survives upgrades away from the policy and back (switchAfterUpgrades), and the
// webhook's account may patch that binding and no other (switchGuarded). Where the API
// server does not serve the policy (1.33 to 1.35), the same nodes leave every GPU pod to
// the webhook (byDefaultWithoutPolicy).
func TestAdmissionPolicyByDefault(t *testing.T) {
	waitPluginReady(t)
	if !servesPolicy(t) {
		byDefaultWithoutPolicy(t)
		return
	}
	ctx := context.Background()
	b, err := client().AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Get(ctx, policyName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's default values installed no MutatingAdmissionPolicyBinding on this cluster: %v", err)
	}
	if b.Spec.ParamRef != nil || b.Spec.MatchResources == nil {
		t.Fatalf("the binding is not switched by its selector: paramRef %+v, matchResources %+v", b.Spec.ParamRef, b.Spec.MatchResources)
	}
	others := hostPathNodes(t)
	if on, err := switchOn(ctx); err != nil || on {
		t.Errorf("the switch is on (%v) beside schedulable nodes without the plugin", err)
	}
	ns := namespace(t, "restricted")
	// admittedBy polls until a modern pod's dry run is made by the policy (no webhook
	// call) or by the webhook, and returns how long that took.
	admittedBy := func(policy bool) time.Duration {
		start := time.Now()
		var last string
		defer func() {
			if t.Failed() {
				t.Logf("the last dry-run pod: %s", last)
			}
		}()
		poll(t, apiTimeout, "the policy on: "+strconv.FormatBool(policy), func(ctx context.Context) (bool, error) {
			p, calls := createCounting(t, ns, cudaPod("warm"), true)
			last = fmt.Sprintf("%v webhook calls, labels %v, annotations %v, nodeSelector %v", calls, p.Labels, p.Annotations, p.Spec.NodeSelector)
			byPolicy := p.Labels[layout.LabelAdmission] == layout.AdmissionPolicy
			return byPolicy == policy && (calls == 0) == policy && p.Annotations[layout.AnnotationRuntimeInject] != "", nil
		})
		return time.Since(start)
	}

	t.Cleanup(func() {
		for _, name := range others {
			setUnschedulable(t, name, false)
		}
	})
	start := time.Now()
	for _, name := range others {
		setUnschedulable(t, name, true)
	}
	poll(t, apiTimeout, "the switch on", switchOn)
	t.Logf("every node without the plugin cordoned: the switch on after %s, the policy admitting after %s",
		time.Since(start).Round(time.Millisecond), admittedBy(true).Round(time.Millisecond))

	p, calls := createCounting(t, ns, cudaPod("by-policy"), false)
	assertRuntimeInjected(t, p, "cuda")
	if calls != 0 {
		t.Errorf("the API server called the webhook %v times for a modern GPU pod the policy covers", calls)
	}
	runsWithDriver(t, ns, p)
	runsWithDriver(t, ns, webhookTakesLegacy(t, ns, "legacy", false))
	switchGuarded(t)
	switchAfterUpgrades(t, admittedBy)

	start = time.Now()
	setUnschedulable(t, others[0], false)
	poll(t, apiTimeout, "the switch off", func(ctx context.Context) (bool, error) {
		on, err := switchOn(ctx)
		return !on, err
	})
	t.Logf("node %s uncordoned: the switch off after %s, the webhook admitting after %s",
		others[0], time.Since(start).Round(time.Millisecond), admittedBy(false).Round(time.Millisecond))
	// Its accelerator fits only the plugin's node: the webhook marks it as the policy
	// would, from the nodes it sees.
	w, calls := createCounting(t, ns, cudaPod("by-webhook"), false)
	if calls < 1 {
		t.Errorf("the webhook was not called with the switch off")
	}
	assertRuntimeInjected(t, w, "cuda")
	runsWithDriver(t, ns, w)
}

// switchAfterUpgrades: with the switch on, the release is upgraded to values without the
// policy (admission.policy=off) and back. Without the policy the webhook takes every GPU
// pod; back, the binding is rendered closed and the switch opens it again within its
// resync (a minute). The test that follows turns the switch off by a node and checks
// that the webhook takes the pods again: a switch that was a ConfigMap parameter stayed
// on there, since the API server stops watching a parameter kind once no binding names
// it (kubernetes/kubernetes#130887).
func switchAfterUpgrades(t *testing.T, admittedBy func(policy bool) time.Duration) {
	ctx := context.Background()
	// Its nodes without the plugin cordoned, whose layouts the webhook leaves out.
	if err := testEnv.UpgradeChartRollout(ctx, "admission.policy=off"); err != nil {
		t.Fatal(err)
	}
	if _, err := client().AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Get(ctx, policyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the policy's binding is still there with admission.policy=off (%v)", err)
	}
	t.Logf("upgraded with admission.policy=off: the webhook admitting after %s", admittedBy(false).Round(time.Millisecond))
	start := time.Now()
	if err := testEnv.UpgradeChartRollout(ctx); err != nil {
		t.Fatal(err)
	}
	poll(t, 90*time.Second, "the switch on again after the upgrade back", switchOn)
	t.Logf("upgraded back: the switch on %s after the upgrade began, the policy admitting after %s",
		time.Since(start).Round(time.Millisecond), admittedBy(true).Round(time.Millisecond))
}

// switchGuarded: the webhook's own account may patch its policy's binding, by name, and
// nothing else of the kind: no other binding, no create, no delete (RBAC).
func switchGuarded(t *testing.T) {
	ctx := context.Background()
	kc := filepath.Join(t.TempDir(), "webhook.kubeconfig")
	if err := testEnv.TokenKubeconfig(ctx, testEnv.WebhookSA, nil, kc); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	asWebhook, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bindings := asWebhook.AdmissionregistrationV1().MutatingAdmissionPolicyBindings()
	if _, err := bindings.Get(ctx, policyName, metav1.GetOptions{}); err != nil {
		t.Errorf("the webhook's account cannot read its policy's binding: %v", err)
	}
	_, err = bindings.Patch(ctx, "another", types.MergePatchType, []byte(`{"spec":{"matchResources":{"namespaceSelector":null}}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the webhook's account patching another binding: %v, want forbidden by RBAC", err)
	}
	_, err = bindings.Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "another"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: policyName}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the webhook's account creating a binding: %v, want forbidden by RBAC", err)
	}
	err = bindings.Delete(ctx, policyName, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the webhook's account deleting its policy's binding: %v, want forbidden by RBAC", err)
	}
}

// hostPathNodes names the environment's nodes without the plugin, which only hostPath
// volumes serve.
func hostPathNodes(t *testing.T) []string {
	t.Helper()
	var others []string
	for _, n := range testEnv.Nodes {
		if !n.Kubelet {
			others = append(others, n.Name)
		}
	}
	if len(others) == 0 {
		t.Fatal("the environment has no node that only hostPath volumes serve")
	}
	return others
}

// byDefaultWithoutPolicy: the chart's default values on an API server that does not
// serve MutatingAdmissionPolicy. The release holds no policy and no switch; with every
// node without the plugin cordoned, where a served policy would take modern pods, the
// webhook still takes a modern and a legacy GPU pod, marks both for the plugin, and
// both run with the node's driver.
func byDefaultWithoutPolicy(t *testing.T) {
	ctx := context.Background()
	assertNoPolicy(t)
	others := hostPathNodes(t)
	t.Cleanup(func() {
		for _, name := range others {
			setUnschedulable(t, name, false)
		}
	})
	for _, name := range others {
		setUnschedulable(t, name, true)
	}
	ns := namespace(t, "restricted")
	p, calls := createCounting(t, ns, cudaPod("by-webhook"), false)
	assertWebhookMarked(t, p, calls)
	runsWithDriver(t, ns, p)
	runsWithDriver(t, ns, webhookTakesLegacy(t, ns, "legacy", false))
	if on, err := switchOn(ctx); err != nil || on {
		t.Errorf("the switch of a policy that is not there is on (%v)", err)
	}
}
