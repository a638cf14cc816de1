package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ConfigMapKey is the key of the chart's ConfigMap that holds the file.
const ConfigMapKey = "config.yaml"

// Verdict is what the webhook and the probe would say of one configuration
// found in a file: nothing, the reason it cannot be read, or every bad field.
type Verdict struct {
	// Sources say where the configuration was found: empty for the file
	// itself, else each ConfigMap that holds it ("ConfigMap ns/name"), as
	// helm template renders the same file into the chart's ConfigMap and its
	// install hook's.
	Sources []string
	// Err is why the configuration cannot be read at all (YAML, a wrong
	// type), with Parse's message; Errs is then empty.
	Err error
	// Errs are every bad field at once, the unknown keys and Validate's
	// errors, each with its line, in the file's order.
	Errs field.ErrorList
}

// Valid reports whether the binary would start with this configuration.
func (v Verdict) Valid() bool { return v.Err == nil && len(v.Errs) == 0 }

// ErrNoConfiguration: the input holds no configuration to check.
var ErrNoConfiguration = errors.New("no gpu-injector configuration: want an " + Kind + ", or a ConfigMap with " + ConfigMapKey)

// Check reads data as the configuration file itself, a ConfigMap that holds it
// under config.yaml (the chart's), or a stream of YAML documents such as the
// output of helm template, and checks each configuration it finds exactly as
// Parse does, one verdict per distinct file. Documents of other kinds are
// skipped; a file with no configuration in it is ErrNoConfiguration.
func Check(data []byte) ([]Verdict, error) {
	found, err := configurations(data)
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, ErrNoConfiguration
	}
	var verdicts []Verdict
	index := map[string]int{}
	for _, f := range found {
		if i, ok := index[string(f.data)]; ok {
			if f.source != "" {
				verdicts[i].Sources = append(verdicts[i].Sources, f.source)
			}
			continue
		}
		index[string(f.data)] = len(verdicts)
		v := Verdict{}
		if f.source != "" {
			v.Sources = []string{f.source}
		}
		_, v.Errs, v.Err = decode(f.data)
		verdicts = append(verdicts, v)
	}
	return verdicts, nil
}

type found struct {
	source string
	data   []byte
}

// configurations splits data into YAML documents and keeps those that are,
// or hold, a configuration.
func configurations(data []byte) ([]found, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []found
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read YAML documents: %w", err)
		}
		out = append(out, fromDocument(doc)...)
	}
}

// fromDocument returns the configurations of one document. A document that
// is no YAML mapping, or names neither a kind nor an apiVersion, is taken for
// a configuration, so that the strict decode says what is wrong with it.
func fromDocument(doc []byte) []found {
	var obj map[string]any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return []found{{data: doc}}
	}
	if obj == nil {
		// Only comments, or nothing: helm template writes such documents.
		return nil
	}
	return fromObject(doc, obj)
}

func fromObject(doc []byte, obj map[string]any) []found {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group, _, _ := strings.Cut(APIVersion, "/")
	switch {
	case kind == Kind || strings.HasPrefix(apiVersion, group+"/") || kind == "" && apiVersion == "":
		return []found{{data: doc}}
	case apiVersion == "v1" && kind == "ConfigMap":
		data, _ := obj["data"].(map[string]any)
		file, ok := data[ConfigMapKey].(string)
		if !ok {
			return nil
		}
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if ns, _ := meta["namespace"].(string); ns != "" {
			name = ns + "/" + name
		}
		return []found{{source: "ConfigMap " + name, data: []byte(file)}}
	case apiVersion == "v1" && kind == "List":
		// kubectl get configmaps -o yaml
		items, _ := obj["items"].([]any)
		var out []found
		for _, item := range items {
			if m, ok := item.(map[string]any); ok {
				if b, err := yaml.Marshal(m); err == nil {
					out = append(out, fromObject(b, m)...)
				}
			}
		}
		return out
	}
	return nil
}
