// Package gpu holds the scripts and manifests of the run on a real GPU
// (hack/gpu-cluster.sh). These tests cover the parts that need no GPU, so
// that the GPU run does not rot between runs.
package gpu

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/mutate"
)

func TestGPUClusterScriptParses(t *testing.T) {
	out, err := exec.Command("bash", "-n", "../gpu-cluster.sh").CombinedOutput()
	if err != nil {
		t.Fatalf("bash -n hack/gpu-cluster.sh: %v\n%s", err, out)
	}
	// The usage is the script's header: every mode is documented there.
	cmd := exec.Command("bash", "../gpu-cluster.sh", "--no-such-flag")
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("unknown flag: exit %d, want 2", cmd.ProcessState.ExitCode())
	}
	for _, mode := range []string{"--build", "--stage", "--payload", "--fake"} {
		if !bytes.Contains(out, []byte(mode)) {
			t.Errorf("usage does not mention %s:\n%s", mode, out)
		}
	}
}

// TestGPUClusterMissingPayload: on a machine where the payload was not
// copied, the run stops at once and says how to get it, before it starts
// anything.
func TestGPUClusterMissingPayload(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("bash", "../gpu-cluster.sh", "--payload", t.TempDir())
	cmd.Env = append(os.Environ(), "OUT="+out)
	// The script's own default folders must not satisfy it either.
	if _, err := os.Stat("../../.device/gpu-cluster"); err == nil {
		t.Skip("a built payload in .device/gpu-cluster would be used")
	}
	if _, err := os.Stat("/tmp/gpu-cluster-payload"); err == nil {
		t.Skip("a staged payload in /tmp/gpu-cluster-payload would be used")
	}
	b, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the run passed without a payload:\n%s", b)
	}
	summary, _ := os.ReadFile(filepath.Join(out, "gpu-cluster.log"))
	if !strings.Contains(string(summary), "FAIL: payload") || !strings.Contains(string(summary), "--build") {
		t.Errorf("log does not say the payload is missing and how to build it:\n%s", summary)
	}
}

func TestRootImage(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/prog"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var digests []string
	for _, name := range []string{"a.tar", "b.tar"} {
		out, err := exec.Command("bash", "root-image.sh", root, "example.local/driverless:test", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Fatalf("root-image.sh: %v\n%s", err, out)
		}
		digests = append(digests, checkDockerArchive(t, filepath.Join(dir, name), "example.local/driverless:test",
			map[string]int64{"./usr/local/bin/prog": 0o755, "./lib": 0o777}))
	}
	if digests[0] != digests[1] {
		t.Errorf("the same root gave two images: %v", digests)
	}
}

