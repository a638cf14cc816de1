package env

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestDriverFiles(t *testing.T) {
	for name, tc := range map[string]struct {
		paths []string
		want  []string
	}{
		"driverless image": {
			paths: []string{"/usr/bin/cuda-check", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"},
		},
		"libcuda and its link": {
			paths: []string{"/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.535.104.05", "/lib/libc.so.6"},
			want:  []string{"/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.535.104.05"},
		},
		"nvml and nvidia-smi": {
			paths: []string{"/usr/lib64/libnvidia-ml.so.1", "/usr/bin/nvidia-smi"},
			want:  []string{"/usr/lib64/libnvidia-ml.so.1", "/usr/bin/nvidia-smi"},
		},
		"a name that only contains nvidia": {
			paths: []string{"/usr/share/doc/about-nvidia.txt"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := DriverFiles(tc.paths); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DriverFiles(%v) = %v, want %v", tc.paths, got, tc.want)
			}
		})
	}
}

// mirror must leave dst equal to src (links kept as links, stale entries
// gone) while keeping the marker, as an upgrade of the host's driver needs.
func TestMirror(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	write := func(p, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(src, "lib64", "libcuda.so.550.54.15"), "new")
	if err := os.Symlink("libcuda.so.550.54.15", filepath.Join(src, "lib64", "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dst, "lib64", "libcuda.so.535.104.05"), "old")
	if err := os.Symlink("libcuda.so.535.104.05", filepath.Join(dst, "lib64", "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dst, "stale", "file"), "stale")
	write(filepath.Join(dst, hostMarker), "ours")

	if err := mirror(src, dst); err != nil {
		t.Fatal(err)
	}
	for name, check := range map[string]func() error{
		"new library copied": func() error {
			b, err := os.ReadFile(filepath.Join(dst, "lib64", "libcuda.so.550.54.15"))
			if err == nil && string(b) != "new" {
				t.Errorf("content %q, want new", b)
			}
			return err
		},
		"link repointed": func() error {
			target, err := os.Readlink(filepath.Join(dst, "lib64", "libcuda.so.1"))
			if err == nil && target != "libcuda.so.550.54.15" {
				t.Errorf("link target %q, want libcuda.so.550.54.15", target)
			}
			return err
		},
		"marker kept": func() error {
			_, err := os.Stat(filepath.Join(dst, hostMarker))
			return err
		},
	} {
		if err := check(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, gone := range []string{filepath.Join("lib64", "libcuda.so.535.104.05"), "stale"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); !os.IsNotExist(err) {
			t.Errorf("%s still exists (err %v)", gone, err)
		}
	}
}
