package ociimage

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// File is one file of an image: where it is on this machine, where it goes
// in the image, and its mode there.
type File struct {
	Source string
	Dest   string
	Mode   fs.FileMode
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
