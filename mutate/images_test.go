package mutate

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

const cudaNodesFile = "../webhook/inject/testdata/nodes-cuda.yaml"

func testImage(t *testing.T, env ...string) v1.Image {
	t.Helper()
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: v1.Config{Env: env}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// manifest is two pods: one whose image keeps its libraries on its own
// LD_LIBRARY_PATH and requires CUDA 12.4, one whose image requires 12.6,
// more than any node's driver supports.
func manifest(app, newer string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  containers:
  - name: main
    image: ` + app + `
    resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: v1
kind: Pod
metadata: {name: newer}
spec:
  containers:
  - name: main
    image: ` + newer + `
    resources: {limits: {nvidia.com/gpu: 1}}
`
}

func runWithImages(t *testing.T, src admitinput.ImageReader, in string) (string, string, error) {
	t.Helper()
	cfg := config.Default()
	cfg.Images.Mode = config.ImagesOn
	return runWithConfig(t, cfg, src, in)
}

func runWithConfig(t *testing.T, cfg *config.Configuration, src admitinput.ImageReader, in string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := Run(Options{File: "-", NodeFiles: []string{cudaNodesFile}, Config: cfg, Images: src}, strings.NewReader(in), &out, &errb)
	return out.String(), errb.String(), err
}

// checkImageOutput: the first pod keeps its image's LD_LIBRARY_PATH with the
// driver's folder appended and is pinned to CUDA 12.4 nodes; the second is
// denied with its need.
func checkImageOutput(t *testing.T, out, stderr string, err error) {
	t.Helper()
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("err = %v, want one denial\n%s", err, stderr)
	}
	if !strings.Contains(out, "value: /opt/app/lib:/usr/local/nvidia/lib64") {
		t.Errorf("output lacks the image's LD_LIBRARY_PATH merged:\n%s", out)
	}
	if !strings.Contains(out, "gpu-injector.io/cuda-driver-version-number") || !strings.Contains(out, "12039") {
		t.Errorf("output lacks the CUDA affinity:\n%s", out)
	}
	if !strings.Contains(stderr, "denied: Pod/newer") || !strings.Contains(stderr, "CUDA 12.6 or newer") || !strings.Contains(stderr, "550.144.03 (CUDA 12.4)") {
		t.Errorf("stderr lacks the denial naming the need and the newest driver:\n%s", stderr)
	}
}

// TestLocalImages: images from an OCI layout and from a `docker save`
// tarball are read by the references they were saved under, as the webhook
// reads their registry; an image in neither is warned about.
func TestLocalImages(t *testing.T) {
	dir := t.TempDir()
	app := testImage(t, "LD_LIBRARY_PATH=/opt/app/lib", "NVIDIA_REQUIRE_CUDA=cuda>=12.4")
	newer := testImage(t, "NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470")
	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(app, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "registry.example.com/team/app:v1"})); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("registry.example.com/team/newer:v2")
	tarFile := filepath.Join(dir, "newer.tar")
	if err := tarball.WriteToFile(tarFile, tag, newer); err != nil {
		t.Fatal(err)
	}
	local, err := offline.ReadLocalImages([]string{filepath.Join(dir, "oci"), tarFile})
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runWithImages(t, local, manifest("registry.example.com/team/app:v1", "registry.example.com/team/newer:v2"))
	checkImageOutput(t, out, stderr, err)

	_, stderr, _ = runWithImages(t, local, manifest("registry.example.com/team/other:v1", "registry.example.com/team/newer:v2"))
	if !strings.Contains(stderr, `image "registry.example.com/team/other:v1" is in none of the --images given`) {
		t.Errorf("stderr lacks the warning for an image not given:\n%s", stderr)
	}
}

// testRegistry serves the images of manifest from a registry on localhost
// and returns its host.
func testRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	for ref, img := range map[string]v1.Image{
		host + "/team/app:v1":   testImage(t, "LD_LIBRARY_PATH=/opt/app/lib", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"),
		host + "/team/newer:v2": testImage(t, "NVIDIA_REQUIRE_CUDA=cuda>=12.6"),
	} {
		r, _ := name.ParseReference(ref)
		if err := remote.Write(r, img); err != nil {
			t.Fatal(err)
		}
	}
	return host
}

// TestPulledImages: --pull reads the registry, with no cluster at all.
func TestPulledImages(t *testing.T) {
	host := testRegistry(t)
	cfg := config.Default()
	cfg.Images.Registries = []string{host}
	cfg.Images.InsecureRegistries = []string{host}
	out, stderr, err := runWithImages(t, offline.NewPulledImages(&cfg.Images), manifest(host+"/team/app:v1", host+"/team/newer:v2"))
	checkImageOutput(t, out, stderr, err)
	if strings.Contains(stderr, "images.mode") {
		t.Errorf("with images.mode On, stderr warns of it:\n%s", stderr)
	}
}

// TestPulledImagesModeOff: --pull with images.mode Off, the default, reads
// the images as asked and says that the webhook would not.
func TestPulledImagesModeOff(t *testing.T) {
	host := testRegistry(t)
	cfg := config.Default()
	cfg.Images.Registries = []string{host}
	cfg.Images.InsecureRegistries = []string{host}
	out, stderr, err := runWithConfig(t, cfg, offline.NewPulledImages(&cfg.Images), manifest(host+"/team/app:v1", host+"/team/newer:v2"))
	checkImageOutput(t, out, stderr, err)
	const want = "warning: mutate reads the images, as asked, but the webhook itself does not read images (config images.mode: Off); its answer would differ"
	if !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
}
