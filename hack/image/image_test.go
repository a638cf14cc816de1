package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

// TestImageRunsTheProbe builds the image, unpacks it as a container root,
// puts a stand-in driver's host root at /host, and runs the image's binary
// in a chroot: `version`, then `nodeprobe --once`, which must load the
// stand-in NVML with only the image's libraries.
func TestImageRunsTheProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot")
	}
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "image.tar")
	if err := Build(tarPath, "gpu-injector.local/test:1", "v0.0.0-test"); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	manifest := unpack(t, tarPath, root)
	if manifest.RepoTags[0] != "gpu-injector.local/test:1" {
		t.Errorf("RepoTags = %v", manifest.RepoTags)
	}
	for _, f := range []string{"usr/local/bin/gpu-injector", "lib/x86_64-linux-gnu/libpthread.so.0", "lib/x86_64-linux-gnu/libdl.so.2"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("image lacks %s", f)
		}
	}
	if err := standin.Install(filepath.Join(root, "host"), standin.UsrLocalNvidia, "580.159.04"); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(binaryPath, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v in the image: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run("version"); !strings.Contains(out, "v0.0.0-test") {
		t.Errorf("version printed %q", out)
	}
	out := run("nodeprobe", "--once", "--host-root", "/host", "-o", "yaml")
	for _, want := range []string{"gpu-injector.io/driver-version-source: NVML", "gpu-injector.io/state: ready", "gpu-injector.io/driver-version: 580.159.04", `"hostPath":"/usr/local/nvidia/lib64"`} {
		if !strings.Contains(out, want) {
			t.Errorf("probe output lacks %q:\n%s", want, out)
		}
	}
}

type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func unpack(t *testing.T, tarPath, root string) dockerManifest {
	t.Helper()
	outer := filepath.Join(filepath.Dir(root), "outer")
	untar(t, tarPath, outer)
	data, err := os.ReadFile(filepath.Join(outer, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ms []dockerManifest
	if err := json.Unmarshal(data, &ms); err != nil || len(ms) != 1 || len(ms[0].Layers) != 1 {
		t.Fatalf("manifest.json: %v %s", err, data)
	}
	untar(t, filepath.Join(outer, ms[0].Layers[0]), root)
	return ms[0]
}

func untar(t *testing.T, file, dest string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dest, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			var w *os.File
			if w, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)); err == nil {
				_, err = io.Copy(w, tr)
				w.Close()
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
