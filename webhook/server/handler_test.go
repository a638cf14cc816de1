package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionv1beta1 "k8s.io/api/admission/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// staticNamespaces stands in for the namespace informer in unit tests.
type staticNamespaces map[string]map[string]string

func (s staticNamespaces) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	l, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("namespace %q not found", name)
	}
	return l, nil
}

func review(t testing.TB, op admissionv1.Operation, namespace string, obj runtime.Object, kind metav1.GroupVersionKind) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("0f9e2c55-0000-4000-8000-000000000001"),
			Kind:      kind,
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: namespace,
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	}
	if op == admissionv1.Delete {
		ar.Request.OldObject, ar.Request.Object = ar.Request.Object, runtime.RawExtension{}
	}
	b, err := json.Marshal(ar)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testServer is the webhook's HTTP handler, Serve, on a loopback listener; the layouts are those of three nodes,
// and a fourth, accelerator nvidia-h200, has a wedged driver.
func testServer(t *testing.T, cfg *config.Configuration) (*httptest.Server, layout.Plan) {
	t.Helper()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	p := gputest.Plan("535.104.05")
	for i := 0; i < 3; i++ {
		idx.Add(gputest.Node(fmt.Sprintf("gpu-%d", i), p, 8, nil))
	}
	idx.Add(gputest.WedgedNode("gpu-wedged", "DriverWedged: NVML does not answer", func(n *corev1.Node) { n.Labels["accelerator"] = "nvidia-h200" }))
	ns := staticNamespaces{
		"ml":         {layout.LabelInject: layout.InjectEnabled},
		"restricted": {layout.LabelInject: layout.InjectEnabled, "pod-security.kubernetes.io/enforce": "restricted"},
	}
	srv := httptest.NewServer(Serve(NewHandler(cfg, idx, ns)))
	t.Cleanup(srv.Close)
	return srv, p
}

func post(t *testing.T, url, contentType string, body []byte) (int, admissionv1.AdmissionReview, string) {
	t.Helper()
	resp, err := http.Post(url+Path, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &ar); err != nil {
		t.Fatalf("response is not an AdmissionReview: %v: %s", err, data)
	}
	if ar.Response == nil {
		t.Fatalf("AdmissionReview without response: %s", data)
	}
	return resp.StatusCode, ar, string(data)
}

