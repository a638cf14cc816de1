// Package clustertest builds the clusters the webhook's tests run against,
// through the node index as the webhook builds them: the injection's golden
// cases (inject/testdata: a Pod and the cluster it is admitted to), and the
// 5,000-node clusters of the benchmarks. Tests of the injection and of the
// admission server run the same cases.
package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// Case is one testdata/X.yaml: a Pod, and optionally an
// InjectorConfiguration, a Namespace, Nodes, or a {nodesFile: F} line that
// replaces the default cluster of testdata/nodes.yaml.
type Case struct {
	Pod             *corev1.Pod
	Config          *config.Configuration
	NamespaceLabels map[string]string
	Nodes           []corev1.Node
	nodesFile       string
	// Memory is the data of the remembered pools' ConfigMap, if the case has one.
	Memory map[string]string
	// DRA are DRA objects (ResourceSlices, DeviceClasses, claims and claim
	// templates), from the case and from its {draFile: F} line.
	DRA     []any
	draFile string
	// Images are what a registry says of images, from the case's
	// ImageConfig documents ({kind: ImageConfig, image, env, labels}).
	Images map[string]*inject.ImageConfig
	// ImagesUnread are the images a registry did not answer for, from the
	// case's ImageUnread documents ({kind: ImageUnread, image, reason}).
	ImagesUnread []layout.ImageUnread
}

// imageUnreadDoc is a golden case's stand-in for a registry that did not
// answer.
type imageUnreadDoc struct {
	Kind   string `json:"kind"`
	Image  string `json:"image"`
	Reason string `json:"reason"`
}

// imageConfigDoc is a golden case's stand-in for a registry's answer.
type imageConfigDoc struct {
	Kind   string            `json:"kind"`
	Image  string            `json:"image"`
	Env    []string          `json:"env"`
	Labels map[string]string `json:"labels"`
}

