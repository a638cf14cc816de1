package nodeprobe

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestH100Once checks what `gpu-injector nodeprobe --once --host-root / -o yaml`
// printed on the real H100 (docs/nodeprobe.md, On a real H100) against that machine's
// nvidia-smi output, so a change to the published format or the plan rules
// that would break a real node shows up here.
func TestH100Once(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "h100", "once.yaml"))
	if err != nil {
		t.Fatalf("failed to read the H100 probe output: %v", err)
	}
	var node corev1.Node
	if err := yaml.UnmarshalStrict(data, &node); err != nil {
		t.Fatalf("failed to decode the H100 probe output: %v", err)
	}

	plan, err := layout.Decode(node.Annotations[layout.AnnotationLayout])
	if err != nil {
		t.Fatalf("failed to decode the layout annotation: %v", err)
	}
	if errs := plan.Validate(config.Default().Rules()); len(errs) > 0 {
		t.Errorf("plan is invalid under the default rules: %v", errs.ToAggregate())
	}
	if got, want := node.Labels[layout.LabelFingerprint], plan.Fingerprint(); got != want {
		t.Errorf("fingerprint label %q, plan.Fingerprint() %q", got, want)
	}
	if plan.DriverVersion != "580.159.04" || plan.CUDADriverVersion != "13.0" {
		t.Errorf("plan driver %q cuda %q, nvidia-smi said 580.159.04 and 13.0", plan.DriverVersion, plan.CUDADriverVersion)
	}

	// /usr/local/nvidia/lib64 holds every compute library of 580.159.04 there,
	// so both driver folders go in whole; the links in /usr/lib add nothing.
	wantMounts := []layout.Mount{
		{HostPath: "/usr/local/nvidia/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
		{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
	}
	if !reflect.DeepEqual(plan.Mounts, wantMounts) {
		t.Errorf("mounts %+v, want %+v", plan.Mounts, wantMounts)
	}
	if want := []string{"/usr/local/nvidia/lib64"}; !reflect.DeepEqual(plan.LibraryPaths, want) {
		t.Errorf("library paths %v, want %v", plan.LibraryPaths, want)
	}

	// What nvidia-smi, nvidia-smi -L and the CUDA program showed on that machine.
	labels := map[string]string{
		layout.LabelState:             layout.StateReady,
		layout.LabelDriverVersion:     "580.159.04",
		layout.LabelCUDADriverVersion: "13.0",
		layout.LabelGPUProduct:        "NVIDIA-H100-80GB-HBM3",
		layout.LabelGPUCount:          "1",
		layout.LabelGPUMemoryMiB:      "81559",
		layout.LabelComputeCapability: "9.0",
		layout.LabelMIGEnabled:        "false",
	}
	for key, want := range labels {
		t.Run(key, func(t *testing.T) {
			if got, ok := node.Labels[key]; !ok || got != want {
				t.Errorf("label %s = %q (present %v), want %q", key, got, ok, want)
			}
		})
	}
	if got := node.Annotations[AnnotationVersionSource]; got != string(SourceNVML) {
		t.Errorf("driver-version-source %q, want %q", got, SourceNVML)
	}
}
