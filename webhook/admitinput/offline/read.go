// Package offline is a cluster as files describe it, for the commands that
// decide without the webhook's caches (`gpu-injector mutate`, `gpu-injector
// status pod`, `gpu-injector precheck`): its Nodes (as `kubectl get nodes -o yaml` or `gpu-injector
// nodeprobe --once` print them), the labels of its Namespaces, its DRA
// objects and the pool memory, and the images of OCI layouts, `docker save`
// tarballs or registries; each is a source of admitinput.Builder, built as
// the webhook's watches would fill it (`status pod` fills a Cluster from
// one read of an API server too). Files are read within bounds, in bytes
// and in objects, before anything is built of them: they come from a
// user's repository or a pipeline, not from a trusted API server.
package offline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// MaxFileBytes bounds one file: `kubectl get nodes -o yaml` of a
	// 5,000-node cluster, each Node with its status and a layout, is about
	// 150 MiB.
	MaxFileBytes = 256 << 20
	// MaxObjects bounds the documents of one file, and the objects of one
	// file with its Lists' items counted: above the 5,000 nodes a cluster
	// is tested at, with their DRA objects and the namespaces beside them.
	MaxObjects = 100_000
)

// ReadFile reads file, "-" for stdin (when stdin is not nil), refusing one
// larger than MaxFileBytes.
func ReadFile(file string, stdin io.Reader) ([]byte, error) {
	r := stdin
	name := "stdin"
	if file == "-" && stdin == nil {
		return nil, errors.New("failed to read -: standard input is not there to read")
	}
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("failed to read %s: %w", file, err)
		}
		defer f.Close()
		r, name = f, file
	}
	return readBounded(r, name, MaxFileBytes)
}

func readBounded(r io.Reader, name string, limit int) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", name, err)
	}
	if len(data) > limit {
		return nil, fmt.Errorf("failed to read %s: larger than %d bytes", name, limit)
	}
	return data, nil
}

// SplitDocuments splits a YAML stream, or a JSON stream of objects, into
// documents, keeping each one's bytes so that a document left alone can
// pass through exactly as written; the bool says JSON. More than
// MaxObjects documents is an error.
func SplitDocuments(data []byte) ([][]byte, bool, error) {
	return splitDocuments(data, MaxObjects)
}

func splitDocuments(data []byte, limit int) ([][]byte, bool, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		var docs [][]byte
		for {
			var raw json.RawMessage
			err := dec.Decode(&raw)
			if errors.Is(err, io.EOF) {
				return docs, true, nil
			}
			if err != nil {
				return nil, true, fmt.Errorf("invalid JSON after %d documents: %w", len(docs), err)
			}
			if len(docs) == limit {
				return nil, true, fmt.Errorf("more than %d documents", limit)
			}
			docs = append(docs, raw)
		}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("invalid YAML after %d documents: %w", len(docs), err)
		}
		if isBlank(doc) {
			continue
		}
		if len(docs) == limit {
			return nil, false, fmt.Errorf("more than %d documents", limit)
		}
		docs = append(docs, doc)
	}
}

func isBlank(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' && !bytes.Equal(l, []byte("---")) {
			return false
		}
	}
	return true
}

// Object is one object of a file, a List's item or a document.
type Object struct {
	*unstructured.Unstructured
	// Where names it in its file: "document 2" or "document 2 items[5]".
	Where string
}

// Decode decodes each document into its map; a document that does not
// decode is nil, with its error.
func Decode(docs [][]byte) ([]map[string]any, []error) {
	maps := make([]map[string]any, len(docs))
	errs := make([]error, len(docs))
	for i, doc := range docs {
		obj := map[string]any{}
		if errs[i] = yaml.Unmarshal(doc, &obj); errs[i] == nil {
			maps[i] = obj
		}
	}
	return maps, errs
}

// Objects are the objects of decoded documents, a List's items in its
// place, read in place; a nil document is left out. More than MaxObjects in
// all is an error, found before any is decoded into its type.
func Objects(docs []map[string]any) ([]Object, error) {
	return objects(docs, MaxObjects)
}

func objects(docs []map[string]any, limit int) ([]Object, error) {
	var out []Object
	var add func(obj map[string]any, where string) error
	add = func(obj map[string]any, where string) error {
		u := &unstructured.Unstructured{Object: obj}
		if !strings.HasSuffix(u.GetKind(), "List") {
			if len(out) == limit {
				return fmt.Errorf("more than %d objects", limit)
			}
			out = append(out, Object{Unstructured: u, Where: where})
			return nil
		}
		// Read in place: a copy of a List of thousands of Nodes doubles
		// what the command holds.
		items, ok := obj["items"].([]any)
		if !ok && obj["items"] != nil {
			return fmt.Errorf("%s: items is a %T, not a list", where, obj["items"])
		}
		if len(out)+len(items) > limit {
			return fmt.Errorf("more than %d objects", limit)
		}
		for i, it := range items {
			o, ok := it.(map[string]any)
			if !ok {
				return fmt.Errorf("%s items[%d] is not an object", where, i)
			}
			if err := add(o, fmt.Sprintf("%s items[%d]", where, i)); err != nil {
				return err
			}
		}
		return nil
	}
	for i, doc := range docs {
		if doc == nil {
			continue
		}
		if err := add(doc, fmt.Sprintf("document %d", i+1)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
