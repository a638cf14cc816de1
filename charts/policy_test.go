package charts_test

// One definition of runtime delivery's change: the chart's MutatingAdmissionPolicy, run
// as the API server runs it (its CEL compiler, matcher and JSON Patch), against Mutate on
// every golden case of the webhook, and the webhook's matchConditions against both.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/applyconfigurations"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

const goldenDir = "../webhook/inject/testdata"

var (
	podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// policyVersions are the CEL environments the policy must compile in: the oldest API
// server that serves it (1.36, compatibility 1.35) and the vendored one.
var policyVersions = map[string]*version.Version{
	"1.36 cluster (compatibility 1.35)": version.MajorMinor(1, 35),
	"current":                           environment.DefaultCompatibilityVersion(),
}

// admissionPolicy is the chart's MutatingAdmissionPolicy as the API server's mutating
// plugin compiles it (k8s.io/apiserver's policy/mutating compilePolicy, which is not
// exported: the same compiler, declarations and JSON patcher).
type admissionPolicy struct {
	compiler *plugincel.CompositedCompiler
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
}

func compileMutatingPolicy(t testing.TB, p *admissionregistrationv1.MutatingAdmissionPolicy) admissionPolicy {
	t.Helper()
	decls := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
	patchDecls := decls
	patchDecls.HasPatchTypes = true
	variables := make([]plugincel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	conds := make([]plugincel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i := range p.Spec.MatchConditions {
		conds[i] = (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i])
	}
	var ap admissionPolicy
	for vname, v := range policyVersions {
		compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(v))
		if err != nil {
			t.Fatalf("failed to build the CEL compiler: %v", err)
		}
		// Created objects are compiled with NewExpressions; the plugin evaluates with
		// StoredExpressions, which the current version's compiler below returns.
		mode := environment.NewExpressions
		if vname == "current" {
			mode = environment.StoredExpressions
		}
		for _, variable := range variables {
			if res := compiler.CompileAndStoreVariable(variable, decls, mode); res.Error != nil {
				t.Fatalf("%s: the API server would refuse variable %s: %v", vname, variable.GetName(), res.Error)
			}
		}
		for _, c := range conds {
			if res := compiler.CompileCELExpression(c, decls, mode); res.Error != nil {
				t.Fatalf("%s: the API server would refuse matchCondition %q: %v", vname, c.GetExpression(), res.Error)
			}
		}
		var patchers []patch.Patcher
		for _, m := range p.Spec.Mutations {
			var accessor plugincel.ExpressionAccessor
			newPatcher := patch.NewJSONPatcher
			switch {
			case m.PatchType == admissionregistrationv1.PatchTypeJSONPatch && m.JSONPatch != nil:
				accessor = &patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}
			case m.PatchType == admissionregistrationv1.PatchTypeApplyConfiguration && m.ApplyConfiguration != nil:
				accessor = &patch.ApplyConfigurationCondition{Expression: m.ApplyConfiguration.Expression}
				newPatcher = patch.NewApplyConfigurationPatcher
			default:
				t.Fatalf("mutation of type %s without its expression", m.PatchType)
			}
			ev := compiler.CompileMutatingEvaluator(accessor, patchDecls, mode)
			if errs := ev.CompilationErrors(); len(errs) > 0 {
				t.Fatalf("%s: the API server would refuse the mutation: %v", vname, errors.Join(errs...))
			}
			patchers = append(patchers, newPatcher(ev))
		}
		if vname == "current" {
			ap.patchers, ap.compiler = patchers, compiler
			ap.matcher = matchconditions.NewMatcher(compiler.CompileCondition(conds, decls, environment.StoredExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name)
		}
	}
	return ap
}

var podScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// podTypeConverter is the schema an ApplyConfiguration mutation merges with, as the API
// server's type converter gives it for built-in kinds.
var podTypeConverter = applyconfigurations.NewTypeConverter(podScheme)

func podAttributes(pod *corev1.Pod) *admission.VersionedAttributes {
	attr := admission.NewAttributesRecord(pod, nil, podGVK, pod.Namespace, pod.Name, podGVR, "", admission.Create, nil, false, &user.DefaultInfo{Name: "alice"})
	return &admission.VersionedAttributes{Attributes: attr, VersionedKind: podGVK, VersionedObject: pod}
}

// admit runs the policy on a pod as the API server's mutating plugin does: nil when
// its matchConditions leave the pod out, else the pod its mutations make.
func (ap admissionPolicy) admit(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	va := podAttributes(pod.DeepCopy())
	// The plugin evaluates a policy's conditions and mutations in one context, which
	// holds its variables.
	ctx := ap.compiler.CreateContext(context.Background())
	m := ap.matcher.Match(ctx, va, nil, nil)
	if m.Error != nil {
		t.Fatalf("the policy's matchConditions failed to evaluate: %v", m.Error)
	}
	if !m.Matches {
		return nil
	}
	oi := admission.NewObjectInterfacesFromScheme(podScheme)
	for _, p := range ap.patchers {
		out, err := p.Patch(ctx, patch.Request{
			MatchedResource: podGVR, VersionedAttributes: va, ObjectInterfaces: oi,
			TypeConverter: podTypeConverter,
		}, celconfig.RuntimeCELCostBudget)
		if err != nil {
			t.Fatalf("the policy's mutation failed: %v", err)
		}
		// The plugin's dispatcher turns a merge's unstructured result back into the
		// typed object.
		if out, err = oi.GetObjectConvertor().ConvertToVersion(out, podGVK.GroupVersion()); err != nil {
			t.Fatalf("failed to convert the policy's result: %v", err)
		}
		va.VersionedObject = out
	}
	return va.VersionedObject.(*corev1.Pod)
}

// webhookGate is what the API server checks before it calls the webhook for a pod of an
// opted-in namespace: the objectSelector on the pod's labels, then the matchConditions.
type webhookGate struct {
	selector labels.Selector
	matcher  matchconditions.Matcher
}

func newWebhookGate(t testing.TB, wh admissionregistrationv1.MutatingWebhook, versions map[string]*version.Version) *webhookGate {
	t.Helper()
	sel := labels.Everything()
	if wh.ObjectSelector != nil {
		var err error
		if sel, err = metav1.LabelSelectorAsSelector(wh.ObjectSelector); err != nil {
			t.Fatalf("the API server would refuse the webhook's objectSelector: %v", err)
		}
	}
	return &webhookGate{selector: sel, matcher: webhookMatcher(t, wh, versions)}
}

// webhookMatcher is the webhook's matchConditions as the API server evaluates them.
func webhookMatcher(t testing.TB, wh admissionregistrationv1.MutatingWebhook, versions map[string]*version.Version) matchconditions.Matcher {
	t.Helper()
	accessors := make([]plugincel.ExpressionAccessor, len(wh.MatchConditions))
	for i := range wh.MatchConditions {
		accessors[i] = (*matchconditions.MatchCondition)(&wh.MatchConditions[i])
	}
	for vname, v := range versions {
		compiler := plugincel.NewCompiler(environment.MustBaseEnvSet(v))
		for _, a := range accessors {
			if res := compiler.CompileCELExpression(a, celDecls, environment.NewExpressions); res.Error != nil {
				t.Fatalf("%s: the API server would refuse matchCondition %q: %v", vname, a.GetExpression(), res.Error)
			}
		}
	}
	compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	return matchconditions.NewMatcher(compiler.CompileCondition(accessors, celDecls, environment.StoredExpressions), wh.FailurePolicy, "webhook", "admit", wh.Name)
}

func webhookCalled(t testing.TB, g *webhookGate, pod *corev1.Pod) bool {
	t.Helper()
	if !g.selector.Matches(labels.Set(pod.Labels)) {
		return false
	}
	res := g.matcher.Match(context.Background(), podAttributes(pod.DeepCopy()), nil, nil)
	if res.Error != nil {
		t.Fatalf("the webhook's matchConditions failed to evaluate: %v", res.Error)
	}
	return res.Matches
}

// goldenCase is what this test reads of a golden case: the pod, the configuration
// document (without apiVersion and kind) and the namespace's labels. The nodes are not
// read: with driverDelivery Runtime, a pod the policy covers is decided without them.
type goldenCase struct {
	pod             *corev1.Pod
	config          map[string]any
	namespaceLabels map[string]string
	// layouts are the cluster's under PreferRuntime, one for which
	// inject.PolicyServes holds; none under Runtime, which reads none.
	layouts []*inject.Layout
}

func loadGolden(t *testing.T, file string) goldenCase {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var gc goldenCase
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("failed to read %s: %v", file, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("failed to parse %s: %v", file, err)
		}
		switch m["kind"] {
		case "Pod":
			gc.pod = &corev1.Pod{}
			if err := yaml.UnmarshalStrict(doc, gc.pod); err != nil {
				t.Fatalf("failed to parse the pod of %s: %v", file, err)
			}
		case config.Kind:
			delete(m, "apiVersion")
			delete(m, "kind")
			gc.config = m
		case "Namespace":
			var ns corev1.Namespace
			if err := yaml.UnmarshalStrict(doc, &ns); err != nil {
				t.Fatal(err)
			}
			gc.namespaceLabels = ns.Labels
		}
	}
	if gc.pod == nil {
		t.Fatalf("%s: no Pod", file)
	}
	return gc
}

