package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func TestKubectlWarnings(t *testing.T) {
	for name, tc := range map[string]struct {
		stderr string
		want   []string
	}{
		"none":  {stderr: "", want: nil},
		"other": {stderr: "error: something\n", want: nil},
		"two": {
			stderr: "Warning: gpu-injector: renamed alpha.kubernetes.io/nvidia-gpu\nWarning: second one\n",
			want:   []string{"gpu-injector: renamed alpha.kubernetes.io/nvidia-gpu", "second one"},
		},
		"indented and mixed": {
			stderr: "  Warning: a: b\nnot a warning\n",
			want:   []string{"a: b"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := kubectlWarnings(tc.stderr); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("kubectlWarnings(%q) = %q, want %q", tc.stderr, got, tc.want)
			}
		})
	}
}

func TestOfflineWarnings(t *testing.T) {
	stderr := strings.Join([]string{
		"warning: Job/nvidia-smi: gpu-injector: container \"nvidia-smi\": renamed a: b",
		"warning: Job/nvidia-smi: second",
		"injected: Job/nvidia-smi: layout abc (driver 1.2)",
		"warning: Deployment/tensorflow-style: gpu-injector: merged LD_LIBRARY_PATH",
		"warning: none of the 3 nodes publishes a usable layout",
		"log: something",
	}, "\n")
	want := map[string][]string{
		"Job/nvidia-smi":              {`gpu-injector: container "nvidia-smi": renamed a: b`, "second"},
		"Deployment/tensorflow-style": {"gpu-injector: merged LD_LIBRARY_PATH"},
	}
	if got := offlineWarnings(stderr); !reflect.DeepEqual(got, want) {
		t.Errorf("offlineWarnings = %q, want %q", got, want)
	}
}

func TestHostPathMounts(t *testing.T) {
	dir := corev1.HostPathDirectory
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "lib", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/h/lib64", Type: &dir}}},
			{Name: "bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/h/bin"}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
		Containers: []corev1.Container{
			{Name: "a", VolumeMounts: []corev1.VolumeMount{{Name: "lib", MountPath: "/usr/local/nvidia/lib64", ReadOnly: true}, {Name: "scratch", MountPath: "/tmp"}}},
			{Name: "b", VolumeMounts: []corev1.VolumeMount{{Name: "lib", MountPath: "/usr/local/nvidia/lib64", ReadOnly: true}, {Name: "bin", MountPath: "/usr/local/nvidia/bin"}}},
		},
	}}
	got := hostPathMounts(p)
	want := []mount{
		{hostPath: "/h/bin", mountPath: "/usr/local/nvidia/bin", containers: []string{"b"}},
		{hostPath: "/h/lib64", mountPath: "/usr/local/nvidia/lib64", kind: "Directory", readOnly: true, containers: []string{"a", "b"}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mounts, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !reflect.DeepEqual(*got[i], want[i]) {
			t.Errorf("mount %d = %+v, want %+v", i, *got[i], want[i])
		}
	}
}

// TestManifests: what the demo promises of its manifests: the driverless
// image, no driver volume or LD_LIBRARY_PATH naming the driver, and the
// classic GPU requests.
func TestManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	gpus := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var obj struct {
				Kind string `json:"kind"`
				Spec struct {
					corev1.PodSpec
					Template struct {
						Spec corev1.PodSpec `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			spec := obj.Spec.PodSpec
			if obj.Kind == "Job" || obj.Kind == "Deployment" {
				spec = obj.Spec.Template.Spec
			}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					t.Errorf("%s: hostPath volume %s: the demo's point is that users write none", f, v.Name)
				}
			}
			for _, c := range spec.Containers {
				if c.Image != image {
					t.Errorf("%s: container %s image %q, want %q", f, c.Name, c.Image, image)
				}
				for _, e := range c.Env {
					if e.Name == "LD_LIBRARY_PATH" && strings.Contains(e.Value, "nvidia") {
						t.Errorf("%s: container %s sets LD_LIBRARY_PATH=%s: the webhook's job", f, c.Name, e.Value)
					}
				}
				for r := range c.Resources.Limits {
					gpus[string(r)] = true
				}
			}
		}
	}
	for _, r := range []string{string(gpuResource), string(legacyResource)} {
		if !gpus[r] {
			t.Errorf("no manifest asks for %s", r)
		}
	}
}
