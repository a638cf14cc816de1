package config

import (
	"cmp"
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// fileFacts is what the YAML text of a file says and its decoded value no longer
// does: the keys the types do not know, the line of every field, and where an
// unquoted YAML 1.1 boolean landed in a string field.
type fileFacts struct {
	unknown field.ErrorList
	// lines maps a field's path to the line of its key, or of the list item.
	lines map[string]int
	// bools maps a string field's path to the unquoted text, such as yes or off,
	// that the decoder (YAML 1.1) read as a boolean and wrote as "true" or "false".
	bools map[string]string
}

// yaml11Bools are the plain scalars YAML 1.1, as the file is decoded, reads as
// booleans, each also in Title and UPPER case.
var yaml11Bools = []string{"y", "yes", "n", "no", "true", "false", "on", "off"}

func isYAML11Bool(s string) bool {
	for _, b := range yaml11Bools {
		if s == b || s == strings.ToUpper(b) || s == strings.ToUpper(b[:1])+b[1:] {
			return true
		}
	}
	return false
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// readFacts walks the YAML of data against Configuration's json names. The strict
// decoder stops at the first unknown key and names no line; this walk finds them
// all, and the line of every known one for Validate's errors. It gives up quietly
// (no facts) on YAML it cannot parse, which the decoder then reports.
func readFacts(data []byte) fileFacts {
	facts := fileFacts{lines: map[string]int{}, bools: map[string]string{}}
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
			f.lines[p.Child(k.Value).String()] = k.Line
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
			f.lines[p.Key(n.Content[i].Value).String()] = n.Content[i].Line
			f.walk(n.Content[i+1], t.Elem(), p.Key(n.Content[i].Value), depth+1)
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			f.lines[p.Index(i).String()] = c.Line
			f.walk(c, t.Elem(), p.Index(i), depth+1)
		}
	case reflect.String:
		// Style 0 is plain: neither quoted nor tagged.
		if n.Kind == yaml.ScalarNode && n.Style == 0 && isYAML11Bool(n.Value) {
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

// annotate gives each of Validate's errors the line of its field, or of the
// nearest field above it in the file, and the fix for a string field given an
// unquoted YAML 1.1 boolean: an enum's error is replaced by one that lists the
// values quoted, any other's is kept with the hint added.
func (f fileFacts) annotate(errs field.ErrorList) field.ErrorList {
	enums := Enums()
	var out field.ErrorList
	replaced := map[string]bool{}
	for _, e := range errs {
		if orig, ok := f.bools[e.Field]; ok {
			values, isEnum := enums[indexPattern.ReplaceAllString(e.Field, "[*]")]
			if isEnum {
				if replaced[e.Field] {
					continue
				}
				replaced[e.Field] = true
				e = &field.Error{Type: field.ErrorTypeInvalid, Field: e.Field, BadValue: field.OmitValueType{}, Detail: boolFix(e.Field, orig, values)}
			} else {
				e.Detail = joinDetail(e.Detail, boolFix(e.Field, orig, nil))
			}
		}
		if where := f.where(e.Field); where != "" {
			e.Detail = joinDetail(where, e.Detail)
		}
		out = append(out, e)
	}
	return out
}

// indexPattern matches a list index of a field path, which Enums writes [*].
var indexPattern = regexp.MustCompile(`\[[0-9]+\]`)

// boolFix says how to write a string field that the file gave the unquoted
// boolean orig: quoted, as one of values when the field takes only those (the
// one orig spells in another case, when there is one), as the file writes it,
// key first.
func boolFix(path, orig string, values []string) string {
	key := path
	if i := strings.LastIndexAny(key, ".]"); i >= 0 && key[i] == '.' {
		key = key[i+1:]
	} else if i >= 0 {
		key = "" // a list item: no key to write
	}
	quoted := func(v string) string {
		if key == "" {
			return strconv.Quote(v)
		}
		return key + ": " + strconv.Quote(v)
	}
	var fixes []string
	for _, v := range values {
		if strings.EqualFold(v, orig) {
			fixes = []string{quoted(v)}
			break
		}
		if v != "" {
			fixes = append(fixes, quoted(v))
		}
	}
	if len(fixes) == 0 {
		fixes = []string{quoted(orig)}
	}
	written := orig
	if key != "" {
		written = key + ": " + orig
	}
	return fmt.Sprintf("%s is read as a boolean (YAML 1.1); quote it: %s", written, strings.Join(fixes, " or "))
}

// boolFixes is the fix of every unquoted YAML 1.1 boolean of a string field,
// each with its path and line, for a decode error that names no field the
// file's way: a boolean that did not become a string, in a field of a named
// string type.
func (f fileFacts) boolFixes() string {
	enums := Enums()
	var fixes []string
	for _, p := range slices.Sorted(maps.Keys(f.bools)) {
		values := enums[indexPattern.ReplaceAllString(p, "[*]")]
		fixes = append(fixes, fmt.Sprintf("%s: %s; %s", p, f.where(p), boolFix(p, f.bools[p], values)))
	}
	return strings.Join(fixes, "; ")
}

// where is "on line N" for a field of the file, "in F, on line N" for one the
// file leaves out under a field F it has, "" for one it has nothing of.
func (f fileFacts) where(path string) string {
	p, line := f.line(path)
	switch {
	case p == "":
		return ""
	case p == path:
		return fmt.Sprintf("on line %d", line)
	}
	return fmt.Sprintf("in %s, on line %d", p, line)
}

// line finds the field of path in the file, or the nearest one above it, and
// its line; "" and 0 when the file has none of them.
func (f fileFacts) line(path string) (string, int) {
	for p := path; p != ""; {
		if line, ok := f.lines[p]; ok {
			return p, line
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return "", 0
}

// byLine orders errors as their fields stand in the file, so that a list of
// them reads from the top of the file down; errors on fields the file does
// not have come last, each group in the order it was found.
func (f fileFacts) byLine(errs field.ErrorList) field.ErrorList {
	lineOf := func(e *field.Error) int {
		if _, line := f.line(e.Field); line > 0 {
			return line
		}
		return math.MaxInt
	}
	slices.SortStableFunc(errs, func(a, b *field.Error) int { return cmp.Compare(lineOf(a), lineOf(b)) })
	return errs
}

func joinDetail(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
