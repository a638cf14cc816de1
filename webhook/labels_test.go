package webhook

import (
	"maps"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestLabels(t *testing.T) {
	m := map[string]string{"zone": "a", "kubernetes.io/hostname": "n1", "empty": "", "nvidia.com/gpu.product": "H100"}
	l := NewLabels(m)
	m["zone"] = "changed"
	if got := l.Get("zone"); got != "a" {
		t.Errorf("zone = %q: the labels follow the caller's map", got)
	}
	m["zone"] = "a"
	if v, ok := l.Lookup("empty"); !ok || v != "" {
		t.Errorf(`Lookup("empty") = %q, %v`, v, ok)
	}
	if l.Has("missing") || l.Get("missing") != "" || l.Len() != 4 {
		t.Errorf("missing label found, or Len %d", l.Len())
	}
	if !maps.Equal(l.Map(), m) {
		t.Errorf("Map() = %v, want %v", l.Map(), m)
	}
	var keys []string
	for k := range l.All() {
		keys = append(keys, k)
	}
	if want := []string{"empty", "kubernetes.io/hostname", "nvidia.com/gpu.product", "zone"}; !slices.Equal(keys, want) {
		t.Errorf("All() keys = %v, want %v (sorted)", keys, want)
	}
	if !l.Equal(NewLabels(maps.Clone(m))) || l.Equal(NewLabels(map[string]string{"zone": "a"})) || !(Labels{}).Equal(NewLabels(nil)) {
		t.Errorf("Equal disagrees with the labels' contents")
	}
	if !l.sameAs(m) || l.sameAs(map[string]string{"zone": "a"}) {
		t.Errorf("sameAs disagrees with the labels' contents")
	}
	m["zone"] = "b"
	if l.sameAs(m) {
		t.Errorf("sameAs missed a changed value")
	}
	delete(m, "zone")
	m["zone2"] = "a"
	if l.sameAs(m) {
		t.Errorf("sameAs missed a renamed key")
	}
	// A label selector reads Labels as it reads a map.
	sel, err := labels.Parse("zone in (a,b),!gpu,nvidia.com/gpu.product=H100")
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(l) || sel.Matches(NewLabels(map[string]string{"zone": "c"})) {
		t.Errorf("selector %s matched wrongly", sel)
	}
}
