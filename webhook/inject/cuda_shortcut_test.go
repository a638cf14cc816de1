package inject_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
)

// FuzzCUDAShortcuts: the steering's shortcuts answer as the general path
// does. A node's CUDA label, whatever it holds, matches the pod's one Gt
// term as the API machinery's node selector has it; and a container's need
// read from its image's requirement parsed once equals the need its whole
// environment (its own env over its image's ENV) says.
func FuzzCUDAShortcuts(f *testing.F) {
	f.Add(12040, "12040", true, "cuda>=12.4 brand=tesla,driver>=470", "", "", "")
	f.Add(12040, "12041", true, "cuda>=12.4", "true", "NVIDIA_REQUIRE_CUDA", "cuda>=12.6")
	f.Add(12040, "+12050", true, "cuda>=12.4", "", "NVIDIA_DISABLE_REQUIRE", "false")
	f.Add(0, "012050", false, "cuda>=11.8", "1", "NVIDIA_DISABLE_REQUIRE", "yes")
	f.Add(-3, "ninety", true, "cuda>12.2.1", "", "NVIDIA_REQUIRE_JETPACK", "jetpack>=5")
	f.Add(1<<40, "99999999999999999999", true, "", "", "LD_LIBRARY_PATH", "/opt/lib")
	f.Fuzz(func(t *testing.T, gt int, label string, labelled bool, require, disable, name, value string) {
		labels := map[string]string{"kubernetes.io/hostname": "n"}
		if labelled {
			labels[layout.LabelCUDADriverVersionNumber] = label
		}
		n := &NodeInfo{Name: "n", Labels: NewLabels(labels)}
		if gt >= 0 {
			if fast, general := CUDAAffinityMatches(gt, n); fast != general {
				t.Fatalf("Gt %d, label %q (present %v): shortcut %v, node selector %v", gt, label, labelled, fast, general)
			}
		}
		img := &ImageConfig{Env: []string{"PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=" + require}}
		if disable != "" {
			img.Env = append(img.Env, "NVIDIA_DISABLE_REQUIRE="+disable)
		}
		c := &corev1.Container{Name: "c", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}
		if name != "" {
			c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
		}
		for range 2 { // the second read is the parsed one kept
			fast, slow, fastValue, slowValue := ContainerCUDANeed(c, img)
			if fast != slow || fastValue != slowValue {
				t.Fatalf("image %q, container %s=%q: need %d %q read once per image, %d %q from the whole environment", img.Env, name, value, fast, fastValue, slow, slowValue)
			}
		}
	})
}
