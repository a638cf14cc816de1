// Package mutate is `gpu-injector mutate`: the webhook's mutation run offline
// over manifests, for review and GitOps, like `istioctl kube-inject`.
package mutate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// ErrDenied is returned when at least one document would be denied.
var ErrDenied = errors.New("the webhook would deny at least one document")

// templatePaths says where each workload kind keeps its pod template.
var templatePaths = map[string][]string{
	"Deployment":            {"spec", "template"},
	"StatefulSet":           {"spec", "template"},
	"DaemonSet":             {"spec", "template"},
	"ReplicaSet":            {"spec", "template"},
	"ReplicationController": {"spec", "template"},
	"Job":                   {"spec", "template"},
	"CronJob":               {"spec", "jobTemplate", "spec", "template"},
	"PodTemplate":           {"template"},
}

// Options say what to mutate, against which cluster.
type Options struct {
	// File holds the manifests: multi-document YAML or JSON of Pods and
	// workloads; "-" reads stdin.
	File string
	// NodeFiles hold Node objects (YAML or JSON; `kubectl get nodes -o
	// yaml` output works as is), and any DRA objects that come with them.
	NodeFiles []string
	// Config is the injector configuration; nil means the defaults.
	Config *config.Configuration
	// Namespace is that of documents that name none; empty means "default".
	Namespace string
	// Images, when set, give the images' configuration, as the webhook
	// reads it from registries with images.mode On.
	Images ImageSource
}

// Run prints the documents of opts.File to stdout as the webhook would mutate
// them, and warnings to stderr (`gpu-injector mutate`). It wraps ErrDenied
// when the webhook would deny a document.
func Run(opts Options, stdin io.Reader, stdout, stderr io.Writer) error {
	cfg := opts.Config
	if cfg == nil {
		cfg = config.Default()
	}
	namespace := opts.Namespace
	if namespace == "" {
		namespace = "default"
	}
	var nodes []corev1.Node
	var draObjects []client.Object
	for _, nf := range opts.NodeFiles {
		ns, objs, err := readCluster(nf)
		if err != nil {
			return err
		}
		nodes = append(nodes, ns...)
		draObjects = append(draObjects, objs...)
	}
	in, err := readInput(opts.File, stdin)
	if err != nil {
		return err
	}
	docs, isJSON, err := splitDocuments(in)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", opts.File, err)
	}
	// Claims and claim templates applied with the workloads say which pods
	// claim GPUs, as the cluster's would.
	for _, doc := range docs {
		if obj := draDocument(doc, namespace); obj != nil {
			draObjects = append(draObjects, obj)
		}
	}
	idx := gpunodes.NewIndex(cfg, stderrLogger(stderr))
	dra := gpunodes.NewDRA(cfg, idx, nil, stderrLogger(stderr))
	for _, o := range draObjects {
		dra.Add(o)
	}
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	layouts := idx.Layouts()
	// With driverDelivery: Runtime no layout is read: the node a pod lands
	// on mounts its own driver.
	if len(layouts) == 0 && cfg.DriverDelivery != config.DeliveryRuntime {
		fmt.Fprintf(stderr, "warning: none of the %d nodes publishes a usable layout\n", len(nodes))
	}
	if w := idx.Wedged(); len(w) > 0 {
		fmt.Fprintf(stderr, "warning: %d nodes have a wedged NVIDIA driver and get no GPU pods\n", len(w))
	}
	if opts.Images != nil && cfg.Images.Mode != config.ImagesOn {
		// The images were asked for, so they are read; the warning says
		// whose answer this is not.
		fmt.Fprintf(stderr, "warning: mutate reads the images, as asked, but the webhook itself does not read images (config images.mode: %s); its answer would differ wherever an image's configuration counts\n", cfg.Images.Mode)
	}
	m := &mutator{cfg: cfg, layouts: layouts, wedged: idx.Wedged(), dra: dra, namespace: namespace, stderr: stderr, images: opts.Images}
	var out [][]byte
	for i, doc := range docs {
		res, err := m.document(doc, isJSON)
		if err != nil {
			return fmt.Errorf("failed to mutate document %d of %s: %w", i+1, opts.File, err)
		}
		out = append(out, res)
	}
	if isJSON {
		for _, o := range out {
			if _, err := stdout.Write(append(o, '\n')); err != nil {
				return err
			}
		}
	} else {
		for i, o := range out {
			if i > 0 {
				fmt.Fprintln(stdout, "---")
			}
			if _, err := stdout.Write(o); err != nil {
				return err
			}
			if len(o) > 0 && o[len(o)-1] != '\n' {
				fmt.Fprintln(stdout)
			}
		}
	}
	if m.denied > 0 {
		return fmt.Errorf("%w: %d denied", ErrDenied, m.denied)
	}
	return nil
}

func stderrLogger(w io.Writer) logr.Logger {
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(w, "log: %s\n", args)
	}, funcr.Options{Verbosity: 0})
}

