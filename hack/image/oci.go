package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
)

// Media types of the OCI image spec.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// platform is one architecture of the image: how to build the cgo binary for
// it and where its glibc files come from.
type platform struct {
	arch string // GOARCH and OCI architecture
	// cc is the C compiler for cgo; "" is the host's.
	cc string
	// sysroot holds the target's glibc (Debian's libc6-<arch>-cross); "" is
	// the host, read through ldd.
	sysroot string
	// aptPackages provide cc and sysroot on Debian.
	aptPackages []string
	// libDir is the multiarch folder the image's libraries go in.
	libDir string
}

var platforms = map[string]platform{
	"amd64": {arch: "amd64", libDir: "/lib/x86_64-linux-gnu"},
	"arm64": {arch: "arm64", cc: "aarch64-linux-gnu-gcc", sysroot: "/usr/aarch64-linux-gnu",
		aptPackages: []string{"gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"}, libDir: "/lib/aarch64-linux-gnu"},
}

// ensureCrossCompiler installs the Debian cross compiler when it is missing,
// saying so: cgo (go-nvml's dlopen) needs a C compiler for the target.
func ensureCrossCompiler(p platform) error {
	if p.cc == "" {
		return nil
	}
	if _, err := exec.LookPath(p.cc); err == nil {
		if _, err := os.Stat(filepath.Join(p.sysroot, "lib", "libc.so.6")); err == nil {
			return nil
		}
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("failed to find %s for the %s binary: install %s (Debian/Ubuntu) or build with -platforms linux/amd64", p.cc, p.arch, strings.Join(p.aptPackages, " "))
	}
	fmt.Fprintf(os.Stderr, "image: %s is missing; installing %s with apt-get (the cgo cross compiler and glibc of the %s binary)\n", p.cc, strings.Join(p.aptPackages, " "), p.arch)
	for _, args := range [][]string{{"update"}, append([]string{"install", "-y", "--no-install-recommends"}, p.aptPackages...)} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("failed to install %s (apt-get %s): %w", strings.Join(p.aptPackages, " "), args[0], err)
		}
	}
	return nil
}

// buildBinary cross-compiles gpu-injector for the platform.
func buildBinary(p platform, out, version string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "image: building %s for linux/%s (cgo, %s)\n", binaryPath, p.arch, version)
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/gpu-injector/gpu-injector/version.Version="+version, "-o", out, ".")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux", "GOARCH="+p.arch)
	if p.cc != "" {
		build.Env = append(build.Env, "CC="+p.cc)
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("failed to build gpu-injector for %s: %w", p.arch, err)
	}
	return nil
}

// sysrootFiles finds what a cross-built binary needs from the target's glibc
// without running it: its ELF interpreter and DT_NEEDED libraries (and
// theirs), plus NVML's needs, from the sysroot. Image path -> host path.
func sysrootFiles(p platform, binary string) (map[string]string, error) {
	files := map[string]string{}
	lib := filepath.Join(p.sysroot, "lib")
	var visit func(file string) error
	seen := map[string]bool{}
	visit = func(file string) error {
		f, err := elf.Open(file)
		if err != nil {
			return fmt.Errorf("failed to read %s: %w", file, err)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			data := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(data, 0); err != nil {
				return fmt.Errorf("failed to read the interpreter of %s: %w", file, err)
			}
			interp := strings.TrimRight(string(data), "\x00")
			src, err := filepath.EvalSymlinks(filepath.Join(lib, path.Base(interp)))
			if err != nil {
				return fmt.Errorf("failed to find %s's interpreter %s in %s: %w", file, interp, lib, err)
			}
			files[interp] = src
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("failed to read the libraries of %s: %w", file, err)
		}
		for _, n := range needed {
			if seen[n] {
				continue
			}
			seen[n] = true
			src, err := filepath.EvalSymlinks(filepath.Join(lib, n))
			if err != nil {
				return fmt.Errorf("failed to find %s (needed by %s) in %s: %w", n, file, lib, err)
			}
			files[path.Join(p.libDir, n)] = src
			if err := visit(src); err != nil {
				return err
			}
		}
		return nil
	}
	if err := visit(binary); err != nil {
		return nil, err
	}
	for _, n := range workloads.DriverNeeds {
		src, err := filepath.EvalSymlinks(filepath.Join(lib, n))
		if err != nil {
			return nil, fmt.Errorf("failed to find %s, which the driver's libraries need, in %s: %w", n, lib, err)
		}
		files[path.Join(p.libDir, n)] = src
	}
	return files, nil
}

