// Command chart-schema writes the schema of .Values.config into the chart's
// values.schema.json from the configuration's Go types (config.JSONSchema):
// the fields, their types, no unknown key, and the values of each choice.
// The rest of the file, the chart's own values, is written by hand and kept
// as it is. Run it from the repository root after changing config's types:
//
//	go run ./hack/chart-schema
//
// Its test fails while the committed file differs from what it writes.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/gpu-injector/gpu-injector/config"
)

// SchemaFile is the chart's values schema, from the repository root.
const SchemaFile = "charts/gpu-injector/values.schema.json"

// description is what the schema says of .Values.config.
const description = "The configuration file (docs/configuration.md). Generated from its Go types by hack/chart-schema: " +
	"fields, types and choices. The chart's install hook runs gpu-injector config validate for every other rule."

func main() {
	file := flag.String("f", SchemaFile, "the values schema to update in place")
	flag.Parse()
	data, err := os.ReadFile(*file)
	if err == nil {
		data, err = Generate(data)
	}
	if err == nil {
		err = os.WriteFile(*file, data, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chart-schema: %v\n", err)
		os.Exit(1)
	}
}

// Generate returns the values schema with properties.config replaced by the
// configuration's schema, less apiVersion and kind, which the chart writes.
// Every other byte of the file stays as it is.
func Generate(values []byte) ([]byte, error) {
	start, end, err := configSpan(values)
	if err != nil {
		return nil, fmt.Errorf("failed to find properties.config in the values schema: %w", err)
	}
	s := config.JSONSchema()
	delete(s["properties"].(map[string]any), "apiVersion")
	delete(s["properties"].(map[string]any), "kind")
	s["description"] = description
	var buf bytes.Buffer
	buf.Write(values[:start])
	write(&buf, ordered(s), "    ")
	buf.Write(values[end:])
	return buf.Bytes(), nil
}

// configSpan finds the bytes of the value of properties.config.
func configSpan(values []byte) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(values))
	if err := enterObject(dec); err != nil {
		return 0, 0, err
	}
	if err := findKey(dec, "properties"); err != nil {
		return 0, 0, err
	}
	if err := enterObject(dec); err != nil {
		return 0, 0, err
	}
	if err := findKey(dec, "config"); err != nil {
		return 0, 0, err
	}
	start = int(dec.InputOffset())
	start += bytes.IndexFunc(values[start:], func(r rune) bool { return r != ':' && r != ' ' && r != '\n' && r != '\t' && r != '\r' })
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return 0, 0, err
	}
	return start, int(dec.InputOffset()), nil
}

func enterObject(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("%v where an object belongs", tok)
	}
	return nil
}

// findKey reads the current object up to key, whose value comes next.
func findKey(dec *json.Decoder, key string) error {
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if tok == key {
			return nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
	}
	return fmt.Errorf("no key %q", key)
}

// object is a JSON object that keeps its keys in order.
type object struct {
	keys   []string
	values map[string]any
}

func (o *object) set(k string, v any) {
	if _, ok := o.values[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.values[k] = v
}

// keywordOrder puts a generated schema's keywords in the order a reader
// expects; properties are sorted by name.
var keywordOrder = []string{"type", "description", "enum", "if", "then", "else", "items", "additionalProperties", "properties"}

// ordered turns a generated schema into objects.
func ordered(s map[string]any) *object {
	o := &object{values: map[string]any{}}
	for _, k := range keywordOrder {
		switch v := s[k].(type) {
		case nil:
		case map[string]any:
			if k == "properties" {
				props := &object{values: map[string]any{}}
				for _, name := range slices.Sorted(maps.Keys(v)) {
					props.set(name, ordered(v[name].(map[string]any)))
				}
				o.set(k, props)
			} else {
				o.set(k, ordered(v))
			}
		case []string:
			values := make([]any, len(v))
			for i, e := range v {
				values[i] = e
			}
			o.set(k, values)
		default:
			o.set(k, v)
		}
	}
	if len(o.keys) != len(s) {
		panic(fmt.Sprintf("chart-schema: a keyword of %v is not in keywordOrder", s))
	}
	return o
}

// write prints v as json.MarshalIndent does with two spaces, without
// escaping HTML characters.
func write(buf *bytes.Buffer, v any, indent string) {
	inner := indent + "  "
	switch v := v.(type) {
	case *object:
		if len(v.keys) == 0 {
			buf.WriteString("{}")
			return
		}
		buf.WriteString("{\n")
		for i, k := range v.keys {
			buf.WriteString(inner)
			scalar(buf, k)
			buf.WriteString(": ")
			write(buf, v.values[k], inner)
			if i < len(v.keys)-1 {
				buf.WriteByte(',')
			}
			buf.WriteByte('\n')
		}
		buf.WriteString(indent + "}")
	case []any:
		if len(v) == 0 {
			buf.WriteString("[]")
			return
		}
		buf.WriteString("[\n")
		for i, e := range v {
			buf.WriteString(inner)
			write(buf, e, inner)
			if i < len(v)-1 {
				buf.WriteByte(',')
			}
			buf.WriteByte('\n')
		}
		buf.WriteString(indent + "]")
	default:
		scalar(buf, v)
	}
}

func scalar(buf *bytes.Buffer, v any) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	// Encode cannot fail on the strings, numbers, booleans and null that
	// decode and config.JSONSchema produce.
	_ = enc.Encode(v)
	buf.Truncate(buf.Len() - 1) // Encode's newline
}
