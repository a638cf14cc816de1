package offline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

var now = time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)

func write(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAddFile: a file of the cluster holds Nodes, Namespaces, DRA objects
// and one pool memory, in Lists or documents; anything else is refused and
// named.
func TestAddFile(t *testing.T) {
	var c Cluster
	err := c.AddFile(write(t, `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: gpu-1}}
- {apiVersion: v1, kind: Namespace, metadata: {name: ml, labels: {pod-security.kubernetes.io/enforce: baseline}}}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: gpu-injector-pools, namespace: gpu-injector}
data: {}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := c.Namespaces.NamespaceLabels(context.Background(), "ml")
	if len(c.Nodes) != 1 || labels["pod-security.kubernetes.io/enforce"] != "baseline" || len(c.DRA) != 1 || c.MemoryName != "gpu-injector/gpu-injector-pools" {
		t.Errorf("cluster %+v", c)
	}
	if l, err := c.Namespaces.NamespaceLabels(context.Background(), "other"); l != nil || err != nil {
		t.Errorf("a namespace not given: %v, %v; want no labels and no error", l, err)
	}
	for name, tc := range map[string]struct{ in, want string }{
		"another kind":         {"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", `document 1 is a "Pod", not a Node`},
		"no kind":              {"metadata: {name: p}\n", `document 1 is a "", not a Node`},
		"two pool memories":    {"kind: ConfigMap\nmetadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: b}\n", "ConfigMap b is a second pool memory, after a"},
		"a nameless namespace": {"kind: Namespace\nmetadata: {labels: {a: b}}\n", "a Namespace without a name"},
		"not YAML":             {"kind: Node\nmetadata: [unclosed\n", "document 1:"},
	} {
		t.Run(name, func(t *testing.T) {
			var c Cluster
			if err := c.AddFile(write(t, tc.in), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// readyNode is a node whose probe published a valid layout.
func readyNode(name string) corev1.Node {
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "550.54.15",
		Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	enc, err := layout.Encode(plan)
	if err != nil {
		panic(err)
	}
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels:      map[string]string{layout.LabelState: layout.StateReady, layout.LabelFingerprint: plan.Fingerprint()},
		Annotations: map[string]string{layout.AnnotationLayout: enc}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

// TestNodeNotes: a node the probe marked ready that the webhook does not
// count is named with the reason the files give, not said to publish no
// usable layout; past ten, the rest are counted.
func TestNodeNotes(t *testing.T) {
	noReady := readyNode("once")
	noReady.Status.Conditions = nil
	notReady := readyNode("down")
	notReady.Status.Conditions[0].Status, notReady.Status.Conditions[0].Reason = corev1.ConditionFalse, "KubeletNotReady"
	cordoned := readyNode("cordoned")
	cordoned.Spec.Unschedulable = true
	noDriver := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Labels: map[string]string{layout.LabelState: layout.StateNoDriver}}}
	var many []corev1.Node
	for i := range 12 {
		n := readyNode(fmt.Sprintf("once-%02d", i))
		n.Status.Conditions = nil
		many = append(many, n)
	}
	runtime := config.Default()
	runtime.DriverDelivery = config.DeliveryRuntime
	for name, tc := range map[string]struct {
		nodes []corev1.Node
		cfg   *config.Configuration
		want  []string
	}{
		"no Ready condition": {nodes: []corev1.Node{noReady}, want: []string{"node once has no Ready condition: the webhook reads a node's layout only when the node is Ready (`gpu-injector nodeprobe --once` prints"}},
		"not Ready":          {nodes: []corev1.Node{notReady, readyNode("up")}, want: []string{"node down is not Ready (Ready=False, KubeletNotReady)"}},
		"cordoned":           {nodes: []corev1.Node{cordoned}, want: []string{"node cordoned is cordoned (spec.unschedulable)"}},
		"no GPU node":        {nodes: []corev1.Node{noDriver}, want: []string{"none of the 1 nodes publishes a usable layout"}},
		"all ready":          {nodes: []corev1.Node{readyNode("up")}},
		"many":               {nodes: many, want: []string{"node once-09 has no Ready condition", "2 more nodes are not counted, for the same reasons"}},
		"runtime delivery":   {nodes: []corev1.Node{noReady}, cfg: runtime},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == nil {
				cfg = config.Default()
			}
			c := Cluster{Nodes: tc.nodes}
			_, notes := c.Builder(cfg, clocktesting.NewFakePassiveClock(now), logr.Discard())
			all := strings.Join(notes, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("notes:\n%s\nwant %q", all, w)
				}
			}
			if len(tc.want) == 0 && all != "" {
				t.Errorf("notes:\n%s\nwant none", all)
			}
			if strings.Contains(all, "publishes a usable layout") && name != "no GPU node" {
				t.Errorf("notes say no node publishes a usable layout:\n%s", all)
			}
		})
	}
}

// TestPoolMemory: the pool memory given is aged against the clock and
// lends the index its remembered layouts; entries that do not decode are
// noted, and a memory without pinning by pool is said to be unused.
func TestPoolMemory(t *testing.T) {
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "535.104.05",
		Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	data, err := pools.EncodeMemory([]pools.Memory{{Pool: "pool=t4", Labels: map[string]string{"pool": "t4"}, NodeLabels: map[string]string{"pool": "t4"}, Plan: plan, LastSeen: now.Add(-time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	data["pool-0000000000000000dead"] = "{"
	byPool := config.Default()
	byPool.Pinning.NodeLabels = []string{"pool"}
	c := Cluster{Memory: data, MemoryName: "gpu-injector/gpu-injector-pools"}

	b, notes := c.Builder(byPool, clocktesting.NewFakePassiveClock(now), logr.Discard())
	if l := b.Layouts.Layouts(); len(l) != 1 || l[0].Fingerprint != plan.Fingerprint() {
		t.Errorf("layouts %+v, want the remembered pool's", l)
	}
	if all := strings.Join(notes, "\n"); !strings.Contains(all, "the pool memory gpu-injector/gpu-injector-pools: 1 entries ignored") {
		t.Errorf("notes:\n%s", all)
	}
	// Past rememberFor the pool is forgotten, as the webhook forgets it.
	b, _ = c.Builder(byPool, clocktesting.NewFakePassiveClock(now.Add(byPool.Pinning.Remember()+time.Hour)), logr.Discard())
	if l := b.Layouts.Layouts(); len(l) != 0 {
		t.Errorf("an expired memory lends %d layouts", len(l))
	}
	_, notes = c.Builder(config.Default(), clocktesting.NewFakePassiveClock(now), logr.Discard())
	if all := strings.Join(notes, "\n"); !strings.Contains(all, "is unused: pinning.nodeLabels is empty") {
		t.Errorf("notes:\n%s", all)
	}
}
