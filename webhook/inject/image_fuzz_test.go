package inject_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// FuzzImageLDLibraryPath: whatever an image's ENV says (a registry's answer
// is untrusted input), a hostPath injection ends with every driver folder on
// the container's LD_LIBRARY_PATH, keeps the image's own value first and
// whole, and writes nothing when the image already lists the folders.
func FuzzImageLDLibraryPath(f *testing.F) {
	f.Add("LD_LIBRARY_PATH=/opt/app/lib", "PATH=/usr/bin")
	f.Add("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64", "")
	f.Add("LD_LIBRARY_PATH=", "LD_LIBRARY_PATH=::")
	f.Add("LD_LIBRARY_PATH=$(X):/a", "LD_LIBRARY_PATH")
	f.Add("LD_LIBRARY_PATH=/a\n/b", "=LD_LIBRARY_PATH=/x")
	f.Add("NVIDIA_REQUIRE_CUDA=cuda>=12.4", "LD_LIBRARY_PATH=/a")
	f.Add("LD_LIBRARY_PATH=/"+strings.Repeat("a", MaxImageLDLibraryPath), "")
	cfg := config.Default()
	cfg.DriverDelivery = config.DeliveryHostPath
	p := gputest.Plan("535.104.05")
	nodes := []corev1.Node{*gputest.Node("gpu-0", p, 8, nil), *gputest.Node("gpu-1", p, 8, nil)}
	layouts := clustertest.LayoutsOf(cfg, nodes)
	f.Fuzz(func(t *testing.T, env1, env2 string) {
		pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "r.example/app:v1" })
		image := &ImageConfig{Env: []string{env1, env2}}
		res := Mutate(Input{Pod: pod, Layouts: layouts, Images: map[string]*ImageConfig{"r.example/app:v1": image}}, cfg)
		if res.Decision == DecisionDenied && strings.Contains(res.Reason, layout.AnnotationCUDARequirement) {
			return // the ENV requires a CUDA version these nodes do not publish
		}
		if res.Decision != DecisionInjected || res.Layout == nil {
			t.Fatalf("decision %s %s, want Injected", res.Decision, res.Reason)
		}
		libs := res.Layout.Plan.LibraryPaths
		own, _ := image.Getenv(EnvLDLibraryPath)
		if len(own) > MaxImageLDLibraryPath {
			own = "" // ignored, as no real image has one so long
		}
		var written *corev1.EnvVar
		for i, e := range pod.Spec.Containers[0].Env {
			if e.Name == EnvLDLibraryPath {
				written = &pod.Spec.Containers[0].Env[i]
			}
		}
		ownList := strings.Split(own, ":")
		listsAll := own != "" && !slices.ContainsFunc(libs, func(l string) bool { return !slices.Contains(ownList, l) })
		if listsAll {
			if written != nil {
				t.Fatalf("image lists every driver folder (%q), yet %q was written", own, written.Value)
			}
			return
		}
		if written == nil {
			t.Fatalf("no LD_LIBRARY_PATH written; image's %q, driver folders %q", own, libs)
		}
		got := strings.Split(written.Value, ":")
		for _, l := range libs {
			if !slices.Contains(got, l) {
				t.Errorf("LD_LIBRARY_PATH %q lacks %s", written.Value, l)
			}
		}
		if own != "" && !strings.HasPrefix(written.Value, own+":") {
			t.Errorf("LD_LIBRARY_PATH %q does not start with the image's %q", written.Value, own)
		}
	})
}

// FuzzCUDASteering: whatever an image requires (a registry's answer) and a
// pod's annotation say, the pod is injected with a layout whose nodes can
// run what its node-affinity term demands, or denied only when no node can.
func FuzzCUDASteering(f *testing.F) {
	f.Add("cuda>=12.4 brand=tesla,driver>=470", "")
	f.Add("cuda>=12.6", "")
	f.Add("cuda>=11.8", "cuda>=12.4")
	f.Add("cuda>=13.0", "none")
	f.Add("cuda>12.2.1", "twelve")
	f.Add("cuda>=99999999.9", "cuda>=.4")
	cfg := config.Default()
	nodes := gputest.LoadNodes(f, "testdata/nodes-cuda.yaml")
	layouts := clustertest.LayoutsOf(cfg, nodes)
	f.Fuzz(func(t *testing.T, require, annotation string) {
		pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
			p.Spec.Containers[0].Image = "r.example/app:v1"
			if annotation != "" {
				p.Annotations = map[string]string{layout.AnnotationCUDARequirement: annotation}
			}
		})
		image := &ImageConfig{Env: []string{"NVIDIA_REQUIRE_CUDA=" + require}}
		res := Mutate(Input{Pod: pod, Layouts: layouts, Images: map[string]*ImageConfig{"r.example/app:v1": image}}, cfg)
		gt := -1
		if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, e := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions {
				if e.Key == layout.LabelCUDADriverVersionNumber {
					gt, _ = strconv.Atoi(e.Values[0])
				}
			}
		}
		switch res.Decision {
		case DecisionDenied:
			if !strings.Contains(res.Reason, "CUDA") {
				t.Fatalf("denied: %s", res.Reason)
			}
			for _, n := range nodes {
				if v, _ := strconv.Atoi(n.Labels[layout.LabelCUDADriverVersionNumber]); v >= 12040 && !strings.Contains(res.Reason, "12.") {
					t.Fatalf("denied without naming the cluster's newest CUDA: %s", res.Reason)
				}
			}
		case DecisionInjected:
			if res.Layout == nil {
				t.Fatalf("injected without a layout")
			}
			for _, n := range res.Layout.Nodes {
				v, _ := strconv.Atoi(n.Labels.Get(layout.LabelCUDADriverVersionNumber))
				if gt >= 0 && v <= gt {
					t.Fatalf("pinned Gt %d, yet injected layout %s of node %s with %d", gt, res.Layout.Fingerprint, n.Name, v)
				}
			}
		default:
			t.Fatalf("decision %s %s", res.Decision, res.Reason)
		}
	})
}
