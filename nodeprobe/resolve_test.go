package nodeprobe

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-injector/gpu-injector/nodeprobe/ldcache"
)

// TestReadDirStaysInRoot: a folder reached through an absolute link is
// listed as the host has it, not as this machine does.
func TestReadDirStaysInRoot(t *testing.T) {
	root := t.TempDir()
	write(t, root, "/usr/lib/libcuda.so.1", "")
	if err := os.Symlink("/usr/lib", filepath.Join(root, "usr/lib64")); err != nil {
		t.Fatal(err)
	}
	des, err := hostFS{root: root}.readDir("/usr/lib64")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	if len(names) != 1 || names[0] != "libcuda.so.1" {
		t.Errorf("/usr/lib64 lists %q, want the host's /usr/lib: [libcuda.so.1]", names)
	}
}

// TestDiscoverReadsOnlyRegularFiles: the host's ld.so.cache is read only
// when it is a regular file within the size limit. A FIFO would block the
// read for ever, and a huge file cost memory.
func TestDiscoverReadsOnlyRegularFiles(t *testing.T) {
	cache, err := ldcache.Encode([]ldcache.Entry{{Key: "libcuda.so.1", Value: "/usr/lib/libcuda.so.1", Flags: ldcache.FlagELFLibc6}}, ldcache.FormatNew)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		make func(t *testing.T, p string)
		want string
	}{
		"a FIFO": {make: func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: "not a regular file"},
		"a cache over the size limit": {make: func(t *testing.T, p string) {
			if err := os.WriteFile(p, append(cache, make([]byte, maxLDCacheBytes)...), 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: "over the size limit"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/usr/lib/libcuda.so.1", "")
			write(t, root, "/etc/ld.so.conf", "")
			tc.make(t, filepath.Join(root, "etc/ld.so.cache"))
			done := make(chan *Files, 1)
			go func() {
				f, err := Discover(root)
				if err != nil {
					t.Error(err)
				}
				done <- f
			}()
			select {
			case f := <-done:
				if f == nil {
					return
				}
				if f.Cache != nil || !strings.Contains(strings.Join(f.Skipped, "\n"), "/etc/ld.so.cache: failed to read \"/etc/ld.so.cache\": "+tc.want) {
					t.Errorf("cache %v, skipped %q; want it unread: %s", f.Cache, f.Skipped, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Discover did not return in 10 s")
			}
		})
	}
}

// TestOpenFollowsNoLinkAfterResolution: the open that follows resolve
// follows no link, so a file or folder swapped for one in between is
// refused. Without openat2 (old kernels, seccomp profiles without it) only
// a link at the last element is.
func TestOpenFollowsNoLinkAfterResolution(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	write(t, outside, "/etc/ld.so.cache", "outside")
	write(t, root, "/etc/x", "")
	if err := os.Symlink(filepath.Join(outside, "etc/ld.so.cache"), filepath.Join(root, "etc/ld.so.cache")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "etc"), filepath.Join(root, "var")); err != nil {
		t.Fatal(err)
	}
	h := hostFS{root: root}
	for name, fallback := range map[string]bool{"openat2": false, "without openat2": true} {
		t.Run(name, func(t *testing.T) {
			if fallback {
				defer func(f func(int, string, *unix.OpenHow) (int, error)) { openat2 = f }(openat2)
				openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
			}
			// As if each had been resolved before it became a link.
			for _, p := range []string{"/etc/ld.so.cache", "/var/ld.so.cache"} {
				fd, err := h.openConfined(p, unix.O_PATH)
				if err == nil {
					var st unix.Stat_t
					_ = unix.Fstat(fd, &st)
					unix.Close(fd)
					if p == "/var/ld.so.cache" && fallback {
						continue // a folder's link is followed there
					}
					if st.Mode&unix.S_IFMT != unix.S_IFLNK {
						t.Errorf("%s opened what its link names", p)
					}
				} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOENT) {
					t.Errorf("%s: %v", p, err)
				}
				if _, err := h.openFile(p, noLimit); err == nil && p == "/etc/ld.so.cache" {
					t.Errorf("%s: opened a file outside the root", p)
				}
			}
		})
	}
}
