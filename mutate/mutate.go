// Package mutate is `gpu-injector mutate`: the webhook's mutation run offline
// over manifests, for review and GitOps, like `istioctl kube-inject`.
package mutate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
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
	// workloads, and the Namespaces, claims, claim templates and
	// DeviceClasses applied with them; "-" reads stdin.
	File string
	// NodeFiles hold the cluster (YAML or JSON, also Lists): Node objects
	// (`kubectl get nodes -o yaml` and `gpu-injector nodeprobe --once`
	// output work as they are), Namespaces, DRA objects and the pool
	// memory's ConfigMap.
	NodeFiles []string
	// Config is the injector configuration; nil means the defaults.
	Config *config.Configuration
	// Namespace is that of documents that name none; empty means "default".
	Namespace string
	// Images, when set, give the images' configuration, as the webhook
	// reads it from registries with images.mode On.
	Images admitinput.ImageReader
	// Clock ages the pool memory's entries; nil is the real clock.
	Clock clock.PassiveClock
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
	clk := opts.Clock
	if clk == nil {
		clk = wallclock.Real()
	}
	var cluster offline.Cluster
	nodesStdin := stdin
	if opts.File == "-" {
		nodesStdin = nil
	}
	for _, nf := range opts.NodeFiles {
		if err := cluster.AddFile(nf, nodesStdin); err != nil {
			return err
		}
	}
	in, err := offline.ReadFile(opts.File, stdin)
	if err != nil {
		return err
	}
	docs, isJSON, err := offline.SplitDocuments(in)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", opts.File, err)
	}
	decoded, decodeErrs := offline.Decode(docs)
	if err := addApplied(&cluster, decoded, namespace); err != nil {
		return fmt.Errorf("failed to read %s: %w", opts.File, err)
	}
	input, notes := cluster.Builder(cfg, clk, stderrLogger(stderr))
	input.Images = opts.Images
	for _, n := range notes {
		fmt.Fprintf(stderr, "warning: %s\n", n)
	}
	if opts.Images != nil && cfg.Images.Mode != config.ImagesOn {
		// The images were asked for, so they are read; the warning says
		// whose answer this is not.
		fmt.Fprintf(stderr, "warning: mutate reads the images, as asked, but the webhook itself does not read images (config images.mode: %s); its answer would differ wherever an image's configuration counts\n", cfg.Images.Mode)
	}
	m := &mutator{input: input, namespace: namespace, stderr: stderr}
	out := make([][]byte, len(docs))
	for i, doc := range docs {
		if out[i], err = m.document(doc, decoded[i], decodeErrs[i], isJSON); err != nil {
			return fmt.Errorf("failed to mutate document %d of %s: %w", i+1, opts.File, err)
		}
	}
	if err := write(stdout, out, isJSON); err != nil {
		return err
	}
	if m.denied > 0 {
		return fmt.Errorf("%w: %d denied", ErrDenied, m.denied)
	}
	return nil
}

// write prints the documents as a stream of the input's kind.
func write(stdout io.Writer, out [][]byte, isJSON bool) error {
	if isJSON {
		for _, o := range out {
			if _, err := stdout.Write(append(o, '\n')); err != nil {
				return err
			}
		}
		return nil
	}
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
	return nil
}

// appliedKinds are the kinds applied with the workloads that the cluster
// holds when their pods are admitted, and that the decision reads: a
// Namespace's Pod Security labels, and which claims request GPUs.
var appliedKinds = map[string]bool{"Namespace": true, "ResourceClaim": true, "ResourceClaimTemplate": true, "DeviceClass": true}

// addApplied adds to the cluster the Namespaces, claims, claim templates
// and DeviceClasses of the manifests, a claim in the namespace it would be
// applied to. One that does not convert is left out: the API server would
// refuse it, and this command is no validator.
func addApplied(cluster *offline.Cluster, decoded []map[string]any, namespace string) error {
	objs, err := offline.Objects(decoded)
	if err != nil {
		return err
	}
	for _, o := range objs {
		kind := o.GetKind()
		if !appliedKinds[kind] {
			continue
		}
		if kind == "Namespace" {
			_, _ = cluster.Add(o)
			continue
		}
		obj := gpunodes.NewDRAObject(kind)
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, obj) != nil {
			continue
		}
		if obj.GetNamespace() == "" && kind != "DeviceClass" {
			obj.SetNamespace(namespace)
		}
		cluster.DRA = append(cluster.DRA, obj)
	}
	return nil
}

func stderrLogger(w io.Writer) logr.Logger {
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(w, "log: %s\n", args)
	}, funcr.Options{Verbosity: 0})
}

type mutator struct {
	input     *admitinput.Builder
	namespace string
	stderr    io.Writer
	denied    int
}

// document mutates one document, decoded as obj (or not, with decodeErr),
// and returns its new bytes, or the original bytes when nothing in it
// changed.
func (m *mutator) document(doc []byte, obj map[string]any, decodeErr error, isJSON bool) ([]byte, error) {
	if decodeErr != nil {
		return nil, fmt.Errorf("invalid document: %w", decodeErr)
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
	// Offline a document names the request, as a UID does an admission.
	res := m.input.Decide(context.Background(), pod, pod.Namespace, types.UID(pod.Namespace+"/"+what))
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
