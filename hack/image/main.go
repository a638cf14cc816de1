// Command image builds gpu-injector's container image without a Docker
// engine: the cgo binary, the glibc files it links (it loads the host's NVML
// with dlopen), nothing else. The result is a docker-archive tar, which
// `docker load`, `ctr images import`, `kind load image-archive` and
// `crane push` all read.
//
//	go run ./hack/image -o _output/gpu-injector-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
)

const binaryPath = "/usr/local/bin/gpu-injector"

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("o", "_output/gpu-injector-image.tar", "where to write the image tar of this machine's platform (docker-archive); empty skips it")
	ociOut := flag.String("oci", "_output/gpu-injector-image-oci.tar", "where to write the multi-platform image index (OCI image layout tar); empty skips it")
	platformList := flag.String("platforms", "linux/amd64,linux/arm64", "platforms of the image index")
	ref := flag.String("ref", "", "image reference (default ghcr.io/gpu-injector/gpu-injector:<chart appVersion>)")
	version := flag.String("version", "", "version stamped in the binary (default: the chart's appVersion)")
	flag.Parse()

	appVersion, err := chartAppVersion("charts/gpu-injector/Chart.yaml")
	if err != nil {
		return err
	}
	if *ref == "" {
		*ref = "ghcr.io/gpu-injector/gpu-injector:" + appVersion
	}
	if *version == "" {
		*version = "v" + appVersion
	}
	if *out != "" {
		if err := Build(*out, *ref, *version); err != nil {
			return err
		}
	}
	if *ociOut == "" {
		return nil
	}
	var archs []string
	for _, p := range strings.Split(*platformList, ",") {
		goos, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos != "linux" {
			return fmt.Errorf("-platforms: %q is not linux/<arch>", p)
		}
		archs = append(archs, arch)
	}
	return BuildIndex(*ociOut, *ref, *version, archs)
}

// Build builds the binary and writes the image tar to out.
func Build(out, ref, version string) error {
	tmp, err := os.MkdirTemp("", "gpu-injector-image-")
	if err != nil {
		return fmt.Errorf("failed to create a temp folder: %w", err)
	}
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "gpu-injector")
	if err := buildBinary(platform{arch: runtime.GOARCH}, bin, version); err != nil {
		return err
	}
	files, err := hostFiles(bin)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", filepath.Dir(out), err)
	}
	if err := cluster.WriteImage(out, ref, files, cluster.ImageConfig{Entrypoint: []string{binaryPath}}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "image: wrote %s (%s, %d files)\n", out, ref, len(files))
	return nil
}

// hostFiles lists the image's files for a binary of this machine: the
// binary and the glibc files ldd names, plus what the host's libnvidia-ml,
// which the probe loads, links besides libc.
func hostFiles(bin string) (map[string]string, error) {
	rt, err := workloads.DriverRuntimeFiles(bin)
	if err != nil {
		return nil, err
	}
	files := map[string]string{binaryPath: bin}
	for _, f := range rt {
		files[f.Dest] = f.Source
	}
	return files, nil
}

// repoRoot is the module's folder, so Build works from any directory.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("failed to find the module root (go env GOMOD): %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func chartAppVersion(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("failed to read %s: %w", file, err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`), nil
		}
	}
	return "", fmt.Errorf("no appVersion in %s", file)
}
