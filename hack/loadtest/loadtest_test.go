package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	jsonpatchops "gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
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

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-memory-only", "-nodes", "65000,5000,20000", "-memory-limit", "none,256Mi"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.nodeCounts, []int{5000, 20000, 65000}) || o.nodes != 5000 {
		t.Errorf("nodes %d, counts %v: want the sizes ascending", o.nodes, o.nodeCounts)
	}
	if !slices.Equal(o.memoryLimits, []int64{0, 256 << 20}) {
		t.Errorf("limits %v", o.memoryLimits)
	}
	if o, err := parseFlags(nil); err != nil || o.nodes != 5000 || o.memoryOnly || !slices.Equal(o.memoryLimits, []int64{0}) {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	if o, err := parseFlags([]string{"-default-values", "-variants", "noop,chart-policy"}); err != nil || !o.nri || !o.chartPolicies() {
		t.Errorf("-default-values: %+v, %v", o, err)
	}
	for name, args := range map[string][]string{
		"too many nodes":               {"-nodes", "65001"},
		"no nodes":                     {"-nodes", "0"},
		"twice the same size":          {"-memory-only", "-nodes", "5000,5000"},
		"several sizes, admission run": {"-nodes", "5000,20000"},
		"a limit, admission run":       {"-memory-limit", "256Mi"},
		"a bad limit":                  {"-memory-only", "-memory-limit", "lots"},
		"no node workers":              {"-node-workers", "0"},
		"no GPU node share":            {"-gpu-fraction", "0"},
		"a GPU share above one":        {"-gpu-fraction", "1.5"},
		"two renderings of the chart":  {"-runtime-delivery", "-default-values"},
		"a ref chart, no chart policy": {"-ref-chart", "/tmp", "-variants", "chart-policy-ref"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%s: %q accepted", name, args)
		}
	}
}

func TestWebhookEnv(t *testing.T) {
	base := []string{"PATH=/bin", nodeagent.MemoryLimitEnv + "=1"}
	if got := webhookEnv(base, 0); !slices.Equal(got, []string{"PATH=/bin"}) {
		t.Errorf("no limit: %q", got)
	}
	if got := webhookEnv(base, 256<<20); !slices.Equal(got, []string{"PATH=/bin", nodeagent.MemoryLimitEnv + "=268435456"}) {
		t.Errorf("256Mi: %q", got)
	}
	if base[1] != nodeagent.MemoryLimitEnv+"=1" {
		t.Errorf("the caller's environment changed: %q", base)
	}
}

func TestProcCPUReadsItsOwnProcess(t *testing.T) {
	// Spend some CPU, so that the figure is above zero ticks.
	deadline := time.Now().Add(50 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		_ = strconv.Itoa(n)
	}
	d, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d > time.Hour {
		t.Errorf("implausible CPU time %s", d)
	}
	if exited(os.Getpid()) {
		t.Error("this process is said to have exited")
	}
}

func TestGPUFraction(t *testing.T) {
	var gpu []int
	cpu := 0
	for i := range 30 {
		isGPU, k := gpuNode(i, 0.1)
		if isGPU {
			if k != len(gpu) {
				t.Errorf("node %d is GPU node %d, want %d", i, k, len(gpu))
			}
			gpu = append(gpu, i)
			continue
		}
		if k != cpu {
			t.Errorf("node %d is CPU node %d, want %d", i, k, cpu)
		}
		cpu++
	}
	if !slices.Equal(gpu, []int{0, 10, 20}) || gpuNodes(30, 0.1) != 3 || gpuNodes(65000, 0.1) != 6500 || gpuNodes(5, 0.1) != 1 {
		t.Errorf("GPU nodes of 30 at 0.1: %v (%d); of 65,000: %d; of 5: %d", gpu, gpuNodes(30, 0.1), gpuNodes(65000, 0.1), gpuNodes(5, 0.1))
	}
	for i := range 10 {
		if isGPU, k := gpuNode(i, 1); !isGPU || k != i {
			t.Errorf("at 1, node %d is GPU %v, number %d", i, isGPU, k)
		}
	}

	r := &run{o: &options{gpuFraction: 0.5}}
	for i := range 4 {
		n, st, _ := r.clusterNode(i)
		_, hasGPU := st.Allocatable["nvidia.com/gpu"]
		probed := gpunodes.ProbedNodes().Matches(labels.Set(n.Labels))
		if want := i%2 == 0; probed != want || hasGPU != want {
			t.Errorf("node %d %s: selected by the webhook %v, GPUs %v; want %v", i, n.Name, probed, hasGPU, want)
		}
	}
}