func readInput(file string, stdin io.Reader) ([]byte, error) {
	if file == "-" {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("failed to read stdin: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", file, err)
	}
	return b, nil
}

// splitDocuments splits a YAML stream, or a JSON stream of objects, into
// documents, keeping each one's bytes so untouched documents pass through
// exactly as written.
func splitDocuments(data []byte) ([][]byte, bool, error) {
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

type mutator struct {
	cfg       *config.Configuration
	layouts   []*inject.Layout
	wedged    []*inject.WedgedNode
	namespace string
	stderr    io.Writer
	denied    int
	dra       *gpunodes.DRA
	images    ImageSource
}

// document mutates one document and returns its new bytes, or the original
// bytes when nothing in it changed.
func (m *mutator) document(doc []byte, isJSON bool) ([]byte, error) {
	obj := map[string]any{}
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return nil, fmt.Errorf("invalid document: %w", err)
	}
	u := &unstructured.Unstructured{Object: obj}
	changed, err := m.object(u)
	if err != nil {
		return nil, err
	}
	if !changed {
		return doc, nil
	}
	if isJSON {
		return json.MarshalIndent(u.Object, "", "  ")
	}
	return yaml.Marshal(u.Object)
}

func (m *mutator) object(u *unstructured.Unstructured) (bool, error) {
	if u.GetKind() == "" {
		return false, fmt.Errorf("document has no kind")
	}
	if strings.HasSuffix(u.GetKind(), "List") {
		items, found, err := unstructured.NestedSlice(u.Object, "items")
		if err != nil || !found {
			return false, err
		}
		changed := false
		for i, it := range items {
			o, ok := it.(map[string]any)
			if !ok {
				return false, fmt.Errorf("items[%d] is not an object", i)
			}
			c, err := m.object(&unstructured.Unstructured{Object: o})
			if err != nil {
				return false, fmt.Errorf("items[%d]: %w", i, err)
			}
			changed = changed || c
		}
		if changed {
			if err := unstructured.SetNestedSlice(u.Object, items, "items"); err != nil {
				return false, err
			}
		}
		return changed, nil
	}
	ns := u.GetNamespace()
	if ns == "" {
		ns = m.namespace
	}
	what := fmt.Sprintf("%s/%s", u.GetKind(), u.GetName())
	if hint := removedAPIHint(u.GetAPIVersion(), u.GetKind()); hint != "" {
		fmt.Fprintf(m.stderr, "warning: %s: %s\n", what, hint)
	}
	if u.GetKind() == "Pod" && u.GetAPIVersion() == "v1" {
		pod := &corev1.Pod{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pod); err != nil {
			return false, fmt.Errorf("invalid Pod %s: %w", u.GetName(), err)
		}
		pod.Namespace = ns
		ops, ok := m.pod(what, pod)
		if !ok {
			return false, nil
		}
		return true, applyOps(u.Object, ops)
	}
	tp, ok := templatePaths[u.GetKind()]
	if !ok {
		return false, nil
	}
	tmpl, found, err := unstructured.NestedMap(u.Object, tp...)
	if err != nil {
		return false, fmt.Errorf("invalid %s: %w", what, err)
	}
	if !found {
		return false, nil
	}
	var pt corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &pt); err != nil {
		return false, fmt.Errorf("invalid pod template of %s: %w", what, err)
	}
	pod := &corev1.Pod{ObjectMeta: pt.ObjectMeta, Spec: pt.Spec}
	pod.Namespace = ns
	ops, ok := m.pod(what, pod)
	if !ok {
		return false, nil
	}
	// A template's metadata and spec sit where a pod's do, so the webhook's
	// operations apply to it as they are.
	if err := applyOps(tmpl, ops); err != nil {
		return false, err
	}
	if err := unstructured.SetNestedMap(u.Object, tmpl, tp...); err != nil {
		return false, err
	}
	return true, nil
}

