package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

// configMap is the chart's ConfigMap of a file, as helm template renders it.
func configMap(name, file string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\n# Source: gpu-injector/templates/%s.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: gpu-injector\ndata:\n  config.yaml: |\n", name, name)
	for _, line := range strings.Split(strings.TrimSuffix(file, "\n"), "\n") {
		b.WriteString("    " + line + "\n")
	}
	return b.String()
}

func TestCheck(t *testing.T) {
	head := "apiVersion: " + APIVersion + "\nkind: " + Kind + "\n"
	bad := head + "noLayout: {action: Static}\nhostPaths: {extraAllowlist: [{path: /usr/lib}]}\nexcludedNamespaces: [Kube]\n"
	badErrs := []string{
		"noLayout.staticLayout: Required value: in noLayout, on line 3; the name of a staticLayouts entry, with action Static",
		"hostPaths.extraAllowlist[0].path: Forbidden: on line 4; it would allow the system folder /usr/lib whole; allow it only with filesOnly: true, or name the driver's own folder",
		`excludedNamespaces[0]: Invalid value: "Kube": on line 5; a lowercase RFC 1123 label`,
	}
	other := "---\n# Source: gpu-injector/templates/serviceaccounts.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\n" +
		"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: dashboard}\ndata: {dashboard.json: '{}'}\n---\n# only a comment\n"
	type want struct {
		sources []string
		errs    []string // substrings, one field error each, in order
		err     string
	}
	tests := map[string]struct {
		file    string
		want    []want
		wantErr error
	}{
		"the defaults":        {file: head, want: []want{{}}},
		"no header":           {file: "ldLibraryPath: Prepend\n", want: []want{{}}},
		"every bad field":     {file: bad, want: []want{{errs: badErrs}}},
		"a chart's ConfigMap": {file: configMap("gpu-injector-config", bad), want: []want{{sources: []string{"ConfigMap gpu-injector/gpu-injector-config"}, errs: badErrs}}},
		"an unknown field":    {file: head + "resource: {}\n", want: []want{{errs: []string{"resource: Forbidden: unknown field, on line 3; did you mean resources?"}}}},
		// Lines count from the first of the ConfigMap's config.yaml.
		"unknown fields in a ConfigMap": {
			file: configMap("c", head+"ldLibaryPath: Prepend\ncontainerPaths:\n  binDir: /b\n"),
			want: []want{{sources: []string{"ConfigMap gpu-injector/c"}, errs: []string{
				"ldLibaryPath: Forbidden: unknown field, on line 3; did you mean ldLibraryPath?",
				"containerPaths.binDir: Forbidden: unknown field, on line 5; did you mean binaryDir?",
			}}},
		},
		"a wrong type":          {file: configMap("c", head+"ldLibraryPath: [a]\n"), want: []want{{sources: []string{"ConfigMap gpu-injector/c"}, err: "failed to parse configuration"}}},
		"no YAML":               {file: "{", want: []want{{err: "failed to parse configuration"}}},
		"a foreign apiVersion":  {file: "apiVersion: " + APIVersion + "x\nkind: " + Kind + "\n", want: []want{{errs: []string{"apiVersion: Unsupported value"}}}},
		"a Deployment only":     {file: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", wantErr: ErrNoConfiguration},
		"nothing":               {file: "", wantErr: ErrNoConfiguration},
		"other objects skipped": {file: other, wantErr: ErrNoConfiguration},
		// helm template renders the same file into the chart's ConfigMap
		// and its install hook's: one verdict naming both.
		"helm template": {
			file: other + configMap("gpu-injector-config", bad) + other + configMap("gpu-injector-config-check", bad),
			want: []want{{sources: []string{"ConfigMap gpu-injector/gpu-injector-config", "ConfigMap gpu-injector/gpu-injector-config-check"}, errs: badErrs}},
		},
		"two different files": {
			file: configMap("a", head) + configMap("b", bad),
			want: []want{{sources: []string{"ConfigMap gpu-injector/a"}}, {sources: []string{"ConfigMap gpu-injector/b"}, errs: badErrs}},
		},
		"kubectl get -o yaml": {
			file: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c, namespace: ns}\n  data:\n    config.yaml: |\n      noLayout: {action: Static}\n",
			want: []want{{sources: []string{"ConfigMap ns/c"}, errs: []string{"noLayout.staticLayout: Required value"}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Check([]byte(tc.file))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d verdicts, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				v := got[i]
				if !slices.Equal(v.Sources, w.sources) {
					t.Errorf("verdict %d: sources %q, want %q", i, v.Sources, w.sources)
				}
				if w.err == "" && v.Err != nil || w.err != "" && (v.Err == nil || !strings.Contains(v.Err.Error(), w.err)) {
					t.Errorf("verdict %d: error %v, want %q", i, v.Err, w.err)
				}
				if len(v.Errs) != len(w.errs) {
					t.Fatalf("verdict %d: %d field errors, want %d: %v", i, len(v.Errs), len(w.errs), v.Errs)
				}
				for j, e := range v.Errs {
					if !strings.Contains(e.Error(), w.errs[j]) {
						t.Errorf("verdict %d: field error %d %q, want %q", i, j, e, w.errs[j])
					}
				}
				if v.Valid() != (w.err == "" && len(w.errs) == 0) {
					t.Errorf("verdict %d: Valid() = %v", i, v.Valid())
				}
			}
		})
	}
}

