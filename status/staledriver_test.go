package status

import (
	"bytes"
	"strings"
	"testing"

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
	for name, tc := range map[string]struct {
		annotation string
		attention  string
		table      string
	}{
		"no record":  {},
		"none stale": {annotation: `{"containers":3}`},
		"two stale pods": {annotation: `{"containers":3,"staleContainers":2,"stalePods":2,"pods":["ml/train-0","ml/train-1"]}`,
			attention: "node gpu-b: 2 GPU pods run a driver deleted since they started (a driver upgrade); restart them: ml/train-0, ml/train-1",
			table:     "gpu-b: 2 GPU pods run a driver deleted"},
		"more than named": {annotation: `{"containers":30,"staleContainers":25,"stalePods":25,"pods":["ml/a"]}`,
			attention: "restart them: ml/a and 24 more", table: "ml/a and 24 more"},
		"unreadable": {annotation: `{"containers":3,"unreadable":3}`, table: "3 GPU containers whose maps the NRI plugin may not read"},
		"a lying record": {annotation: `{"stalePods":1,"pods":["/etc/passwd"]}`,
			table: "gpu-b: stale driver record ignored"},
	} {
		t.Run(name, func(t *testing.T) {
			r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, append(healthy(), node("gpu-b", tc.annotation))...)
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
			if tc.table == "" && strings.Contains(out.String(), "deleted") {
				t.Errorf("table speaks of a deleted driver:\n%s", out.String())
			}
		})
	}
}
