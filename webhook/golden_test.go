package webhook

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
)

// goldenCase is one testdata/X.yaml: a Pod, and optionally an
// InjectorConfiguration, a Namespace, Nodes, or a {nodesFile: F} line that
// replaces the default cluster of testdata/nodes.yaml.
type goldenCase struct {
	pod       *corev1.Pod
	cfg       *config.Configuration
	nsLabels  map[string]string
	nodes     []corev1.Node
	nodesFile string
	// memory is the data of the remembered pools' ConfigMap, if the case has one.
	memory map[string]string
	// dra are DRA objects (ResourceSlices, DeviceClasses, claims and claim
	// templates), from the case and from its {draFile: F} line.
	dra     []any
	draFile string
}

// goldenResult is what testdata/X.golden holds.
type goldenResult struct {
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	Layout   string   `json:"layout,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Patch is what the webhook answers; Pod is the input with it applied.
	Patch []jsonpatch.Operation `json:"patch,omitempty"`
	Pod   *corev1.Pod           `json:"pod"`
}

func splitDocs(t testing.TB, data []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("failed to split YAML: %v", err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func loadNodes(t testing.TB, file string) []corev1.Node {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []corev1.Node
	for _, doc := range splitDocs(t, data) {
		var n corev1.Node
		if err := yaml.UnmarshalStrict(doc, &n); err != nil {
			t.Fatalf("failed to parse node in %s: %v", file, err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func loadCase(t *testing.T, file string) goldenCase {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	gc := goldenCase{cfg: config.Default(), nodesFile: "nodes.yaml"}
	for _, doc := range splitDocs(t, data) {
		var meta struct {
			Kind      string `json:"kind"`
			NodesFile string `json:"nodesFile"`
			DRAFile   string `json:"draFile"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("failed to parse %s: %v", file, err)
		}
		if obj, ok := decodeDRA(t, meta.Kind, doc); ok {
			gc.dra = append(gc.dra, obj)
			continue
		}
		switch {
		case meta.NodesFile != "" || meta.DRAFile != "":
			if meta.NodesFile != "" {
				gc.nodesFile = meta.NodesFile
			}
			if meta.DRAFile != "" {
				gc.draFile = meta.DRAFile
			}
		case meta.Kind == config.Kind:
			if gc.cfg, err = config.Parse(doc); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		case meta.Kind == "Namespace":
			var ns corev1.Namespace
			if err := yaml.UnmarshalStrict(doc, &ns); err != nil {
				t.Fatal(err)
			}
			gc.nsLabels = ns.Labels
		case meta.Kind == "Node":
			var n corev1.Node
			if err := yaml.UnmarshalStrict(doc, &n); err != nil {
				t.Fatal(err)
			}
			gc.nodes = append(gc.nodes, n)
		case meta.Kind == "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
				t.Fatal(err)
			}
			gc.memory = cm.Data
		case meta.Kind == "Pod":
			gc.pod = &corev1.Pod{}
			if err := yaml.UnmarshalStrict(doc, gc.pod); err != nil {
				t.Fatalf("failed to parse pod in %s: %v", file, err)
			}
		default:
			t.Fatalf("%s: unexpected document of kind %q", file, meta.Kind)
		}
	}
	if gc.pod == nil {
		t.Fatalf("%s: no Pod", file)
	}
	if gc.nodes == nil {
		gc.nodes = loadNodes(t, filepath.Join("testdata", gc.nodesFile))
	}
	if gc.draFile != "" {
		data, err := os.ReadFile(filepath.Join("testdata", gc.draFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(t, data) {
			var meta struct {
				Kind string `json:"kind"`
			}
			_ = yaml.Unmarshal(doc, &meta)
			obj, ok := decodeDRA(t, meta.Kind, doc)
			if !ok {
				t.Fatalf("%s: unexpected document of kind %q", gc.draFile, meta.Kind)
			}
			gc.dra = append(gc.dra, obj)
		}
	}
	return gc
}

// decodeDRA decodes a DRA object of the golden cases.
func decodeDRA(t testing.TB, kind string, doc []byte) (any, bool) {
	t.Helper()
	var obj any
	switch kind {
	case "ResourceSlice":
		obj = &resourcev1.ResourceSlice{}
	case "DeviceClass":
		obj = &resourcev1.DeviceClass{}
	case "ResourceClaim":
		obj = &resourcev1.ResourceClaim{}
	case "ResourceClaimTemplate":
		obj = &resourcev1.ResourceClaimTemplate{}
	default:
		return nil, false
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("failed to parse %s: %v", kind, err)
	}
	return obj, true
}

// input builds the mutation's input as the webhook would: layouts from the
// nodes, counted with the case's ResourceSlices, and the DRA facts.
func (gc goldenCase) input(t *testing.T, pod *corev1.Pod) Input {
	t.Helper()
	idx, d := gc.sources(t)
	claims, _ := d.GPUClaims(context.Background(), pod, pod.Namespace)
	return Input{Pod: pod, NamespaceLabels: gc.nsLabels, Layouts: idx.Layouts(), Wedged: idx.Wedged(), GPUResources: d.GPUResources(), GPUClaims: claims}
}

// sources are the case's node index and DRA objects.
func (gc goldenCase) sources(t *testing.T) (*Index, *DRA) {
	t.Helper()
	idx := NewIndex(gc.cfg, logr.Discard())
	idx.now = func() time.Time { return goldenNow }
	if gc.memory != nil {
		mem, errs := DecodeMemory(gc.memory, gc.cfg, goldenNow)
		if len(errs) > 0 {
			t.Fatalf("bad memory in the case: %v", errs)
		}
		idx.SetMemory(mem)
	}
	d := NewDRA(gc.cfg, idx, nil, logr.Discard())
	for _, o := range gc.dra {
		d.Add(o)
	}
	for i := range gc.nodes {
		idx.Update(&gc.nodes[i])
	}
	return idx, d
}

func layoutsOf(cfg *config.Configuration, nodes []corev1.Node) []*Layout {
	idx := NewIndex(cfg, logr.Discard())
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	return idx.Layouts()
}

// goldenNow is the golden tests' clock, against which a case's remembered
// pools are aged.
var goldenNow = time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)

