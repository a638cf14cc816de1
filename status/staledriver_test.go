package status

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-injector/gpu-injector/layout"
)

func TestStaleDriverRow(t *testing.T) {
	withPlugin := map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol}
	node := func(name, annotation string) runtime.Object {
		n := gpuNode(name, layout.StateReady, "", 4, withPlugin)
		if annotation != "" {
			n.Annotations[layout.AnnotationStaleDriver] = annotation
		}
		return n
	}
	on := func(node string, names ...string) []runtime.Object {
		var out []runtime.Object
		for _, n := range names {
			out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: n}, Spec: corev1.PodSpec{NodeName: node}})
		}
		return out
	}
	for name, tc := range map[string]struct {
		annotation string
		pods       []runtime.Object
		attention  string
		table      string
		// notNamed must appear nowhere in the report.
		notNamed string
	}{
		"no record":  {},
		"none stale": {annotation: `{"containers":3}`},
		"two stale pods": {annotation: `{"containers":3,"staleContainers":2,"stalePods":2,"pods":["ml/train-0","ml/train-1"]}`,
			pods:      on("gpu-b", "train-0", "train-1"),
			attention: "node gpu-b: 2 GPU pods run a driver deleted since they started (a driver upgrade); restart them: ml/train-0, ml/train-1",
			table:     "gpu-b: 2 GPU pods run a driver deleted"},
		"more than named": {annotation: `{"containers":30,"staleContainers":25,"stalePods":25,"pods":["ml/a"]}`,
			pods: on("gpu-b", "a"), attention: "restart them: ml/a and 24 more", table: "ml/a and 24 more"},
		"unreadable": {annotation: `{"containers":3,"unreadable":3}`, table: "3 GPU containers whose maps the NRI plugin may not read"},
		"a pod of another node": {annotation: `{"containers":3,"staleContainers":2,"stalePods":2,"pods":["ml/elsewhere","ml/train-0"]}`,
			pods:      append(on("gpu-b", "train-0"), on("gpu-a", "elsewhere")...),
			attention: "restart them: ml/train-0 (1 pods the node named do not run on it: not shown)", table: "restart them: ml/train-0", notNamed: "ml/elsewhere"},
		"a pod that does not exist": {annotation: `{"containers":3,"staleContainers":1,"stalePods":1,"pods":["ml/ghost"]}`,
			attention: "restart them: none it names runs on it", table: "none it names runs on it", notNamed: "ml/ghost"},
		"an escape sequence in a name": {annotation: `{"stalePods":1,"pods":["ml/a\u001b[2J"]}`,
			table: "gpu-b: stale driver record ignored", notNamed: "\x1b"},
		"a lying record": {annotation: `{"stalePods":1,"pods":["/etc/passwd"]}`,
			table: "gpu-b: stale driver record ignored"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := append(append(healthy(), node("gpu-b", tc.annotation)), tc.pods...)
			r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
			all := strings.Join(r.Attention, "\n")
			if tc.attention == "" && len(r.Attention) > 0 || !strings.Contains(all, tc.attention) {
				t.Errorf("attention:\n%s\nwant %q", all, tc.attention)
			}
			var out bytes.Buffer
			if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
				t.Fatal(err)
			}
			if tc.table != "" && !strings.Contains(out.String(), tc.table) {
				t.Errorf("table lacks %q:\n%s", tc.table, out.String())
			}
			if tc.notNamed != "" && (strings.Contains(out.String(), tc.notNamed) || strings.Contains(all, tc.notNamed)) {
				t.Errorf("the report names %q:\n%s\n%s", tc.notNamed, all, out.String())
			}
			if tc.table == "" && strings.Contains(out.String(), "deleted") {
				t.Errorf("table speaks of a deleted driver:\n%s", out.String())
			}
		})
	}
}

// TestNodeTextCleaned: a node's state reason that carries escape sequences
// reaches neither the report nor the terminal as they are.
func TestNodeTextCleaned(t *testing.T) {
	evil := "probe failed \x1b]0;owned\x07\x1b[2J\rroot"
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, append(healthy(), gpuNode("gpu-b", layout.StateError, evil, 4, nil))...)
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	for _, n := range r.Nodes {
		if strings.ContainsAny(n.Reason, "\x1b\x07\r") {
			t.Errorf("node %s: reason %q", n.Name, n.Reason)
		}
	}
	if strings.ContainsAny(out.String(), "\x1b\x07\r") || strings.Contains(strings.Join(r.Attention, "\n"), "\x1b") {
		t.Errorf("the report carries the node's control characters:\n%q", out.String())
	}
	if !strings.Contains(out.String(), "not shown") {
		t.Errorf("the report does not say the reason was not shown:\n%s", out.String())
	}
}
