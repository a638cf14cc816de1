package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JSONSchema describes the file as far as a JSON schema (draft 07) can
// without restating Validate: the fields and their types from the Go types,
// no unknown field (the file is decoded strictly), the values of Enums, and,
// for a boolean in a string field, how to quote it.
// The chart's values.schema.json carries it for .Values.config, so that helm
// refuses a misspelt key or an unknown choice before it renders anything;
// every other rule is Validate's alone.
func JSONSchema() map[string]any {
	return schemaOf(reflect.TypeFor[Configuration](), "", Enums())
}

// schemaOf is the schema of a value of type t at path (as Enums writes it).
func schemaOf(t reflect.Type, path string, enums map[string][]string) map[string]any {
	if t == reflect.TypeFor[*metav1.Duration]() {
		// A Go duration, such as 168h or 0s; time.ParseDuration's message
		// is clearer than a pattern's.
		return map[string]any{"type": "string"}
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		panic(fmt.Sprintf("config: no schema for %s, which decodes itself", t))
	}
	switch t.Kind() {
	case reflect.String:
		return stringSchema(enums[path])
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		// Bounds are the binary's to check, with its message.
		return map[string]any{"type": "integer"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), path+"[*]", enums)}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("config: no schema for %s", t))
		}
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), path+"[*]", enums)}
	case reflect.Pointer:
		return schemaOf(t.Elem(), path, enums)
	case reflect.Struct:
		props := map[string]any{}
		addFields(props, t, path, enums)
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	}
	panic(fmt.Sprintf("config: no schema for %s", t))
}

// yaml11Note says why a values file's unquoted yes or off is no string: helm
// reads values as YAML 1.1, and its --set makes true and false booleans.
const yaml11Note = "(YAML 1.1 reads yes, no, on, off, true and false unquoted as booleans; with --set, use --set-string)"

// stringSchema is the schema of a string field, of one of values when there
// are any. Helm's validators print none of a schema's own words but an enum's
// values, so a boolean, which an unquoted yes or off becomes, meets an enum
// whose one value says how to quote it. The other constraints are kept out
// of if/else where they can be, so that their errors come without a line
// about the branch.
func stringSchema(values []string) map[string]any {
	if len(values) == 0 {
		return map[string]any{
			"if":   map[string]any{"type": "boolean"},
			"then": map[string]any{"enum": []string{"a quoted string " + yaml11Note}},
			"else": map[string]any{"type": "string"},
		}
	}
	var quoted []string
	for _, v := range values {
		if v != "" {
			quoted = append(quoted, "'"+v+"'")
		}
	}
	return map[string]any{
		// The enum refuses any value but its own strings: no type needed.
		"enum": slices.Clone(values),
		"if":   map[string]any{"type": "boolean"},
		"then": map[string]any{"enum": []string{"quoted: " + strings.Join(quoted, " or ") + " " + yaml11Note}},
	}
}

// addFields adds the properties of struct t as encoding/json sees them:
// tagged names, embedded structs inlined.
func addFields(props map[string]any, t reflect.Type, path string, enums map[string][]string) {
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "":
			addFields(props, f.Type, path, enums)
		default:
			if name == "" {
				name = f.Name
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			props[name] = schemaOf(f.Type, p, enums)
		}
	}
}
