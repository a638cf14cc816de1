package offline

import (
	"strings"
	"testing"
)

// TestReadBounds: a file, its documents and its objects (a List's items
// counted) are bounded before anything is built of them.
func TestReadBounds(t *testing.T) {
	if _, err := readBounded(strings.NewReader(strings.Repeat("x", 11)), "f", 10); err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") {
		t.Errorf("11 bytes, limit 10: %v", err)
	}
	if b, err := readBounded(strings.NewReader("0123456789"), "f", 10); err != nil || len(b) != 10 {
		t.Errorf("10 bytes, limit 10: %d, %v", len(b), err)
	}
	yamlDocs := "kind: A\n---\nkind: B\n---\nkind: C\n"
	if _, _, err := splitDocuments([]byte(yamlDocs), 2); err == nil || !strings.Contains(err.Error(), "more than 2 documents") {
		t.Errorf("3 YAML documents, limit 2: %v", err)
	}
	if _, _, err := splitDocuments([]byte(`{"kind":"A"}{"kind":"B"}{"kind":"C"}`), 2); err == nil || !strings.Contains(err.Error(), "more than 2 documents") {
		t.Errorf("3 JSON documents, limit 2: %v", err)
	}
	docs, isJSON, err := splitDocuments([]byte("# a comment only\n---\n"+yamlDocs), 3)
	if err != nil || isJSON || len(docs) != 3 {
		t.Errorf("3 YAML documents and a blank one, limit 3: %d, %v, %v", len(docs), isJSON, err)
	}

	list := "kind: List\nitems:\n- {kind: Node}\n- {kind: Node}\n- {kind: Node}\n"
	for name, tc := range map[string]struct {
		in   string
		want string
		n    int
	}{
		"a List within the limit": {in: list, n: 3},
		"a List past the limit":   {in: list + "---\nkind: Node\n", want: "more than 3 objects"},
		"nested Lists":            {in: "kind: List\nitems:\n- kind: NodeList\n  items: [{kind: Node}, {kind: Node}]\n- kind: NodeList\n  items: [{kind: Node}, {kind: Node}]\n", want: "more than 3 objects"},
		"items not a list":        {in: "kind: List\nitems: {a: 1}\n", want: "items is a map[string]interface {}, not a list"},
		"an item not an object":   {in: "kind: List\nitems: [1]\n", want: "document 1 items[0] is not an object"},
	} {
		t.Run(name, func(t *testing.T) {
			docs, _, err := SplitDocuments([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			maps, errs := Decode(docs)
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			objs, err := objects(maps, 3)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || len(objs) != tc.n || objs[2].Where != "document 1 items[2]" {
				t.Errorf("%d objects, %v", len(objs), err)
			}
		})
	}
}
