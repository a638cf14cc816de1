package nodeprobe

import (
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/gpu-injector/gpu-injector/nodeprobe/hostroot"
)

// hostFS reads a host's files through a folder where the host's / is mounted.
// Every path it takes and returns is a host path (as the host sees it); links
// resolve as they would on the host, so an absolute link target or a '..'
// never leaves the root.
type hostFS struct {
	root string
}

// osPath is where a host path is on this machine.
func (h hostFS) osPath(p string) string { return hostroot.OSPath(h.root, p) }

// resolve returns the host path of what p names after following every link,
// like realpath(3) run on the host. The last element must exist.
func (h hostFS) resolve(p string) (string, error) { return hostroot.Resolve(h.root, p) }

// stat follows links inside the root.
func (h hostFS) stat(p string) (string, fs.FileInfo, error) {
	real, err := h.resolve(p)
	if err != nil {
		return "", nil, err
	}
	fi, err := os.Lstat(h.osPath(real))
	if err != nil {
		return "", nil, fmt.Errorf("failed to stat %q: %w", real, bare(err))
	}
	return real, fi, nil
}

// readDir lists a host folder without following the links it holds.
func (h hostFS) readDir(p string) ([]fs.DirEntry, error) {
	des, err := os.ReadDir(h.osPath(p))
	if err != nil {
		return nil, fmt.Errorf("failed to list %q: %w", p, bare(err))
	}
	return des, nil
}

// readFile reads a host file after resolving it inside the root.
func (h hostFS) readFile(p string) ([]byte, error) {
	real, err := h.resolve(p)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(h.osPath(real))
	if err != nil {
		return nil, fmt.Errorf("failed to read %q: %w", p, bare(err))
	}
	return data, nil
}

// bare drops the machine path from an os error: messages name host paths
// only, which are the same on every machine.
func bare(err error) error { return hostroot.Bare(err) }

// linkChain lists p and every path its links lead to, in order, each with its
// folders resolved, ending at the real file (or where the chain broke): the
// way from /usr/lib/x86_64-linux-gnu/libcuda.so.1 through
// /etc/alternatives/... to /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1
// and on to the versioned file.
func (h hostFS) linkChain(p string) []string {
	chain := []string{p}
	current := p
	for range hostroot.MaxSymlinks {
		dir, err := h.resolve(path.Dir(current))
		if err != nil {
			break
		}
		current = path.Join(dir, path.Base(current))
		chain[len(chain)-1] = current
		fi, err := os.Lstat(h.osPath(current))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			break
		}
		target, err := os.Readlink(h.osPath(current))
		if err != nil {
			break
		}
		if !path.IsAbs(target) {
			target = path.Join(dir, target)
		}
		current = path.Clean(target)
		chain = append(chain, current)
	}
	return chain
}