// policyRender is the chart rendered for one configuration with driverDelivery Runtime.
type policyRender struct {
	cfg     *config.Configuration
	policy  *admissionPolicy // nil where the chart rendered none
	webhook *webhookGate
}

var (
	policyRendersMu sync.Mutex
	policyRenders   = map[string]policyRender{}
)

// renderForConfig renders the chart on Kubernetes 1.37 with the case's configuration
// given as the chart's config values, and driverDelivery Runtime; Mutate reads the
// configuration the chart writes into its ConfigMap, as the webhook does.
func renderForConfig(t *testing.T, cfg map[string]any) policyRender {
	t.Helper()
	return renderForDelivery(t, cfg, config.DeliveryRuntime)
}

// renderForDelivery is renderForConfig with the driverDelivery given.
func renderForDelivery(t *testing.T, cfg map[string]any, delivery config.DriverDelivery) policyRender {
	t.Helper()
	values := map[string]any{}
	for k, v := range cfg {
		values[k] = v
	}
	values["driverDelivery"] = delivery
	doc, err := json.Marshal(map[string]any{"config": values})
	if err != nil {
		t.Fatal(err)
	}
	policyRendersMu.Lock()
	defer policyRendersMu.Unlock()
	if r, ok := policyRenders[string(doc)]; ok {
		return r
	}
	// helm splits --values on commas, which a subtest's name (and so its TempDir) may hold.
	dir, err := os.MkdirTemp("", "values")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "values.json")
	if err := os.WriteFile(file, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	out := render(t, renderOpts{kubeVersion: "1.37.2", files: []string{file}})
	pr := policyRender{cfg: checkConfigMap(t, out)}
	if maps := out.all("MutatingAdmissionPolicy"); len(maps) > 0 {
		p := mustGet[admissionregistrationv1.MutatingAdmissionPolicy](t, out, "MutatingAdmissionPolicy", fullname+"-runtime")
		ap := compileMutatingPolicy(t, p)
		pr.policy = &ap
		b := mustGet[admissionregistrationv1.MutatingAdmissionPolicyBinding](t, out, "MutatingAdmissionPolicyBinding", fullname+"-runtime")
		if b.Spec.PolicyName != p.Name {
			t.Fatalf("the binding names policy %q, want %q", b.Spec.PolicyName, p.Name)
		}
	}
	pr.webhook = newWebhookGate(t, mutatingWebhook(t, out), celVersions)
	policyRenders[string(doc)] = pr
	return pr
}

