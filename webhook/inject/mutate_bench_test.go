package inject_test

import (
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/config"
)

func benchPod(mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", Labels: map[string]string{"app": "train"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "train",
			Image: "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
			Env:   []corev1.EnvVar{{Name: "EPOCHS", Value: "10"}},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				"nvidia.com/gpu": resource.MustParse("1"),
				"memory":         resource.MustParse("8Gi"),
			}},
		}, {
			Name:  "sidecar",
			Image: "fluent/fluent-bit:3.0",
		}}},
	}
	if mod != nil {
		mod(p)
	}
	return p
}

// BenchmarkMutate is the pure mutation of one GPU pod against 5,000 GPU
// nodes of three layouts (the index of BenchmarkHandler). Each op includes
// the pod's deep copy, as the webhook decodes a fresh pod per request.
func BenchmarkMutate(b *testing.B) {
	cfg := config.Default()
	idx, _ := clustertest.BenchIndex(b, cfg)
	layouts := idx.Layouts()
	cases := map[string]*corev1.Pod{
		"gpu-pod": benchPod(nil),
		"legacy-limit": benchPod(func(p *corev1.Pod) {
			rl := p.Spec.Containers[0].Resources.Limits
			delete(rl, "nvidia.com/gpu")
			rl["alpha.kubernetes.io/nvidia-gpu"] = resource.MustParse("1")
		}),
		"node-selector-zone": benchPod(func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"topology.kubernetes.io/zone": "zone-2"}
		}),
		// The worst case: a selector no node matches scans all 5,000 nodes
		// and ends in a denial.
		"no-layout-fits": benchPod(func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"accelerator": "nvidia-h100"}
		}),
	}
	for name, pod := range cases {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p := pod.DeepCopy()
				res := Mutate(Input{Pod: p, Layouts: layouts}, cfg)
				if res.Decision == "" {
					b.Fatal("no decision")
				}
			}
		})
	}
}

// BenchmarkMutateAffinity is a pod with required node affinity against the
// load script's 5,000 nodes (114 labels each): the matcher reads each node
// checked as a Node with a label map. "zone" fits on the first node of its
// zone; "no-match" checks every node and ends in a denial.
func BenchmarkMutateAffinity(b *testing.B) {
	cfg := config.Default()
	layouts := clustertest.LooseFileIndex(b, cfg).Layouts()
	affinity := func(key string, values ...string) *corev1.Pod {
		return benchPod(func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}},
				}}},
			}}
		})
	}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		want Decision
	}{
		{"zone", affinity("topology.kubernetes.io/zone", "us-east-1c"), DecisionInjected},
		{"no-match", affinity("nvidia.com/gpu.product", "NVIDIA-B200"), DecisionDenied},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if res := Mutate(Input{Pod: c.pod.DeepCopy(), Layouts: layouts}, cfg); res.Decision != c.want {
					b.Fatalf("decision %s (%s), want %s", res.Decision, res.Reason, c.want)
				}
			}
		})
	}
}
