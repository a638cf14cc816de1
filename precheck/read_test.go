package precheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadFile: the output of kubectl get nodes,ns in YAML and JSON, and
// multi-document YAML, read the same; anything else is refused with where.
func TestReadFile(t *testing.T) {
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	asJSON, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(asJSON, &list); err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, it := range list.Items {
		y, err := yaml.JSONToYAML(it)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(y))
	}
	multi := "# nodes and namespaces\n---\n" + strings.Join(docs, "---\n")
	for name, file := range map[string]string{
		"List":        example,
		"JSON":        writeFile(t, "cluster.json", string(asJSON)),
		"documents":   writeFile(t, "docs.yaml", multi),
		"typed Lists": writeFile(t, "lists.yaml", "kind: NodeList\nitems: []\n---\nkind: NamespaceList\nitems: [{kind: Namespace, metadata: {name: ml}}]\n"),
	} {
		t.Run(name, func(t *testing.T) {
			nodes, namespaces, err := readFile(file, nil)
			if err != nil {
				t.Fatal(err)
			}
			if name == "typed Lists" {
				if len(nodes) != 0 || len(namespaces) != 1 {
					t.Errorf("%d nodes, %d namespaces", len(nodes), len(namespaces))
				}
				return
			}
			if len(nodes) != 6 || len(namespaces) != 4 {
				t.Errorf("%d nodes, %d namespaces, want 6 and 4", len(nodes), len(namespaces))
			}
		})
	}
	if _, _, err := readFile("-", strings.NewReader(multi)); err != nil {
		t.Errorf("stdin: %v", err)
	}
}

func TestReadFileRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		data string
		want string
	}{
		"a Pod":           {data: "kind: Pod\nmetadata: {name: p}\n", want: "document 1: a Pod, not a Node or a Namespace"},
		"a Pod in a List": {data: "kind: List\nitems:\n- kind: Namespace\n  metadata: {name: a}\n- kind: Pod\n", want: "document 1 items[1]: a Pod"},
		"no kind":         {data: "metadata: {name: x}\n", want: "an object with no kind"},
		"not an object":   {data: "- a\n- b\n", want: "document 1: error unmarshaling JSON"},
		"bad YAML":        {data: "kind: Node\n  bad: [\n", want: "failed to read"},
		"a bad Node":      {data: "kind: Node\nmetadata: []\n", want: "invalid Node"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := readFile(writeFile(t, "in.yaml", tc.data), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, _, err := readFile(filepath.Join(t.TempDir(), "none.yaml"), nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}
