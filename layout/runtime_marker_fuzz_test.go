package layout

import (
	"slices"
	"strings"
	"testing"
)

// FuzzRuntimeMarker feeds pod annotation values to ParseRuntimeMarker, which
// the NRI plugin runs inside every container creation of a marked pod: never
// a panic; a value is accepted exactly when a model written apart from the
// code accepts it (at most MaxRuntimeMarkerBytes, comma-separated DNS
// labels, none twice); what is accepted formats back to the same value.
func FuzzRuntimeMarker(f *testing.F) {
	for _, s := range []string{"main", "main,sidecar", "a,b,c", "", ",", "main,", ",main", "main,main",
		"Main", "a_b", "-a", "a-", "a.b", "../x", " main", "main ", "é", "a\x00b",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a,", MaxRuntimeMarkerBytes/2) + "b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ParseRuntimeMarker(s)
		want := markerModel(s)
		if (err == nil) != want {
			t.Fatalf("ParseRuntimeMarker(%q) = %v, %v; the model says accepted=%v", s, names, err, want)
		}
		if err != nil {
			if names != nil {
				t.Fatalf("names %q with an error", names)
			}
			return
		}
		if len(names) == 0 {
			t.Fatal("accepted a marker that names no container")
		}
		seen := map[string]bool{}
		for _, n := range names {
			if !isDNSLabel(n) {
				t.Fatalf("accepted %q, not a DNS label", n)
			}
			if seen[n] {
				t.Fatalf("accepted %q twice", n)
			}
			seen[n] = true
		}
		if got := FormatRuntimeMarker(names); got != s {
			t.Fatalf("FormatRuntimeMarker(%q) = %q, want %q", names, got, s)
		}
		again, err := ParseRuntimeMarker(FormatRuntimeMarker(names))
		if err != nil || !slices.Equal(again, names) {
			t.Fatalf("round trip: %q, %v", again, err)
		}
	})
}

func markerModel(s string) bool {
	if s == "" || len(s) > MaxRuntimeMarkerBytes {
		return false
	}
	seen := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		if !isDNSLabel(n) || seen[n] {
			return false
		}
		seen[n] = true
	}
	return true
}

// isDNSLabel is RFC 1123's label as Kubernetes names containers: 1 to 63
// lowercase letters, digits and '-', starting and ending alphanumeric.
func isDNSLabel(n string) bool {
	if len(n) == 0 || len(n) > 63 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(n)-1) {
			return false
		}
	}
	return true
}