func loadCase(t *testing.T, dir, file string) Case {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	gc := Case{Config: config.Default(), nodesFile: "nodes.yaml"}
	for _, doc := range gputest.SplitDocs(t, data) {
		var meta struct {
			Kind      string `json:"kind"`
			NodesFile string `json:"nodesFile"`
			DRAFile   string `json:"draFile"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("failed to parse %s: %v", file, err)
		}
		if obj, ok := decodeDRA(t, meta.Kind, doc); ok {
			gc.DRA = append(gc.DRA, obj)
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
			if gc.Config, err = config.Parse(doc); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		case meta.Kind == "Namespace":
			var ns corev1.Namespace
			if err := yaml.UnmarshalStrict(doc, &ns); err != nil {
				t.Fatal(err)
			}
			gc.NamespaceLabels = ns.Labels
		case meta.Kind == "Node":
			var n corev1.Node
			if err := yaml.UnmarshalStrict(doc, &n); err != nil {
				t.Fatal(err)
			}
			gc.Nodes = append(gc.Nodes, n)
		case meta.Kind == "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
				t.Fatal(err)
			}
			gc.Memory = cm.Data
		case meta.Kind == "ImageConfig":
			var ic imageConfigDoc
			if err := yaml.UnmarshalStrict(doc, &ic); err != nil {
				t.Fatalf("failed to parse ImageConfig in %s: %v", file, err)
			}
			if gc.Images == nil {
				gc.Images = map[string]*inject.ImageConfig{}
			}
			gc.Images[ic.Image] = &inject.ImageConfig{Env: ic.Env, Labels: ic.Labels}
		case meta.Kind == "ImageUnread":
			var iu imageUnreadDoc
			if err := yaml.UnmarshalStrict(doc, &iu); err != nil {
				t.Fatalf("failed to parse ImageUnread in %s: %v", file, err)
			}
			gc.ImagesUnread = append(gc.ImagesUnread, layout.ImageUnread{Image: iu.Image, Reason: iu.Reason})
		case meta.Kind == "Pod":
			gc.Pod = &corev1.Pod{}
			if err := yaml.UnmarshalStrict(doc, gc.Pod); err != nil {
				t.Fatalf("failed to parse pod in %s: %v", file, err)
			}
		default:
			t.Fatalf("%s: unexpected document of kind %q", file, meta.Kind)
		}
	}
	if gc.Pod == nil {
		t.Fatalf("%s: no Pod", file)
	}
	if gc.Nodes == nil {
		gc.Nodes = gputest.LoadNodes(t, filepath.Join(dir, gc.nodesFile))
	}
	if gc.draFile != "" {
		data, err := os.ReadFile(filepath.Join(dir, gc.draFile))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range gputest.SplitDocs(t, data) {
			var meta struct {
				Kind string `json:"kind"`
			}
			_ = yaml.Unmarshal(doc, &meta)
			obj, ok := decodeDRA(t, meta.Kind, doc)
			if !ok {
				t.Fatalf("%s: unexpected document of kind %q", gc.draFile, meta.Kind)
			}
			gc.DRA = append(gc.DRA, obj)
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

// Input builds the mutation's input as the webhook does, through its
// builder: layouts from the nodes, counted with the case's ResourceSlices,
// the pool memory, the DRA facts, the namespace's labels and what the
// case's registry says of the images.
func (gc Case) Input(t *testing.T, pod *corev1.Pod) inject.Input {
	t.Helper()
	idx, d := gc.Sources(t)
	// The case gives what a registry said of its images: they are read as
	// with images.mode On, whatever its configuration says of reading.
	cfg := *gc.Config
	cfg.Images.Mode = config.ImagesOn
	cfg.Images.Namespaces = nil
	b := admitinput.Builder{Config: &cfg, Layouts: idx, Namespaces: caseNamespace(gc.NamespaceLabels), DRA: d, Images: caseImages(gc)}
	in, _ := b.Build(context.Background(), pod, pod.Namespace, "")
	// No request names a case: every case chooses with the seed 0.
	in.Seed = 0
	return in
}

// caseNamespace is the case's Namespace, whatever the pod's namespace.
type caseNamespace map[string]string

func (c caseNamespace) NamespaceLabels(context.Context, string) (map[string]string, error) {
	return c, nil
}

// caseImages is the case's registry: the images of its ImageConfig
// documents, and the answers of its ImageUnread documents.
type caseImages Case

func (c caseImages) Read(_ context.Context, image string, _ imageconfig.Credentials) (*imageconfig.Facts, error) {
	if ic, ok := c.Images[image]; ok {
		return &imageconfig.Facts{Env: ic.Env, Labels: ic.Labels}, nil
	}
	for _, u := range c.ImagesUnread {
		if u.Image == image {
			return nil, &imageconfig.Error{Image: image, Err: errors.New(u.Reason)}
		}
	}
	return nil, &imageconfig.Error{Image: image, Err: imageconfig.ErrNotListed}
}

// Sources are the case's node index and DRA objects.
func (gc Case) Sources(t *testing.T) (*gpunodes.Index, *gpunodes.DRA) {
	t.Helper()
	idx := gpunodes.NewIndex(gc.Config, logr.Discard())
	idx.SetClock(clocktesting.NewFakePassiveClock(Now))
	if gc.Memory != nil {
		mem, errs := pools.DecodeMemory(gc.Memory, gc.Config.Pinning.NodeLabels, gc.Config.Rules(), Now)
		if len(errs) > 0 {
			t.Fatalf("bad memory in the case: %v", errs)
		}
		idx.SetMemory(mem)
	}
	d := gpunodes.NewDRA(gc.Config, idx, nil, logr.Discard())
	for _, o := range gc.DRA {
		d.Add(o)
	}
	for i := range gc.Nodes {
		idx.Update(&gc.Nodes[i])
	}
	return idx, d
}

// LayoutsOf are the layouts the node index builds of nodes.
func LayoutsOf(cfg *config.Configuration, nodes []corev1.Node) []*inject.Layout {
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	return idx.Layouts()
}

// Now is the golden tests' clock, against which a case's remembered
// pools are aged.
var Now = time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)

// ForEach runs every case of dir (the injection's testdata folder) as a
// subtest, and fails on a golden file whose input is gone.
func ForEach(t *testing.T, dir string, run func(t *testing.T, base string, gc Case)) {
	inputs, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
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
		t.Run(base, func(t *testing.T) { run(t, base, loadCase(t, dir, in)) })
	}
	goldens, _ := filepath.Glob(filepath.Join(dir, "*.golden"))
	for _, g := range goldens {
		if base := strings.TrimSuffix(filepath.Base(g), ".golden"); !seen[base] {
			t.Errorf("%s has no input %s.yaml: delete it or restore the input", g, base)
		}
	}
}

// PatchBytes is the patch as the webhook sends it: controller-runtime
// encodes the operations with json.Marshal.
func PatchBytes(t *testing.T, ops []jsonpatch.Operation) []byte {
	t.Helper()
	return []byte(MustJSON(t, ops))
}

// ApplyOps applies a patch to the pod's JSON, as the API server does.
func ApplyOps(t *testing.T, pod *corev1.Pod, ops []jsonpatch.Operation) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) > 0 {
		patch, err := jsonpatchv5.DecodePatch(PatchBytes(t, ops))
		if err != nil {
			t.Fatalf("patch does not decode: %v", err)
		}
		if raw, err = patch.Apply(raw); err != nil {
			t.Fatalf("patch does not apply: %v\n%s", err, MustJSON(t, ops))
		}
	}
	out := &corev1.Pod{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// AssertKeepsUnknownFields applies the patch to the pod's JSON with a field
// this build does not know in the spec, every container and the metadata,
// as a newer API server may send: each must come through untouched.
func AssertKeepsUnknownFields(t *testing.T, pod *corev1.Pod, ops []jsonpatch.Operation) {
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
	patch, err := jsonpatchv5.DecodePatch(PatchBytes(t, ops))
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

// MustJSON is v as JSON.
func MustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// AssertHostPathsSafe checks the invariants every injected pod must keep,
// whatever the golden file says.
func AssertHostPathsSafe(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ours := map[string]string{}
	prev, _ := inject.PreviousInjection(pod)
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
	for _, c := range inject.AllContainers(pod) {
		for _, vm := range c.VolumeMounts {
			if _, ok := ours[vm.Name]; ok && !vm.ReadOnly {
				t.Errorf("container %s mounts %s read-write", c.Name, vm.Name)
			}
		}
	}
}

// MustYAML is v as YAML.
func MustYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// LineDiff is a small line diff, enough to read a golden mismatch.
func LineDiff(want, got string) string {
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
