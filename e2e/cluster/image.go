package cluster

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

// ImageConfig is the part of an OCI image config a test image may need.
type ImageConfig struct {
	// Entrypoint runs when a pod gives no command.
	Entrypoint []string
	// Env is KEY=VALUE pairs.
	Env []string
}

// WriteImage writes a docker-archive tar (what `docker save` makes and
// `ctr images import` reads) with one layer built from files: container path ->
// host path. A host file is copied with its mode (symlinks followed, so a
// library's SONAME link becomes the library); a host folder is copied whole,
// symlinks inside it kept as links. Parent folders are created as needed.
// Nothing else goes in: a test image holds exactly what it is given. The
// archive itself is go-containerregistry's, as the release image's is.
func WriteImage(tarPath, ref string, files map[string]string, cfg ImageConfig) error {
	data, err := ociimage.Layer(files)
	if err != nil {
		return fmt.Errorf("failed to build layer of %s: %w", ref, err)
	}
	// Test images are imported once and thrown away: no compression to wait for.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompressionLevel(gzip.NoCompression))
	if err != nil {
		return fmt.Errorf("failed to make the layer of %s: %w", ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("failed to make image %s: %w", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("failed to read the config of %s: %w", ref, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint, cf.Config.Env = cfg.Entrypoint, cfg.Env
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("failed to set the config of %s: %w", ref, err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("failed to parse image name %q: %w", ref, err)
	}
	if err := os.MkdirAll(filepath.Dir(tarPath), 0o755); err != nil {
		return fmt.Errorf("failed to create image dir: %w", err)
	}
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		return fmt.Errorf("failed to write image %s: %w", tarPath, err)
	}
	return nil
}

// pauseSource is the sandbox ("pause") container: it only waits for the signal
// that ends the pod, and reaps the zombies of a shared PID namespace.
const pauseSource = `#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
	signal(SIGINT, stop);
	signal(SIGTERM, stop);
	signal(SIGCHLD, reap);
	for (;;) pause();
}
`

// buildPause compiles the pause program statically and wraps it as ref.
func buildPause(ctx context.Context, dir, ref string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("failed to create %s: %w", dir, err)
	}
	src := filepath.Join(dir, "pause.c")
	bin := filepath.Join(dir, "pause")
	if err := os.WriteFile(src, []byte(pauseSource), 0o644); err != nil {
		return "", fmt.Errorf("failed to write pause source: %w", err)
	}
	out, err := exec.CommandContext(ctx, "gcc", "-static", "-O2", "-o", bin, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("failed to compile pause (needs gcc and libc6-dev): %w: %s", err, out)
	}
	tarPath := filepath.Join(dir, "pause.tar")
	if err := WriteImage(tarPath, ref, map[string]string{"/pause": bin}, ImageConfig{Entrypoint: []string{"/pause"}}); err != nil {
		return "", err
	}
	return tarPath, nil
}
