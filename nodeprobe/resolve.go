package nodeprobe

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

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

// readDir lists a host folder, its links resolved inside the root, without
// following the links it holds.
func (h hostFS) readDir(p string) ([]fs.DirEntry, error) {
	real, err := h.resolve(p)
	if err != nil {
		return nil, err
	}
	fd, err := h.openConfined(real, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("failed to list %q: %w", p, err)
	}
	dir := os.NewFile(uintptr(fd), real)
	defer dir.Close()
	des, err := dir.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("failed to list %q: %w", p, bare(err))
	}
	slices.SortFunc(des, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return des, nil
}

var (
	errNotRegular = errors.New("not a regular file")
	errTooLarge   = errors.New("over the size limit")
)

// noLimit is openFile's limit for a file read in pieces, never whole.
const noLimit = -1

// openFile opens the regular file a host path names, of at most limit
// bytes, for reading. Its links are resolved inside the root first; the
// open follows none (openConfined), so a file or folder swapped for a link
// after the resolution is an error, not followed. The file is checked before
// it is opened for reading: a FIFO would block the read (a FIFO at
// /etc/ld.so.cache would hang the probe) and a device may act on an open.
func (h hostFS) openFile(p string, limit int64) (*os.File, error) {
	real, err := h.resolve(p)
	if err != nil {
		return nil, err
	}
	fd, err := h.openConfined(real, unix.O_PATH)
	if err != nil {
		return nil, fmt.Errorf("failed to open %q: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("failed to stat %q: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("failed to read %q: %w", p, errNotRegular)
	}
	if limit != noLimit && st.Size > limit {
		return nil, fmt.Errorf("failed to read %q: %w: %d bytes, at most %d", p, errTooLarge, st.Size, limit)
	}
	// Reopened through the descriptor, so the file read is the file checked.
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDONLY|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open %q: %w", p, bare(err))
	}
	return f, nil
}

// readFile reads a host file of at most limit (>= 0) bytes (openFile).
// /proc and /sys files report no size or a page, so the read is bounded too.
func (h hostFS) readFile(p string, limit int64) ([]byte, error) {
	f, err := h.openFile(p, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %q: %w", p, bare(err))
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("failed to read %q: %w: more than %d bytes", p, errTooLarge, limit)
	}
	return data, nil
}

// openat2 is unix.Openat2; tests replace it to take the fallback.
var openat2 = unix.Openat2

// openConfined opens a resolved host path with flags, following no link:
// openat2 confines the whole lookup to the root and refuses a link in any
// element (Linux 5.6). Where the kernel or the seccomp profile has no
// openat2, only the last element's link is refused (O_NOFOLLOW). Not
// filepath-securejoin's OpenInRoot: it follows links inside the root, where
// this open of a path already resolved must follow none.
func (h hostFS) openConfined(real string, flags int) (int, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	root, err := unix.Open(h.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for range 8 {
		fd, err := openat2(root, real, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			// A rename or mount raced the lookup: try again.
			continue
		case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
			fd, err := unix.Open(h.osPath(real), flags, 0)
			if err != nil {
				return -1, err
			}
			return fd, nil
		default:
			return -1, err
		}
	}
	return -1, unix.EAGAIN
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