// TestDriverlessRoot builds a root with make-driverless-root.sh, as the GPU
// run does for its image: the program, its libraries and glibc, and no path
// naming nvidia or libcuda. A program linked to the driver is refused, since
// it would carry the driver into the image; given with --libs-for (as the
// driver's nvidia-smi is) only its other libraries come in, not the program.
func TestDriverlessRoot(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc to build the test programs")
	}
	dir := t.TempDir()
	gcc := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A stub driver library, and a program linked to it.
	driver := filepath.Join(dir, "driver")
	if err := os.Mkdir(driver, 0o755); err != nil {
		t.Fatal(err)
	}
	gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(driver, "libcuda.so.1"),
		write("stub.c", "int stub_driver(void) { return 580; }\n"))
	linked := filepath.Join(dir, "linked")
	gcc("-o", linked, write("linked.c", "int stub_driver(void);\nint main(void) { return stub_driver() != 580; }\n"),
		"-L"+driver, "-l:libcuda.so.1")
	app := filepath.Join(dir, "app")
	gcc("-o", app, write("app.c", "#include <stdio.h>\nint main(void) { puts(\"app\"); return 0; }\n"))

	script := func(args ...string) (string, error) {
		cmd := exec.Command("bash", append([]string{"make-driverless-root.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+driver)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	root := filepath.Join(dir, "root")
	if out, err := script("--libs-for", linked, root, app); err != nil {
		t.Fatalf("make-driverless-root.sh: %v\n%s", err, out)
	}
	for _, p := range []string{"usr/local/bin/app", "usr/bin/env", "etc/passwd"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("the root lacks /%s: %v", p, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(root, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("/lib is %q (%v), want a link to usr/lib", l, err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/linked")); err == nil {
		t.Errorf("--libs-for copied the program itself into the root")
	}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name := strings.ToLower(p[len(root):]); strings.Contains(name, "nvidia") || strings.Contains(name, "libcuda") {
			t.Errorf("the root holds %s", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chroot", root, "/usr/local/bin/app").CombinedOutput(); err != nil || string(out) != "app\n" {
			t.Errorf("the program does not run in its root: %v: %q", err, out)
		}
	}

	out, err := script(filepath.Join(dir, "bad-root"), linked)
	if err == nil || !strings.Contains(out, "a file of the NVIDIA driver") {
		t.Errorf("a program linked to libcuda was accepted: %v\n%s", err, out)
	}
}

// checkDockerArchive reads the image as `ctr images import` does and returns
// its config digest: one manifest entry with the tag, a config whose diff_id
// is the layer's digest, and a layer holding the wanted files with their modes,
// owned by root.
func checkDockerArchive(t *testing.T, path, ref string, want map[string]int64) string {
	t.Helper()
	files := map[string][]byte{}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json %q: %v", files["manifest.json"], err)
	}
	m := manifest[0]
	if !slices.Equal(m.RepoTags, []string{ref}) || len(m.Layers) != 1 {
		t.Fatalf("manifest %+v", m)
	}
	cfg := files[m.Config]
	if sum := sha256.Sum256(cfg); m.Config != hex.EncodeToString(sum[:])+".json" {
		t.Errorf("config %s is not named by its digest", m.Config)
	}
	var config struct {
		OS, Architecture string
		RootFS           struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(cfg, &config); err != nil {
		t.Fatalf("config: %v", err)
	}
	layer := files[m.Layers[0]]
	sum := sha256.Sum256(layer)
	if config.OS != "linux" || config.Architecture != "amd64" || !slices.Equal(config.RootFS.DiffIDs, []string{"sha256:" + hex.EncodeToString(sum[:])}) {
		t.Errorf("config %s does not match the layer (sha256:%x)", cfg, sum)
	}
	lr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		if mode, ok := want[h.Name]; ok {
			if h.Mode&0o777 != mode {
				t.Errorf("%s mode %o, want %o", h.Name, h.Mode&0o777, mode)
			}
			delete(want, h.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("layer lacks %v", want)
	}
	return m.Config
}

// TestClusterManifestsMutate runs the cluster workloads through the mutation
// against the Node the probe pod labelled on the H100 (docs/real-gpu/cluster/node.yaml):
// what the webhook will do to them on the GPU machine.
func TestClusterManifestsMutate(t *testing.T) {
	for _, name := range []string{"nvidia-smi-job", "cuda-pod", "tensorflow-style"} {
		t.Run(name, func(t *testing.T) {
			manifest := filepath.Join("cluster", name+".yaml")
			raw, err := os.ReadFile(manifest)
			if err != nil {
				t.Fatal(err)
			}
			// As written: no driver, no volume; the image is the driverless one.
			var body []byte
			for _, l := range bytes.SplitAfter(raw, []byte("\n")) {
				if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
					body = append(body, l...)
				}
			}
			if bytes.Contains(body, []byte("hostPath")) || bytes.Contains(body, []byte("volumes")) {
				t.Errorf("%s brings its own volumes: the point is that it does not", manifest)
			}
			if !bytes.Contains(raw, []byte("image: gpu-injector.local/driverless-cuda:gpu")) || !bytes.Contains(raw, []byte("imagePullPolicy: Never")) {
				t.Errorf("%s does not run the imported driverless image", manifest)
			}
			var stdout, stderr bytes.Buffer
			if err := mutate.Run(mutate.Options{File: manifest, NodeFiles: []string{"../../docs/real-gpu/cluster/node.yaml"}}, nil, &stdout, &stderr); err != nil {
				t.Fatalf("mutate: %v\n%s", err, stderr.String())
			}
			spec := podSpecOf(t, stdout.Bytes())
			var paths []string
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					paths = append(paths, v.HostPath.Path)
				}
			}
			slices.Sort(paths)
			if !slices.Equal(paths, []string{"/usr/local/nvidia/bin", "/usr/local/nvidia/lib64"}) {
				t.Errorf("hostPath volumes %v, want the H100's two driver folders", paths)
			}
			c := spec.Containers[0]
			for _, m := range c.VolumeMounts {
				if !m.ReadOnly {
					t.Errorf("mount %s is writable", m.MountPath)
				}
			}
			if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
				t.Errorf("limits %v: want nvidia.com/gpu (the legacy name renamed)", c.Resources.Limits)
			}
			var ld string
			for _, e := range c.Env {
				if e.Name == "LD_LIBRARY_PATH" {
					ld = e.Value
				}
			}
			if !strings.Contains(ld, "/usr/local/nvidia/lib64") {
				t.Errorf("LD_LIBRARY_PATH %q lacks the driver folder", ld)
			}
			if spec.NodeSelector["gpu-injector.io/layout-fingerprint"] == "" {
				t.Errorf("nodeSelector %v: not pinned to the layout", spec.NodeSelector)
			}
		})
	}
}

// podSpecOf finds the pod spec in the first document of mutate's output.
func podSpecOf(t *testing.T, out []byte) corev1.PodSpec {
	t.Helper()
	doc := out
	if i := bytes.Index(out, []byte("\n---")); i >= 0 {
		doc = out[:i]
	}
	var meta struct{ Kind string }
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		t.Fatalf("mutate output: %v\n%s", err, out)
	}
	switch meta.Kind {
	case "Pod":
		var p corev1.Pod
		if err := yaml.Unmarshal(doc, &p); err != nil {
			t.Fatal(err)
		}
		return p.Spec
	case "Job":
		var j batchv1.Job
		if err := yaml.Unmarshal(doc, &j); err != nil {
			t.Fatal(err)
		}
		return j.Spec.Template.Spec
	case "Deployment":
		var d struct {
			Spec struct{ Template corev1.PodTemplateSpec }
		}
		if err := yaml.Unmarshal(doc, &d); err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Spec
	}
	t.Fatalf("unexpected kind %q in mutate output", meta.Kind)
	return corev1.PodSpec{}
}
