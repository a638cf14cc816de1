package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	admissionv1beta1 "k8s.io/api/admission/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// maxReviewSize is controller-runtime's limit on a request body: two objects
// of the API server's largest request size and the rest of the review.
const maxReviewSize = 7 * 1024 * 1024

// Serve is the webhook's HTTP handler, the one path of every request. It
// reads the AdmissionReview itself, with the API machinery's decoder
// (sigs.k8s.io/json, as the API server and controller-runtime decode), so a
// body that is no API server's review gets its error code as the HTTP status:
// controller-runtime's admission.Webhook answers it with HTTP 200 and the code
// only inside the review, which hides a broken client from HTTP tooling. A
// review with a request uid is always answered with HTTP 200, as the API
// server needs it to read the answer. The request itself goes through
// admission.Webhook.Handle, which sets up the request's logger, recovers a
// panic and completes the response.
func Serve(h admission.Handler) http.Handler {
	return &reviewServer{webhook: &admission.Webhook{Handler: h, RecoverPanic: ptr.To(true)}}
}

type reviewServer struct {
	webhook *admission.Webhook
}

func (s *reviewServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	review, code, err := readReview(r)
	if err != nil {
		logf.Log.WithName("admission").Error(err, "failed to read the admission review")
		writeReview(w, int(code), reviewV1, admission.Errored(code, err))
		return
	}
	resp := s.webhook.Handle(r.Context(), admission.Request{AdmissionRequest: *review.Request})
	writeReview(w, http.StatusOK, review.TypeMeta, resp)
}

var reviewV1 = metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"}

// readReview reads the body as an API server sends it: a JSON AdmissionReview
// of admission.k8s.io/v1 or v1beta1 (their fields are the same) with a request
// and its uid. Otherwise it gives the HTTP status to answer with.
func readReview(r *http.Request) (*admissionv1.AdmissionReview, int32, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, http.StatusBadRequest, errors.New("request body is empty")
	}
	defer r.Body.Close()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewSize))
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("failed to read the request body: %w", err)
	}
	if len(body) >= maxReviewSize {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request entity is too large; limit is %d bytes", maxReviewSize)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return nil, http.StatusBadRequest, fmt.Errorf("contentType=%s, expected application/json", ct)
	}
	var review admissionv1.AdmissionReview
	if err := kjson.UnmarshalCaseSensitivePreserveInts(body, &review); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("failed to decode the AdmissionReview: %w", err)
	}
	if v := review.APIVersion; review.Kind != reviewV1.Kind || v != reviewV1.APIVersion && v != admissionv1beta1.SchemeGroupVersion.String() {
		return nil, http.StatusBadRequest, fmt.Errorf("the body is no AdmissionReview of admission.k8s.io/v1 or v1beta1: apiVersion %q, kind %q", v, review.Kind)
	}
	if review.Request == nil || review.Request.UID == "" {
		return nil, http.StatusBadRequest, errors.New("the AdmissionReview has no request uid")
	}
	return &review, 0, nil
}

// writeReview answers with the response in a review of the request's version,
// encoded as controller-runtime encodes it.
func writeReview(w http.ResponseWriter, code int, tm metav1.TypeMeta, resp admission.Response) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(admissionv1.AdmissionReview{TypeMeta: tm, Response: &resp.AdmissionResponse}); err != nil {
		logf.Log.WithName("admission").Error(err, "failed to write the admission response", "requestID", resp.UID)
	}
}