// TestPolicyMatchesMutate: for every golden case, with driverDelivery Runtime, a pod
// the chart's MutatingAdmissionPolicy takes comes out of it exactly as Mutate leaves it,
// with the policy's label and no warning Mutate would give, and the webhook is not called
// for the pod the policy made (policies run before webhooks); a pod the policy leaves out
// is sent to the webhook
// whenever Mutate would change it, warn or deny it. The pods the policy leaves the
// webhook are those that need code or the cluster's state.
func TestPolicyMatchesMutate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	covered := map[string]bool{}
	for _, file := range files {
		base := strings.TrimSuffix(filepath.Base(file), ".yaml")
		if strings.HasPrefix(base, "nodes") {
			continue
		}
		t.Run(base, func(t *testing.T) {
			gc := loadGolden(t, file)
			pr := renderForConfig(t, gc.config)
			if pr.policy == nil {
				t.Logf("the chart renders no policy for this configuration")
			}
			if checkPolicyCase(t, pr, gc) {
				mu.Lock()
				covered[base] = true
				mu.Unlock()
			}
		})
	}
	// The modern GPU pods of the golden cases: the policy must take every one.
	for _, base := range []string{"runtime-all-ready", "multi-container", "gpu-init-container", "mig-resource", "gpu-shared", "tensorflow-deployment", "runtime-only-no-gpu-node"} {
		if !covered[base] {
			t.Errorf("the policy does not take golden case %s, a modern GPU pod", base)
		}
	}
	t.Logf("the policy takes %d golden cases: %v", len(covered), sortedKeys(covered))
}

