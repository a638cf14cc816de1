package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// FuzzAdmissionReview sends arbitrary bytes as the HTTP body: the webhook
// must never panic (recovery is off here, so a panic fails the fuzz) and must
// always answer with an AdmissionReview: a patch that applies, or an error.
func FuzzAdmissionReview(f *testing.F) {
	cfg := config.Default()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	for i := 0; i < 3; i++ {
		idx.Add(gputest.Node(fmt.Sprintf("gpu-%d", i), gputest.Plan("535.104.05"), 8, nil))
	}
	hd := NewHandler(cfg, idx, staticNamespaces{"ml": {}})
	h := &reviewServer{webhook: &admission.Webhook{Handler: hd, RecoverPanic: ptr.To(false)}}
	// controller-runtime's admission.Webhook as it is, the reference for
	// every body it reads as the API server's review.
	reference := &admission.Webhook{Handler: hd, RecoverPanic: ptr.To(false)}

	f.Add(review(f, admissionv1.Create, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind))
	f.Add(review(f, admissionv1.Create, "ml", gputest.Pod("alpha.kubernetes.io/nvidia-gpu", func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: p.Spec.Containers[0].Resources}}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LD_LIBRARY_PATH", Value: "/opt/lib"}}
	}), podKind))
	f.Add(review(f, admissionv1.Create, "ml", gputest.Pod("", nil), podKind))
	f.Add(review(f, admissionv1.Delete, "ml", gputest.Pod("nvidia.com/gpu", nil), podKind))
	f.Add(review(f, admissionv1.Create, "ml", &corev1.ConfigMap{}, metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"object":null}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"object":{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1e9"}}}],"nodeSelector":{"a":"b"}}}}}`))
	f.Add([]byte(`{`))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("one review took %v", d)
		}

		// Wherever controller-runtime's webhook reads a JSON AdmissionReview
		// and gets as far as the handler, Serve answers with the same bytes.
		// It also reads a body of another kind or version, or YAML, which
		// Serve refuses.
		req = httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		ref := httptest.NewRecorder()
		reference.ServeHTTP(ref, req)
		var want admissionv1.AdmissionReview
		if err := json.Unmarshal(ref.Body.Bytes(), &want); err == nil && want.Response != nil && want.Response.UID != "" &&
			(want.Response.Result == nil || want.Response.Result.Code != http.StatusBadRequest) && isReview(body) &&
			(rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), ref.Body.Bytes())) {
			t.Fatalf("answers differ:\n Serve              %d %s\n controller-runtime %d %s", rec.Code, rec.Body.Bytes(), ref.Code, ref.Body.Bytes())
		}

		var ar admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &ar); err != nil || ar.Response == nil {
			t.Fatalf("answer is no AdmissionReview (%v): %s", err, rec.Body.Bytes())
		}
		r := ar.Response
		switch {
		case rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge:
			t.Fatalf("HTTP status %d: %s", rec.Code, rec.Body.Bytes())
		case r.Result != nil && r.Result.Code >= 500:
			t.Fatalf("internal error for input: %s", rec.Body.Bytes())
		case !r.Allowed && (r.Result == nil || r.Result.Message == ""):
			t.Fatalf("a refusal without a message: %s", rec.Body.Bytes())
		case r.Patch != nil && !r.Allowed:
			t.Fatalf("a refusal with a patch: %s", rec.Body.Bytes())
		}
	})
}

// isReview: the body is JSON whose apiVersion and kind name an
// AdmissionReview of a version Serve reads, also to encoding/json, which
// controller-runtime's decoder reads them with (names matched in any case).
func isReview(body []byte) bool {
	if !json.Valid(body) {
		return false
	}
	for _, unmarshal := range []func([]byte, any) error{json.Unmarshal, kjson.UnmarshalCaseSensitivePreserveInts} {
		var tm metav1.TypeMeta
		if unmarshal(body, &tm) != nil || tm.Kind != "AdmissionReview" ||
			tm.APIVersion != "admission.k8s.io/v1" && tm.APIVersion != "admission.k8s.io/v1beta1" {
			return false
		}
	}
	return true
}
