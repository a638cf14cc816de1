package inject_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-injector/gpu-injector/config"
)

// TestDefaultGPUResources: the default names are what NVIDIA's device plugin
// advertises, and nothing that only shares a prefix with them.
func TestDefaultGPUResources(t *testing.T) {
	tests := map[string]bool{
		"nvidia.com/gpu":                 true,
		"nvidia.com/gpu.shared":          true,
		"nvidia.com/mig-1g.10gb":         true,
		"nvidia.com/mig-3g.40gb.shared":  true,
		"nvidia.com/mig-1g.5gb+me":       true,
		"alpha.kubernetes.io/nvidia-gpu": true,
		"nvidia.com/migration":           false,
		"nvidia.com/gpu.other":           false,
		"nvidia.com/gpus":                false,
		"example.com/fpga":               false,
		"cpu":                            false,
	}
	cfg := config.Default()
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			if got := cfg.IsGPUResource(name); got != want {
				t.Errorf("IsGPUResource(%s) = %v, want %v", name, got, want)
			}
		})
	}
}

// gkeLayouts are the golden cluster's GKE nodes alone: every GPU node is
// tainted nvidia.com/gpu=present:NoSchedule.
func gkeLayouts(t *testing.T, cfg *config.Configuration) []*Layout {
	t.Helper()
	var gke []corev1.Node
	for _, n := range gputest.LoadNodes(t, "testdata/nodes.yaml") {
		if strings.HasPrefix(n.Name, "gpu-gke-") {
			gke = append(gke, n)
		}
	}
	if len(gke) != 2 {
		t.Fatalf("found %d GKE nodes in testdata/nodes.yaml, want 2", len(gke))
	}
	return clustertest.LayoutsOf(cfg, gke)
}

// TestRenameToleration: a renamed legacy pod gets the toleration the
// ExtendedResourceToleration admission plugin gives a pod that requests
// nvidia.com/gpu, unless one it has already covers it; with renameToleration
// None it gets none and is denied on a tainted pool, with the fix named.
func TestRenameToleration(t *testing.T) {
	gpu := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	tests := map[string]struct {
		have    []corev1.Toleration
		none    bool
		added   bool
		decided Decision
	}{
		"no tolerations":                   {added: true, decided: DecisionInjected},
		"the plugin's own":                 {have: []corev1.Toleration{gpu}, decided: DecisionInjected},
		"the key, every effect":            {have: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}}, decided: DecisionInjected},
		"every taint":                      {have: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, decided: DecisionInjected},
		"the key with GKE's value":         {have: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpEqual, Value: "present", Effect: corev1.TaintEffectNoSchedule}}, added: true, decided: DecisionInjected},
		"the key, NoExecute only":          {have: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}, added: true, decided: DecisionInjected},
		"another key":                      {have: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}, added: true, decided: DecisionInjected},
		"renameToleration None":            {none: true, decided: DecisionDenied},
		"renameToleration None, tolerated": {none: true, have: []corev1.Toleration{gpu}, decided: DecisionInjected},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			// hostPath only: the denial that names the taint is the hostPath decision's.
			cfg.DriverDelivery = config.DeliveryHostPath
			if tc.none {
				cfg.Resources.RenameToleration = config.RenameTolerationNone
			}
			pod := gputest.Pod("alpha.kubernetes.io/nvidia-gpu", func(p *corev1.Pod) { p.Namespace = "ml"; p.Spec.Tolerations = slices.Clone(tc.have) })
			before := pod.DeepCopy()
			res := Mutate(Input{Pod: pod, Layouts: gkeLayouts(t, cfg)}, cfg)
			if res.Decision != tc.decided {
				t.Fatalf("decision %s (%s), want %s", res.Decision, res.Reason, tc.decided)
			}
			if res.Decision == DecisionDenied {
				// The admission plugin would not help: it saw the legacy name.
				for _, want := range []string{"nodes have taint nvidia.com/gpu=present:NoSchedule the pod does not tolerate", "add the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule} to the pod, or have gpu-injector add it to pods whose legacy resource it renames (resources.renameToleration: Add in its configuration)"} {
					if !strings.Contains(res.Reason, want) {
						t.Errorf("denial lacks %q:\n%s", want, res.Reason)
					}
				}
				return
			}
			gputest.CheckPatch(t, before, pod, res.Patch)
			want := slices.Clone(tc.have)
			if tc.added {
				want = append(want, gpu)
			}
			if !apiequality.Semantic.DeepEqual(pod.Spec.Tolerations, want) {
				t.Errorf("tolerations = %+v, want %+v", pod.Spec.Tolerations, want)
			}
			if mentions := strings.Contains(strings.Join(res.Warnings, "\n"), "added the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}"); mentions != tc.added {
				t.Errorf("the rename warning mentions the toleration: %v, want %v: %q", mentions, tc.added, res.Warnings)
			}
		})
	}
}