// checkPolicyCase checks one pod, and says whether the policy took it.
func checkPolicyCase(t *testing.T, pr policyRender, gc goldenCase) bool {
	t.Helper()
	excluded := slices.Contains(pr.cfg.ExcludedNamespaces, gc.pod.Namespace)
	mutated := gc.pod.DeepCopy()
	res := inject.Mutate(inject.Input{Pod: mutated, NamespaceLabels: gc.namespaceLabels, Layouts: gc.layouts}, pr.cfg)
	changes := len(res.Patch) > 0 || len(res.Warnings) > 0 || res.Decision == inject.DecisionDenied
	var byPolicy *corev1.Pod
	if pr.policy != nil && !excluded {
		byPolicy = pr.policy.admit(t, gc.pod)
	}
	if byPolicy == nil {
		// Neither the policy's nor the webhook's namespaceSelector takes an excluded
		// namespace's pod; Mutate leaves it alone too.
		if excluded {
			if changes {
				t.Errorf("a pod of excluded namespace %s: Mutate %s it (%v)", gc.pod.Namespace, res.Decision, res.Patch)
			}
			return false
		}
		if changes && !webhookCalled(t, pr.webhook, gc.pod) {
			t.Errorf("neither the policy nor the webhook takes this pod, but Mutate gives decision %s, patch %v, warnings %q", res.Decision, res.Patch, res.Warnings)
		}
		return false
	}
	if warnings := slices.DeleteFunc(slices.Clone(res.Warnings), noNodeYet); res.Decision != inject.DecisionInjected || len(warnings) > 0 {
		t.Errorf("the policy takes a pod that Mutate gives decision %s (%s), warnings %q", res.Decision, res.Reason, warnings)
	}
	labelled(mutated)
	if !apiequality.Semantic.DeepEqual(byPolicy, mutated) {
		t.Errorf("the policy and Mutate disagree (-Mutate and the policy's label +policy):\n%s", diffLines(t, mutated, byPolicy))
	}
	if webhookCalled(t, pr.webhook, byPolicy) {
		t.Errorf("the webhook is called for the pod the policy made")
	}
	again := byPolicy.DeepCopy()
	if res2 := inject.Mutate(inject.Input{Pod: again, NamespaceLabels: gc.namespaceLabels, Layouts: gc.layouts}, pr.cfg); len(res2.Patch) > 0 || len(res2.Warnings) > 0 {
		t.Errorf("Mutate changes the pod the policy made: %v %q", res2.Patch, res2.Warnings)
	}
	if pr.policy.admit(t, byPolicy) != nil {
		t.Errorf("the policy takes the pod it made again")
	}
	return true
}

// noNodeYet: the webhook's warning that no known GPU node fits the pod yet, which the
// policy, admitting the same pod without it, cannot give.
func noNodeYet(w string) bool {
	return strings.Contains(w, "no GPU node is ready yet") || strings.Contains(w, "no ready GPU node fits this pod yet")
}

// switchedLayouts are clusters for which the webhook's switch turns the policy on: every
// pool at zero, nodes whose NRI plugin is registered, and nodes whose own runtime
// injects the driver, beside the plugin's.
func switchedLayouts() map[string][]*inject.Layout {
	node := func(name string, l map[string]string) *inject.NodeInfo {
		return &inject.NodeInfo{Name: name, Labels: inject.NewLabels(l), AllocatableGPUs: 8}
	}
	nri := map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol}
	plan := layout.Plan{Mounts: []layout.Mount{{HostPath: "/usr/lib64/libcuda.so.1", ContainerPath: "/usr/lib64/libcuda.so.1", Kind: layout.KindFile}}}
	toolkit := layout.Plan{RuntimeInjection: layout.RuntimeToolkit}
	return map[string][]*inject.Layout{
		"every pool at zero": nil,
		"the plugin's nodes": {{Fingerprint: "a", Plan: plan, AllocatableGPUs: 16, Nodes: []*inject.NodeInfo{node("gpu-1", nri), node("gpu-2", nri)}}},
		"the plugin's and the toolkit's nodes": {
			{Fingerprint: "a", Plan: plan, AllocatableGPUs: 8, Nodes: []*inject.NodeInfo{node("gpu-1", nri)}},
			{Fingerprint: "b", Plan: toolkit, AllocatableGPUs: 8, Nodes: []*inject.NodeInfo{node("eks-1", nil)}},
		},
	}
}

