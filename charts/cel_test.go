package charts_test

// The chart's CEL (the webhook's matchConditions and the probe's
// ValidatingAdmissionPolicy) compiled and evaluated by the API server's own CEL code:
// the same compiler, environments and evaluation path kube-apiserver uses, so that an
// expression that passes here is one a real cluster accepts and evaluates the same way.

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// celVersions are the CEL environments an expression must compile in when it is
// created: an API server offers the libraries of its compatibility version, one minor
// below its own (environment.DefaultCompatibilityVersion), so a 1.33 API server (the
// oldest release tested end to end) compiles with those of 1.32, a 1.30 one (the
// chart's floor) with those of 1.29; the vendored one, the newest.
var celVersions = map[string]*version.Version{
	"1.30 cluster (compatibility 1.29)": version.MajorMinor(1, 29),
	"1.33 cluster (compatibility 1.32)": version.MajorMinor(1, 32),
	"current":                           environment.DefaultCompatibilityVersion(),
}

// The API server declares the authorizer for both matchConditions and validations.
var celDecls = plugincel.OptionalVariableDeclarations{HasAuthorizer: true}

func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("bad test object: %v\n%s", err, doc)
	}
	return &unstructured.Unstructured{Object: m}
}

func attributes(obj, old *unstructured.Unstructured, gvk schema.GroupVersionKind, gvr schema.GroupVersionResource, subresource string, op admission.Operation, u user.Info) *admission.VersionedAttributes {
	// A nil *Unstructured in a runtime.Object would not be a nil interface.
	var oldObj runtime.Object
	if old != nil {
		oldObj = old
	}
	attr := admission.NewAttributesRecord(obj, oldObj, gvk, obj.GetNamespace(), obj.GetName(), gvr, subresource, op, nil, false, u)
	return &admission.VersionedAttributes{Attributes: attr, VersionedKind: gvk, VersionedObject: obj, VersionedOldObject: oldObj}
}

