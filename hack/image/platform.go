package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

const binaryPath = "/usr/local/bin/gpu-injector"

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
	for _, n := range ociimage.DriverNeeds {
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

// hostFiles lists the image's files for a binary of this machine: the
// binary and the glibc files ldd names, plus what the host's libnvidia-ml,
// which the probe loads, links besides libc.
func hostFiles(bin string) (map[string]string, error) {
	rt, err := ociimage.DriverRuntimeFiles(bin)
	if err != nil {
		return nil, err
	}
	files := map[string]string{binaryPath: bin}
	for _, f := range rt {
		files[f.Dest] = f.Source
	}
	return files, nil
}

// repoRoot is the module's folder, so the build works from any directory.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("failed to find the module root (go env GOMOD): %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}
