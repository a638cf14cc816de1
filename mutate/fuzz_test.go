package mutate

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// FuzzManifests feeds `gpu-injector mutate` arbitrary input: a YAML or JSON
// stream of documents of any kind, as a user's repository holds them. Every
// document either fails with an error or comes out as one document of the
// same kind, name and namespace; a document left alone keeps its bytes; and
// mutating the output again changes nothing.
func FuzzManifests(f *testing.F) {
	var cluster offline.Cluster
	if err := cluster.AddFile(nodesFile, nil); err != nil {
		f.Fatal(err)
	}
	input, _ := cluster.Builder(config.Default(), clocktesting.NewFakePassiveClock(time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)), logr.Discard())
	m := &mutator{input: input, namespace: "default", stderr: io.Discard}

	classic, err := os.ReadFile("testdata/classic.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(classic)
	for _, d := range bytes.Split(classic, []byte("\n---\n")) {
		if j, err := yaml.YAMLToJSON(d); err == nil {
			f.Add(j)
		}
	}
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":1}}}]}}{"kind":"List","items":[{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","resources":{"limits":{"alpha.kubernetes.io/nvidia-gpu":"1"}}}]}}]}`))
	f.Add([]byte("apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers:\n          - name: c\n            resources: {limits: {nvidia.com/gpu: 1}}\n            x-unknown: kept\n---\n# only a comment\n---\napiVersion: v1\nkind: PodTemplate\ntemplate: {spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 2}}}]}}\n"))
	f.Add([]byte("kind: v1List\nitems: [1]\n"))
	f.Add([]byte("a: &a [*a]\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		docs, isJSON, err := offline.SplitDocuments(data)
		if err != nil {
			return
		}
		for _, doc := range docs {
			out, err := mutateDocument(m, doc, isJSON)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("%d bytes took %v", len(data), d)
			}
			if err != nil {
				continue
			}
			if bytes.Equal(out, doc) {
				continue
			}
			var before, after map[string]any
			if err := yaml.Unmarshal(doc, &before); err != nil {
				t.Fatalf("input document no longer parses: %v", err)
			}
			if err := yaml.Unmarshal(out, &after); err != nil {
				t.Fatalf("output does not parse: %v\n%s", err, out)
			}
			b, a := unstructured.Unstructured{Object: before}, unstructured.Unstructured{Object: after}
			if b.GetKind() != a.GetKind() || b.GetName() != a.GetName() || b.GetNamespace() != a.GetNamespace() || b.GetAPIVersion() != a.GetAPIVersion() {
				t.Fatalf("the document changed identity: %s %s/%s -> %s %s/%s", b.GetKind(), b.GetNamespace(), b.GetName(), a.GetKind(), a.GetNamespace(), a.GetName())
			}
			// The output must stay one document of its stream.
			if isJSON && !json.Valid(out) {
				t.Fatalf("output is not JSON:\n%s", out)
			}
			split, again, err := offline.SplitDocuments(out)
			if err != nil || len(split) != 1 || again != isJSON {
				t.Fatalf("output splits into %d documents (%v):\n%s", len(split), err, out)
			}
			out2, err := mutateDocument(m, out, isJSON)
			if err != nil {
				t.Fatalf("mutating the output fails: %v\n%s", err, out)
			}
			if !bytes.Equal(out2, out) {
				t.Fatalf("mutating the output again changes it:\n%s\n---\n%s", out, out2)
			}
		}
	})
}

// mutateDocument decodes doc and mutates it, as Run does.
func mutateDocument(m *mutator, doc []byte, isJSON bool) ([]byte, error) {
	decoded, errs := offline.Decode([][]byte{doc})
	return m.document(doc, decoded[0], errs[0], isJSON)
}
