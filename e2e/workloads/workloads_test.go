package workloads

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

func TestBuild(t *testing.T) {
	files, err := Build(t.TempDir())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if files[0].Dest != CUDACheck {
		t.Errorf("first file goes to %s, want %s", files[0].Dest, CUDACheck)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f.Dest))
		fi, err := os.Stat(f.Source)
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: source %s is not a regular file (%v)", f.Dest, f.Source, err)
		}
		if strings.Contains(f.Dest, "cuda.so") || strings.Contains(f.Dest, "nvidia") {
			t.Errorf("image would hold a driver file: %s", f.Dest)
		}
	}
	for _, want := range []string{"cuda-check", "libc.so.6"} {
		if !slices.Contains(names, want) {
			t.Errorf("image files %v lack %s", names, want)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "ld-linux") }) {
		t.Errorf("image files %v lack the dynamic loader", names)
	}
}

// TestCUDACheckOnHost runs cuda-check against a stand-in driver folder given
// by LD_LIBRARY_PATH, as a container with the injected mount would.
func TestCUDACheckOnHost(t *testing.T) {
	files, err := Build(t.TempDir())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	root := t.TempDir()
	if err := standin.Install(root, standin.UsrLocalNvidia, "580.159.04"); err != nil {
		t.Fatalf("install stand-in: %v", err)
	}
	lib := filepath.Join(root, "usr/local/nvidia/lib64")
	cmd := exec.Command(files[0].Source)
	cmd.Env = []string{"LD_LIBRARY_PATH=" + lib}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cuda-check: %v\n%s", err, out)
	}
	for _, want := range []string{
		"loaded libcuda.so.1 from " + lib + "/libcuda.so.1 driver=580.159.04 cuda=13000\n",
		"file: " + lib + "/libcuda.so.580.159.04\n",
		"stand-in: " + standin.Notice + "\n",
		"cuInit: 100 (no CUDA-capable device is detected",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestDriverlessImage builds the image root the e2e tests package, enters it
// with chroot like a container runtime, and checks that the programs find a
// driver only when its folder is there and on LD_LIBRARY_PATH.
func TestDriverlessImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root; run as root to check the image file list")
	}
	files, err := Build(t.TempDir())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	host := t.TempDir()
	const version = "384.130"
	if err := standin.Install(host, standin.UbuntuNvidia, version); err != nil {
		t.Fatalf("install stand-in: %v", err)
	}

	const libDir, binDir = "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"
	tests := map[string]struct {
		mountDriver bool
		env         []string
		argv        []string
		wantExit    int
		want        string
	}{
		"driver mounted": {
			mountDriver: true, env: []string{"LD_LIBRARY_PATH=" + libDir}, argv: []string{CUDACheck},
			want: "loaded libcuda.so.1 from " + libDir + "/libcuda.so.1 driver=" + version + " cuda=9000\n",
		},
		"driver mounted after a user library path": {
			mountDriver: true, env: []string{"LD_LIBRARY_PATH=/opt/app/lib:" + libDir}, argv: []string{CUDACheck},
			want: "driver=" + version,
		},
		"no driver": {
			env: []string{"LD_LIBRARY_PATH=" + libDir}, argv: []string{CUDACheck},
			wantExit: 1, want: "cannot load libcuda.so.1: libcuda.so.1: cannot open shared object file",
		},
		"driver mounted but no library path": {
			mountDriver: true, argv: []string{CUDACheck},
			wantExit: 1, want: "cannot open shared object file",
		},
		"classic nvidia-smi from the mount": {
			mountDriver: true, env: []string{"LD_LIBRARY_PATH=" + libDir}, argv: []string{binDir + "/nvidia-smi"},
			want: "NVIDIA-SMI stand-in | Driver Version: " + version,
		},
		"nvidia-smi without the library path": {
			mountDriver: true, argv: []string{binDir + "/nvidia-smi"},
			wantExit: 127, want: "libnvidia-ml.so.1: cannot open shared object file",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			image := t.TempDir()
			if err := WriteRoot(image, files); err != nil {
				t.Fatalf("WriteRoot: %v", err)
			}
			if tc.mountDriver {
				// What the webhook injects for this layout: the dedicated
				// folder and its bin/ at the conventional container paths.
				copyTree(t, filepath.Join(host, "usr/lib/nvidia-384"), filepath.Join(image, libDir))
				copyTree(t, filepath.Join(host, "usr/lib/nvidia-384/bin"), filepath.Join(image, binDir))
			}
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.Env = tc.env
			cmd.Dir = "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: image}
			out, err := cmd.CombinedOutput()
			exit := 0
			if ee, ok := err.(*exec.ExitError); ok {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("run %v in %s: %v", tc.argv, image, err)
			}
			if exit != tc.wantExit || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d, output:\n%s\nwant exit %d and %q", exit, out, tc.wantExit, tc.want)
			}
		})
	}
}

// copyTree copies regular files and symlinks of one folder, not recursing.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatalf("read %s: %v", src, err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(s)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, d); err != nil {
				t.Fatal(err)
			}
		case e.Type().IsRegular():
			b, err := os.ReadFile(s)
			if err != nil {
				t.Fatal(err)
			}
			fi, _ := e.Info()
			if err := os.WriteFile(d, b, fi.Mode().Perm()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBuildAppCheck: app-check starts only where LD_LIBRARY_PATH names its
// library's folder, and then reports the library's answer.
func TestBuildAppCheck(t *testing.T) {
	dir := t.TempDir()
	files, err := BuildAppCheck(dir)
	if err != nil {
		t.Fatalf("BuildAppCheck: %v", err)
	}
	var app, lib string
	for _, f := range files {
		switch f.Dest {
		case AppCheck:
			app = f.Source
		case AppLibDir + "/libapp.so":
			lib = f.Source
		}
	}
	if app == "" || lib == "" {
		t.Fatalf("files %v lack %s or %s/libapp.so", files, AppCheck, AppLibDir)
	}
	bare := exec.Command(app)
	bare.Env = []string{"LD_LIBRARY_PATH="}
	if out, err := bare.CombinedOutput(); err == nil || strings.Contains(string(out), "libapp: 42") {
		t.Errorf("app-check without its library's folder: err %v, output %q; want the loader to refuse it", err, out)
	}
	withLib := exec.Command(app)
	withLib.Env = []string{"LD_LIBRARY_PATH=" + filepath.Dir(lib)}
	out, _ := withLib.CombinedOutput()
	if !strings.Contains(string(out), "libapp: 42\n") {
		t.Errorf("app-check with LD_LIBRARY_PATH=%s: output %q, want libapp: 42", filepath.Dir(lib), out)
	}
}
