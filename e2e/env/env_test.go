package env

import (
	"context"
	"errors"
	"io/fs"
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

// TestHostShare: what environments make of the machine's shared state stays
// while any of them runs, and the last one to leave removes it, folders after
// what they hold.
func TestHostShare(t *testing.T) {
	dir := t.TempDir()
	saved := []string{hostSetupLock, hostUsersLock, hostMadeFile}
	t.Cleanup(func() { hostSetupLock, hostUsersLock, hostMadeFile = saved[0], saved[1], saved[2] })
	hostSetupLock, hostUsersLock, hostMadeFile = filepath.Join(dir, "setup.lock"), filepath.Join(dir, "users.lock"), filepath.Join(dir, "made")
	mount := filepath.Join(dir, "home", "kubernetes")
	device := filepath.Join(dir, "nvidia0")
	ctx := context.Background()
	first, err := joinHost(ctx, func() ([]string, error) { return makeMountpoint(mount) })
	if err != nil {
		t.Fatal(err)
	}
	second, err := joinHost(ctx, func() ([]string, error) {
		if err := os.WriteFile(device, nil, 0o666); err != nil {
			return nil, err
		}
		if _, err := makeMountpoint(mount); err != nil {
			return nil, err
		}
		return []string{device}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.leave(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mount, device} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s gone while an environment still runs: %v", p, err)
		}
	}
	if err := second.leave(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{mount, filepath.Dir(mount), device, hostMadeFile} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left after the last environment: %v", p, err)
		}
	}
	// A folder someone else filled stays.
	third, err := joinHost(ctx, func() ([]string, error) { return makeMountpoint(mount) })
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mount, "theirs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := third.leave(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mount, "theirs")); err != nil {
		t.Errorf("a folder with another's file removed: %v", err)
	}
}
