package inject_test

import (
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestLegacyMounts: which hand-written mounts of a GPU container are the old
// driver recipe, and which are the user's business.
func TestLegacyMounts(t *testing.T) {
	gke := &Layout{Fingerprint: "f", Plan: layout.Plan{Mounts: []layout.Mount{
		{HostPath: "/home/kubernetes/bin/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
	}}}
	tests := map[string]struct {
		hostPath, mountPath, subPath string
		want                         bool
	}{
		"driver folder at /usr/local/nvidia/bin":       {"/usr/lib/nvidia-384/bin", "/usr/local/nvidia/bin", "", true},
		"driver folder at /usr/lib/nvidia":             {"/usr/lib/nvidia-375", "/usr/lib/nvidia", "", true},
		"a trailing slash":                             {"/usr/lib/nvidia-375/", "/usr/local/nvidia/lib64/", "", true},
		"libcuda over the image's system folder":       {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "", true},
		"nvidia-docker 1.0 volume":                     {"/var/lib/nvidia-docker/volumes/nvidia_driver/387.26", "/usr/local/nvidia", "", true},
		"the host's /usr/bin at the driver location":   {"/usr/bin", "/usr/local/nvidia/bin", "", true},
		"a published layout's folder, elsewhere":       {"/home/kubernetes/bin/nvidia/lib64", "/opt/tools/nvidia", "", true},
		"the host's /usr/bin at /usr/bin":              {"/usr/bin", "/usr/bin", "", false},
		"a shared system folder onto itself":           {"/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "", false},
		"data":                                         {"/data", "/data", "", false},
		"a GKE folder that is no driver":               {"/home/kubernetes/bin/gib", "/usr/local/gib", "", false},
		"a driver folder mounted for inspection":       {"/usr/local/nvidia", "/host-driver", "", false},
		"a subPath mount":                              {"/usr/lib/nvidia-384", "/usr/local/nvidia/lib64", "lib", false},
		"the host root":                                {"/", "/usr/local/nvidia", "", false},
		"a relative mount path (invalid, never loops)": {"/usr/lib/nvidia-384", "usr/local/nvidia", "", false},
	}
	cfg := config.Default()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{
				Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: tc.hostPath}}}},
				Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{
					{Name: "v", MountPath: tc.mountPath, SubPath: tc.subPath},
				}}},
			}}
			got := LegacyMounts(cfg, pod, []*Layout{gke}, nil)
			if (got == 1) != tc.want {
				t.Errorf("legacy mounts %+v, want legacy=%v", got, tc.want)
			}
			// The webhook's own volumes are never hand-written.
			if LegacyMounts(cfg, pod, []*Layout{gke}, []string{"v"}) != 0 {
				t.Errorf("an injected volume counted as hand-written")
			}
		})
	}
}
