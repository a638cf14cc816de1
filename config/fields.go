package config

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// fileFacts is what the YAML text of a file says and its decoded value no longer
// does: the keys the types do not know, each with its line, and where an unquoted
// YAML 1.1 boolean landed in a string field.
type fileFacts struct {
	unknown field.ErrorList
	// bools maps a string field's path to the unquoted text, such as yes or off,
	// that the decoder (YAML 1.1) read as a boolean and wrote as "true" or "false".
	bools map[string]string
}

// yaml11Bools are the plain scalars YAML 1.1, as the file is decoded, reads as booleans.
var yaml11Bools = []string{"y", "yes", "n", "no", "true", "false", "on", "off"}

// boolHint is added to every error on a field whose value was an unquoted boolean.
const boolHint = "quote the value: yes/no/on/off are booleans in YAML"

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// readFacts walks the YAML of data against Configuration's json names. The strict
// decoder stops at the first unknown key and names no line; this walk finds them
// all. It gives up quietly (no facts) on YAML it cannot parse, which the decoder
// then reports.
func readFacts(data []byte) fileFacts {
	facts := fileFacts{bools: map[string]string{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return facts
	}
	facts.walk(doc.Content[0], reflect.TypeFor[Configuration](), nil, 0)
	return facts
}

// maxDepth bounds the walk on a file of aliases nested to blow up.
const maxDepth = 64

func (f *fileFacts) walk(n *yaml.Node, t reflect.Type, p *field.Path, depth int) {
	if depth > maxDepth {
		return
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// A type that decodes itself (a duration, a quantity) has no fields to know.
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return
		}
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := lookupField(fields, k.Value)
			if !ok {
				f.unknown = append(f.unknown, unknownField(p.Child(k.Value), k.Line, fields))
				continue
			}
			f.walk(v, ft, p.Child(k.Value), depth+1)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			f.walk(n.Content[i+1], t.Elem(), p.Key(n.Content[i].Value), depth+1)
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			f.walk(c, t.Elem(), p.Index(i), depth+1)
		}
	case reflect.String:
		if n.Kind == yaml.ScalarNode && n.Style == 0 && n.Tag != "!!null" && slices.Contains(yaml11Bools, strings.ToLower(n.Value)) {
			f.bools[p.String()] = n.Value
		}
	}
}

// jsonFields are the fields of struct t by the names encoding/json decodes them
// from: tagged names, embedded structs inlined.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for sf := range t.Fields() {
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch {
		case name == "-" || !sf.IsExported() && !sf.Anonymous:
		case sf.Anonymous && name == "":
			for k, v := range jsonFields(sf.Type) {
				out[k] = v
			}
		default:
			if name == "" {
				name = sf.Name
			}
			out[name] = sf.Type
		}
	}
	return out
}

// lookupField matches a key as encoding/json does: the exact name first, else
// one that differs in case only, so that the walk refuses nothing the decoder takes.
func lookupField(fields map[string]reflect.Type, key string) (reflect.Type, bool) {
	if t, ok := fields[key]; ok {
		return t, true
	}
	for name, t := range fields {
		if strings.EqualFold(name, key) {
			return t, true
		}
	}
	return nil, false
}

func unknownField(p *field.Path, line int, fields map[string]reflect.Type) *field.Error {
	msg := fmt.Sprintf("unknown field, on line %d", line)
	if s := closest(p, fields); s != "" {
		msg += fmt.Sprintf("; did you mean %s?", s)
	}
	return field.Forbidden(p, msg)
}

// closest is the known name nearest the key of p, if it is a likely typo: at most
// two edits away, or half its length.
func closest(p *field.Path, fields map[string]reflect.Type) string {
	key := p.String()
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		key = key[i+1:]
	}
	best, bestD := "", max(2, len(key)/2)+1
	for name := range fields {
		d := editDistance(strings.ToLower(key), strings.ToLower(name))
		if d < bestD || d == bestD && name < best {
			best, bestD = name, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// hint adds the YAML 1.1 hint to each error on a field whose value was an unquoted
// boolean, but for an error that already says how to quote it.
func (f fileFacts) hint(errs field.ErrorList) field.ErrorList {
	for _, e := range errs {
		orig, ok := f.bools[e.Field]
		if !ok || strings.Contains(e.Detail, "quote the value") {
			continue
		}
		h := fmt.Sprintf("the file says %s unquoted; %s", orig, boolHint)
		if e.Detail == "" {
			e.Detail = h
		} else {
			e.Detail += "; " + h
		}
	}
	return errs
}
