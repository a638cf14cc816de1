package webhook

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

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
			if got := IsGPUResource(cfg, corev1.ResourceName(name)); got != want {
				t.Errorf("IsGPUResource(%s) = %v, want %v", name, got, want)
			}
		})
	}
}
