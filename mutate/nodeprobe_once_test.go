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
