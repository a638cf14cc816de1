package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

func TestListVerdict(t *testing.T) {
	const mi = 1 << 20
	for name, tc := range map[string]struct {
		nodes, soft, container int64
		hold, warn             bool
	}{
		"5,000 nodes, the chart's 256Mi":           {5000, 224 * mi, 256 * mi, false, false},
		"65,000 nodes, the chart's 256Mi":          {65000, 224 * mi, 256 * mi, false, false},
		"90,000 nodes, the chart's 256Mi":          {90000, 224 * mi, 256 * mi, true, true},
		"90,000 nodes, 384Mi":                      {90000, 352 * mi, 384 * mi, false, false},
		"378,000 nodes, 1Gi: soft short, hard not": {378000, 922 * mi, 1024 * mi, false, true},
		"GOMEMLIMIT chosen: never held":            {500000, 224 * mi, 0, false, true},
		"no limit at all":                          {500000, 0, 0, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			hold, warn, need := listVerdict(tc.nodes, tc.soft, tc.container)
			if hold != tc.hold || warn != tc.warn {
				t.Errorf("listVerdict(%d nodes, soft %d MiB, container %d MiB) = hold %v, warn %v (need %d MiB), want hold %v, warn %v",
					tc.nodes, tc.soft/mi, tc.container/mi, hold, warn, need/mi, tc.hold, tc.warn)
			}
		})
	}
}

// apiServerOfNodes answers what countListNodes asks of an API server with
// all nodes of which gpu are GPU nodes: a list of one Node that says how
// many remain, and, for the GPU nodes' label selector, pages of a table of
// names. It counts the table pages asked for.
func apiServerOfNodes(t *testing.T, all, gpu int, pages *atomic.Int32) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/api/v1/nodes" {
			t.Errorf("unexpected request %s", r.URL)
			http.NotFound(w, r)
			return
		}
		if q.Get("labelSelector") == "" {
			remaining := int64(all - 1)
			_ = json.NewEncoder(w).Encode(&corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{RemainingItemCount: &remaining}, Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n0"}}}})
			return
		}
		if q.Get("labelSelector") != gpunodes.ProbedNodes().String() || q.Get("includeObject") != "None" || !strings.Contains(r.Header.Get("Accept"), "as=Table") {
			t.Errorf("the GPU nodes counted by %s (Accept %s), want a table of those ProbedNodes selects", r.URL, r.Header.Get("Accept"))
		}
		pages.Add(1)
		from, _ := strconv.Atoi(q.Get("continue"))
		limit, _ := strconv.Atoi(q.Get("limit"))
		table := metav1.Table{TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"}}
		for i := from; i < min(from+limit, gpu); i++ {
			table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{fmt.Sprintf("gpu-%05d", i)}})
		}
		if from+limit < gpu {
			table.Continue = strconv.Itoa(from + limit)
		}
		_ = json.NewEncoder(w).Encode(&table)
	}))
}

func TestCountListNodes(t *testing.T) {
	for name, tc := range map[string]struct {
		all, gpu int
		short    int64
		want     int64
		pages    int32
	}{
		"every node counts as few":         {all: 5000, gpu: 500, short: 10000, want: 5000},
		"too many nodes: the GPU ones":     {all: 100000, gpu: 12345, short: 10000, want: 12345, pages: 3},
		"too many nodes, none of them GPU": {all: 100000, gpu: 0, short: 10000, want: 0, pages: 1},
	} {
		t.Run(name, func(t *testing.T) {
			var pages atomic.Int32
			srv := apiServerOfNodes(t, tc.all, tc.gpu, &pages)
			defer srv.Close()
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			got, err := countListNodes(context.Background(), cs, func(n int64) bool { return n > tc.short })
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || pages.Load() != tc.pages {
				t.Errorf("counted %d in %d table pages, want %d in %d", got, pages.Load(), tc.want, tc.pages)
			}
		})
	}
}

// TestCheckListMemoryCountsGPUNodes: a cluster too large for the chart's
// limit if all its nodes were listed, but whose GPU nodes fit, is listed.
func TestCheckListMemoryCountsGPUNodes(t *testing.T) {
	const mi = 1 << 20
	for name, tc := range map[string]struct {
		all, gpu int
		hold     bool
	}{
		"100,000 nodes, 10 % GPU": {100000, 10000, false},
		"100,000 nodes, all GPU":  {100000, 100000, true},
		"5,000 nodes, all GPU":    {5000, 5000, false},
	} {
		t.Run(name, func(t *testing.T) {
			var pages atomic.Int32
			srv := apiServerOfNodes(t, tc.all, tc.gpu, &pages)
			defer srv.Close()
			err := checkListMemory(context.Background(), &rest.Config{Host: srv.URL}, 224*mi, 256*mi, logr.Discard())
			if (err != nil) != tc.hold {
				t.Errorf("held: %v, want held %v", err, tc.hold)
			}
			if tc.hold && err != nil && !strings.Contains(err.Error(), fmt.Sprintf("first list of %d GPU nodes", tc.gpu)) {
				t.Errorf("error %q does not count the GPU nodes", err)
			}
		})
	}
}
