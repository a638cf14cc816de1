package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// BenchmarkHandler is one GPU pod's AdmissionReview through the webhook's
// HTTP handler, in process: "http" is Serve (body decode, Mutate, patch and
// response encode); "handle" the admission.Handler alone, its response completed (the patch encoded).
// "tiny" is a one-container pod against two-folder layouts; small, medium
// and large are the load script's pods (2, 10 and 80 KB of JSON, three
// containers) against its loose-file cluster.
func BenchmarkHandler(b *testing.B) {
	cfg := config.Default()
	folders, _ := clustertest.BenchIndex(b, cfg)
	loose := clustertest.LooseFileIndex(b, cfg)
	type tc struct {
		idx *gpunodes.Index
		pod *corev1.Pod
	}
	cases := []struct {
		name string
		tc
	}{{"tiny", tc{folders, gputest.Pod("nvidia.com/gpu", nil)}}}
	for _, s := range workload.Sizes {
		cases = append(cases, struct {
			name string
			tc
		}{s.Name, tc{loose, workload.Pod(s.Name, s.Bytes)}})
	}
	ns := staticNamespaces{"ml": {layout.LabelInject: layout.InjectEnabled}}
	for _, c := range cases {
		body := review(b, admissionv1.Create, "ml", c.pod, podKind)
		b.Run("http/"+c.name, func(b *testing.B) {
			h := Serve(NewHandler(cfg, c.idx, ns))
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"patch":`)) {
					b.Fatalf("HTTP %d: %s", rec.Code, rec.Body.Bytes())
				}
			}
		})
		b.Run("handle/"+c.name, func(b *testing.B) {
			h := NewHandler(cfg, c.idx, ns)
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				UID: types.UID("1"), Kind: podKind, Namespace: "ml", Operation: admissionv1.Create,
			}}
			req.Object.Raw = bodyPod(b, body)
			b.SetBytes(int64(len(req.Object.Raw)))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				// Complete encodes the patch, as Serve does.
				resp := h.Handle(ctx, req)
				if err := resp.Complete(req); err != nil || !resp.Allowed || len(resp.Patch) == 0 {
					b.Fatalf("response %+v: %v", resp.Result, err)
				}
			}
		})
	}
}

func bodyPod(b *testing.B, body []byte) []byte {
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil {
		b.Fatal(err)
	}
	return ar.Request.Object.Raw
}

// BenchmarkDecodePod decodes the load script's pods as the handler does, into
// a whole Pod with the API machinery's decoder.
func BenchmarkDecodePod(b *testing.B) {
	for _, s := range workload.Sizes {
		raw, err := json.Marshal(workload.Pod(s.Name, s.Bytes))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(s.Name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodePod(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
