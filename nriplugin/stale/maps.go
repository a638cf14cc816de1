// Package stale finds the processes of GPU containers that still map a
// driver library deleted on disk: what a driver upgrade leaves behind until
// the container restarts. It reads the host's /proc, which anyone able to
// start a process on the node writes into (a file name of any bytes), so
// every reader here treats what it reads as untrusted and bounded.
package stale

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
)

// deletedSuffix is what the kernel appends to the name of a mapped file that
// was unlinked (fs/d_path.c, d_path).
const deletedSuffix = " (deleted)"

// Bounds on one maps file: the kernel writes a line of at most about 100
// bytes of fields and a path of at most PATH_MAX (4096) with \n escaped as
// \012, so a longer line is no maps line. A process maps tens of thousands of
// regions at most (vm.max_map_count is 65530 by default).
const (
	maxLineBytes = 16 << 10
	maxLines     = 1 << 17
	// MaxPathsPerProcess bounds the deleted paths kept of one process.
	MaxPathsPerProcess = 16
)

// ErrNotMaps is returned for input that is not a maps file.
var ErrNotMaps = errors.New("not a /proc/<pid>/maps file")

// DriverLibrary reports whether a path a process maps is a file of the
// NVIDIA driver: by its name, since the driver's files come under names that
// no other software uses, wherever a layout mounts them in the container.
func DriverLibrary(p string) bool {
	base := path.Base(p)
	stem, version, ok := strings.Cut(base, ".so")
	if !ok || !versionSuffix(version) {
		return false
	}
	for _, prefix := range driverLibraryPrefixes {
		if rest, ok := strings.CutPrefix(stem+".so", prefix); ok && nameChars(strings.TrimSuffix(rest, ".so")) {
			return true
		}
	}
	return false
}

// versionSuffix reports whether s is what follows ".so" in a library's
// name: nothing, or dot-separated numbers.
func versionSuffix(s string) bool {
	for s != "" {
		var ok bool
		if s, ok = strings.CutPrefix(s, "."); !ok {
			return false
		}
		n := 0
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		if n == 0 {
			return false
		}
		s = s[n:]
	}
	return true
}

func nameChars(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// driverLibraryPrefixes are the names of the libraries that NVIDIA's driver
// installs with the driver's version as their suffix (the container
// toolkit's list of driver libraries, plus libcuda and the GL vendor ones).
var driverLibraryPrefixes = []string{
	"libcuda.so", "libcudadebugger.so", "libnvidia-", "libnvcuvid.so", "libnvoptix.so",
	"libGLX_nvidia.so", "libEGL_nvidia.so", "libGLESv1_CM_nvidia.so", "libGLESv2_nvidia.so", "libvdpau_nvidia.so",
}

// DeletedDriverLibraries reads a /proc/<pid>/maps file and returns the
// driver libraries (DriverLibrary) it maps that were deleted, each once, in
// the order first mapped, at most MaxPathsPerProcess of them.
func DeletedDriverLibraries(r io.Reader) ([]string, error) {
	return deletedDriverLibraries(r, nil)
}

// deletedDriverLibraries is DeletedDriverLibraries, but for the mappings
// live reports as the live file they name: the kernel appends " (deleted)"
// to the name of a deleted file, but any process can map a file whose name
// ends so. Read here, not by procfs's ProcMaps: it keeps every line of the
// file, unbounded, where a process chooses how many it maps.
func deletedDriverLibraries(r io.Reader, live func(path string, inode uint64) bool) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	var out []string
	lines := 0
	for sc.Scan() {
		lines++
		if lines > maxLines {
			return out, fmt.Errorf("%w: more than %d lines", ErrNotMaps, maxLines)
		}
		inode, name, err := mappedName(sc.Bytes())
		if err != nil {
			return out, fmt.Errorf("%w: line %d: %w", ErrNotMaps, lines, err)
		}
		file, deleted := strings.CutSuffix(name, deletedSuffix)
		if !deleted || !strings.HasPrefix(file, "/") || !DriverLibrary(file) || slices.Contains(out, file) {
			continue
		}
		if live != nil && live(name, inode) {
			continue
		}
		if len(out) < MaxPathsPerProcess {
			out = append(out, file)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("failed to read maps: %w", err)
	}
	return out, nil
}

// mappedName returns the inode and path fields of one maps line, "" for an
// anonymous mapping: "address perms offset dev inode [path]", the first five
// fields separated by one space, the path after padding, and itself free to
// hold spaces.
func mappedName(line []byte) (inode uint64, name string, err error) {
	rest := line
	for i := range 5 {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			if i == 4 && len(rest) > 0 {
				inode, err = strconv.ParseUint(string(rest), 10, 64)
				if err != nil {
					return 0, "", fmt.Errorf("inode %q is no number", layoutTruncate(rest))
				}
				return inode, "", nil
			}
			return 0, "", fmt.Errorf("%d fields, want at least 5", i+boolInt(len(rest) > 0))
		}
		if end == 0 {
			return 0, "", errors.New("an empty field")
		}
		if i == 4 {
			inode, err = strconv.ParseUint(string(rest[:end]), 10, 64)
			if err != nil {
				return 0, "", fmt.Errorf("inode %q is no number", layoutTruncate(rest[:end]))
			}
		}
		rest = rest[end:]
	}
	return inode, string(bytes.TrimLeft(rest, " ")), nil
}

// layoutTruncate is at most 32 bytes of b, for an error.
func layoutTruncate(b []byte) string {
	if len(b) > 32 {
		b = b[:32]
	}
	return string(b)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
