//go:build linux

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxSymlinks is the kernel's own limit on symlinks in one path walk (40),
// so podsim refuses what the container itself could not resolve.
const maxSymlinks = 40

// resolveIn returns where container path p lies on the host when root is the
// container's "/": symlinks in the root are followed as the container would
// see them, so an absolute link such as /lib -> /usr/lib stays inside root and
// a hostile link such as /x -> /etc or ../../.. cannot make podsim create a
// mount point, or mount, outside the root. Missing components are kept as is.
func resolveIn(root, p string) (string, error) {
	resolved := "/"
	remaining := p
	links := 0
	for remaining != "" {
		var comp string
		remaining = strings.TrimLeft(remaining, "/")
		comp, remaining, _ = strings.Cut(remaining, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, comp)
		fi, err := os.Lstat(filepath.Join(root, next))
		if errors.Is(err, fs.ErrNotExist) {
			resolved = next
			continue
		}
		if err != nil {
			return "", fmt.Errorf("failed to resolve %q in root %q: %w", p, root, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		links++
		if links > maxSymlinks {
			return "", fmt.Errorf("failed to resolve %q in root %q: too many symbolic links", p, root)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("failed to read link %q in root %q: %w", next, root, err)
		}
		if path.IsAbs(target) {
			resolved = "/"
		}
		remaining = target + "/" + remaining
	}
	return filepath.Join(root, resolved), nil
}
