// Package workloads builds the programs that end-to-end test pods run, and
// lists the files a container image needs to run them: the program, glibc and
// the dynamic loader, and no driver file, so whatever driver a pod sees came
// from the injected mounts.
package workloads

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

//go:embed csrc/cuda-check.c
var cudaCheckSource []byte

// CUDACheck is where Build places cuda-check in an image.
const CUDACheck = "/usr/bin/cuda-check"

// Build compiles cuda-check into outDir and returns the files of an image
// that runs it: cuda-check at CUDACheck first, then the files it and the
// driver need (ociimage.DriverRuntimeFiles). A driverless image for the classic
// nvidia-smi Job is the same list without its first entry, since nvidia-smi
// comes from the injected driver folder.
func Build(outDir string) ([]ociimage.File, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %q: %w", outDir, err)
	}
	src := filepath.Join(outDir, "cuda-check.c")
	if err := os.WriteFile(src, cudaCheckSource, 0o644); err != nil {
		return nil, fmt.Errorf("failed to write %q: %w", src, err)
	}
	bin := filepath.Join(outDir, "cuda-check")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	// Dynamic glibc on purpose: the loader must search LD_LIBRARY_PATH, as in
	// a real CUDA image. -ldl for glibc older than 2.34, where dlopen lived there.
	cmd := exec.Command(cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-o", bin, src, "-ldl")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("failed to compile cuda-check: %w\n%s", err, out)
	}
	// DriverRuntimeFiles: a CUDA image holds the whole glibc, and the driver's
	// libraries (nvidia-smi's libnvidia-ml among them) need more of it than
	// cuda-check does.
	runtime, err := ociimage.DriverRuntimeFiles(bin)
	if err != nil {
		return nil, err
	}
	return append([]ociimage.File{{Source: bin, Dest: CUDACheck, Mode: 0o755}}, runtime...), nil
}

// WriteRoot copies files into dir, an image's root folder, creating the
// folders on the way. A Dest under a symlinked folder of this machine (/lib on
// merged-/usr systems) becomes a real folder in the image, which the loader
// searches all the same.
func WriteRoot(dir string, files []ociimage.File) error {
	for _, f := range files {
		dst := filepath.Join(dir, filepath.FromSlash(f.Dest))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("failed to create folder of %q: %w", dst, err)
		}
		b, err := os.ReadFile(f.Source)
		if err != nil {
			return fmt.Errorf("failed to read %q: %w", f.Source, err)
		}
		if err := os.WriteFile(dst, b, f.Mode); err != nil {
			return fmt.Errorf("failed to write %q: %w", dst, err)
		}
		if err := os.Chmod(dst, f.Mode); err != nil {
			return fmt.Errorf("failed to set mode of %q: %w", dst, err)
		}
	}
	return nil
}
