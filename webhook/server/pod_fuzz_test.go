package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// FuzzAdmitPod sends a pod's JSON as the object of a pod CREATE review in a
// namespace that opted in. Wherever the API machinery decodes it into a Pod,
// the webhook admits it as it admits that Pod's own encoding, which is what
// an API server sends: the same answer, byte for byte, and a patch that
// applies to that encoding. It refuses only what a JSON Patch cannot edit (a
// missing metadata or spec, a null container). Bodies an API server never
// sends (repeated names, invalid UTF-8, odd numbers, nulls) are where the
// spelling could change the answer.
func FuzzAdmitPod(f *testing.F) {
	for _, s := range workload.Sizes {
		raw, err := json.Marshal(workload.Pod(s.Name, s.Bytes))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"metadata":{"name":"a","name":"b","labels":{"k":"v","k":"w"}},"spec":{"nodeName":"n","NodeName":"m","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpu":"2"}}}]}}`))
	f.Add([]byte("{\"metadata\":{\"name\":\"\xff\xfe\",\"annotations\":{\"a\":\"\\ud800\"}},\"spec\":{\"containers\":[{\"name\":\"c\",\"env\":[{\"name\":\"LD_LIBRARY_PATH\",\"value\":null,\"valueFrom\":{}}]}]}}"))
	f.Add([]byte(`{"metadata":{},"spec":{"tolerations":[{"key":"k","tolerationSeconds":1e3}],"volumes":[{"name":"v","hostPath":{"path":"/x","type":null}}],"containers":null}}`))
	f.Add([]byte(`{"metadata":null,"spec":{}}`))
	f.Add([]byte(`{"metadata":{},"spec":{"containers":[null,{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`))

	cfg := config.Default()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	for i := 0; i < 3; i++ {
		idx.Add(gputest.Node(fmt.Sprintf("gpu-%d", i), gputest.Plan("535.104.05"), 8, nil))
	}
	hd := NewHandler(cfg, idx, staticNamespaces{"ml": {layout.LabelInject: layout.InjectEnabled}})
	h := &reviewServer{webhook: &admission.Webhook{Handler: hd, RecoverPanic: ptr.To(false)}}
	envelope := review(f, admissionv1.Create, "ml", gputest.Pod("", nil), podKind)
	answer := func(t *testing.T, object []byte) (int, []byte, *admissionv1.AdmissionResponse) {
		var ar admissionv1.AdmissionReview
		if err := json.Unmarshal(envelope, &ar); err != nil {
			t.Fatal(err)
		}
		ar.Request.Object.Raw = object
		body, err := json.Marshal(ar)
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("answer is no AdmissionReview (%v): %s", err, rec.Body.Bytes())
		}
		return rec.Code, rec.Body.Bytes(), out.Response
	}

	// A quantity with a long decimal exponent stalls apimachinery v0.36's
	// ParseQuantity (see FuzzNodeLayout); the API server parses a pod's
	// quantities before any webhook sees it. Four exponent digits are kept.
	longExponent := regexp.MustCompile(`[0-9.][eE][+-]?[0-9]{5}`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if longExponent.Match(raw) || !json.Valid(raw) {
			return
		}
		var pod corev1.Pod
		if kjson.UnmarshalCaseSensitivePreserveInts(raw, &pod) != nil {
			return
		}
		canonical, err := json.Marshal(&pod)
		if err != nil {
			t.Fatal(err)
		}
		code, got, resp := answer(t, raw)
		if code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, got)
		}
		if !resp.Allowed && resp.Result != nil && resp.Result.Code == http.StatusBadRequest {
			if msg := resp.Result.Message; !strings.Contains(msg, errNoMetadataOrSpec.Error()) && !strings.Contains(msg, "] is null") {
				t.Fatalf("refused a pod the API machinery decodes: %s\nfrom %s", got, raw)
			}
			return
		}
		_, want, wantResp := answer(t, canonical)
		if !bytes.Equal(got, want) {
			t.Fatalf("the pod's spelling changed the answer:\n%s\nfrom %s\n%s\nfrom its encoding %s", got, raw, want, canonical)
		}
		switch {
		case wantResp.Result != nil && wantResp.Result.Code >= 500:
			t.Fatalf("internal error: %s\nfrom %s", want, canonical)
		case !wantResp.Allowed && (wantResp.Result == nil || wantResp.Result.Message == "" || wantResp.Patch != nil):
			t.Fatalf("a refusal without a message or with a patch: %s", want)
		case wantResp.Patch != nil:
			patch, err := jsonpatch.DecodePatch(wantResp.Patch)
			if err != nil {
				t.Fatalf("patch does not decode: %v: %s", err, wantResp.Patch)
			}
			out, err := patch.Apply(canonical)
			if err != nil {
				t.Fatalf("patch does not apply: %v\n%s\nto %s", err, wantResp.Patch, canonical)
			}
			if err := kjson.UnmarshalCaseSensitivePreserveInts(out, &corev1.Pod{}); err != nil {
				t.Fatalf("patched pod does not decode: %v: %s", err, out)
			}
		}
	})
}
