package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/loadtest/workload"
	"github.com/gpu-injector/gpu-injector/layout"
)

const benchNodes = 5000

// benchIndex is a cluster of 5,000 GPU nodes of three driver layouts, some
// tainted, in three zones.
func benchIndex(b *testing.B, cfg *config.Configuration) (*Index, []*corev1.Node) {
	b.Helper()
	plans := []layout.Plan{ixPlan("470.256.02"), ixPlan("535.104.05"), ixPlan("550.54.15")}
	idx := NewIndex(cfg, logr.Discard())
	nodes := make([]*corev1.Node, benchNodes)
	for i := range nodes {
		nodes[i] = ixNode(fmt.Sprintf("gpu-%05d", i), plans[i%3], 8, func(n *corev1.Node) {
			n.Labels["topology.kubernetes.io/zone"] = fmt.Sprintf("zone-%d", i%3)
			if i%10 == 0 {
				n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
			}
		})
		idx.Add(nodes[i])
	}
	if got := len(idx.Layouts()); got != 3 {
		b.Fatalf("index has %d layouts, want 3", got)
	}
	return idx, nodes
}

// looseFileIndex is 5,000 GPU nodes as the load script creates them: three
// pools, most GPUs on a loose-file layout (19 file mounts), every tenth node
// tainted, three zones, a kubelet's labels and status.
func looseFileIndex(b *testing.B, cfg *config.Configuration) *Index {
	b.Helper()
	idx := NewIndex(cfg, logr.Discard())
	if err := (NodeStore{idx}).Replace(streamedNodes(b, cfg), ""); err != nil {
		b.Fatal(err)
	}
	if got := len(idx.Layouts()); got != len(workload.Pools()) {
		b.Fatalf("index has %d layouts, want %d", got, len(workload.Pools()))
	}
	return idx
}

// looseFileNodes are the load script's 5,000 nodes (114 labels each), as
// a watch event delivers them.
func looseFileNodes() []*corev1.Node {
	nodes := make([]*corev1.Node, benchNodes)
	for i := range nodes {
		nodes[i] = workload.ReadyNode(i)
	}
	return nodes
}

// streamedNodes are the same nodes as a reflector hands over a streamed
// first list: each through the index's Transform.
func streamedNodes(b *testing.B, cfg *config.Configuration) []any {
	b.Helper()
	idx := NewIndex(cfg, logr.Discard())
	list := make([]any, benchNodes)
	for i, n := range looseFileNodes() {
		var err error
		if list[i], err = idx.Transform(n); err != nil {
			b.Fatal(err)
		}
	}
	return list
}

// BenchmarkHandler is one GPU pod's AdmissionReview through the real
// controller-runtime webhook handler, in process: "http" is body decode,
// Mutate, patch and response encode; "handle" the admission.Handler alone.
// "tiny" is a one-container pod against two-folder layouts; small, medium
// and large are the load script's pods (2, 10 and 80 KB of JSON, three
// containers) against its loose-file cluster.
func BenchmarkHandler(b *testing.B) {
	cfg := config.Default()
	folders, _ := benchIndex(b, cfg)
	loose := looseFileIndex(b, cfg)
	type tc struct {
		idx *Index
		pod *corev1.Pod
	}
	cases := []struct {
		name string
		tc
	}{{"tiny", tc{folders, hPod("nvidia.com/gpu", nil)}}}
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
				if resp := h.Handle(ctx, req); !resp.Allowed || len(resp.Patch) == 0 {
					b.Fatalf("response %+v", resp.Result)
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

// BenchmarkIndexUpdate is one Node event on a 5,000-node index: "change"
// moves a node's allocatable GPUs, so its layout is republished; "heartbeat"
// is a status update that changes nothing the index keeps.
func BenchmarkIndexUpdate(b *testing.B) {
	cfg := config.Default()
	b.Run("change", func(b *testing.B) {
		nodes := looseFileNodes()
		idx := looseFileIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			n := nodes[i%benchNodes]
			q := n.Status.Allocatable["nvidia.com/gpu"]
			q.Set(12 - q.Value()) // 8 <-> 4, 4 <-> 8, 1 <-> 11: every event is a change
			n.Status.Allocatable["nvidia.com/gpu"] = q
			idx.Update(n)
			i++
		}
	})
	b.Run("heartbeat", func(b *testing.B) {
		nodes := looseFileNodes()
		idx := looseFileIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			idx.Update(nodes[i%benchNodes])
			i++
		}
	})
	b.Run("list", func(b *testing.B) {
		// The first list of the load script's 5,000 nodes, as a reflector
		// hands it over: stripped while streamed, recorded at once.
		list := streamedNodes(b, cfg)
		b.ReportAllocs()
		for b.Loop() {
			idx := NewIndex(cfg, logr.Discard())
			if err := (NodeStore{idx}).Replace(list, ""); err != nil {
				b.Fatal(err)
			}
			if len(idx.Layouts()) != len(workload.Pools()) {
				b.Fatalf("index has %d layouts", len(idx.Layouts()))
			}
		}
	})
	b.Run("transform", func(b *testing.B) {
		// One Node of a streamed list, stripped and its 114 labels
		// interned; the nodes take turns, so each one's own labels (its
		// hostname, a timestamp) are as new as they are in a real list.
		// The Node's deep copy is part of the time.
		idx := NewIndex(cfg, logr.Discard())
		nodes := looseFileNodes()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := idx.Transform(nodes[i%benchNodes].DeepCopy()); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkDecodePod decodes the load script's pods into what Mutate reads:
// "one-pass" is decodePod's decoder, "encoding-json" the API machinery's
// (sigs.k8s.io/json, encoding/json's validate-then-decode) it replaced.
func BenchmarkDecodePod(b *testing.B) {
	for _, s := range workload.Sizes {
		raw, err := json.Marshal(workload.Pod(s.Name, s.Bytes))
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range []struct {
			name      string
			unmarshal func([]byte, any) error
		}{{"one-pass", unmarshal}, {"encoding-json", kjson.UnmarshalCaseSensitivePreserveInts}} {
			b.Run(d.name+"/"+s.Name, func(b *testing.B) {
				b.SetBytes(int64(len(raw)))
				b.ReportAllocs()
				for b.Loop() {
					var p slimPod
					if err := d.unmarshal(raw, &p); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
