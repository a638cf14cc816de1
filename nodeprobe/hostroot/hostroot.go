// Package hostroot reads paths of a host whose / is mounted at a folder of
// this machine: links resolve as they would on the host, so an absolute link
// target or a '..' never leaves the root. The probe reads the host through it,
// and the fake host roots of the tests index their libraries with it, so both
// follow links the same way.
package hostroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// MaxSymlinks matches Linux's limit on links followed in one lookup.
const MaxSymlinks = 40

// ErrTooManyLinks is wrapped by Resolve when a lookup follows more than
// MaxSymlinks links.
var ErrTooManyLinks = errors.New("too many levels of symbolic links")

// Resolve returns the host path of what p names after following every link,
// like realpath(3) run on the host whose / is root. The last element must
// exist. Errors name host paths only.
func Resolve(root, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("failed to resolve %q: not an absolute path", p)
	}
	current := "/"
	todo := strings.Split(p, "/")
	links := 0
	for len(todo) > 0 {
		elem := todo[0]
		todo = todo[1:]
		switch elem {
		case "", ".":
			continue
		case "..":
			current = path.Dir(current)
			continue
		}
		next := path.Join(current, elem)
		fi, err := os.Lstat(OSPath(root, next))
		if err != nil {
			return "", fmt.Errorf("failed to resolve %q at %q: %w", p, next, Bare(err))
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			current = next
			continue
		}
		links++
		if links > MaxSymlinks {
			return "", fmt.Errorf("failed to resolve %q: %w", p, ErrTooManyLinks)
		}
		target, err := os.Readlink(OSPath(root, next))
		if err != nil {
			return "", fmt.Errorf("failed to resolve %q at %q: %w", p, next, Bare(err))
		}
		if path.IsAbs(target) {
			current = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return current, nil
}

// OSPath is where the host path p is on this machine.
func OSPath(root, p string) string {
	return filepath.Join(root, filepath.FromSlash(p))
}

// Bare drops the machine path from an os error, so that a message names host
// paths only, which are the same on every machine.
func Bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
