package inject

import (
	"iter"
	"maps"
	"slices"
	"sort"
	"strings"
	"unique"
)

// Labels are a node's labels as the index keeps them: interned key-value
// pairs sorted by key, in interned chunks of labelChunk pairs. The nodes of a
// cluster repeat a few dozen to a hundred pairs (zone, instance type, GPU
// product, what Node Feature Discovery and GPU feature discovery find)
// thousands of times, so each distinct pair is kept once in the process, and
// so is each distinct run of labelChunk of them: a node holds a pointer per
// chunk, of which only those with a label of its own (its hostname, a
// timestamp) are not shared with the other nodes of its pool. A map of its own
// would cost it several kilobytes. A Labels is never changed once made; it
// implements k8s.io/apimachinery's labels.Labels.
type Labels struct {
	chunks []unique.Handle[labelChunk]
	n      int
}

type labelPair struct{ key, value string }

// labelChunk is a run of pairs; the last chunk of a node is padded with
// zero handles.
type labelChunk [labelChunkLen]unique.Handle[labelPair]

const labelChunkLen = 8

// NewLabels keeps the labels of m; m may be changed afterwards.
func NewLabels(m map[string]string) Labels {
	if len(m) == 0 {
		return Labels{}
	}
	keys := slices.Sorted(maps.Keys(m))
	l := Labels{chunks: make([]unique.Handle[labelChunk], 0, (len(keys)+labelChunkLen-1)/labelChunkLen), n: len(keys)}
	for i := 0; i < len(keys); i += labelChunkLen {
		var c labelChunk
		for j, k := range keys[i:min(i+labelChunkLen, len(keys))] {
			c[j] = unique.Make(labelPair{k, m[k]})
		}
		l.chunks = append(l.chunks, unique.Make(c))
	}
	return l
}

// pairs are the pairs of chunk i.
func (l Labels) pairs(i int) []unique.Handle[labelPair] {
	c := l.chunks[i].Value()
	return c[:min(labelChunkLen, l.n-i*labelChunkLen)]
}

// Lookup returns the value of key and whether the node has the label.
func (l Labels) Lookup(key string) (string, bool) {
	// The last chunk whose first key is not after key holds it, if any.
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].Value()[0].Value().key > key }) - 1
	if i < 0 {
		return "", false
	}
	ps := l.pairs(i)
	j, ok := slices.BinarySearchFunc(ps, key, func(p unique.Handle[labelPair], k string) int { return strings.Compare(p.Value().key, k) })
	if !ok {
		return "", false
	}
	return ps[j].Value().value, true
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
func (l Labels) Len() int { return l.n }

// All yields the labels in the order of their keys.
func (l Labels) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for i := range l.chunks {
			for _, p := range l.pairs(i) {
				if !yield(p.Value().key, p.Value().value) {
					return
				}
			}
		}
	}
}

// Map returns the labels as a new map, which the caller owns.
func (l Labels) Map() map[string]string {
	m := make(map[string]string, l.n)
	for k, v := range l.All() {
		m[k] = v
	}
	return m
}

// SameAs reports whether m holds exactly these labels, without interning m:
// most Node events (status updates) leave the labels as they were.
func (l Labels) SameAs(m map[string]string) bool {
	if len(m) != l.n {
		return false
	}
	for k, v := range l.All() {
		if w, ok := m[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Equal reports whether both hold the same labels; interned chunks compare
// as pointers.
func (l Labels) Equal(o Labels) bool { return l.n == o.n && slices.Equal(l.chunks, o.chunks) }