// platformFiles builds the binary for p and lists the image's files.
func platformFiles(p platform, tmp, version string) (map[string]string, error) {
	if p.arch == runtime.GOARCH {
		// This machine's own: its compiler and its glibc.
		p.cc, p.sysroot = "", ""
	}
	if err := ensureCrossCompiler(p); err != nil {
		return nil, err
	}
	bin := filepath.Join(tmp, "gpu-injector-"+p.arch)
	if err := buildBinary(p, bin, version); err != nil {
		return nil, err
	}
	if p.sysroot == "" {
		return hostFiles(bin)
	}
	files, err := sysrootFiles(p, bin)
	if err != nil {
		return nil, err
	}
	files[binaryPath] = bin
	return files, nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *ociPlatform      `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociPlatform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// BuildIndex writes a multi-platform image as an OCI image layout in a tar
// (oci-layout, index.json, blobs/sha256/...): an image index with one
// manifest per platform, named ref. `ctr images import --all-platforms`,
// `skopeo copy oci-archive:` and `crane push` read it.
func BuildIndex(out, ref, version string, archs []string) error {
	tmp, err := os.MkdirTemp("", "gpu-injector-index-")
	if err != nil {
		return fmt.Errorf("failed to create a temp folder: %w", err)
	}
	defer os.RemoveAll(tmp)
	blobs := map[string][]byte{}
	add := func(mediaType string, data []byte) descriptor {
		sum := sha256.Sum256(data)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = data
		return descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
	}
	var manifests []descriptor
	for _, arch := range archs {
		p, ok := platforms[arch]
		if !ok {
			return fmt.Errorf("failed to build the image index: unknown platform linux/%s (known: amd64, arm64)", arch)
		}
		files, err := platformFiles(p, tmp, version)
		if err != nil {
			return err
		}
		layer, err := cluster.ImageLayer(files)
		if err != nil {
			return fmt.Errorf("failed to build the %s layer: %w", arch, err)
		}
		layerDesc := add(mediaLayer, layer)
		config, err := json.Marshal(map[string]any{
			"architecture": arch, "os": "linux",
			"created": time.Unix(0, 0).UTC().Format(time.RFC3339),
			"config":  map[string]any{"Entrypoint": []string{binaryPath}},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
		})
		if err != nil {
			return fmt.Errorf("failed to encode the %s config: %w", arch, err)
		}
		manifest, err := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": mediaManifest,
			"config": add(mediaConfig, config), "layers": []descriptor{layerDesc},
		})
		if err != nil {
			return fmt.Errorf("failed to encode the %s manifest: %w", arch, err)
		}
		d := add(mediaManifest, manifest)
		d.Platform = &ociPlatform{Architecture: arch, OS: "linux"}
		manifests = append(manifests, d)
	}
	inner, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": manifests})
	if err != nil {
		return fmt.Errorf("failed to encode the image index: %w", err)
	}
	innerDesc := add(mediaIndex, inner)
	tag := ref[strings.LastIndex(ref, ":")+1:]
	innerDesc.Annotations = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
	top, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": []descriptor{innerDesc}})
	if err != nil {
		return fmt.Errorf("failed to encode index.json: %w", err)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := errors.Join(
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755}),
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755}),
	); err != nil {
		return fmt.Errorf("failed to write %s: %w", out, err)
	}
	// Sorted, so equal inputs give equal archives.
	for _, digest := range slices.Sorted(maps.Keys(blobs)) {
		if err := write("blobs/sha256/"+strings.TrimPrefix(digest, "sha256:"), blobs[digest]); err != nil {
			return fmt.Errorf("failed to write %s: %w", out, err)
		}
	}
	if err := errors.Join(write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)), write("index.json", top), tw.Close()); err != nil {
		return fmt.Errorf("failed to write %s: %w", out, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", filepath.Dir(out), err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("failed to write %s: %w", out, err)
	}
	fmt.Fprintf(os.Stderr, "image: wrote %s (%s, OCI image index of linux/%s)\n", out, ref, strings.Join(archs, ", linux/"))
	return nil
}