// TestSwitchedPolicyMatchesMutate: with the chart's default driverDelivery,
// PreferRuntime, on every cluster the webhook's switch turns the policy on for, a pod
// the policy takes comes out of it exactly as Mutate leaves it there (but for the
// warning that no node fits yet), and every other pod goes to the webhook. A cluster
// with a node that only hostPath serves turns the switch off.
func TestSwitchedPolicyMatchesMutate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clusters := switchedLayouts()
	for _, file := range files {
		base := strings.TrimSuffix(filepath.Base(file), ".yaml")
		if strings.HasPrefix(base, "nodes") {
			continue
		}
		t.Run(base, func(t *testing.T) {
			gc := loadGolden(t, file)
			if d, _ := gc.config["driverDelivery"].(string); d != "" && d != string(config.DeliveryPreferRuntime) {
				t.Skipf("the case's driverDelivery is %s", d)
			}
			pr := renderForDelivery(t, gc.config, config.DeliveryPreferRuntime)
			for name, layouts := range clusters {
				if !inject.PolicyServes(pr.cfg, layouts, nil) {
					if pr.cfg.RuntimeInjection == config.RuntimeInjectionSkip {
						continue
					}
					t.Fatalf("%s: the switch would turn the policy off", name)
				}
				gc.layouts = layouts
				checkPolicyCase(t, pr, gc)
			}
		})
	}
	hostPathOnly := []*inject.Layout{{Fingerprint: "c", Plan: layout.Plan{Mounts: []layout.Mount{{HostPath: "/usr/lib64/libcuda.so.1", ContainerPath: "/usr/lib64/libcuda.so.1", Kind: layout.KindFile}}},
		AllocatableGPUs: 8, Nodes: []*inject.NodeInfo{{Name: "rhel-1", AllocatableGPUs: 8}}}}
	if cfg := config.Default(); inject.PolicyServes(cfg, append(clusters["the plugin's nodes"], hostPathOnly...), nil) {
		t.Errorf("the switch keeps the policy on beside a node that only hostPath volumes serve")
	}
}

// labelled puts the policy's label on a pod Mutate injected: the one thing the policy
// writes that the webhook does not, by which the webhook's objectSelector leaves the
// policy's pods out.
func labelled(pod *corev1.Pod) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[layout.LabelAdmission] = layout.AdmissionPolicy
}