// TestUntoleratedTaintFix: a denial names the taint and the toleration that
// fixes it; the admission plugin only where it would add that toleration.
func TestUntoleratedTaintFix(t *testing.T) {
	tests := map[string]struct {
		resource string
		taint    corev1.Taint
		want     string
	}{
		"the GPU taint of a GPU pod": {
			resource: "nvidia.com/gpu", taint: corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
			want: "nodes have taint nvidia.com/gpu=present:NoSchedule the pod does not tolerate (add the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule} to the pod, or enable the API server's ExtendedResourceToleration admission plugin, which adds it to pods that request nvidia.com/gpu)",
		},
		"a MIG taint of a MIG pod": {
			resource: "nvidia.com/mig-1g.10gb", taint: corev1.Taint{Key: "nvidia.com/mig-1g.10gb", Effect: corev1.TaintEffectNoSchedule},
			want: "nodes have taint nvidia.com/mig-1g.10gb:NoSchedule the pod does not tolerate (add the toleration {key: nvidia.com/mig-1g.10gb, operator: Exists, effect: NoSchedule} to the pod, or enable the API server's ExtendedResourceToleration admission plugin, which adds it to pods that request nvidia.com/mig-1g.10gb)",
		},
		"the GPU taint of a shared-GPU pod": {
			resource: "nvidia.com/gpu.shared", taint: corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
			want: "nodes have taint nvidia.com/gpu=present:NoSchedule the pod does not tolerate (add the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule} to the pod)",
		},
		"a NoExecute GPU taint": {
			resource: "nvidia.com/gpu", taint: corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoExecute},
			want: "nodes have taint nvidia.com/gpu:NoExecute the pod does not tolerate (add the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoExecute} to the pod)",
		},
		"a taint of another kind": {
			resource: "nvidia.com/gpu", taint: corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule},
			want: "nodes have taint dedicated=ml:NoSchedule the pod does not tolerate (add the toleration {key: dedicated, operator: Exists, effect: NoSchedule} to the pod)",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			node := gputest.Node("n1", gputest.Plan("535.104.05"), 4, func(n *corev1.Node) {
				n.Spec.Taints = []corev1.Taint{tc.taint}
				// The node offers what the pod requests: only the taint is in the way.
				n.Status.Allocatable[corev1.ResourceName(tc.resource)] = resource.MustParse("4")
			})
			cfg := config.Default()
			cfg.DriverDelivery = config.DeliveryHostPath
			pod := gputest.Pod(tc.resource, func(p *corev1.Pod) { p.Namespace = "ml" })
			res := Mutate(Input{Pod: pod, Layouts: clustertest.LayoutsOf(cfg, []corev1.Node{*node})}, cfg)
			if res.Decision != DecisionDenied || !strings.Contains(res.Reason, tc.want) {
				t.Errorf("got %s:\n%s\nwant it to contain\n%s", res.Decision, res.Reason, tc.want)
			}
		})
	}
}

