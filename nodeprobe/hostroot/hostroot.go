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

	securejoin "github.com/cyphar/filepath-securejoin"
)

// MaxSymlinks matches Linux's limit on links followed in one lookup.
const MaxSymlinks = 40

// ErrTooManyLinks is wrapped by Resolve when a lookup follows more than
// MaxSymlinks links.
var ErrTooManyLinks = errors.New("too many levels of symbolic links")

// Resolve returns the host path of what p names after following every link,
// like realpath(3) run on the host whose / is root. Every element must
// exist. Errors name host paths only.
func Resolve(root, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("failed to resolve %q: not an absolute path", p)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("failed to resolve %q: %w", p, err)
	}
	l := &lookup{}
	real, err := securejoin.SecureJoinVFS(root, p, l)
	switch {
	case errors.Is(err, ErrTooManyLinks):
		return "", fmt.Errorf("failed to resolve %q: %w", p, ErrTooManyLinks)
	case l.failed != "":
		return "", fmt.Errorf("failed to resolve %q at %q: %w", p, hostPath(root, l.failed), Bare(l.err))
	case err != nil:
		return "", fmt.Errorf("failed to resolve %q: %w", p, Bare(err))
	}
	return hostPath(root, real), nil
}

// lookup is the filesystem of SecureJoinVFS as the host's kernel looks a
// path up: the library takes a missing element for a folder and follows up
// to 255 links, where Linux fails at the first missing element and after
// MaxSymlinks links.
type lookup struct {
	links int
	// failed is the first machine path whose Lstat or Readlink failed, with
	// err.
	failed string
	err    error
}

func (l *lookup) Lstat(name string) (os.FileInfo, error) {
	fi, err := os.Lstat(name)
	l.fail(name, err)
	return fi, err
}

func (l *lookup) Readlink(name string) (string, error) {
	if l.links++; l.links > MaxSymlinks {
		return "", ErrTooManyLinks
	}
	target, err := os.Readlink(name)
	l.fail(name, err)
	return target, err
}

func (l *lookup) fail(name string, err error) {
	if err != nil && l.failed == "" {
		l.failed, l.err = name, err
	}
}

// hostPath is the host path of a machine path that SecureJoinVFS built on
// root.
func hostPath(root, p string) string {
	return path.Clean("/" + filepath.ToSlash(strings.TrimPrefix(p, root)))
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
