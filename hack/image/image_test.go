package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

const testRef = "gpu-injector.local/test:1"

// testArchs are the index's platforms here: linux/arm64 only where the cross
// compiler is installed (make image installs it).
func testArchs(t *testing.T) []string {
	if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err != nil {
		t.Log("aarch64-linux-gnu-gcc not installed: building linux/amd64 only (make image installs it)")
		return []string{"amd64"}
	}
	return []string{"amd64", "arm64"}
}

// TestImageIndex builds the image index twice from the same sources and
// wants the same digests and byte-equal layout tars; then reads the layout
// back with go-containerregistry and checks, per platform, that the index's
// platform, the config's architecture and the binary's ELF machine agree,
// that the binary's interpreter and libraries are in the layer, and runs
// the binary from its unpacked layer (this machine's in a chroot, arm64
// where qemu-aarch64-static is installed).
func TestImageIndex(t *testing.T) {
	archs := testArchs(t)
	dir := t.TempDir()
	build := func(n string) (*Result, string) {
		t.Helper()
		o := Options{Ref: testRef, Version: "v0.0.0-test", Archs: archs, Created: time.Unix(1700000000, 0).UTC(),
			OCITar: filepath.Join(dir, n+".tar"), Layout: filepath.Join(dir, "layout-"+n)}
		res, err := Build(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(o.OCITar)
		if err != nil {
			t.Fatal(err)
		}
		return res, string(sha256Sum(data))
	}
	first, firstTar := build("1")
	second, secondTar := build("2")
	d1, _ := first.Index.Digest()
	d2, _ := second.Index.Digest()
	if d1 != d2 || firstTar != secondTar {
		t.Errorf("two builds of the same sources differ: index %s and %s, tars equal %v", d1, d2, firstTar == secondTar)
	}
	t.Logf("index digest %s", d1)

	p, err := layout.FromPath(filepath.Join(dir, "layout-1"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 {
		t.Fatalf("index.json: %v %+v", err, tm)
	}
	if a := tm.Manifests[0].Annotations; tm.Manifests[0].MediaType != types.OCIImageIndex || a["io.containerd.image.name"] != testRef || a["org.opencontainers.image.ref.name"] != "1" {
		t.Errorf("index.json names %+v", tm.Manifests[0])
	}
	if tm.Manifests[0].Digest != d1 {
		t.Errorf("index.json lists %s, built %s", tm.Manifests[0].Digest, d1)
	}
	idx, err := top.ImageIndex(d1)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, idx, archs, true)
}

// checkIndex checks each platform's image of idx: its platform, its config,
// its binary's ELF machine and libraries; with run, runs the binary.
func checkIndex(t *testing.T, idx v1.ImageIndex, archs []string, run bool) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != len(archs) {
		t.Fatalf("index %s lists %d manifests, want %d", im.MediaType, len(im.Manifests), len(archs))
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for i, m := range im.Manifests {
		arch := archs[i]
		if m.Platform == nil || m.Platform.Architecture != arch || m.Platform.OS != "linux" || m.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: %s platform %+v, want an OCI manifest of linux/%s", i, m.MediaType, m.Platform, arch)
		}
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != arch || cf.OS != "linux" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != binaryPath {
			t.Errorf("%s config: %s/%s entrypoint %v", arch, cf.OS, cf.Architecture, cf.Config.Entrypoint)
		}
		root := filepath.Join(t.TempDir(), "root-"+arch)
		unpackImage(t, img, root)
		for _, shell := range []string{"bin/sh", "usr/bin/sh", "bin/bash"} {
			if _, err := os.Lstat(filepath.Join(root, shell)); err == nil {
				t.Errorf("%s image has a shell: %s", arch, shell)
			}
		}
		bin := filepath.Join(root, binaryPath)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machines[arch] {
			t.Errorf("%s binary is %s", arch, f.Machine)
		}
		needed, _ := f.ImportedLibraries()
		var interp string
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				_, _ = p.ReadAt(b, 0)
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
		f.Close()
		if _, err := os.Stat(filepath.Join(root, interp)); interp == "" || err != nil {
			t.Errorf("%s: interpreter %q not in the layer: %v", arch, interp, err)
		}
		for _, n := range append(needed, ociimage.DriverNeeds...) {
			found := false
			for _, d := range []string{"lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib", "usr/lib/x86_64-linux-gnu"} {
				if _, err := os.Stat(filepath.Join(root, d, n)); err == nil {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: %s not in the layer", arch, n)
			}
		}
		if !run {
			continue
		}
		// Run it: natively for this machine, through qemu for arm64.
		var cmd *exec.Cmd
		switch {
		case arch == runtime.GOARCH && os.Geteuid() == 0:
			cmd = exec.Command(binaryPath, "version")
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		case arch == "arm64":
			qemu, err := exec.LookPath("qemu-aarch64-static")
			if err != nil {
				t.Log("qemu-aarch64-static not installed: the arm64 binary is checked, not run")
				continue
			}
			cmd = exec.Command(qemu, "-L", root, bin, "version")
		default:
			continue
		}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "v0.0.0-test") {
			t.Errorf("%s binary from the layer: %v\n%s", arch, err, out)
		}
	}
}

// TestImageRunsTheProbe builds this machine's docker-archive, unpacks it as
// a container root, puts a stand-in driver's host root at /host, and runs the
// image's binary in a chroot: `version`, then `nodeprobe --once`, which must
// load the stand-in NVML with only the image's libraries.
func TestImageRunsTheProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot")
	}
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "image.tar")
	if _, err := Build(context.Background(), Options{Ref: testRef, Version: "v0.0.0-test", Archive: tarPath}); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(testRef)
	img, err := tarball.ImageFromPath(tarPath, &tag)
	if err != nil {
		t.Fatalf("the docker-archive does not name %s: %v", testRef, err)
	}
	root := filepath.Join(dir, "root")
	unpackImage(t, img, root)
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

func sha256Sum(data []byte) []byte {
	s := sha256.Sum256(data)
	return s[:]
}

// unpackImage writes the image's flattened file system under dest.
func unpackImage(t *testing.T, img v1.Image, dest string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
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
