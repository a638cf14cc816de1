package inject_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
)

// fuzzWorld is what the golden cases hold, loaded once per fuzzing process:
// their configurations, namespace labels, and every node of the golden
// clusters (hostile ones included).
type fuzzWorld struct {
	cfgs     []*config.Configuration
	layouts  [][]*Layout // layouts[i] are the nodes' layouts under cfgs[i]
	nsLabels []map[string]string
	pods     [][]byte // JSON
	nodes    []corev1.Node
}

func loadFuzzWorld(tb testing.TB) *fuzzWorld {
	tb.Helper()
	w := &fuzzWorld{cfgs: []*config.Configuration{config.Default()}, nsLabels: []map[string]string{nil}}
	for _, f := range []string{"nodes.yaml", "nodes-hostile.yaml", "nodes-nri.yaml"} {
		w.nodes = append(w.nodes, gputest.LoadNodes(tb, filepath.Join("testdata", f))...)
	}
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	for _, in := range inputs {
		if strings.HasPrefix(filepath.Base(in), "nodes") {
			continue
		}
		data, err := os.ReadFile(in)
		if err != nil {
			tb.Fatal(err)
		}
		for _, doc := range gputest.SplitDocs(tb, data) {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				tb.Fatalf("%s: %v", in, err)
			}
			switch meta.Kind {
			case config.Kind:
				cfg, err := config.Parse(doc)
				if err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.cfgs = append(w.cfgs, cfg)
			case "Namespace":
				var ns corev1.Namespace
				if err := yaml.Unmarshal(doc, &ns); err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.nsLabels = append(w.nsLabels, ns.Labels)
			case "Pod":
				j, err := yaml.YAMLToJSON(doc)
				if err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.pods = append(w.pods, j)
			}
		}
	}
	for _, cfg := range w.cfgs {
		w.layouts = append(w.layouts, clustertest.LayoutsOf(cfg, w.nodes))
	}
	return w
}

// FuzzMutate feeds arbitrary Pods (as JSON, the webhook's input) to Mutate
// under each golden configuration and namespace, and checks what every
// mutation must keep: a denied or skipped pod is unchanged, every volume
// the mutation adds is a hostPath of the chosen layout inside the allowlist
// and mounted read-only wherever it is mounted, the pod's own volumes are
// untouched, and a second run changes nothing (a reinvocation, or the
// offline `gpu-injector mutate` run on its own output).
func FuzzMutate(f *testing.F) {
	w := loadFuzzWorld(f)
	for i, p := range w.pods {
		f.Add(p, uint8(i))
	}
	f.Add([]byte(`{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}},"volumeMounts":[{"name":"gpu-injector-x","mountPath":"/usr/local/nvidia/lib64"}]}],"volumes":[{"name":"gpu-injector-x","emptyDir":{}}]}}`), uint8(0))
	f.Add([]byte(`{"metadata":{"annotations":{"gpu-injector.io/injected":"{\"fingerprint\":\"x\",\"volumes\":[\"v\"]}"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"alpha.kubernetes.io/nvidia-gpu":"2","nvidia.com/gpu":"1"}},"volumeMounts":[{"name":"v","mountPath":"/data"}]}],"volumes":[{"name":"v","hostPath":{"path":"/"}}]}}`), uint8(1))
	f.Fuzz(func(t *testing.T, podJSON []byte, sel uint8) {
		var pod corev1.Pod
		if err := json.Unmarshal(podJSON, &pod); err != nil {
			return
		}
		i := int(sel) % len(w.cfgs)
		cfg, layouts := w.cfgs[i], w.layouts[i]
		ns := w.nsLabels[int(sel/16)%len(w.nsLabels)]
		gputest.CheckMutation(t, &pod, ns, layouts, cfg)
	})
}