func diffLines(t *testing.T, a, b *corev1.Pod) string {
	t.Helper()
	ya, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	yb, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	al, bl := strings.Split(string(ya), "\n"), strings.Split(string(yb), "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestPolicyEdges: pods the golden cases lack, at the edges of what the policy takes,
// each through the policy, the webhook's matchConditions and Mutate as above.
func TestPolicyEdges(t *testing.T) {
	gpu := func(name, q string) string {
		return "\n  - name: " + name + "\n    image: cuda\n    resources:\n      limits: {nvidia.com/gpu: \"" + q + "\"}"
	}
	long := strings.Repeat("a", 60)
	tests := map[string]struct {
		pod    string
		config map[string]any
		takes  bool
	}{
		"no annotations at all":          {pod: "spec:\n  containers:" + gpu("main", "1"), takes: true},
		"opted out in capitals":          {pod: "metadata:\n  annotations: {gpu-injector.io/inject: \"FALSE\"}\nspec:\n  containers:" + gpu("main", "1")},
		"opt-out spelled with a long s":  {pod: "metadata:\n  annotations: {gpu-injector.io/inject: \"falſe\"}\nspec:\n  containers:" + gpu("main", "1")},
		"inject annotation true":         {pod: "metadata:\n  annotations: {gpu-injector.io/inject: \"true\"}\nspec:\n  containers:" + gpu("main", "1"), takes: true},
		"a zero GPU limit only":          {pod: "spec:\n  containers:" + gpu("main", "0")},
		"a zero and a real GPU":          {pod: "spec:\n  containers:" + gpu("idle", "0") + gpu("main", "2"), takes: true},
		"two containers of one name":     {pod: "spec:\n  containers:" + gpu("main", "1") + gpu("main", "1")},
		"a name too long for NRI's key":  {pod: "spec:\n  containers:" + gpu(long, "1") + gpu("b", "1"), takes: true},
		"another extended resource":      {pod: "spec:\n  containers:" + gpu("main", "1") + "\n  - name: net\n    image: x\n    resources:\n      limits: {rdma/hca: \"1\"}"},
		"a DeviceClass's implicit name":  {pod: "spec:\n  containers:\n  - name: main\n    image: cuda\n    resources:\n      limits: {deviceclass.resource.kubernetes.io/gpu.nvidia.com: \"1\"}"},
		"cpu, memory and hugepages":      {pod: "spec:\n  containers:\n  - name: main\n    image: cuda\n    resources:\n      limits: {nvidia.com/gpu: \"1\", cpu: \"2\", memory: 1Gi, hugepages-2Mi: 64Mi, ephemeral-storage: 1Gi}", takes: true},
		"a hostPath volume of no driver": {pod: "spec:\n  volumes:\n  - name: data\n    hostPath: {path: /data}\n  containers:" + gpu("main", "1")},
		"the policy's label by hand":     {pod: "metadata:\n  labels: {gpu-injector.io/admission: policy}\nspec:\n  containers:\n  - name: main\n    image: cuda\n    resources:\n      limits: {alpha.kubernetes.io/nvidia-gpu: \"1\"}"},
		"another plugin required":        {pod: "metadata:\n  annotations: {required-plugins.noderesource.dev/pod: \"[x]\"}\nspec:\n  containers:" + gpu("main", "1")},
		"containers All":                 {pod: "spec:\n  initContainers:\n  - name: init\n    image: busybox\n  containers:" + gpu("main", "1") + "\n  - name: side\n    image: envoy", config: map[string]any{"containers": "All"}, takes: true},
		"a GPU request above its limit":  {pod: "spec:\n  containers:\n  - name: main\n    image: cuda\n    resources:\n      limits: {nvidia.com/gpu: \"0\"}\n      requests: {nvidia.com/gpu: \"1\"}", takes: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			doc := "apiVersion: v1\nkind: Pod\n" + tc.pod
			if !strings.HasPrefix(tc.pod, "metadata:") {
				doc = "apiVersion: v1\nkind: Pod\nmetadata:\n" + tc.pod
			}
			doc = strings.Replace(doc, "metadata:\n", "metadata:\n  name: p\n  namespace: ml\n", 1)
			pod := &corev1.Pod{}
			if err := yaml.UnmarshalStrict([]byte(doc), pod); err != nil {
				t.Fatalf("bad test pod: %v\n%s", err, doc)
			}
			pr := renderForConfig(t, tc.config)
			if pr.policy == nil {
				t.Fatal("the chart renders no policy")
			}
			if got := checkPolicyCase(t, pr, goldenCase{pod: pod}); got != tc.takes {
				t.Errorf("the policy takes the pod: %v, want %v", got, tc.takes)
			}
		})
	}
}

// clusterAdmissionAPIs is admissionregistration.k8s.io/v1 as helm install, upgrade and
// template --validate list it from an API server (action.GetVersionSet: the
// group/version, then group/version/Kind of every resource served): the webhook and
// validating-policy kinds every supported release serves, and kinds.
func clusterAdmissionAPIs(kinds ...string) []string {
	const gv = "admissionregistration.k8s.io/v1"
	apis := []string{gv}
	for _, k := range append([]string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, kinds...) {
		apis = append(apis, gv+"/"+k)
	}
	return apis
}

// TestAdmissionPolicyRender: where the chart renders the policy and the webhook's
// condition on it, by admission.policy, the cluster's version, the kinds it lists and
// the configuration. Where helm lists the cluster's kinds, a 1.36 or later API server
// that leaves the kind out (the MutatingAdmissionPolicy feature gate off,
// --runtime-config, --emulated-version) gets no policy it would refuse.
func TestAdmissionPolicyRender(t *testing.T) {
	runtimeDelivery := "config.driverDelivery=Runtime"
	kube137 := renderOpts{kubeVersion: "1.37.2"}
	tests := map[string]struct {
		opts renderOpts
		want bool
		// switched: the binding takes the webhook's switch as its parameter.
		switched bool
		refused  string // helm fails with this
	}{
		"auto, runtime delivery on 1.37":          {opts: with(kube137, runtimeDelivery), want: true},
		"auto, runtime delivery on 1.36":          {opts: with(kube136, runtimeDelivery), want: true},
		"auto, runtime delivery on 1.35":          {opts: with(renderOpts{kubeVersion: "1.35.4"}, runtimeDelivery)},
		"auto, the API listed by the cluster":     {opts: renderOpts{kubeVersion: "1.35.4", apiVersions: []string{"admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}, set: []string{runtimeDelivery}}, want: true},
		"auto, a 1.37 cluster that serves it":     {opts: renderOpts{kubeVersion: "1.37.2", apiVersions: clusterAdmissionAPIs("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"), set: []string{runtimeDelivery}}, want: true},
		"auto, a 1.37 cluster that does not":      {opts: renderOpts{kubeVersion: "1.37.2", apiVersions: clusterAdmissionAPIs(), set: []string{runtimeDelivery}}},
		"auto, a 1.35 cluster that does not":      {opts: renderOpts{kubeVersion: "1.35.4", apiVersions: clusterAdmissionAPIs(), set: []string{runtimeDelivery}}},
		"auto, PreferRuntime (the default)":       {opts: kube137, want: true, switched: true},
		"auto, PreferRuntime on 1.35":             {opts: renderOpts{kubeVersion: "1.35.4"}},
		"auto, PreferRuntime without the plugin":  {opts: with(kube137, "runtimeInjection.enabled=false")},
		"auto, HostPath":                          {opts: with(kube137, "config.driverDelivery=HostPath")},
		"auto, image-aware admission":             {opts: with(kube137, runtimeDelivery, "config.images.mode=On"), refused: "config"},
		"auto, a resource pattern it cannot read": {opts: with(kube137, runtimeDelivery, "config.resources.names={nvidia.com/gpu,nvidia.com/mig-?g.*}")},
		"off":                          {opts: with(kube137, runtimeDelivery, "admission.policy=off")},
		"on, runtime delivery on 1.35": {opts: with(renderOpts{kubeVersion: "1.35.4"}, runtimeDelivery, "admission.policy=on"), want: true},
		"on, PreferRuntime":            {opts: with(kube137, "admission.policy=on"), want: true, switched: true},
		"on, HostPath":                 {opts: with(kube137, "admission.policy=on", "config.driverDelivery=HostPath"), refused: "admission.policy=on, but config.driverDelivery is HostPath, not Runtime or PreferRuntime"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.opts)
			if tc.refused != "" {
				if err == nil {
					if tc.refused == "config" {
						// The configuration has no images section on this build: the
						// schema refuses it, or the chart renders no policy.
						if len(parseRendered(t, out).all("MutatingAdmissionPolicy")) > 0 {
							t.Errorf("the policy is rendered with image-aware admission on")
						}
						return
					}
					t.Fatalf("helm rendered the chart, want it refused with %q", tc.refused)
				}
				if tc.refused != "config" && !strings.Contains(err.Error(), tc.refused) {
					t.Errorf("helm refused with %v, want %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := parseRendered(t, out)
			checkKnownTypes(t, r)
			got := len(r.all("MutatingAdmissionPolicy")) == 1 && len(r.all("MutatingAdmissionPolicyBinding")) == 1
			if got != tc.want {
				t.Errorf("policy rendered: %v, want %v", got, tc.want)
			}
			if selected := mutatingWebhook(t, r).ObjectSelector != nil; selected != tc.want {
				t.Errorf("the webhook's objectSelector on the policy's label rendered: %v, want %v", selected, tc.want)
			}
			if tc.want {
				checkSwitch(t, r, tc.switched)
			}
			// IfNeeded would have the API server invoke the policy again after its own
			// change, for nothing: it takes no pod it marked.
			for _, p := range r.all("MutatingAdmissionPolicy") {
				if rp, _, _ := unstructured.NestedString(p.Object, "spec", "reinvocationPolicy"); rp != string(admissionregistrationv1.NeverReinvocationPolicy) {
					t.Errorf("the policy's reinvocationPolicy is %q, want Never", rp)
				}
			}
		})
	}
}

// checkSwitch: under PreferRuntime the policy's binding is rendered closed, for the
// webhook's elected replica to open; the webhook is told its name and may get and patch
// it by name, nothing more. Under Runtime nothing switches it: the binding is open, and
// the webhook is told no switch.
func checkSwitch(t *testing.T, r rendered, switched bool) {
	t.Helper()
	const name = fullname + "-runtime"
	p := mustGet[admissionregistrationv1.MutatingAdmissionPolicy](t, r, "MutatingAdmissionPolicy", name)
	b := mustGet[admissionregistrationv1.MutatingAdmissionPolicyBinding](t, r, "MutatingAdmissionPolicyBinding", name)
	args := strings.Join(container(t, mustGet[appsv1.Deployment](t, r, "Deployment", webhookSA).Spec.Template, "webhook").Args, " ")
	if p.Spec.ParamKind != nil || b.Spec.ParamRef != nil {
		t.Errorf("the policy takes a parameter (paramKind %v, paramRef %v): the API server keeps a parameter kind's last objects once no binding names it", p.Spec.ParamKind, b.Spec.ParamRef)
	}
	var rule *rbacv1.PolicyRule
	for _, rl := range mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", webhookSA).Rules {
		if slices.Contains(rl.Resources, "mutatingadmissionpolicybindings") {
			rule = &rl
		}
	}
	if !switched {
		if b.Spec.MatchResources != nil || strings.Contains(args, "--policy-binding-name") || rule != nil {
			t.Errorf("runtime delivery's policy is switched: matchResources %+v, args %s, rule %+v", b.Spec.MatchResources, args, rule)
		}
		return
	}
	if !gpunodes.PolicyBindingClosed(b) {
		t.Errorf("the switched binding's matchResources %+v are not closed as the switch closes them (gpunodes.PolicyOffSelector)", b.Spec.MatchResources)
	}
	if !strings.Contains(args, "--policy-binding-name="+name) {
		t.Errorf("the webhook is not told the binding to switch: %s", args)
	}
	if want := (rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingadmissionpolicybindings"},
		ResourceNames: []string{name}, Verbs: []string{"get", "patch"}}); rule == nil || !reflect.DeepEqual(*rule, want) {
		t.Errorf("the webhook's rule on the binding: %+v, want %+v", rule, want)
	}
}

// BenchmarkPolicyAdmission: the chart's admission policy as the API server's plugin runs
// it on the load script's pods (its conditions, its variable and its JSON Patch, from
// the typed pod to the typed pod), the webhook's matchConditions on the pod the policy
// made, and Mutate on the same pod with driverDelivery Runtime; then both sets of
// conditions on a pod without a GPU.
func BenchmarkPolicyAdmission(b *testing.B) {
	pr := benchRender(b)
	t := b
	for _, s := range workload.Sizes {
		pod := workload.Pod(s.Name, s.Bytes)
		pod.Namespace = "ml"
		b.Run("policy/"+s.Name, func(b *testing.B) {
			for range b.N {
				if pr.policy.admit(t, pod) == nil {
					b.Fatal("the policy does not take the pod")
				}
			}
		})
		made := pr.policy.admit(t, pod)
		b.Run("webhook-conditions/"+s.Name, func(b *testing.B) {
			for range b.N {
				if webhookCalled(t, pr.webhook, made) {
					b.Fatal("the webhook would be called")
				}
			}
		})
		b.Run("mutate/"+s.Name, func(b *testing.B) {
			for range b.N {
				p := pod.DeepCopy()
				if res := inject.Mutate(inject.Input{Pod: p}, pr.cfg); res.Decision != inject.DecisionInjected {
					b.Fatal(res.Decision)
				}
			}
		})
	}
	// The load script's cpu pod: the small pod without its GPU, in the same namespace,
	// which the policy's conditions and the webhook's leave out.
	cpu := workload.Pod("cpu", workload.Sizes[0].Bytes)
	cpu.Namespace = "ml"
	delete(cpu.Spec.Containers[0].Resources.Limits, "nvidia.com/gpu")
	b.Run("policy/cpu", func(b *testing.B) {
		for range b.N {
			if pr.policy.admit(t, cpu) != nil {
				b.Fatal("the policy takes a pod without a GPU")
			}
		}
	})
	b.Run("webhook-conditions/cpu", func(b *testing.B) {
		for range b.N {
			if webhookCalled(t, pr.webhook, cpu) {
				b.Fatal("the webhook would be called for a pod without a GPU")
			}
		}
	})
}

// benchRender is renderForConfig's chart, driverDelivery Runtime on 1.37, for a
// benchmark.
func benchRender(b *testing.B) policyRender {
	b.Helper()
	cache, err := cluster.CacheDir()
	if err != nil {
		b.Fatal(err)
	}
	helm := os.Getenv("HELM")
	if helm == "" {
		helm = filepath.Join(cache, "helm-"+cluster.HelmVersion, "helm")
	}
	out, err := exec.Command(helm, "template", releaseName, chartDir, "--namespace", namespace, "--kube-version", "1.37.2", "--set", "config.driverDelivery=Runtime").Output()
	if err != nil {
		b.Fatalf("failed to render the chart: %v", err)
	}
	var pr policyRender
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			b.Fatal(err)
		}
		doc, err := json.Marshal(obj)
		if err != nil {
			b.Fatal(err)
		}
		switch obj["kind"] {
		case "MutatingAdmissionPolicy":
			var p admissionregistrationv1.MutatingAdmissionPolicy
			if err := json.Unmarshal(doc, &p); err != nil {
				b.Fatal(err)
			}
			ap := compileMutatingPolicy(b, &p)
			pr.policy = &ap
		case "MutatingWebhookConfiguration":
			var m admissionregistrationv1.MutatingWebhookConfiguration
			if err := json.Unmarshal(doc, &m); err != nil {
				b.Fatal(err)
			}
			pr.webhook = newWebhookGate(b, m.Webhooks[0], policyVersions)
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := json.Unmarshal(doc, &cm); err != nil {
				b.Fatal(err)
			}
			if data, ok := cm.Data["config.yaml"]; ok {
				if pr.cfg, err = config.Parse([]byte(data)); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if pr.policy == nil || pr.webhook == nil || pr.cfg == nil {
		b.Fatal("the chart rendered no policy, webhook configuration or configuration")
	}
	return pr
}
