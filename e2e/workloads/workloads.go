// Package workloads builds the programs that end-to-end test pods run, and
// lists the files a container image needs to run them: the program, glibc and
// the dynamic loader, and no driver file, so whatever driver a pod sees came
// from the injected mounts.
package workloads

import (
	"bufio"
	"bytes"
	"debug/elf"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

//go:embed csrc/cuda-check.c
var cudaCheckSource []byte

// CUDACheck is where Build places cuda-check in an image.
const CUDACheck = "/usr/bin/cuda-check"

// File is one file of an image: where it is on this machine, where it goes
// in the image, and its mode there.
type File struct {
	Source string
	Dest   string
	Mode   fs.FileMode
}

// Build compiles cuda-check into outDir and returns the files of an image
// that runs it: cuda-check at CUDACheck first, then RuntimeFiles of it.
// A driverless image for the classic nvidia-smi Job is the same list without
// its first entry, since nvidia-smi comes from the injected driver folder.
func Build(outDir string) ([]File, error) {
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
	runtime, err := DriverRuntimeFiles(bin)
	if err != nil {
		return nil, err
	}
	return append([]File{{Source: bin, Dest: CUDACheck, Mode: 0o755}}, runtime...), nil
}

// DriverNeeds are the glibc libraries that the NVIDIA driver's libraries
// (libcuda, libnvidia-ml) link besides libc, and the stand-in's link too.
// With glibc 2.34+ they are small stubs, but the loader still wants the files.
var DriverNeeds = []string{"libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1"}

// DriverRuntimeFiles is RuntimeFiles of binary plus DriverNeeds, beside libc:
// the files of an image whose program loads the node's driver.
func DriverRuntimeFiles(binary string) ([]File, error) {
	files, err := RuntimeFiles(binary)
	if err != nil {
		return nil, err
	}
	libc := ""
	have := map[string]bool{}
	for _, f := range files {
		have[path.Base(f.Dest)] = true
		if path.Base(f.Dest) == "libc.so.6" {
			libc = f.Dest
		}
	}
	if libc == "" {
		return nil, fmt.Errorf("%q links no libc.so.6, so no folder for the driver's glibc libraries", binary)
	}
	for _, name := range DriverNeeds {
		if have[name] {
			continue
		}
		dest := path.Join(path.Dir(libc), name)
		real, err := filepath.EvalSymlinks(dest)
		if err != nil {
			return nil, fmt.Errorf("failed to find %s, which the driver's libraries need: %w", name, err)
		}
		files = append(files, File{Source: real, Dest: dest, Mode: 0o755})
	}
	return files, nil
}

// RuntimeFiles lists the shared libraries and the dynamic loader that a
// dynamically linked program needs, as found by ldd on this machine. Each
// Source is the real file behind the path ldd names; each Dest is that path,
// which is where the loader looks in an image with no ld.so.cache.
func RuntimeFiles(binary string) ([]File, error) {
	interp, err := interpreter(binary)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("ldd", binary).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("failed to run ldd on %q: %w\n%s", binary, err, out)
	}
	paths, err := parseLDD(out)
	if err != nil {
		return nil, fmt.Errorf("failed to read ldd output for %q: %w", binary, err)
	}
	seen := map[string]bool{}
	var files []File
	for _, p := range append([]string{interp}, paths...) {
		if seen[p] {
			continue
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil, fmt.Errorf("failed to resolve %q: %w", p, err)
		}
		files = append(files, File{Source: real, Dest: p, Mode: 0o755})
	}
	return files, nil
}

func interpreter(binary string) (string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return "", fmt.Errorf("failed to read ELF file %q: %w", binary, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", fmt.Errorf("failed to read the interpreter of %q: %w", binary, err)
		}
		return string(bytes.TrimRight(b, "\x00")), nil
	}
	return "", fmt.Errorf("failed to find the interpreter of %q: it is not dynamically linked", binary)
}

// parseLDD reads the absolute paths out of ldd's lines, which come as
// "name => /path (0x...)", "/path (0x...)" or, for the vDSO, "name (0x...)".
func parseLDD(out []byte) ([]string, error) {
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if strings.Contains(line, "not a dynamic executable") {
			return nil, errors.New("statically linked: it needs no loader, and this package builds dynamic programs only")
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("missing library: %s", line)
		}
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " ")
		if strings.HasPrefix(p, "/") {
			paths = append(paths, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, errors.New("no library paths")
	}
	return paths, nil
}

// WriteRoot copies files into dir, an image's root folder, creating the
// folders on the way. A Dest under a symlinked folder of this machine (/lib on
// merged-/usr systems) becomes a real folder in the image, which the loader
// searches all the same.
func WriteRoot(dir string, files []File) error {
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
