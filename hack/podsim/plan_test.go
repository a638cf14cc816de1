//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for name, tc := range map[string]struct{ in, want string }{
		"no reference":         {in: "/usr/local/nvidia/lib64", want: "/usr/local/nvidia/lib64"},
		"a defined variable":   {in: "$(A)/lib", want: "x/lib"},
		"an empty variable":    {in: "a$(EMPTY)b", want: "ab"},
		"an undefined one":     {in: "$(B):$(A)", want: "$(B):x"},
		"an escaped dollar":    {in: "$$(A)", want: "$(A)"},
		"a lone dollar":        {in: "cost $5", want: "cost $5"},
		"a trailing dollar":    {in: "end$", want: "end$"},
		"an unterminated name": {in: "$(A", want: "$(A"},
		"two in a row":         {in: "$(A)$(A)", want: "xx"},
		"shell syntax is kept": {in: "${A}", want: "${A}"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := expand(tc.in, lookup); got != tc.want {
				t.Fatalf("expand(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestContainerEnv(t *testing.T) {
	p := podCandidate{Name: "p", Namespace: "ml", Meta: metav1.ObjectMeta{Labels: map[string]string{"app": "cuda"}}}
	for name, tc := range map[string]struct {
		env     []corev1.EnvVar
		want    []string
		wantErr string
	}{
		"PATH defaults as in container runtimes": {
			want: []string{"PATH=" + defaultPath},
		},
		"a PATH of the pod wins": {
			env:  []corev1.EnvVar{{Name: "PATH", Value: "/usr/local/nvidia/bin:/bin"}},
			want: []string{"PATH=/usr/local/nvidia/bin:/bin"},
		},
		"a later value of the same name replaces the first in place": {
			env:  []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "A", Value: "$(A)3"}},
			want: []string{"A=13", "B=2", "PATH=" + defaultPath},
		},
		"field references": {
			env: []corev1.EnvVar{
				{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			},
			want: []string{"NS=ml", "APP=cuda", "NODE=gpu-node-1", "PATH=" + defaultPath},
		},
		"an unsupported field reference": {
			env:     []corev1.EnvVar{{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
			wantErr: `podsim does not support fieldRef "status.podIP"`,
		},
		"a secret reference": {
			env:     []corev1.EnvVar{{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}}},
			wantErr: "podsim supports value and fieldRef",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := containerEnv(p, &corev1.Container{Name: "c", Env: tc.env}, "gpu-node-1")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBuildPlan(t *testing.T) {
	host := t.TempDir()
	dir := filepath.Join(host, "lib64")
	file := filepath.Join(host, "libcuda.so.1")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	typ := func(t corev1.HostPathType) *corev1.HostPathType { return &t }
	hp := func(name, p string, tp *corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p, Type: tp}}}
	}
	injectedMeta := metav1.ObjectMeta{Annotations: map[string]string{"gpu-injector.io/injected": `{"driverVersion":"580","containers":["c"],"volumes":["drv"]}`}}
	for name, tc := range map[string]struct {
		meta         metav1.ObjectMeta
		volumes      []corev1.Volume
		mounts       []corev1.VolumeMount
		command      []string
		wantMounts   []mountSpec
		wantWarnings int
		wantErr      string
	}{
		"folder and file mounts, parents first": {
			volumes: []corev1.Volume{hp("f", file, typ(corev1.HostPathFile)), hp("d", dir, typ(corev1.HostPathDirectory))},
			mounts:  []corev1.VolumeMount{{Name: "f", MountPath: "/usr/local/nvidia/lib64/libcuda.so.1", ReadOnly: true}, {Name: "d", MountPath: "/usr/local/nvidia/lib64/", ReadOnly: true}},
			wantMounts: []mountSpec{
				{Volume: "d", Type: mountBind, Source: dir, Target: "/usr/local/nvidia/lib64", Dir: true, ReadOnly: true},
				{Volume: "f", Type: mountBind, Source: file, Target: "/usr/local/nvidia/lib64/libcuda.so.1", ReadOnly: true},
			},
		},
		"an unset type takes the kind of what is there": {
			volumes:    []corev1.Volume{hp("f", file, nil)},
			mounts:     []corev1.VolumeMount{{Name: "f", MountPath: "/x"}},
			wantMounts: []mountSpec{{Volume: "f", Type: mountBind, Source: file, Target: "/x"}},
		},
		"a subPath": {
			volumes:    []corev1.Volume{hp("d", dir, nil)},
			mounts:     []corev1.VolumeMount{{Name: "d", MountPath: "/x", SubPath: "sub"}},
			wantMounts: []mountSpec{{Volume: "d", Type: mountBind, Source: filepath.Join(dir, "sub"), Target: "/x", Dir: true}},
		},
		"a subPath that escapes": {
			volumes: []corev1.Volume{hp("d", dir, nil)},
			mounts:  []corev1.VolumeMount{{Name: "d", MountPath: "/x", SubPath: "../../etc"}},
			wantErr: "must be a relative path inside the volume",
		},
		"an emptyDir": {
			volumes:    []corev1.Volume{{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			mounts:     []corev1.VolumeMount{{Name: "e", MountPath: "/scratch"}},
			wantMounts: []mountSpec{{Volume: "e", Type: mountTmpfs, Target: "/scratch", Dir: true}},
		},
		"an injected volume mounted read-write warns": {
			meta:         injectedMeta,
			volumes:      []corev1.Volume{hp("drv", dir, nil)},
			mounts:       []corev1.VolumeMount{{Name: "drv", MountPath: "/usr/local/nvidia/lib64"}},
			wantMounts:   []mountSpec{{Volume: "drv", Type: mountBind, Source: dir, Target: "/usr/local/nvidia/lib64", Dir: true}},
			wantWarnings: 1,
		},
		"an injected volume mounted read-only does not warn": {
			meta:       injectedMeta,
			volumes:    []corev1.Volume{hp("drv", dir, nil)},
			mounts:     []corev1.VolumeMount{{Name: "drv", MountPath: "/usr/local/nvidia/lib64", ReadOnly: true}},
			wantMounts: []mountSpec{{Volume: "drv", Type: mountBind, Source: dir, Target: "/usr/local/nvidia/lib64", Dir: true, ReadOnly: true}},
		},
		"a directory type on a file": {
			volumes: []corev1.Volume{hp("f", file, typ(corev1.HostPathDirectory))},
			mounts:  []corev1.VolumeMount{{Name: "f", MountPath: "/x"}},
			wantErr: "is not of type Directory",
		},
		"a relative hostPath": {
			volumes: []corev1.Volume{hp("f", "usr/lib", nil)},
			mounts:  []corev1.VolumeMount{{Name: "f", MountPath: "/x"}},
			wantErr: "is not absolute",
		},
		"a mount at /": {
			volumes: []corev1.Volume{hp("d", dir, nil)},
			mounts:  []corev1.VolumeMount{{Name: "d", MountPath: "/"}},
			wantErr: "is not a mountable folder",
		},
		"an undefined volume": {
			mounts:  []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}},
			wantErr: `mounts volume "nope" that the pod does not define`,
		},
		"a projected volume": {
			volumes: []corev1.Volume{{Name: "p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
			mounts:  []corev1.VolumeMount{{Name: "p", MountPath: "/x"}},
			wantErr: `podsim supports hostPath and emptyDir volumes, not projected`,
		},
		"no command": {
			command: []string{},
			wantErr: "must set command",
		},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := tc.command
			if cmd == nil {
				cmd = []string{"/bin/true"}
			}
			c := corev1.Container{Name: "c", Command: cmd, VolumeMounts: tc.mounts}
			pod := podCandidate{Kind: "Pod", Name: "p", Meta: tc.meta, Spec: corev1.PodSpec{Volumes: tc.volumes, Containers: []corev1.Container{c}}}
			plan, warnings, err := buildPlan(pod, &pod.Spec.Containers[0], options{Root: "/r", HostDev: filepath.Join(host, "nodev")})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Mounts) != len(tc.wantMounts) {
				t.Fatalf("got mounts %+v, want %+v", plan.Mounts, tc.wantMounts)
			}
			for i := range tc.wantMounts {
				if plan.Mounts[i] != tc.wantMounts[i] {
					t.Fatalf("mount %d: got %+v, want %+v", i, plan.Mounts[i], tc.wantMounts[i])
				}
			}
			if len(warnings) != tc.wantWarnings {
				t.Fatalf("got warnings %q, want %d", warnings, tc.wantWarnings)
			}
		})
	}
}

func TestBuildPlanHostRoot(t *testing.T) {
	node := t.TempDir()
	if err := os.MkdirAll(filepath.Join(node, "opt/driver-580"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(node, "usr/local/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	// An absolute link on the node means the node's /opt, not this host's.
	if err := os.Symlink("/opt/driver-580", filepath.Join(node, "usr/local/nvidia/lib64")); err != nil {
		t.Fatal(err)
	}
	c := corev1.Container{Name: "c", Command: []string{"x"}, VolumeMounts: []corev1.VolumeMount{{Name: "d", MountPath: "/usr/local/nvidia/lib64", ReadOnly: true}}}
	dirType := corev1.HostPathDirectory
	pod := podCandidate{Name: "p", Spec: corev1.PodSpec{
		Volumes:    []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/local/nvidia/lib64", Type: &dirType}}}},
		Containers: []corev1.Container{c},
	}}
	plan, _, err := buildPlan(pod, &pod.Spec.Containers[0], options{Root: "/r", HostRoot: node})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(node, "opt/driver-580"); len(plan.Mounts) != 1 || plan.Mounts[0].Source != want {
		t.Fatalf("got mounts %+v, want one from %q", plan.Mounts, want)
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	for p, target := range map[string]string{
		"lib":          "usr/lib",
		"abs":          "/usr/lib",
		"escape":       "../../../../etc",
		"absescape":    "/../../etc",
		"usr/lib/self": "../lib",
		"loop":         "loop",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	for name, tc := range map[string]struct {
		in, want, wantErr string
	}{
		"a plain path":                     {in: "/usr/local/nvidia/lib64", want: "/usr/local/nvidia/lib64"},
		"a relative link":                  {in: "/lib/x86_64-linux-gnu/libcuda.so.1", want: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
		"an absolute link stays in root":   {in: "/abs/nvidia", want: "/usr/lib/nvidia"},
		"a link escaping with .. stays":    {in: "/escape/passwd", want: "/etc/passwd"},
		"an absolute escaping link stays":  {in: "/absescape/shadow", want: "/etc/shadow"},
		"a link to its own parent":         {in: "/usr/lib/self/x", want: "/usr/lib/x"},
		"dot-dot in the input stays":       {in: "/../../../etc", want: "/etc"},
		"a symlink loop is refused":        {in: "/loop/x", wantErr: "too many symbolic links"},
		"the root itself":                  {in: "/", want: "/"},
		"a relative input is taken from /": {in: "usr/lib", want: "/usr/lib"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := resolveIn(root, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tc.want); got != want {
				t.Fatalf("resolveIn(%q) = %q, want %q", tc.in, got, want)
			}
		})
	}
}