func TestHandlerBadRequests(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	cases := map[string]struct {
		contentType string
		body        []byte
		code        int
		want        string
	}{
		"malformed json":      {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{`), http.StatusBadRequest, "failed to decode the AdmissionReview: unexpected end of JSON input"},
		"not json":            {"application/json", []byte("hello"), http.StatusBadRequest, "failed to decode the AdmissionReview: invalid character"},
		"wrong content type":  {"text/plain", review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind), http.StatusBadRequest, "contentType=text/plain, expected application/json"},
		"empty body":          {"application/json", nil, http.StatusBadRequest, "request body is empty"},
		"too large":           {"application/json", bytes.Repeat([]byte(" "), maxReviewSize), http.StatusRequestEntityTooLarge, "request entity is too large"},
		"wrong review kind":   {"application/json", []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}`), http.StatusBadRequest, `no AdmissionReview of admission.k8s.io/v1 or v1beta1: apiVersion "v1", kind "Pod"`},
		"no request":          {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest, "no request uid"},
		"no uid":              {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`), http.StatusBadRequest, "no request uid"},
		"request field wrong": {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}`), http.StatusBadRequest, "uid"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, ar, raw := post(t, srv.URL, tc.contentType, tc.body)
			if code != tc.code {
				t.Errorf("HTTP status = %d, want %d: %s", code, tc.code, raw)
			}
			if ar.Response.Allowed || ar.Response.Result == nil || ar.Response.Result.Code != int32(tc.code) {
				t.Errorf("response = %+v, want a denial with code %d", ar.Response, tc.code)
			}
			if ar.Response.Result != nil && !strings.Contains(ar.Response.Result.Message, tc.want) {
				t.Errorf("message %q does not name the problem %q", ar.Response.Result.Message, tc.want)
			}
		})
	}

	// A review with a uid is the API server's: its answer keeps HTTP 200,
	// with the error inside.
	body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"7","kind":{"version":"v1","kind":"Pod"}}}`)
	code, ar, raw := post(t, srv.URL, "application/json", body)
	if code != http.StatusOK || ar.Response.UID != "7" || ar.Response.Result == nil || ar.Response.Result.Code != http.StatusBadRequest ||
		!strings.Contains(ar.Response.Result.Message, "no request operation") {
		t.Errorf("no operation: got HTTP %d %s, want HTTP 200 and a 400 naming the operation", code, raw)
	}
}

// TestServeRecoversPanic: a panic in the handler is an internal error of
// that request, answered to the API server under its uid.
func TestServeRecoversPanic(t *testing.T) {
	srv := httptest.NewServer(Serve(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { panic("boom") })))
	t.Cleanup(srv.Close)
	code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind))
	r := ar.Response
	if code != http.StatusOK || r.Allowed || r.UID != "0f9e2c55-0000-4000-8000-000000000001" || r.Result == nil ||
		r.Result.Code != http.StatusInternalServerError || !strings.Contains(r.Result.Message, "boom") {
		t.Errorf("got HTTP %d %s, want HTTP 200 and a 500 under the request's uid", code, raw)
	}
}

func TestHandlerWrongKind(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	body := review(t, admissionv1.Create, "ml", cm, metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	code, ar, raw := post(t, srv.URL, "application/json", body)
	// A decodable review: the API server needs HTTP 200 to read our answer.
	if code != http.StatusOK {
		t.Errorf("HTTP status = %d, want 200: %s", code, raw)
	}
	if ar.Response.Allowed || ar.Response.Result.Code != http.StatusBadRequest || !strings.Contains(ar.Response.Result.Message, `"ConfigMap"`) {
		t.Errorf("response = %+v, want code 400 naming the kind", ar.Response.Result)
	}
	if ar.Response.UID != "0f9e2c55-0000-4000-8000-000000000001" {
		t.Errorf("UID = %q, want the request's", ar.Response.UID)
	}

	// A pod whose object is not a pod at all.
	bad := review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind)
	bad = bytes.Replace(bad, []byte(`"containers":[`), []byte(`"containers":7,"x":[`), 1)
	_, ar, _ = post(t, srv.URL, "application/json", bad)
	if ar.Response.Allowed || ar.Response.Result.Code != http.StatusBadRequest || !strings.Contains(ar.Response.Result.Message, "failed to decode the pod") {
		t.Errorf("undecodable pod: response = %+v, want code 400", ar.Response.Result)
	}
}

func TestHandlerIgnoresOtherOperations(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	for _, op := range []admissionv1.Operation{admissionv1.Delete, admissionv1.Update, admissionv1.Connect} {
		t.Run(string(op), func(t *testing.T) {
			code, ar, raw := post(t, srv.URL, "application/json", review(t, op, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind))
			if code != http.StatusOK || !ar.Response.Allowed || ar.Response.Patch != nil || len(ar.Response.Warnings) != 0 {
				t.Errorf("%s: got HTTP %d %s, want allowed without patch or warnings", op, code, raw)
			}
		})
	}
	// A subresource CREATE (eviction, binding) is never ours to block.
	body := review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"})
	body = bytes.Replace(body, []byte(`"operation"`), []byte(`"subResource":"eviction","operation"`), 1)
	if _, ar, raw := post(t, srv.URL, "application/json", body); !ar.Response.Allowed || ar.Response.Patch != nil {
		t.Errorf("eviction: got %s, want allowed", raw)
	}
}

func applyPatch(t *testing.T, original runtime.Object, resp *admissionv1.AdmissionResponse) *corev1.Pod {
	t.Helper()
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type = %v, want JSONPatch", resp.PatchType)
	}
	raw, err := json.Marshal(original)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("patch does not decode: %v: %s", err, resp.Patch)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch does not apply: %v: %s", err, resp.Patch)
	}
	var p corev1.Pod
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestHandlerInjectsGPUPod(t *testing.T) {
	srv, plan := testServer(t, config.Default())
	injected := gputest.MetricValue(t, podsInjected)
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1"}}
	pod := gputest.Pod("alpha.kubernetes.io/nvidia-gpu", func(p *corev1.Pod) { p.ManagedFields = managed })

	code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, "ml", pod, podKind))
	if code != http.StatusOK || !ar.Response.Allowed {
		t.Fatalf("got HTTP %d %s, want allowed", code, raw)
	}
	if len(ar.Response.Warnings) == 0 || !strings.Contains(strings.Join(ar.Response.Warnings, "\n"), "alpha.kubernetes.io/nvidia-gpu") {
		t.Errorf("warnings = %q, want one about the legacy resource name", ar.Response.Warnings)
	}
	if bytes.Contains(ar.Response.Patch, []byte("managedFields")) {
		t.Errorf("patch touches managedFields: %s", ar.Response.Patch)
	}
	got := applyPatch(t, pod, ar.Response)
	c := got.Spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
		t.Errorf("limits = %v, want nvidia.com/gpu", c.Resources.Limits)
	}
	if got.Spec.NodeSelector[layout.LabelFingerprint] != plan.Fingerprint() {
		t.Errorf("node selector = %v, want the layout's fingerprint %s", got.Spec.NodeSelector, plan.Fingerprint())
	}
	if len(got.Spec.Volumes) != len(plan.Mounts) {
		t.Errorf("volumes = %+v, want %d", got.Spec.Volumes, len(plan.Mounts))
	}
	for _, v := range got.Spec.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("mount %s is writable", m.MountPath)
		}
	}
	if len(got.ManagedFields) != 1 {
		t.Errorf("managedFields lost: %v", got.ManagedFields)
	}
	if got.Namespace != "" {
		t.Errorf("patch set namespace %q; the API server fills it", got.Namespace)
	}
	if d := gputest.MetricValue(t, podsInjected) - injected; d != 1 {
		t.Errorf("injected counter moved by %v, want 1", d)
	}

	// The API server reinvokes with our own output: nothing more to do.
	code, ar, raw = post(t, srv.URL, "application/json", review(t, admissionv1.Create, "ml", got, podKind))
	if code != http.StatusOK || !ar.Response.Allowed || ar.Response.Patch != nil {
		t.Errorf("reinvocation: got HTTP %d %s, want allowed without patch", code, raw)
	}
}

func TestHandlerSkips(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	cases := map[string]struct {
		namespace string
		pod       *corev1.Pod
		reason    string
	}{
		"cpu pod":            {"ml", gputest.Pod("", nil), inject.ReasonNoGPU},
		"opt out":            {"ml", gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Annotations = map[string]string{layout.AnnotationInject: "false"} }), inject.ReasonOptOut},
		"excluded namespace": {"kube-system", gputest.Pod("nvidia.com/gpu", nil), inject.ReasonExcludedNamespace},
		"unknown namespace":  {"nowhere", gputest.Pod("", nil), inject.ReasonNoGPU},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			counter := podsSkipped.WithLabelValues(tc.reason)
			before := gputest.MetricValue(t, counter)
			code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, tc.namespace, tc.pod, podKind))
			if code != http.StatusOK || !ar.Response.Allowed || ar.Response.Patch != nil {
				t.Errorf("got HTTP %d %s, want allowed without patch", code, raw)
			}
			if d := gputest.MetricValue(t, counter) - before; d != 1 {
				t.Errorf("skipped{reason=%s} moved by %v, want 1", tc.reason, d)
			}
		})
	}
}

func TestHandlerDenies(t *testing.T) {
	strict := config.Default()
	strict.PodSecurity = config.PodSecurityDeny
	// hostPath only: with the default delivery a pod that no known node
	// fits is admitted for the node that will.
	hostPath := config.Default()
	hostPath.DriverDelivery = config.DeliveryHostPath
	cases := map[string]struct {
		cfg       *config.Configuration
		namespace string
		pod       *corev1.Pod
		want      string
	}{
		"no layout fits the node selector": {hostPath, "ml", gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"accelerator": "nvidia-h100"}
		}), "no ready GPU node layout fits this pod"},
		"pod security forbids hostPath": {strict, "restricted", gputest.Pod("nvidia.com/gpu", nil), `Pod Security level "restricted"`},
		"the node it fits is wedged": {config.Default(), "ml", gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"accelerator": "nvidia-h200"}
		}), "node gpu-wedged fits the pod but its NVIDIA driver is wedged (DriverWedged: NVML does not answer)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv, _ := testServer(t, tc.cfg)
			before := gputest.MetricValue(t, podsDenied)
			code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, tc.namespace, tc.pod, podKind))
			if code != http.StatusOK {
				t.Errorf("HTTP status = %d, want 200 (the denial is in the review)", code)
			}
			r := ar.Response
			if r.Allowed || r.Result == nil || r.Result.Code != http.StatusForbidden || !strings.Contains(r.Result.Message, tc.want) {
				t.Errorf("got %s, want a 403 denial saying %q", raw, tc.want)
			}
			if r.Patch != nil {
				t.Errorf("a denial carries a patch: %s", r.Patch)
			}
			if d := gputest.MetricValue(t, podsDenied) - before; d != 1 {
				t.Errorf("denied counter moved by %v, want 1", d)
			}
		})
	}
}

func TestHandlerPodSecurityWarns(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	_, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, "restricted", gputest.Pod("nvidia.com/gpu", nil), podKind))
	if !ar.Response.Allowed || !strings.Contains(strings.Join(ar.Response.Warnings, "\n"), "Pod Security") {
		t.Errorf("got %s, want allowed with a Pod Security warning", raw)
	}
}

func TestHandlerV1beta1Review(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	body := review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind)
	body = bytes.Replace(body, []byte(`"apiVersion":"admission.k8s.io/v1"`), []byte(`"apiVersion":"admission.k8s.io/v1beta1"`), 1)
	code, _, raw := post(t, srv.URL, "application/json", body)
	var ar admissionv1beta1.AdmissionReview
	if err := json.Unmarshal([]byte(raw), &ar); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || ar.APIVersion != "admission.k8s.io/v1beta1" || ar.Response == nil || !ar.Response.Allowed || ar.Response.Patch == nil {
		t.Errorf("got HTTP %d %s, want a v1beta1 review with a patch", code, raw)
	}
}

// TestHandlerKeepsUnknownFields: a newer API server may send pod fields this
// build's types do not know; the patch must leave them alone, not remove them.
func TestHandlerKeepsUnknownFields(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	pod := gputest.Pod("nvidia.com/gpu", nil)
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	spec := obj["spec"].(map[string]any)
	spec["futureField"] = map[string]any{"enabled": true}
	spec["containers"].([]any)[0].(map[string]any)["futureContainerField"] = "x"
	body := review(t, admissionv1.Create, "ml", pod, podKind)
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil {
		t.Fatal(err)
	}
	if ar.Request.Object.Raw, err = json.Marshal(obj); err != nil {
		t.Fatal(err)
	}
	if body, err = json.Marshal(ar); err != nil {
		t.Fatal(err)
	}

	code, resp, text := post(t, srv.URL, "application/json", body)
	if code != http.StatusOK || !resp.Response.Allowed || len(resp.Response.Patch) == 0 {
		t.Fatalf("got HTTP %d %s, want an allowed patch", code, text)
	}
	patch, err := jsonpatch.DecodePatch(resp.Response.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(ar.Request.Object.Raw)
	if err != nil {
		t.Fatalf("patch does not apply to the raw object: %v", err)
	}
	for _, want := range []string{`"futureField":{"enabled":true}`, `"futureContainerField":"x"`, `"gpu-injector.io/layout-fingerprint"`} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("patched object lacks %s:\n%s", want, out)
		}
	}
}

// TestHandlerPatchesNullAndEmpty: a client or another webhook may write a
// list or map as null, as [] or {}, or leave it out; each operation must
// apply to each spelling, as the API server applies it to the raw object.
func TestHandlerPatchesNullAndEmpty(t *testing.T) {
	srv, plan := testServer(t, config.Default())
	for name, object := range map[string]string{
		"null":                       `{"metadata":{"generateName":"x-","annotations":null},"spec":{"nodeSelector":null,"volumes":null,"containers":[{"name":"c","env":null,"volumeMounts":null,"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
		"empty":                      `{"metadata":{"generateName":"x-","annotations":{}},"spec":{"nodeSelector":{},"volumes":[],"containers":[{"name":"c","env":[],"volumeMounts":[],"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
		"absent":                     `{"metadata":{"generateName":"x-"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
		"requests only, limits null": `{"metadata":{},"spec":{"containers":[{"name":"c","resources":{"limits":null,"requests":{"nvidia.com/gpu":"1"}}}]}}`,
		// A renamed legacy resource brings a toleration.
		"legacy, tolerations null":  `{"metadata":{},"spec":{"tolerations":null,"containers":[{"name":"c","resources":{"limits":{"alpha.kubernetes.io/nvidia-gpu":"1"}}}]}}`,
		"legacy, tolerations empty": `{"metadata":{},"spec":{"tolerations":[],"containers":[{"name":"c","resources":{"limits":{"alpha.kubernetes.io/nvidia-gpu":"1"}}}]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			body := review(t, admissionv1.Create, "ml", gputest.Pod("", nil), podKind)
			var ar admissionv1.AdmissionReview
			if err := json.Unmarshal(body, &ar); err != nil {
				t.Fatal(err)
			}
			ar.Request.Object.Raw = []byte(object)
			body, err := json.Marshal(ar)
			if err != nil {
				t.Fatal(err)
			}
			code, resp, text := post(t, srv.URL, "application/json", body)
			if code != http.StatusOK || !resp.Response.Allowed || len(resp.Response.Patch) == 0 {
				t.Fatalf("got HTTP %d %s, want an allowed patch", code, text)
			}
			patch, err := jsonpatch.DecodePatch(resp.Response.Patch)
			if err != nil {
				t.Fatal(err)
			}
			out, err := patch.Apply([]byte(object))
			if err != nil {
				t.Fatalf("patch does not apply: %v: %s", err, resp.Response.Patch)
			}
			var p corev1.Pod
			if err := json.Unmarshal(out, &p); err != nil {
				t.Fatal(err)
			}
			c := p.Spec.Containers[0]
			if len(p.Spec.Volumes) != len(plan.Mounts) || len(c.VolumeMounts) != len(plan.Mounts) || len(c.Env) != 1 ||
				p.Spec.NodeSelector[layout.LabelFingerprint] == "" || p.Annotations[layout.AnnotationInjected] == "" || c.Resources.Limits.Name("nvidia.com/gpu", "").IsZero() {
				t.Errorf("patched pod lacks part of the injection: %s", out)
			}
			if strings.Contains(object, "alpha.kubernetes.io/nvidia-gpu") && !apiequality.Semantic.DeepEqual(p.Spec.Tolerations, []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}) {
				t.Errorf("tolerations = %+v, want the renamed resource's", p.Spec.Tolerations)
			}
		})
	}
}

// TestHandlerNoObject: an object that is absent, null or no pod at all is
// the caller's error, not an empty pod to admit.
func TestHandlerNoObject(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	for name, object := range map[string]string{"null": `null`, "no spec": `{"metadata":{"name":"x"}}`, "no metadata": `{"spec":{"containers":[]}}`, "null container": `{"metadata":{},"spec":{"containers":[null]}}`} {
		t.Run(name, func(t *testing.T) {
			body := review(t, admissionv1.Create, "ml", gputest.Pod("", nil), podKind)
			var ar admissionv1.AdmissionReview
			if err := json.Unmarshal(body, &ar); err != nil {
				t.Fatal(err)
			}
			ar.Request.Object.Raw = []byte(object)
			body, err := json.Marshal(ar)
			if err != nil {
				t.Fatal(err)
			}
			_, resp, text := post(t, srv.URL, "application/json", body)
			if resp.Response.Allowed || resp.Response.Result == nil || resp.Response.Result.Code != http.StatusBadRequest {
				t.Errorf("got %s, want a 400", text)
			}
		})
	}
}

// TestServeAnswersAsControllerRuntime sends every golden case's pod as an
// AdmissionReview through Serve and through controller-runtime's
// admission.Webhook as it is: reading the review itself changes no answer to
// an API server, byte for byte.
func TestServeAnswersAsControllerRuntime(t *testing.T) {
	clustertest.ForEach(t, filepath.Join("..", "inject", "testdata"), func(t *testing.T, _ string, gc clustertest.Case) {
		idx, d := gc.Sources(t)
		ns := gc.Pod.Namespace
		if ns == "" {
			ns = "default"
		}
		h := NewHandler(gc.Config, idx, staticNamespaces{ns: gc.NamespaceLabels}).WithDRA(d)
		body := review(t, admissionv1.Create, ns, gc.Pod, podKind)
		answer := func(s http.Handler) (int, []byte) {
			req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			return rec.Code, rec.Body.Bytes()
		}
		code, got := answer(Serve(h))
		wantCode, want := answer(&admission.Webhook{Handler: h})
		if code != wantCode || !bytes.Equal(got, want) {
			t.Errorf("answers differ:\n Serve              %d %s\n controller-runtime %d %s", code, got, wantCode, want)
		}
		if !bytes.Contains(got, []byte(`"uid":"0f9e2c55-`)) {
			t.Errorf("answer without the request's uid: %s", got)
		}
	})
}

// TestServeConcurrentRequestsShareTheLayout sends GPU pods from many
// goroutines at once: every answer is the same patch, built from the
// layout's prepared mounts that all requests share (go test -race checks
// that none writes them).
func TestServeConcurrentRequestsShareTheLayout(t *testing.T) {
	srv, _ := testServer(t, config.Default())
	body := review(t, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind)
	var want []byte
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				// post calls t.Fatal, which belongs to the test's goroutine.
				resp, err := http.Post(srv.URL+Path, "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				var ar admissionv1.AdmissionReview
				err = json.NewDecoder(resp.Body).Decode(&ar)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || ar.Response == nil || !ar.Response.Allowed || len(ar.Response.Patch) == 0 {
					t.Errorf("HTTP %d, %v, response %+v", resp.StatusCode, err, ar.Response)
					return
				}
				mu.Lock()
				if want == nil {
					want = ar.Response.Patch
				} else if !bytes.Equal(want, ar.Response.Patch) {
					t.Errorf("patches differ:\n%s\n%s", want, ar.Response.Patch)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
