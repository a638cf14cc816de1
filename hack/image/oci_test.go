package main

import (
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-injector/gpu-injector/e2e/workloads"
)

// TestImageIndex builds the multi-platform image index and checks, per
// platform, that the manifest's platform, the config's architecture and the
// binary's ELF machine agree, that the binary's interpreter and libraries are
// in the layer, and runs this machine's binary from its unpacked layer.
// linux/arm64 is built only where the cross compiler is installed (make image
// installs it); its binary runs where qemu-aarch64-static is installed.
func TestImageIndex(t *testing.T) {
	archs := []string{"amd64"}
	if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err == nil {
		archs = append(archs, "arm64")
	} else {
		t.Log("aarch64-linux-gnu-gcc not installed: building linux/amd64 only (make image installs it)")
	}
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "oci.tar")
	if err := BuildIndex(tarPath, "gpu-injector.local/test:1", "v0.0.0-test", archs); err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(dir, "layout")
	untar(t, tarPath, layout)
	blob := func(digest string, v any) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
		if err != nil {
			t.Fatal(err)
		}
		if v != nil {
			if err := json.Unmarshal(data, v); err != nil {
				t.Fatal(err)
			}
		}
		return data
	}
	var top struct{ Manifests []descriptor }
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil || json.Unmarshal(data, &top) != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, data)
	}
	if top.Manifests[0].MediaType != mediaIndex || top.Manifests[0].Annotations["io.containerd.image.name"] != "gpu-injector.local/test:1" {
		t.Errorf("index.json names %+v", top.Manifests[0])
	}
	var inner struct{ Manifests []descriptor }
	blob(top.Manifests[0].Digest, &inner)
	if len(inner.Manifests) != len(archs) {
		t.Fatalf("index lists %d manifests, want %d", len(inner.Manifests), len(archs))
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for i, m := range inner.Manifests {
		arch := archs[i]
		if m.Platform == nil || m.Platform.Architecture != arch || m.Platform.OS != "linux" {
			t.Errorf("manifest %d platform %+v, want linux/%s", i, m.Platform, arch)
		}
		var man struct {
			Config descriptor
			Layers []descriptor
		}
		blob(m.Digest, &man)
		var cfg struct{ Architecture string }
		blob(man.Config.Digest, &cfg)
		if cfg.Architecture != arch {
			t.Errorf("%s config architecture %q", arch, cfg.Architecture)
		}
		root := filepath.Join(dir, "root-"+arch)
		untar(t, filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(man.Layers[0].Digest, "sha256:")), root)
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
		for _, n := range append(needed, workloads.DriverNeeds...) {
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
		// Run it: natively for this machine, through qemu for arm64.
		var cmd *exec.Cmd
		switch {
		case arch == "amd64" && os.Geteuid() == 0:
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
