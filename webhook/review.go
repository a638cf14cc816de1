package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// maxReviewSize is controller-runtime's limit on a request body.
const maxReviewSize = 7 * 1024 * 1024

// Serve is the webhook's HTTP handler. A pod CREATE review, the API server's
// every GPU pod, is decoded in one pass straight into the fields Mutate
// reads; controller-runtime's decoder reads the body three times and copies
// the pod before decodePod reads it twice more, which was most of the time
// on a large pod. Every other body (an UPDATE, a v1beta1 review, no uid, a
// wrong content type, a body that does not decode) goes to
// controller-runtime's admission.Webhook, whose answers are unchanged.
func Serve(h *Handler) http.Handler {
	return HTTPStatus(&reviewServer{handler: h, webhook: NewWebhook(h)})
}

type reviewServer struct {
	handler *Handler
	webhook *admission.Webhook
}

// slimReview is an AdmissionReview with only what the fast path reads.
type slimReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID         types.UID                   `json:"uid"`
		Kind        metav1.GroupVersionKind     `json:"kind"`
		Resource    metav1.GroupVersionResource `json:"resource"`
		SubResource string                      `json:"subResource"`
		Name        string                      `json:"name"`
		Namespace   string                      `json:"namespace"`
		Operation   admissionv1.Operation       `json:"operation"`
		UserInfo    struct {
			Username string `json:"username"`
		} `json:"userInfo"`
		Object *slimPod `json:"object"`
	} `json:"request"`
}

func (s *reviewServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Content-Type") != "application/json" {
		s.webhook.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewSize))
	r.Body.Close()
	if err != nil || len(body) >= maxReviewSize {
		s.fallback(w, r, body, err)
		return
	}
	var rev slimReview
	if unmarshal(body, &rev) != nil || rev.APIVersion != admissionv1.SchemeGroupVersion.String() ||
		rev.Kind != "AdmissionReview" || rev.Request == nil || rev.Request.UID == "" || rev.Request.Object == nil ||
		rev.Request.Operation != admissionv1.Create || rev.Request.SubResource != "" ||
		rev.Request.Kind.Group != podKind.Group || rev.Request.Kind.Kind != podKind.Kind {
		s.fallback(w, r, body, nil)
		return
	}
	rq := rev.Request
	pod, err := rq.Object.pod()
	if err != nil {
		s.fallback(w, r, body, nil)
		return
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: rq.UID, Kind: rq.Kind, Resource: rq.Resource, Name: rq.Name, Namespace: rq.Namespace,
		Operation: rq.Operation, UserInfo: authenticationv1.UserInfo{Username: rq.UserInfo.Username},
	}}
	// The same request logger controller-runtime gives its handlers.
	ctx := logf.IntoContext(r.Context(), admission.DefaultLogConstructor(logf.Log.WithName("admission"), &req))
	resp := s.admit(ctx, req, pod)
	if err := resp.Complete(req); err != nil {
		resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("failed to encode the response: %w", err))
		resp.UID = req.UID
	}
	w.Header().Set("Content-Type", "application/json")
	ar := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: rev.APIVersion, Kind: rev.Kind}, Response: &resp.AdmissionResponse}
	if err := json.NewEncoder(w).Encode(ar); err != nil {
		logf.FromContext(ctx).Error(err, "failed to write the response")
	}
}

// admit recovers a panic as controller-runtime's webhook does, unless its
// RecoverPanic is off (the fuzz tests turn it off to see panics).
func (s *reviewServer) admit(ctx context.Context, req admission.Request, pod *corev1.Pod) (resp admission.Response) {
	if s.webhook.RecoverPanic == nil || *s.webhook.RecoverPanic {
		defer func() {
			if r := recover(); r != nil {
				logf.FromContext(ctx).Error(fmt.Errorf("%v", r), "recovered from a panic in the webhook")
				resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("panic: %v [recovered]", r))
				resp.UID = req.UID
			}
		}()
	}
	return s.handler.admit(ctx, req.Namespace, req.UID, pod)
}

// fallback hands a body the fast path does not take to controller-runtime.
func (s *reviewServer) fallback(w http.ResponseWriter, r *http.Request, body []byte, readErr error) {
	var rd io.Reader = bytes.NewReader(body)
	if readErr != nil {
		rd = io.MultiReader(rd, errReader{readErr})
	}
	r.Body = io.NopCloser(rd)
	s.webhook.ServeHTTP(w, r)
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
