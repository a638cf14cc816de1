package webhook

import (
	"iter"
	"slices"
	"strings"
	"unique"
)

// Labels are a node's labels as the index keeps them: interned key-value
// pairs sorted by key. The nodes of a cluster repeat a few dozen pairs (zone,
// instance type, GPU product, the probe's labels) thousands of times, so each
// distinct pair is kept once in the process and a node holds a pointer per
// label, where a map of its own would cost it over a kilobyte. A Labels is
// never changed once made; it implements k8s.io/apimachinery's labels.Labels.
type Labels struct {
	pairs []unique.Handle[labelPair]
}

type labelPair struct{ key, value string }

// NewLabels keeps the labels of m; m may be changed afterwards.
func NewLabels(m map[string]string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	pairs := make([]unique.Handle[labelPair], 0, len(m))
	for k, v := range m {
		pairs = append(pairs, unique.Make(labelPair{k, v}))
	}
	slices.SortFunc(pairs, func(a, b unique.Handle[labelPair]) int { return strings.Compare(a.Value().key, b.Value().key) })
	return Labels{pairs: pairs}
}

// Lookup returns the value of key and whether the node has the label.
func (l Labels) Lookup(key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(l.pairs, key, func(p unique.Handle[labelPair], k string) int { return strings.Compare(p.Value().key, k) })
	if !ok {
		return "", false
	}
	return l.pairs[i].Value().value, true
}

// Get returns the value of key, "" if the node has no such label.
func (l Labels) Get(key string) string {
	v, _ := l.Lookup(key)
	return v
}

// Has reports whether the node has the label.
func (l Labels) Has(key string) bool {
	_, ok := l.Lookup(key)
	return ok
}

// Len is the number of labels.
func (l Labels) Len() int { return len(l.pairs) }

// All yields the labels in the order of their keys.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, p := range l.pairs {
			if !yield(p.Value().key, p.Value().value) {
				return
			}
		}
	}
}

// Map returns the labels as a new map, which the caller owns.
func (l Labels) Map() map[string]string {
	m := make(map[string]string, len(l.pairs))
	for k, v := range l.All() {
		m[k] = v
	}
	return m
}

// sameAs reports whether m holds exactly these labels, without interning m:
// most Node events (status updates) leave the labels as they were.
func (l Labels) sameAs(m map[string]string) bool {
	if len(m) != len(l.pairs) {
		return false
	}
	for _, p := range l.pairs {
		if v, ok := m[p.Value().key]; !ok || v != p.Value().value {
			return false
		}
	}
	return true
}

// Equal reports whether both hold the same labels; interned pairs compare
// as pointers.
func (l Labels) Equal(o Labels) bool { return slices.Equal(l.pairs, o.pairs) }
