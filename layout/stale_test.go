package layout

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestStaleDriverRoundTrip(t *testing.T) {
	in := StaleDriver{CheckedAt: time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC), Containers: 3, StaleContainers: 2, StalePods: 2,
		Pods: []string{"ml/train-0", "ml/train-1"}, Unreadable: 1}
	enc, err := EncodeStaleDriver(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeStaleDriver(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip gave %+v, want %+v", out, in)
	}
}

func TestDecodeStaleDriverRefuses(t *testing.T) {
	for name, v := range map[string]string{
		"not json":                 "{",
		"unknown field":            `{"containers":1,"x":1}`,
		"negative":                 `{"containers":-1}`,
		"more pods":                `{"stalePods":1,"pods":["a/b","a/c"]}`,
		"no namespace":             `{"stalePods":1,"pods":["b"]}`,
		"slash in name":            `{"stalePods":1,"pods":["a/b/c"]}`,
		"too large":                `{"pods":["` + strings.Repeat("a", maxStaleDriverBytes) + `"]}`,
		"too many pods":            `{"stalePods":30,"pods":[` + strings.Repeat(`"a/b",`, 21) + `"a/b"]}`,
		"an escape in a name":      `{"stalePods":1,"pods":["ml/train\u001b]0;owned\u0007"]}`,
		"a carriage return":        `{"stalePods":1,"pods":["ml\r/train"]}`,
		"a control char, no space": `{"stalePods":1,"pods":["ml/tr\u0085ain"]}`,
		"a capital":                `{"stalePods":1,"pods":["ML/train"]}`,
	} {
		if _, err := DecodeStaleDriver(v); err == nil {
			t.Errorf("%s: %s decoded", name, v)
		}
	}
}

// FuzzDecodeStaleDriver: the annotation is what a node wrote. What decodes
// keeps the bounds and encodes back to something that decodes to itself.
func FuzzDecodeStaleDriver(f *testing.F) {
	f.Add(`{"checkedAt":"2026-11-27T04:00:00Z","containers":3,"staleContainers":2,"stalePods":2,"pods":["ml/a","ml/b"]}`)
	f.Add(`{"stalePods":1,"pods":["b"]}`)
	f.Add(`{"containers":0}`)
	f.Fuzz(func(t *testing.T, v string) {
		s, err := DecodeStaleDriver(v)
		if err != nil {
			return
		}
		if len(s.Pods) > MaxStalePods || len(s.Pods) > s.StalePods {
			t.Fatalf("decoded %d pods of %d", len(s.Pods), s.StalePods)
		}
		for _, p := range s.Pods {
			if Printable(p) != p || strings.ContainsAny(p, " \t") {
				t.Fatalf("decoded pod %q, not printable on one line", p)
			}
		}
		enc, err := EncodeStaleDriver(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeStaleDriver(enc)
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("re-decoding %q gave %+v, %v; want %+v", enc, again, err, s)
		}
	})
}
