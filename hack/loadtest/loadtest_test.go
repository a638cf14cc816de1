package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	jsonpatchops "gomodules.xyz/jsonpatch/v2"
)

func TestCELPatch(t *testing.T) {
	got, err := celPatch([]byte(`[{"op":"add","path":"/spec/volumes/-","value":{"name":"v","hostPath":{"path":"/usr/bin/nvidia-smi","type":"File"}}},` +
		`{"op":"add","path":"/spec/containers/0/volumeMounts/1/readOnly","value":true},` +
		`{"op":"add","path":"/spec/nodeSelector","value":{"gpu-injector.io/layout-fingerprint":"abc"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`JSONPatch{op: "add", path: "/spec/volumes/-", value: Object.spec.volumes{hostPath: Object.spec.volumes.hostPath{path: "/usr/bin/nvidia-smi", type: "File"}, name: "v"}}`,
		`path: "/spec/containers/0/volumeMounts/1/readOnly", value: true}`,
		`value: {"gpu-injector.io/layout-fingerprint": "abc"}}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("CEL lacks %s:\n%s", want, got)
		}
	}
}

func TestRequestUID(t *testing.T) {
	body := []byte(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"0f9e-1","kind":{"kind":"Pod"},"object":{"metadata":{"uid":"other"}}}}`)
	if got := requestUID(body); got != "0f9e-1" {
		t.Errorf("uid = %q", got)
	}
	if got := requestUID([]byte(`{"request":{}}`)); got != "" {
		t.Errorf("uid of no uid = %q", got)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	if p50, p99 := percentile(d, 0.5), percentile(d, 0.99); p50 != 50 || p99 != 99 {
		t.Errorf("p50 %v p99 %v", p50, p99)
	}
	if got := percentile(d[:1], 0.99); got != 1 {
		t.Errorf("p99 of one = %v", got)
	}
}

func TestWholeListsMakesTheSamePod(t *testing.T) {
	pod := []byte(`{"metadata":{"name":"p"},"spec":{"volumes":[{"name":"data","emptyDir":{}}],"containers":[{"name":"c","volumeMounts":[{"name":"data","mountPath":"/data"}]}]}}`)
	ops := []jsonpatchops.Operation{
		{Operation: "add", Path: "/spec/volumes/-", Value: map[string]any{"name": "a", "hostPath": map[string]any{"path": "/a"}}},
		{Operation: "add", Path: "/spec/containers/0/volumeMounts/-", Value: map[string]any{"name": "a", "mountPath": "/a"}},
		{Operation: "add", Path: "/spec/volumes/-", Value: map[string]any{"name": "b", "hostPath": map[string]any{"path": "/b"}}},
		{Operation: "add", Path: "/spec/containers/0/volumeMounts/-", Value: map[string]any{"name": "b", "mountPath": "/b"}},
		{Operation: "add", Path: "/spec/nodeSelector", Value: map[string]any{"k": "v"}},
	}
	whole, n, err := wholeLists(pod, ops)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("%d operations, want 3: %s", n, whole)
	}
	apply := func(p []byte) string {
		t.Helper()
		patch, err := jsonpatch.DecodePatch(p)
		if err != nil {
			t.Fatal(err)
		}
		out, err := patch.Apply(pod)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	orig, _ := json.Marshal(ops)
	if a, b := apply(whole), apply(orig); a != b {
		t.Errorf("whole lists make\n%s\nours make\n%s", a, b)
	}
}

func TestProcMemoryReadsItsOwnProcess(t *testing.T) {
	m, err := procMemory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.rss <= 0 || m.hwm < m.rss || m.anon <= 0 || m.file <= 0 || m.anon+m.file > m.rss+1024 {
		t.Errorf("implausible /proc figures: %+v", m)
	}
}

func TestScrapeReadsHistogramsAndRuntimeGauges(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `# TYPE go_gc_heap_live_bytes gauge
go_gc_heap_live_bytes 1.2e+07
go_gc_heap_goal_bytes 2.4e+07
go_gc_heap_goal_bytes_other 1
go_memory_classes_heap_free_bytes 3.5e+06
go_memory_classes_heap_unused_bytes 6e+06
go_memstats_heap_inuse_bytes 1.8e+07
controller_runtime_webhook_latency_seconds_sum{webhook="/mutate-v1-pod"} 0.5
controller_runtime_webhook_latency_seconds_count{webhook="/mutate-v1-pod"} 1000
`)
	}))
	defer srv.Close()
	m, err := scrapeURL(context.Background(), srv.Client(), srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{heapLive: 12e6, heapGoal: 24e6, heapFree: 3.5e6, heapUnused: 6e6, heapInUse: 18e6}
	for k, v := range want {
		if m[k][0] != v {
			t.Errorf("%s = %v, want %v", k, m[k][0], v)
		}
	}
	if len(m) != len(want)+1 {
		t.Errorf("scraped %v, want the five gauges and the webhook's latency", m)
	}
}