// TestRemoveLibraryDirs: an earlier injection's folders leave LD_LIBRARY_PATH,
// but for those the next layout puts there again; the user's stay, and a
// variable left with nothing of the user's goes.
func TestRemoveLibraryDirs(t *testing.T) {
	lib := "/usr/local/nvidia/lib64"
	tests := map[string]struct {
		value, want string
		keep        []string
		removed     bool
	}{
		"the next layout's folder too":    {value: "/opt/conda/lib:" + lib, keep: []string{lib}, want: "/opt/conda/lib:" + lib},
		"no folder next (runtime)":        {value: "/opt/conda/lib:" + lib, want: "/opt/conda/lib"},
		"prepended":                       {value: lib + ":/opt/conda/lib", want: "/opt/conda/lib"},
		"only ours":                       {value: lib, removed: true},
		"only ours, after envFrom's":      {value: "$(LD_LIBRARY_PATH):" + lib, removed: true},
		"a folder below a mounted one":    {value: lib + "/vdpau:/opt/lib", want: "/opt/lib"},
		"a folder that only starts alike": {value: lib + "-old:/opt/lib", want: lib + "-old:/opt/lib"},
		"none of ours":                    {value: "/opt/lib", want: "/opt/lib"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: EnvLDLibraryPath, Value: tc.value}}
			})
			before := pod.DeepCopy()
			ops := RemoveLibraryDirs(pod, 0, []string{lib}, tc.keep)
			gputest.CheckPatch(t, before, pod, ops)
			env := pod.Spec.Containers[0].Env
			switch {
			case tc.removed:
				if len(env) != 1 || env[0].Name != "A" {
					t.Errorf("env = %+v, want LD_LIBRARY_PATH removed", env)
				}
			case len(env) != 2 || env[1].Value != tc.want:
				t.Errorf("env = %+v, want LD_LIBRARY_PATH=%s", env, tc.want)
			case tc.want == tc.value && len(ops) > 0:
				t.Errorf("unchanged value, yet %d patch operations", len(ops))
			}
		})
	}
}

// TestReinjectTouchesOnlyItsOwn: a stale injection's volume goes from every
// container that mounts it, a sidecar's included (the volume goes); the
// user's own volume named like gpu-injector's but not in the record, their
// LD_LIBRARY_PATH under ldLibraryPath: Off, and their selectors stay.
func TestReinjectTouchesOnlyItsOwn(t *testing.T) {
	cfg := config.Default()
	cfg.LDLibraryPath = config.LDLibraryPathOff
	ro := func(name, at string) corev1.VolumeMount {
		return corev1.VolumeMount{Name: name, MountPath: at, ReadOnly: true}
	}
	host := func(name, p string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}}
	}
	pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
		p.Namespace = "ml"
		p.Annotations = map[string]string{"gpu-injector.io/injected": `{"fingerprint":"aaaaaaaaaaaaaaaaaaaa","driverVersion":"470.57.02","containers":["cuda"],"volumes":["gpu-injector-old"]}`}
		p.Spec.NodeSelector = map[string]string{"accelerator": "nvidia-tesla-k80", "gpu-injector.io/layout-fingerprint": "aaaaaaaaaaaaaaaaaaaa"}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: EnvLDLibraryPath, Value: "/usr/local/nvidia/lib64"}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{ro("gpu-injector-old", "/usr/local/nvidia/lib64"), ro("gpu-injector-mine", "/opt/mine")}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "profiler", VolumeMounts: []corev1.VolumeMount{ro("gpu-injector-old", "/driver")}})
		p.Spec.Volumes = []corev1.Volume{host("gpu-injector-old", "/usr/lib/nvidia-470"), host("gpu-injector-mine", "/opt/mine")}
	})
	before := pod.DeepCopy()
	res := Mutate(Input{Pod: pod, Layouts: clustertest.LayoutsOf(cfg, gputest.LoadNodes(t, "testdata/nodes.yaml"))}, cfg)
	if res.Decision != DecisionInjected || res.Layout == nil || res.Layout.Fingerprint != "03b3b0fb0c0413aeadfa" {
		t.Fatalf("decision %s %q, layout %v: want re-injected with the K80 nodes' layout", res.Decision, res.Reason, res.Layout)
	}
	gputest.CheckPatch(t, before, pod, res.Patch)
	var names []string
	for _, v := range pod.Spec.Volumes {
		names = append(names, v.Name)
	}
	if slices.Contains(names, "gpu-injector-old") || !slices.Contains(names, "gpu-injector-mine") {
		t.Errorf("volumes = %v, want the stale one gone and the user's kept", names)
	}
	for _, c := range pod.Spec.Containers {
		for _, vm := range c.VolumeMounts {
			if vm.Name == "gpu-injector-old" {
				t.Errorf("container %s still mounts the stale volume", c.Name)
			}
		}
	}
	if env := pod.Spec.Containers[0].Env; len(env) != 1 || env[0].Value != "/usr/local/nvidia/lib64" {
		t.Errorf("env = %+v, want LD_LIBRARY_PATH untouched under ldLibraryPath: Off", env)
	}
	if want := map[string]string{"accelerator": "nvidia-tesla-k80", "gpu-injector.io/layout-fingerprint": "03b3b0fb0c0413aeadfa"}; !apiequality.Semantic.DeepEqual(pod.Spec.NodeSelector, want) {
		t.Errorf("nodeSelector = %v, want %v", pod.Spec.NodeSelector, want)
	}
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, "470.57.02") || !strings.Contains(w, "re-injected with driver 384.130") {
		t.Errorf("warnings do not name both drivers: %q", res.Warnings)
	}
}