// TestCheckIsParse: Check's verdict on a file is Parse's, message for message.
func TestCheckIsParse(t *testing.T) {
	for _, file := range []string{"", "noLayout: {action: Static}\nexcludedNamespaces: [A, B]\n", "resource: {}\n", "containers: GPU\n"} {
		file = "kind: " + Kind + "\n" + file
		_, parseErr := Parse([]byte(file))
		vs, err := Check([]byte(file))
		if err != nil || len(vs) != 1 {
			t.Fatalf("%q: %v, %v", file, vs, err)
		}
		var checkErr error
		switch {
		case vs[0].Err != nil:
			checkErr = vs[0].Err
		case len(vs[0].Errs) > 0:
			checkErr = fmt.Errorf("invalid configuration: %w", vs[0].Errs.ToAggregate())
		}
		if fmt.Sprint(checkErr) != fmt.Sprint(parseErr) {
			t.Errorf("%q: Check says %v, Parse %v", file, checkErr, parseErr)
		}
	}
}

// TestSchemaChoicesAreValidates: every string field of JSONSchema offers exactly the
// values Validate accepts, "" included: a field Validate refuses a value of
// with "Unsupported value" is an enum of the schema with every value it
// accepts, and no other field is.
func TestSchemaChoicesAreValidates(t *testing.T) {
	// Every list holds one item, so that each of its fields can be set.
	base := Default()
	base.HostPaths.ExtraAllowlist = base.HostPaths.Allowlist[:1]
	base.Pinning.NodeLabels = []string{"karpenter.sh/nodepool"}
	base.Images.Registries = []string{"localhost:5000"}
	base.Images.InsecureRegistries = []string{"localhost:5000"}
	base.Images.Namespaces = []string{"ml"}
	base.Images.CredentialProviders = CredentialProviders{Config: "/etc/eks/image-credential-provider/config.json", BinDir: "/etc/eks/image-credential-provider"}
	data, err := yaml.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["staticLayouts"] = []any{map[string]any{
		"name": "s", "nodeSelector": map[string]any{"a": "b"}, "driverVersion": "1", "libraryPaths": []any{"/usr/local/nvidia/lib64"},
		"mounts": []any{map[string]any{"hostPath": "/usr/lib/nvidia-384", "containerPath": "/usr/local/nvidia/lib64", "kind": "Directory"}},
	}}
	plan, err := layout.Encode(layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "1", LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{{HostPath: "/usr/lib/nvidia-384", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}}})
	if err != nil {
		t.Fatal(err)
	}
	doc["pinning"].(map[string]any)["pools"] = []any{map[string]any{
		"pool": map[string]any{"karpenter.sh/nodepool": "a"}, "nodeLabels": map[string]any{"a": "b"},
		"taints": []any{map[string]any{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}}, "layout": plan,
	}}
	// errorsAt sets the field at path to v and returns Validate's errors of
	// that field, or a decode error: what the field's type refuses.
	errorsAt := func(path, v string) field.ErrorList {
		t.Helper()
		var d map[string]any
		b, _ := yaml.Marshal(doc)
		if err := yaml.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		set(t, d, strings.Split(strings.ReplaceAll(path, "[*]", ".[0]"), "."), v)
		b, _ = yaml.Marshal(d)
		_, errs, err := decode(b)
		if err != nil {
			return field.ErrorList{field.TypeInvalid(field.NewPath(path), v, err.Error())}
		}
		var out field.ErrorList
		for _, e := range errs {
			if e.Field == strings.ReplaceAll(path, "[*]", "[0]") {
				out = append(out, e)
			}
		}
		return out
	}
	if errs := errorsAt("containers", string(ContainersGPU)); len(errs) > 0 {
		t.Fatalf("the base file is invalid: %v", errs)
	}
	schema := JSONSchema()
	fields := stringFields(schema, "")
	if len(fields) < 30 {
		t.Fatalf("only %d string fields in the schema: %v", len(fields), fields)
	}
	enums := Enums()
	for _, path := range fields {
		s := schemaAt(schema, path)
		values, isEnum := s["enum"].([]string)
		if !slices.Equal(values, enums[path]) {
			t.Errorf("%s: schema enum %q, Enums %q", path, values, enums[path])
		}
		refused := errorsAt(path, "Bogus")
		unsupported := len(refused) > 0 && refused[0].Type == field.ErrorTypeNotSupported
		if unsupported != isEnum {
			t.Errorf("%s: an enum of the schema %v, yet Validate says of an unknown value %v", path, isEnum, refused)
		}
		for _, v := range values {
			if errs := errorsAt(path, v); len(errs) > 0 {
				t.Errorf("%s: the schema offers %q, Validate refuses it: %v", path, v, errs)
			}
		}
		if isEnum && !slices.Contains(values, "") && len(errorsAt(path, "")) == 0 {
			t.Errorf("%s: Validate accepts \"\", the schema does not offer it", path)
		}
		checkBooleanGuard(t, path, s, values)
	}
	for path := range enums {
		if !slices.Contains(fields, path) {
			t.Errorf("Enums names %s, which is no string field of the file", path)
		}
	}
}

