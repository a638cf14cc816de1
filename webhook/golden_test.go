package webhook

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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
}

// goldenResult is what testdata/X.golden holds.
type goldenResult struct {
	Decision Decision    `json:"decision"`
	Reason   string      `json:"reason,omitempty"`
	Layout   string      `json:"layout,omitempty"`
	Warnings []string    `json:"warnings,omitempty"`
	Pod      *corev1.Pod `json:"pod"`
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
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("failed to parse %s: %v", file, err)
		}
		switch {
		case meta.NodesFile != "":
			gc.nodesFile = meta.NodesFile
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
	return gc
}

func layoutsOf(cfg *config.Configuration, nodes []corev1.Node) []*Layout {
	idx := NewIndex(cfg, logr.Discard())
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	return idx.Layouts()
}

// TestGolden runs every testdata/*.yaml through Mutate and compares with its
// .golden twin (REFRESH_GOLDEN=true rewrites them), then runs Mutate again on
// the result to prove a reinvocation changes nothing.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	refresh := os.Getenv("REFRESH_GOLDEN") == "true"
	seen := map[string]bool{}
	for _, in := range inputs {
		base := strings.TrimSuffix(filepath.Base(in), ".yaml")
		if strings.HasPrefix(base, "nodes") {
			continue
		}
		seen[base] = true
		t.Run(base, func(t *testing.T) {
			gc := loadCase(t, in)
			layouts := layoutsOf(gc.cfg, gc.nodes)
			pod := gc.pod.DeepCopy()
			res := Mutate(Input{Pod: pod, NamespaceLabels: gc.nsLabels, Layouts: layouts}, gc.cfg)
			got := goldenResult{Decision: res.Decision, Reason: res.Reason, Warnings: res.Warnings, Pod: pod}
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
			assertHostPathsSafe(t, pod)

			again := pod.DeepCopy()
			res2 := Mutate(Input{Pod: again, NamespaceLabels: gc.nsLabels, Layouts: layouts}, gc.cfg)
			if !apiequality.Semantic.DeepEqual(again, pod) {
				t.Errorf("second run changed the pod:\n%s", lineDiff(mustYAML(t, pod), mustYAML(t, again)))
			}
			if res.Decision == DecisionInjected && res.Layout != nil && (res2.Decision != DecisionSkipped || res2.Reason != ReasonAlreadyInjected) {
				t.Errorf("second run: decision %s/%s, want Skipped/%s", res2.Decision, res2.Reason, ReasonAlreadyInjected)
			}
		})
	}
	goldens, _ := filepath.Glob("testdata/*.golden")
	for _, g := range goldens {
		if base := strings.TrimSuffix(filepath.Base(g), ".golden"); !seen[base] {
			t.Errorf("%s has no input %s.yaml: delete it or restore the input", g, base)
		}
	}
}

// assertHostPathsSafe checks the invariants every injected pod must keep,
// whatever the golden file says.
func assertHostPathsSafe(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ours := map[string]string{}
	prev := previousInjection(pod)
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