// TestGolden runs every testdata/*.yaml through Mutate and compares with its
// .golden twin (REFRESH_GOLDEN=true rewrites them): the decision, the JSON
// Patch and the pod that patch makes of the input's JSON. It checks that the
// patch makes the same pod as the edits make on the typed pod, that it
// leaves fields this build does not know alone, and runs Mutate again on the
// result to prove a reinvocation changes nothing.
func TestGolden(t *testing.T) {
	refresh := os.Getenv("REFRESH_GOLDEN") == "true"
	forEachGolden(t, func(t *testing.T, base string, gc goldenCase) {
		pod := gc.pod.DeepCopy()
		input := gc.input(t, pod)
		res := Mutate(input, gc.cfg)
		if res.Decision != DecisionInjected && len(res.Patch) > 0 {
			t.Errorf("decision %s carries a patch", res.Decision)
		}
		if res.Decision == DecisionInjected && len(res.Patch) == 0 {
			t.Errorf("decision Injected without a patch")
		}
		patched := applyOps(t, gc.pod, res.Patch)
		if !apiequality.Semantic.DeepEqual(patched, pod) {
			t.Errorf("the patch and the edits disagree:\n%s", lineDiff(mustYAML(t, pod), mustYAML(t, patched)))
		}
		assertKeepsUnknownFields(t, gc.pod, res.Patch)

		got := goldenResult{Decision: res.Decision, Reason: res.Reason, Warnings: res.Warnings, Patch: res.Patch, Pod: patched}
		if res.Layout != nil {
			got.Layout = res.Layout.Fingerprint + res.Layout.Static
		}
		if res.Decision == DecisionDenied && !apiequality.Semantic.DeepEqual(pod, gc.pod) {
			t.Errorf("a denied pod must not be changed")
		}
		out, err := yaml.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		goldenFile := filepath.Join("testdata", base+".golden")
		if refresh {
			if err := os.WriteFile(goldenFile, out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(goldenFile)
		if err != nil {
			t.Fatalf("failed to read golden file (run with REFRESH_GOLDEN=true to create it): %v", err)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("mutation differs from %s (REFRESH_GOLDEN=true to accept):\n%s", goldenFile, lineDiff(string(want), string(out)))
		}
		assertHostPathsSafe(t, patched)

		again := patched.DeepCopy()
		input.Pod = again
		res2 := Mutate(input, gc.cfg)
		if !apiequality.Semantic.DeepEqual(again, patched) || len(res2.Patch) > 0 {
			t.Errorf("second run changed the pod (patch %v):\n%s", res2.Patch, lineDiff(mustYAML(t, patched), mustYAML(t, again)))
		}
		if res.Decision == DecisionInjected && res.Layout != nil && (res2.Decision != DecisionSkipped || res2.Reason != ReasonAlreadyInjected) {
			t.Errorf("second run: decision %s/%s, want Skipped/%s", res2.Decision, res2.Reason, ReasonAlreadyInjected)
		}
	})
}

// TestDecodePodMatchesFullDecode runs every golden case as the webhook does,
// from decodePod's partial pod, and as the offline command does, from the
// whole pod: a field Mutate reads that decodePod skips shows up here.
func TestDecodePodMatchesFullDecode(t *testing.T) {
	forEachGolden(t, func(t *testing.T, _ string, gc goldenCase) {
		raw, err := json.Marshal(gc.pod)
		if err != nil {
			t.Fatal(err)
		}
		slim, err := decodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		// The handler resolves the pod's claims from the partial pod too.
		fullIn, partIn := gc.input(t, gc.pod.DeepCopy()), gc.input(t, slim)
		fullIn.Seed, partIn.Seed = 7, 7
		full := Mutate(fullIn, gc.cfg)
		part := Mutate(partIn, gc.cfg)
		a, b := mustJSON(t, full.Patch), mustJSON(t, part.Patch)
		if full.Decision != part.Decision || full.Reason != part.Reason || !slices.Equal(full.Warnings, part.Warnings) || a != b {
			t.Errorf("decoded in part: %s/%s %q\n%s\nwhole pod: %s/%s %q\n%s", part.Decision, part.Reason, part.Warnings, b, full.Decision, full.Reason, full.Warnings, a)
		}
	})
}

func forEachGolden(t *testing.T, run func(t *testing.T, base string, gc goldenCase)) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, in := range inputs {
		base := strings.TrimSuffix(filepath.Base(in), ".yaml")
		if strings.HasPrefix(base, "nodes") {
			continue
		}
		seen[base] = true
		t.Run(base, func(t *testing.T) { run(t, base, loadCase(t, in)) })
	}
	goldens, _ := filepath.Glob("testdata/*.golden")
	for _, g := range goldens {
		if base := strings.TrimSuffix(filepath.Base(g), ".golden"); !seen[base] {
			t.Errorf("%s has no input %s.yaml: delete it or restore the input", g, base)
		}
	}
}

// patchBytes is the patch as the webhook sends it, which must be what
// json.Marshal makes of the operations, byte for byte.
func patchBytes(t *testing.T, ops []jsonpatch.Operation) []byte {
	t.Helper()
	b, err := MarshalPatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	if want := mustJSON(t, ops); string(b) != want {
		t.Fatalf("MarshalPatch differs from json.Marshal:\n got %s\nwant %s", b, want)
	}
	return b
}

// applyOps applies a patch to the pod's JSON, as the API server does.
func applyOps(t *testing.T, pod *corev1.Pod, ops []jsonpatch.Operation) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) > 0 {
		patch, err := jsonpatchv5.DecodePatch(patchBytes(t, ops))
		if err != nil {
			t.Fatalf("patch does not decode: %v", err)
		}
		if raw, err = patch.Apply(raw); err != nil {
			t.Fatalf("patch does not apply: %v\n%s", err, mustJSON(t, ops))
		}
	}
	out := &corev1.Pod{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertKeepsUnknownFields applies the patch to the pod's JSON with a field
// this build does not know in the spec, every container and the metadata,
// as a newer API server may send: each must come through untouched.
func assertKeepsUnknownFields(t *testing.T, pod *corev1.Pod, ops []jsonpatch.Operation) {
	t.Helper()
	if len(ops) == 0 {
		return
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	obj["metadata"].(map[string]any)["futureMeta"] = "m"
	spec := obj["spec"].(map[string]any)
	spec["futureField"] = map[string]any{"enabled": true}
	n := 0
	for _, list := range []string{"initContainers", "containers", "ephemeralContainers"} {
		cs, _ := spec[list].([]any)
		for _, c := range cs {
			c.(map[string]any)["futureContainerField"] = list
			n++
		}
	}
	if raw, err = json.Marshal(obj); err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatchv5.DecodePatch(patchBytes(t, ops))
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch does not apply with unknown fields: %v", err)
	}
	for _, want := range []string{`"futureMeta":"m"`, `"futureField":{"enabled":true}`} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("patched pod lost %s", want)
		}
	}
	if got := bytes.Count(out, []byte(`"futureContainerField"`)); got != n {
		t.Errorf("patched pod keeps %d of %d unknown container fields", got, n)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// assertHostPathsSafe checks the invariants every injected pod must keep,
// whatever the golden file says.
func assertHostPathsSafe(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ours := map[string]string{}
	prev, _ := previousInjection(pod)
	for _, v := range pod.Spec.Volumes {
		if prev == nil || !slices.Contains(prev.Volumes, v.Name) {
			continue
		}
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
			continue
		}
		p := v.HostPath.Path
		if p == "/" || p == "/etc" || strings.Contains(p, "..") || !strings.HasPrefix(p, "/") {
			t.Errorf("volume %s mounts forbidden host path %q", v.Name, p)
		}
		ours[v.Name] = p
	}
	for _, c := range allContainers(pod) {
		for _, vm := range c.VolumeMounts {
			if _, ok := ours[vm.Name]; ok && !vm.ReadOnly {
				t.Errorf("container %s mounts %s read-write", c.Name, vm.Name)
			}
		}
	}
}

func mustYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineDiff is a small line diff, enough to read a golden mismatch.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var x, y string
		if i < len(w) {
			x = w[i]
		}
		if i < len(g) {
			y = g[i]
		}
		if x != y {
			b.WriteString("- " + x + "\n+ " + y + "\n")
		}
	}
	return b.String()
}
