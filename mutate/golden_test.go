package mutate

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
)

// goldenCase is one testdata/golden/X.yaml, the manifests given with -f,
// and the cluster and configuration it is mutated against.
type goldenCase struct {
	// nodes are the --nodes files, relative to testdata.
	nodes []string
	// config is the --config file, relative to testdata; empty: defaults.
	config string
}

// goldenCases are the cases of testdata/golden.
var goldenCases = map[string]goldenCase{
	// A Namespace that enforces baseline, in the same file as its Job:
	// hostPath delivery on nodes without the NRI plugin, and the webhook's
	// warning that the API server will refuse the pod.
	"namespace-baseline-warn": {nodes: []string{"../../webhook/inject/testdata/nodes.yaml"}},
	// The same with podSecurity: Deny: the webhook's denial.
	"namespace-baseline-deny": {nodes: []string{"../../webhook/inject/testdata/nodes.yaml"}, config: "pod-security-deny.yaml"},
	// A v1 List of a baseline Namespace and a Deployment for nodes that all
	// run the NRI plugin: delivered at the runtime, no hostPath.
	"namespace-baseline-runtime": {nodes: []string{"../../webhook/inject/testdata/nodes-nri.yaml"}},
	// The Namespace in a file of the cluster, as `kubectl get namespaces -o
	// yaml` prints it.
	"namespace-in-nodes-file": {nodes: []string{"../../webhook/inject/testdata/nodes.yaml", "namespace-baseline.yaml"}, config: "pod-security-deny.yaml"},
	// `gpu-injector nodeprobe --once` output as the cluster: the node has
	// no Ready condition, and says so.
	"nodeprobe-once": {nodes: []string{"nodeprobe-once.yaml"}, config: "hostpath-delivery.yaml"},
}

// goldenResult is what testdata/golden/X.golden holds.
type goldenResult struct {
	Error  string `json:"error,omitempty"`
	Stderr string `json:"stderr"`
	Stdout string `json:"stdout"`
}

// TestGolden runs `gpu-injector mutate` over every case of testdata/golden
// and compares stdout, stderr and the error with its .golden twin
// (REFRESH_GOLDEN=true rewrites them); mutating the output again changes
// nothing. A golden file or an input without its case fails.
func TestGolden(t *testing.T) {
	refresh := os.Getenv("REFRESH_GOLDEN") == "true"
	for name, gc := range goldenCases {
		t.Run(name, func(t *testing.T) {
			opts := Options{File: filepath.Join("testdata", "golden", name+".yaml"), Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC))}
			for _, n := range gc.nodes {
				opts.NodeFiles = append(opts.NodeFiles, filepath.Join("testdata", n))
			}
			if gc.config != "" {
				cfg, err := config.Load(filepath.Join("testdata", gc.config))
				if err != nil {
					t.Fatal(err)
				}
				opts.Config = cfg
			}
			var out, errb bytes.Buffer
			err := Run(opts, nil, &out, &errb)
			got := goldenResult{Stdout: out.String(), Stderr: errb.String()}
			if err != nil {
				got.Error = err.Error()
			}
			b, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "golden", name+".golden")
			if refresh {
				if err := os.WriteFile(file, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("failed to read the golden file (REFRESH_GOLDEN=true creates it): %v", err)
			}
			if !bytes.Equal(b, want) {
				t.Errorf("mutate differs from %s (REFRESH_GOLDEN=true to accept):\n%s", file, lineDiff(string(want), string(b)))
			}
			if got.Error == "" {
				again := opts
				again.File = "-"
				var out2, errb2 bytes.Buffer
				if err := Run(again, strings.NewReader(got.Stdout), &out2, &errb2); err != nil || out2.String() != got.Stdout {
					t.Errorf("a second run: %v, changed %v\n%s", err, out2.String() != got.Stdout, errb2.String())
				}
			}
		})
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*"))
	for _, f := range files {
		base := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(f), ".golden"), ".yaml")
		if _, ok := goldenCases[base]; !ok {
			t.Errorf("%s belongs to no case of goldenCases: add the case or delete it", f)
		}
	}
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