// checkBooleanGuard: a string field's schema meets a boolean, an unquoted yes or
// off in a values file, with an enum whose one value says how to quote it; a
// duration's is a plain string, whose boolean time.ParseDuration refuses.
func checkBooleanGuard(t *testing.T, path string, s map[string]any, values []string) {
	t.Helper()
	if s["type"] == "string" {
		return
	}
	then, _ := s["then"].(map[string]any)
	fix, _ := then["enum"].([]string)
	if !reflect.DeepEqual(s["if"], map[string]any{"type": "boolean"}) || len(fix) != 1 || !strings.Contains(fix[0], "YAML 1.1") {
		t.Errorf("%s: no enum naming the fix for a boolean: %v", path, s)
		return
	}
	for _, v := range values {
		if v != "" && !strings.Contains(fix[0], "'"+v+"'") {
			t.Errorf("%s: the fix %q does not offer %q", path, fix[0], v)
		}
	}
}

// isStringSchema: a string field's schema says "type": "string", or, guarded
// against booleans, tests for one.
func isStringSchema(s map[string]any) bool {
	_, guarded := s["if"]
	return s["type"] == "string" || guarded
}

// stringFields are the paths of every string field in schema s.
func stringFields(s map[string]any, path string) []string {
	var out []string
	switch {
	case isStringSchema(s):
		out = append(out, path)
	case s["type"] == "array":
		out = append(out, stringFields(s["items"].(map[string]any), path+"[*]")...)
	case s["type"] == "object":
		props, _ := s["properties"].(map[string]any)
		for name, p := range props {
			child := name
			if path != "" {
				child = path + "." + name
			}
			out = append(out, stringFields(p.(map[string]any), child)...)
		}
	}
	slices.Sort(out)
	return out
}

func schemaAt(s map[string]any, path string) map[string]any {
	for _, part := range strings.Split(strings.ReplaceAll(path, "[*]", ".[*]"), ".") {
		if part == "[*]" {
			s = s["items"].(map[string]any)
		} else {
			s = s["properties"].(map[string]any)[part].(map[string]any)
		}
	}
	return s
}

// set puts v at path in a decoded YAML document; "[0]" is a list's first item.
func set(t *testing.T, doc any, path []string, v string) {
	t.Helper()
	last := len(path) == 1
	switch d := doc.(type) {
	case map[string]any:
		if last {
			d[path[0]] = v
			return
		}
		set(t, d[path[0]], path[1:], v)
	case []any:
		if path[0] != "[0]" || len(d) == 0 {
			t.Fatalf("no list item at %v", path)
		}
		if last {
			d[0] = v
			return
		}
		set(t, d[0], path[1:], v)
	default:
		t.Fatalf("nothing to set at %v in %T", path, doc)
	}
}

// TestCheckEveryErrorWithItsLine: two unknown keys and two invalid values are
// reported in one run, each with its line, top of the file first.
func TestCheckEveryErrorWithItsLine(t *testing.T) {
	file := "apiVersion: " + APIVersion + "\nkind: " + Kind + "\n" +
		"layoutPolicy: Random\n" +
		"noLayuot: {action: Deny}\n" +
		"images:\n" +
		"  mode: on\n" +
		"  registires: [registry.example.com]\n"
	want := []string{
		`layoutPolicy: Unsupported value: "Random": on line 3; supported values:`,
		"noLayuot: Forbidden: unknown field, on line 4; did you mean noLayout?",
		`images.mode: Invalid value: on line 6; mode: on is read as a boolean (YAML 1.1); quote it: mode: "On"`,
		"images.registires: Forbidden: unknown field, on line 7; did you mean registries?",
	}
	verdicts, err := Check([]byte(file))
	if err != nil || len(verdicts) != 1 {
		t.Fatalf("Check = %+v, %v; want one verdict", verdicts, err)
	}
	errs := verdicts[0].Errs
	if len(errs) != len(want) {
		t.Fatalf("%d errors, want %d: %v", len(errs), len(want), errs)
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("error %d %q, want %q", i, errs[i], w)
		}
	}
}
