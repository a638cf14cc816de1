package precheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Bounds of the offline file, checked before anything is built from it:
// `kubectl get nodes,ns -o yaml` of a cluster at Kubernetes' tested limit
// (5,000 nodes, each with a layout annotation of a few KiB) is well under
// them. Variables only so that tests can reach them with small files.
var (
	maxFileBytes  = 256 << 20
	maxDocuments  = 10000
	maxNodes      = 20000
	maxNamespaces = 20000
)

// readFile reads Nodes and Namespaces from file ("-": stdin): a v1 List as
// `kubectl get nodes,ns -o yaml` (or -o json) prints it, or multi-document
// YAML of Nodes, Namespaces and such Lists.
func readFile(file string, stdin io.Reader) ([]corev1.Node, []corev1.Namespace, error) {
	data, err := readBounded(file, stdin)
	if err != nil {
		return nil, nil, err
	}
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read %s: %w", file, err)
	}
	var c collected
	for i, doc := range docs {
		if err := c.document(doc); err != nil {
			return nil, nil, fmt.Errorf("failed to read %s: document %d: %w", file, i+1, err)
		}
	}
	return c.nodes, c.namespaces, nil
}

func readBounded(file string, stdin io.Reader) ([]byte, error) {
	in := stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("failed to open %s: %w", file, err)
		}
		defer f.Close()
		in = f
	}
	data, err := io.ReadAll(io.LimitReader(in, int64(maxFileBytes)+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", file, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("failed to read %s: larger than %d bytes", file, maxFileBytes)
	}
	return data, nil
}

// splitDocuments splits a YAML stream into its documents, as `gpu-injector
// mutate` reads its files; a JSON file is one document.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("invalid YAML after %d documents: %w", len(docs), err)
		}
		if len(bytes.TrimSpace(doc)) == 0 || isComment(doc) {
			continue
		}
		if len(docs) == maxDocuments {
			return nil, fmt.Errorf("more than %d documents", maxDocuments)
		}
		docs = append(docs, doc)
	}
}

func isComment(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) {
			return false
		}
	}
	return true
}

// collected are the objects read so far.
type collected struct {
	nodes      []corev1.Node
	namespaces []corev1.Namespace
}

// header is what is read of an object before it is decoded whole: a List's
// items stay raw until their number is checked.
type header struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
}

func (c *collected) document(doc []byte) error {
	raw, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return fmt.Errorf("not an object: %w", err)
	}
	if !strings.HasSuffix(h.Kind, "List") {
		return c.object(raw, h.Kind)
	}
	if len(h.Items) > maxNodes+maxNamespaces {
		return fmt.Errorf("a List of %d items, more than %d", len(h.Items), maxNodes+maxNamespaces)
	}
	for i, it := range h.Items {
		var ih header
		if err := json.Unmarshal(it, &ih); err != nil {
			return fmt.Errorf("items[%d]: not an object: %w", i, err)
		}
		if err := c.object(it, ih.Kind); err != nil {
			return fmt.Errorf("items[%d]: %w", i, err)
		}
	}
	return nil
}

func (c *collected) object(raw []byte, kind string) error {
	switch kind {
	case "Node":
		if len(c.nodes) == maxNodes {
			return fmt.Errorf("more than %d Nodes", maxNodes)
		}
		var n corev1.Node
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("invalid Node: %w", err)
		}
		c.nodes = append(c.nodes, n)
	case "Namespace":
		if len(c.namespaces) == maxNamespaces {
			return fmt.Errorf("more than %d Namespaces", maxNamespaces)
		}
		var ns corev1.Namespace
		if err := json.Unmarshal(raw, &ns); err != nil {
			return fmt.Errorf("invalid Namespace: %w", err)
		}
		c.namespaces = append(c.namespaces, ns)
	case "":
		return errors.New("an object with no kind")
	default:
		return fmt.Errorf("a %s, not a Node or a Namespace (kubectl get nodes,ns -o yaml)", kind)
	}
	return nil
}