func TestMatchConditions(t *testing.T) {
	renders := map[string]renderOpts{
		"default names": kube136,
		"mig pattern":   with(kube136, "config.resources.names={nvidia.com/gpu,nvidia.com/mig-*}"),
	}
	const gpuPod = `
metadata: {name: train, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/gpu: "1"}
`
	tests := map[string]struct {
		pod  string
		want map[string]bool // by render
	}{
		"gpu limit": {
			pod:  gpuPod,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"legacy limit": {
			pod: `
metadata: {name: legacy, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {alpha.kubernetes.io/nvidia-gpu: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": false},
		},
		"gpu request without limit": {
			pod: `
metadata: {name: req, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      requests: {nvidia.com/gpu: "1", cpu: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"gpu only in an init container": {
			pod: `
metadata: {name: init, namespace: ml}
spec:
  initContainers:
  - name: warmup
    image: cuda
    resources:
      limits: {nvidia.com/gpu: "1"}
  containers:
  - name: main
    image: busybox
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"GPU only through a DRA claim": {
			pod: `
metadata: {name: dra, namespace: ml}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
  containers:
  - name: main
    image: cuda
    resources:
      claims: [{name: gpu}]
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"a DeviceClass's implicit extended resource": {
			pod: `
metadata: {name: implicit, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {deviceclass.resource.kubernetes.io/gpu.nvidia.com: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"no resources anywhere": {
			pod: `
metadata: {name: web, namespace: ml}
spec:
  containers:
  - name: main
    image: nginx
`,
			want: map[string]bool{"default names": false, "mig pattern": false},
		},
		"empty resources and empty limits": {
			pod: `
metadata: {name: web, namespace: ml}
spec:
  initContainers:
  - name: init
    image: busybox
    resources: {}
  containers:
  - name: main
    image: nginx
    resources:
      limits: {}
      requests: {cpu: 100m}
`,
			want: map[string]bool{"default names": false, "mig pattern": false},
		},
		"cpu and memory only": {
			pod: `
metadata: {name: web, namespace: ml}
spec:
  containers:
  - name: main
    image: nginx
    resources:
      limits: {cpu: "1", memory: 1Gi}
`,
			want: map[string]bool{"default names": false, "mig pattern": false},
		},
		"mig profile": {
			pod: `
metadata: {name: mig, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/mig-1g.10gb: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"shared gpu": {
			pod: `
metadata: {name: shared, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/gpu.shared: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": false},
		},
		"a name that only shares the pattern's stem": {
			pod: `
metadata: {name: other, namespace: ml}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/migration: "1"}
`,
			want: map[string]bool{"default names": false, "mig pattern": false},
		},
		"opted out": {
			pod: `
metadata:
  name: optout
  namespace: ml
  annotations: {gpu-injector.io/inject: "false"}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/gpu: "1"}
`,
			want: map[string]bool{"default names": false, "mig pattern": false},
		},
		"inject annotation with another value": {
			pod: `
metadata:
  name: optin
  namespace: ml
  annotations: {gpu-injector.io/inject: "true", team: vision}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/gpu: "1"}
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
		"other annotations only": {
			pod: `
metadata:
  name: annotated
  namespace: ml
  annotations: {team: vision}
spec:
  containers:
  - name: main
    image: cuda
    resources:
      limits: {nvidia.com/gpu: "2"}
`,
			want: map[string]bool{"default names": true, "mig pattern": true},
		},
	}

	podGVK := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	podGVR := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	for rname, opts := range renders {
		t.Run(rname, func(t *testing.T) {
			wh := mutatingWebhook(t, render(t, opts))
			if len(wh.MatchConditions) == 0 {
				t.Fatalf("no matchConditions rendered")
			}
			matcher := webhookMatcher(t, wh, celVersions)
			for name, tc := range tests {
				t.Run(name, func(t *testing.T) {
					want, ok := tc.want[rname]
					if !ok {
						t.Fatalf("test case has no expectation for render %q", rname)
					}
					pod := object(t, tc.pod)
					va := attributes(pod, nil, podGVK, podGVR, "", admission.Create, &user.DefaultInfo{Name: "alice"})
					res := matcher.Match(context.Background(), va, nil, nil)
					if res.Error != nil {
						t.Fatalf("matchConditions failed to evaluate: %v", res.Error)
					}
					if res.Matches != want {
						t.Errorf("sent to webhook = %v, want %v (failed condition %q)", res.Matches, want, res.FailedConditionName)
					}
				})
			}
		})
	}
}

const (
	probeUser   = "system:serviceaccount:" + namespace + ":" + probeSA
	nodeNameKey = "authentication.kubernetes.io/node-name"
)

const baseNode = `
metadata:
  name: gpu-a
  labels:
    kubernetes.io/hostname: gpu-a
    nvidia.com/gpu.present: "true"
    gpu-injector.io/layout-fingerprint: aaaa
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    gpu-injector.io/layout: '{"schemaVersion":"v1"}'
spec:
  podCIDR: 10.0.0.0/24
  taints:
  - {key: nvidia.com/gpu, effect: NoSchedule}
status:
  addresses:
  - {type: InternalIP, address: 10.0.0.5}
  allocatable:
    nvidia.com/gpu: "8"
  capacity:
    nvidia.com/gpu: "8"
  conditions:
  - {type: MemoryPressure, status: "False", reason: KubeletHasSufficientMemory, lastHeartbeatTime: "2026-11-26T10:00:00Z"}
  - {type: Ready, status: "True", reason: KubeletReady, lastHeartbeatTime: "2026-11-26T10:00:00Z"}
  nodeInfo:
    kubeletVersion: v1.36.3
`

// wedgedNode is baseNode with the probe's condition set.
var wedgedNode = strings.Replace(baseNode, "  nodeInfo:", `  - {type: GPUDriverWedged, status: "True", reason: DriverWedged, message: "NVML does not answer"}
  nodeInfo:`, 1)

func TestNodeRestrictionPolicy(t *testing.T) {
	vap := mustGet[admissionregistrationv1.ValidatingAdmissionPolicy](t, render(t, kube136), "ValidatingAdmissionPolicy", probeSA)

	validator := compilePolicy(t, vap)

	const (
		ownNode     = "the gpu-injector probe may only change its own Node"
		labels      = "the gpu-injector probe may only change labels under gpu-injector.io/"
		annotations = "the gpu-injector probe may only change annotations under gpu-injector.io/"
		spec        = "the gpu-injector probe may not change a Node's spec, owners or finalizers"
		status      = "the gpu-injector probe may only change the GPUDriverWedged condition of a Node's status"
	)
	// The probe's status writes, as the API server applies its strategic merge:
	// the one condition replaced or added, the others where they were.
	withWedged := func(status, reason string) string {
		return `{"status":{"conditions":[
			{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
			{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
			{"type":"GPUDriverWedged","status":"` + status + `","reason":"` + reason + `","message":"m"}]}}`
	}
	probeOn := func(node string) user.Info {
		return &user.DefaultInfo{Name: probeUser, Extra: map[string][]string{nodeNameKey: {node}}}
	}
	tests := map[string]struct {
		old, new    string // new: a JSON merge patch onto old
		subresource string // "status" for a write through nodes/status
		user        user.Info
		denied      []string // messages; nil: admitted
		notMatch    bool     // the policy does not apply at all
	}{
		"own node, our keys added and changed": {
			new: `{"metadata":{"labels":{"gpu-injector.io/layout-fingerprint":"bbbb","gpu-injector.io/driver-version":"550.54.15","gpu-injector.io/cuda-driver-version-number":"12040"},"annotations":{"gpu-injector.io/layout":"{}"}}}`,
		},
		"own node, our keys removed": {
			new: `{"metadata":{"labels":{"gpu-injector.io/layout-fingerprint":null},"annotations":{"gpu-injector.io/layout":null}}}`,
		},
		"first publication on a node without labels or annotations": {
			old: `{"metadata":{"name":"gpu-a"},"spec":{}}`,
			new: `{"metadata":{"labels":{"gpu-injector.io/state":"ready"},"annotations":{"gpu-injector.io/layout":"{}"}}}`,
		},
		"nothing changed": {
			new: `{}`,
		},
		"another node": {
			old:    strings.Replace(baseNode, "name: gpu-a", "name: gpu-b", 1),
			new:    `{"metadata":{"labels":{"gpu-injector.io/state":"ready"}}}`,
			denied: []string{ownNode},
		},
		"token without a node claim": {
			user:   &user.DefaultInfo{Name: probeUser},
			new:    `{"metadata":{"labels":{"gpu-injector.io/state":"ready"}}}`,
			denied: []string{ownNode},
		},
		"token with an empty node claim": {
			user:   &user.DefaultInfo{Name: probeUser, Extra: map[string][]string{nodeNameKey: {}}},
			new:    `{"metadata":{"labels":{"gpu-injector.io/state":"ready"}}}`,
			denied: []string{ownNode},
		},
		"foreign label added": {
			new:    `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
			denied: []string{labels},
		},
		"foreign label changed": {
			new:    `{"metadata":{"labels":{"nvidia.com/gpu.present":"false"}}}`,
			denied: []string{labels},
		},
		"foreign label removed": {
			new:    `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`,
			denied: []string{labels},
		},
		"a look-alike prefix": {
			new:    `{"metadata":{"labels":{"gpu-injector.io.evil.com/x":"y"}}}`,
			denied: []string{labels},
		},
		"all labels removed": {
			new:    `{"metadata":{"labels":null}}`,
			denied: []string{labels},
		},
		"foreign annotation added": {
			new:    `{"metadata":{"annotations":{"example.com/owner":"me"}}}`,
			denied: []string{annotations},
		},
		"taint removed": {
			new:    `{"spec":{"taints":null}}`,
			denied: []string{spec},
		},
		"cordoned": {
			new:    `{"spec":{"unschedulable":true}}`,
			denied: []string{spec},
		},
		"finalizer added": {
			new:    `{"metadata":{"finalizers":["example.com/hold"]}}`,
			denied: []string{spec},
		},
		"another node and a foreign label": {
			old:    strings.Replace(baseNode, "name: gpu-a", "name: gpu-b", 1),
			new:    `{"metadata":{"labels":{"kubernetes.io/hostname":"x"}}}`,
			denied: []string{ownNode, labels},
		},
		"status: wedged condition added": {
			subresource: "status",
			new:         withWedged("True", "DriverWedged"),
		},
		"status: wedged condition cleared": {
			subresource: "status", old: wedgedNode,
			new: withWedged("False", "DriverAnswers"),
		},
		"status: first condition on a node without status": {
			subresource: "status", old: `{"metadata":{"name":"gpu-a"},"spec":{}}`,
			new: `{"status":{"conditions":[{"type":"GPUDriverWedged","status":"True","reason":"GPULost","message":"m"}]}}`,
		},
		"status: nothing changed": {
			subresource: "status", new: `{}`,
		},
		"status: the kubelet's Ready condition": {
			subresource: "status",
			new: `{"status":{"conditions":[
				{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
				{"type":"Ready","status":"False","reason":"KubeletNotReady","lastHeartbeatTime":"2026-11-26T10:00:00Z"}]}}`,
			denied: []string{status},
		},
		"status: a condition removed": {
			subresource: "status",
			new:         `{"status":{"conditions":[{"type":"GPUDriverWedged","status":"True","reason":"DriverWedged","message":"m"}]}}`,
			denied:      []string{status},
		},
		"status: a condition of another type added": {
			subresource: "status",
			new: `{"status":{"conditions":[
				{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
				{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
				{"type":"KernelDeadlock","status":"True","reason":"x","message":"m"}]}}`,
			denied: []string{status},
		},
		"status: addresses": {
			subresource: "status",
			new:         `{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}`,
			denied:      []string{status},
		},
		"status: allocatable": {
			subresource: "status",
			new:         `{"status":{"allocatable":{"nvidia.com/gpu":"64"}}}`,
			denied:      []string{status},
		},
		"status: a field added": {
			subresource: "status",
			new:         `{"status":{"phase":"Running"}}`,
			denied:      []string{status},
		},
		"status: a field removed": {
			subresource: "status",
			new:         `{"status":{"nodeInfo":null}}`,
			denied:      []string{status},
		},
		"status: our label through the status": {
			subresource: "status",
			new:         `{"metadata":{"labels":{"gpu-injector.io/state":"ready"}}}`,
			denied:      []string{status},
		},
		"status: our annotation through the status": {
			subresource: "status",
			new:         `{"metadata":{"annotations":{"gpu-injector.io/state-reason":"x"}}}`,
			denied:      []string{status},
		},
		"status: a foreign label through the status": {
			subresource: "status",
			new:         `{"metadata":{"labels":{"kubernetes.io/hostname":"x"}}}`,
			denied:      []string{labels, status},
		},
		"status: another node's condition": {
			subresource: "status", old: strings.Replace(baseNode, "name: gpu-a", "name: gpu-b", 1),
			new:    withWedged("True", "DriverWedged"),
			denied: []string{ownNode},
		},
		"someone else": {
			user:     &user.DefaultInfo{Name: "system:node:gpu-a", Extra: map[string][]string{nodeNameKey: {"gpu-b"}}},
			new:      `{"metadata":{"labels":{"kubernetes.io/hostname":"x"}},"spec":{"unschedulable":true}}`,
			notMatch: true,
		},
		"the same service account name in another namespace": {
			user:     &user.DefaultInfo{Name: "system:serviceaccount:other:" + probeSA},
			new:      `{"metadata":{"labels":{"kubernetes.io/hostname":"x"}}}`,
			notMatch: true,
		},
	}
	nodeGVK := schema.GroupVersionKind{Version: "v1", Kind: "Node"}
	nodeGVR := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			oldDoc := tc.old
			if oldDoc == "" {
				oldDoc = baseNode
			}
			old := object(t, oldDoc)
			updated := mergePatch(t, old, tc.new)
			u := tc.user
			if u == nil {
				u = probeOn("gpu-a") // the probe of baseNode
			}
			va := attributes(updated, old, nodeGVK, nodeGVR, tc.subresource, admission.Update, u)
			res := validator.Validate(context.Background(), nodeGVR, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
			checkDecisions(t, res, tc.notMatch, tc.denied, u.GetName())
		})
	}
}

// mergePatch applies an RFC 7386 merge patch, the way the probe's patches read.
func mergePatch(t *testing.T, base *unstructured.Unstructured, patch string) *unstructured.Unstructured {
	t.Helper()
	var p map[string]any
	if err := yaml.Unmarshal([]byte(patch), &p); err != nil {
		t.Fatalf("bad patch %s: %v", patch, err)
	}
	return &unstructured.Unstructured{Object: merge(base.DeepCopy().Object, p)}
}

func merge(dst, patch map[string]any) map[string]any {
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(dst, k)
		case map[string]any:
			d, ok := dst[k].(map[string]any)
			if !ok {
				d = map[string]any{}
			}
			dst[k] = merge(d, pv)
		default:
			dst[k] = v
		}
	}
	return dst
}

// compilePolicy checks a ValidatingAdmissionPolicy's CEL as kube-apiserver
// does when the policy is created, on every CEL version the chart supports,
// and returns the validator its validating plugin runs on each request.
func compilePolicy(t *testing.T, vap *admissionregistrationv1.ValidatingAdmissionPolicy) validating.Validator {
	t.Helper()
	variables := make([]plugincel.NamedExpressionAccessor, len(vap.Spec.Variables))
	for i, v := range vap.Spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	matchConds := make([]plugincel.ExpressionAccessor, len(vap.Spec.MatchConditions))
	for i := range vap.Spec.MatchConditions {
		matchConds[i] = (*matchconditions.MatchCondition)(&vap.Spec.MatchConditions[i])
	}
	validations := make([]plugincel.ExpressionAccessor, len(vap.Spec.Validations))
	for i, v := range vap.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
	}
	for vname, v := range celVersions {
		compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(v))
		if err != nil {
			t.Fatalf("failed to build the CEL compiler: %v", err)
		}
		for _, variable := range variables {
			if res := compiler.CompileAndStoreVariable(variable, celDecls, environment.NewExpressions); res.Error != nil {
				t.Fatalf("%s: the API server would refuse variable %s: %v", vname, variable.GetName(), res.Error)
			}
		}
		for _, a := range append(slices.Clone(matchConds), validations...) {
			if res := compiler.CompileCELExpression(a, celDecls, environment.NewExpressions); res.Error != nil {
				t.Fatalf("%s: the API server would refuse expression %q: %v", vname, a.GetExpression(), res.Error)
			}
		}
	}
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatalf("failed to build the CEL compiler: %v", err)
	}
	compiler.CompileAndStoreVariables(variables, celDecls, environment.StoredExpressions)
	var matcher matchconditions.Matcher
	if len(matchConds) > 0 {
		matcher = matchconditions.NewMatcher(compiler.CompileCondition(matchConds, celDecls, environment.StoredExpressions), vap.Spec.FailurePolicy, "policy", "validate", vap.Name)
	}
	return validating.NewValidator(
		compiler.CompileCondition(validations, celDecls, environment.StoredExpressions),
		matcher,
		compiler.CompileCondition(nil, celDecls, environment.StoredExpressions),
		compiler.CompileCondition(nil, celDecls, environment.StoredExpressions),
		vap.Spec.FailurePolicy, nil)
}

// checkDecisions: a validating policy's result for one request, evaluated
// without error, is exactly the denials want (each Forbidden), or, with
// notMatch, no decision at all: the policy does not apply to who.
func checkDecisions(t *testing.T, res validating.ValidateResult, notMatch bool, want []string, who string) {
	t.Helper()
	if notMatch {
		if len(res.Decisions) != 0 {
			t.Errorf("policy applied to %s: %+v", who, res.Decisions)
		}
		return
	}
	var denied []string
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Errorf("evaluation error: %s", d.Message)
		}
		if d.Action == validating.ActionDeny {
			denied = append(denied, d.Message)
			if d.Reason != metav1.StatusReasonForbidden {
				t.Errorf("reason = %q, want Forbidden", d.Reason)
			}
		}
	}
	if !slices.Equal(denied, want) {
		t.Errorf("denied with %q, want %q", denied, want)
	}
}