// applyOps applies the webhook's JSON Patch to the document's own map, so
// that fields the typed pod does not know (a newer API's, a typo the API
// server would reject) and the document's own spelling of values stay
// exactly as written.
func applyOps(doc map[string]any, ops []jsonpatch.Operation) error {
	if _, ok := doc["metadata"].(map[string]any); !ok {
		// Every patch records the injection in the annotations.
		doc["metadata"] = map[string]any{}
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	patch, err := jsonpatchv5.DecodePatch(raw)
	if err != nil {
		return fmt.Errorf("failed to decode the mutation's patch: %w", err)
	}
	orig, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	out, err := patch.Apply(orig)
	if err != nil {
		return fmt.Errorf("failed to apply the mutation to the document: %w", err)
	}
	patched := map[string]any{}
	if err := json.Unmarshal(out, &patched); err != nil {
		return err
	}
	// Replace the contents, not the map: a List's items hold this map.
	for k := range doc {
		delete(doc, k)
	}
	for k, v := range patched {
		doc[k] = v
	}
	return nil
}

// pod mutates and reports, and returns the patch; false means leave the
// document as written.
func (m *mutator) pod(what string, pod *corev1.Pod) ([]jsonpatch.Operation, bool) {
	in := inject.Input{Pod: pod, Layouts: m.layouts, Wedged: m.wedged, Seed: inject.Seed(pod.Namespace + "/" + what)}
	if m.dra != nil {
		in.GPUResources = m.dra.GPUResources()
		in.GPUClaims, _ = m.dra.GPUClaims(context.Background(), pod, pod.Namespace)
	}
	if m.images != nil {
		var warnings []string
		in.Images, warnings = podImages(m.images, pod)
		for _, w := range warnings {
			fmt.Fprintf(m.stderr, "warning: %s: %s\n", what, w)
		}
	}
	res := inject.Mutate(in, m.cfg)
	for _, w := range res.Warnings {
		fmt.Fprintf(m.stderr, "warning: %s: %s\n", what, w)
	}
	switch res.Decision {
	case inject.DecisionDenied:
		m.denied++
		fmt.Fprintf(m.stderr, "denied: %s: %s\n", what, res.Reason)
		return nil, false
	case inject.DecisionInjected:
		if res.Layout != nil && res.Layout.Runtime {
			fmt.Fprintf(m.stderr, "injected: %s: at the runtime, by the nodes' gpu-injector NRI plugin\n", what)
		} else if res.Layout != nil {
			fmt.Fprintf(m.stderr, "injected: %s: layout %s%s (driver %s)\n", what, res.Layout.Fingerprint, res.Layout.Static, res.Layout.Plan.DriverVersion)
		}
		return res.Patch, true
	default:
		fmt.Fprintf(m.stderr, "skipped: %s: %s\n", what, res.Reason)
		return nil, false
	}
}

// ReadNodes reads Node objects from a YAML or JSON file, also a List such
// as kubectl get -o yaml writes; DRA objects in it are skipped.
func ReadNodes(file string) ([]corev1.Node, error) {
	nodes, _, err := readCluster(file)
	return nodes, err
}

// draDocument decodes a ResourceClaim or ResourceClaimTemplate of the
// manifests, in the namespace it would be applied to; nil for anything else.
func draDocument(doc []byte, namespace string) client.Object {
	var meta struct {
		Kind string `json:"kind"`
	}
	if yaml.Unmarshal(doc, &meta) != nil || (meta.Kind != "ResourceClaim" && meta.Kind != "ResourceClaimTemplate" && meta.Kind != "DeviceClass") {
		return nil
	}
	obj := gpunodes.NewDRAObject(meta.Kind)
	if yaml.Unmarshal(doc, obj) != nil {
		return nil
	}
	if obj.GetNamespace() == "" && meta.Kind != "DeviceClass" {
		obj.SetNamespace(namespace)
	}
	return obj
}

// readCluster reads Node objects, and the DRA objects that say how many GPUs
// nodes have and which classes are GPUs (ResourceSlices, DeviceClasses,
// ResourceClaims, ResourceClaimTemplates), from a YAML or JSON file, also a
// List such
// as `kubectl get nodes -o yaml` prints.
func readCluster(file string) ([]corev1.Node, []client.Object, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read nodes %s: %w", file, err)
	}
	docs, _, err := splitDocuments(data)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read nodes %s: %w", file, err)
	}
	var nodes []corev1.Node
	var objs []client.Object
	var add func(obj map[string]any, where string) error
	add = func(obj map[string]any, where string) error {
		u := unstructured.Unstructured{Object: obj}
		switch {
		case strings.HasSuffix(u.GetKind(), "List"):
			items, _, err := unstructured.NestedSlice(obj, "items")
			if err != nil {
				return fmt.Errorf("%s: %w", where, err)
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
		case u.GetKind() == "Node":
			var n corev1.Node
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &n); err != nil {
				return fmt.Errorf("%s: invalid Node: %w", where, err)
			}
			nodes = append(nodes, n)
		case gpunodes.IsDRAKind(u.GetKind()):
			o := gpunodes.NewDRAObject(u.GetKind())
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, o); err != nil {
				return fmt.Errorf("%s: invalid %s: %w", where, u.GetKind(), err)
			}
			objs = append(objs, o)
		default:
			return fmt.Errorf("%s is a %q, not a Node or a DRA object", where, u.GetKind())
		}
		return nil
	}
	for i, doc := range docs {
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, nil, fmt.Errorf("failed to read nodes %s: document %d: %w", file, i+1, err)
		}
		if err := add(obj, fmt.Sprintf("document %d", i+1)); err != nil {
			return nil, nil, fmt.Errorf("failed to read nodes %s: %w", file, err)
		}
	}
	return nodes, objs, nil
}
