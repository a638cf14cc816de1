package mutate

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// onceNode writes what `gpu-injector nodeprobe --once -o format` prints on
// a node of the fake root layout name.
func onceNode(t *testing.T, name, format string) string {
	t.Helper()
	root := t.TempDir()
	if _, err := fakeroot.Build(root, name); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o := nodeprobe.Options{NodeName: "gpu-1", Log: logr.Discard(),
		Probe: nodeprobe.ProbeOptions{HostRoot: root, NVMLLibrary: filepath.Join(root, "no-nvml-on-this-machine")}}
	if err := nodeprobe.Once(o, format, &out); err != nil {
		t.Fatalf("nodeprobe --once: %v\n%s", err, out.String())
	}
	f := filepath.Join(t.TempDir(), "node."+format)
	if err := os.WriteFile(f, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestNodeProbeOnceOutput: `gpu-injector nodeprobe --once` output, YAML or
// JSON, is read as it is; its Node has no Ready condition, so the webhook
// would take no layout from it, and mutate names that as the reason, not
// that the node publishes no usable layout. With the kubelet's Ready
// condition added, as `kubectl get node` shows it, the node's layout is
// injected.
func TestNodeProbeOnceOutput(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			nodes := onceNode(t, "ubuntu1604-nvidia384", format)
			var out, stderr bytes.Buffer
			err := Run(Options{File: "-", NodeFiles: []string{nodes}, Config: hostPathOnly()}, strings.NewReader(pod), &out, &stderr)
			if !errors.Is(err, ErrDenied) {
				t.Fatalf("err = %v, want a denial: no Ready node\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), "warning: node gpu-1 has no Ready condition: ") {
				t.Errorf("stderr does not name the missing Ready condition:\n%s", stderr.String())
			}
			if strings.Contains(stderr.String(), "publishes a usable layout") {
				t.Errorf("stderr says no node publishes a usable layout:\n%s", stderr.String())
			}

			var c offline.Cluster
			if err := c.AddFile(nodes, nil); err != nil {
				t.Fatal(err)
			}
			n := c.Nodes[0]
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue})
			b, err := yaml.Marshal(n)
			if err != nil {
				t.Fatal(err)
			}
			ready := filepath.Join(t.TempDir(), "ready.yaml")
			if err := os.WriteFile(ready, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			stderr.Reset()
			if err := Run(Options{File: "-", NodeFiles: []string{ready}, Config: hostPathOnly()}, strings.NewReader(pod), &out, &stderr); err != nil {
				t.Fatalf("mutate with the node Ready: %v\n%s", err, stderr.String())
			}
			if !strings.Contains(out.String(), layout.LabelFingerprint+": "+n.Labels[layout.LabelFingerprint]) || strings.Contains(stderr.String(), "Ready condition") {
				t.Errorf("the Ready node's layout is not injected:\n%s\n%s", out.String(), stderr.String())
			}
		})
	}
}

// TestDeclaredPoolFromNodeprobeOnce: the layout `gpu-injector nodeprobe
// --once -o layout` prints on a machine of a pool's node image, declared in
// pinning.pools, serves the first pod of a HostPath cluster whose GPU pools
// are all at zero: injected with that layout, pinned by the pool's labels,
// which the autoscaler knows, and warned. A pod for a pool nobody declared
// is still denied.
func TestDeclaredPoolFromNodeprobeOnce(t *testing.T) {
	text, err := os.ReadFile(onceNode(t, "ubuntu1604-nvidia384", "layout"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := layout.Decode(strings.TrimSpace(string(text))); err != nil {
		t.Fatalf("-o layout printed no layout: %v\n%s", err, text)
	}
	cfg := hostPathOnly()
	cfg.Pinning.NodeLabels = []string{"karpenter.sh/nodepool"}
	cfg.Pinning.Pools = []config.DeclaredPool{{
		Pool:   map[string]string{"karpenter.sh/nodepool": "gpu-k80"},
		Taints: []config.PoolTaint{{Key: "nvidia.com/gpu", Effect: "NoSchedule"}},
		Layout: strings.TrimSpace(string(text)),
	}}
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	pod := func(pool string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ml}\nspec:\n  nodeSelector: {karpenter.sh/nodepool: " + pool + "}\n" +
			"  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n" +
			"  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
	}
	nodes := filepath.Join("testdata", "cpu-nodes.yaml")
	var out, stderr bytes.Buffer
	if err := Run(Options{File: "-", NodeFiles: []string{nodes}, Config: cfg}, strings.NewReader(pod("gpu-k80")), &out, &stderr); err != nil {
		t.Fatalf("the declared pool's pod: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"path: /usr/lib/nvidia-384/bin", "karpenter.sh/nodepool: gpu-k80", `"remembered":true`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the declared pool's pod lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), layout.LabelFingerprint) {
		t.Errorf("the declared pool's pod is pinned by fingerprint, which no autoscaler can create a node for:\n%s", out.String())
	}
	if !strings.Contains(stderr.String(), "pool karpenter.sh/nodepool=gpu-k80 has no ready node; injected the layout pinning.pools declares for it (driver 384.130)") {
		t.Errorf("no warning names the declaration:\n%s", stderr.String())
	}
	out.Reset()
	stderr.Reset()
	if err := Run(Options{File: "-", NodeFiles: []string{nodes}, Config: cfg}, strings.NewReader(pod("gpu-a100")), &out, &stderr); !errors.Is(err, ErrDenied) {
		t.Errorf("a pod for a pool nobody declared: err = %v, want a denial\n%s", err, stderr.String())
	}
}