// TestWedgedWhy: a denial names at most a few wedged nodes with their
// reasons and counts the rest, and names only nodes the pod could use.
func TestWedgedWhy(t *testing.T) {
	var wedged []*WedgedNode
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		wedged = append(wedged, &WedgedNode{Node: &NodeInfo{Name: name, Labels: NewLabels(map[string]string{"pool": "x"})}, Reason: "DriverWedged: " + name})
	}
	pod := &corev1.Pod{}
	got := WedgedWhy(pod, wedged)
	want := "nodes a, b, c and 2 more fit the pod but their NVIDIA driver is wedged (a: DriverWedged: a; b: DriverWedged: b; c: DriverWedged: c)"
	if !strings.HasPrefix(got, want) {
		t.Errorf("wedgedWhy =\n%s\nwant it to start with\n%s", got, want)
	}
	pod.Spec.NodeSelector = map[string]string{"pool": "y"}
	if got := WedgedWhy(pod, wedged); got != "" {
		t.Errorf("wedgedWhy for a pod that fits none = %q, want \"\"", got)
	}
	pod.Spec.NodeSelector = nil
	pod.Spec.NodeName = "d"
	if got := WedgedWhy(pod, wedged); !strings.HasPrefix(got, "node d fits the pod but its NVIDIA driver is wedged (DriverWedged: d)") {
		t.Errorf("wedgedWhy for a pod bound to d = %q", got)
	}
}

// TestOptOutAnnotationValues: only "false" opts a pod out, in any case; "true" is the
// default said aloud; every other value is injected with a warning that names it, and
// a pod without the annotation gets none.
func TestOptOutAnnotationValues(t *testing.T) {
	cfg := config.Default()
	layouts := clustertest.LayoutsOf(cfg, gputest.LoadNodes(t, "testdata/nodes.yaml"))
	const warning = `the pod's annotation gpu-injector.io/inject=%q is neither "false" nor "true", and is ignored`
	tests := map[string]struct {
		value    *string
		decision Decision
		warn     bool
	}{
		"absent":   {decision: DecisionInjected},
		"false":    {value: ptr("false"), decision: DecisionSkipped},
		"FALSE":    {value: ptr("FALSE"), decision: DecisionSkipped},
		"true":     {value: ptr("true"), decision: DecisionInjected},
		"no":       {value: ptr("no"), decision: DecisionInjected, warn: true},
		"disabled": {value: ptr("disabled"), decision: DecisionInjected, warn: true},
		"empty":    {value: ptr(""), decision: DecisionInjected, warn: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "cuda", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
			pod.Namespace = "ml"
			if tc.value != nil {
				pod.Annotations = map[string]string{"gpu-injector.io/inject": *tc.value}
			}
			res := Mutate(Input{Pod: pod, Layouts: layouts}, cfg)
			if res.Decision != tc.decision {
				t.Errorf("decision %s (%s), want %s", res.Decision, res.Reason, tc.decision)
			}
			var warned bool
			for _, w := range res.Warnings {
				if tc.value != nil && strings.Contains(w, fmt.Sprintf(warning, *tc.value)) {
					warned = true
				}
			}
			if warned != tc.warn {
				t.Errorf("warned of the annotation %v, want %v: %q", warned, tc.warn, res.Warnings)
			}
		})
	}
}

func ptr(s string) *string { return &s }
