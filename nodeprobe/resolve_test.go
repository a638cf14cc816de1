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

func TestResolveStaysInRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(p, target string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("etc/passwd")
	mk("usr/lib/libcuda.so.1.real")
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln("lib", "usr/lib")
	ln("usr/lib/abs", "/etc/passwd")
	ln("usr/lib/climb", "../../../../../../../etc/passwd")
	ln("usr/lib/out", outside+"/secret")
	ln("usr/lib/rel", "libcuda.so.1.real")
	ln("usr/lib/chain", "/lib/rel")
	ln("usr/lib/loop", "loop")
	ln("usr/lib/dangling", "/nowhere")
	h := hostFS{root: root}
	for name, tc := range map[string]struct {
		in, want string
		err      error
	}{
		"absolute link is re-rooted": {in: "/usr/lib/abs", want: "/etc/passwd"},
		"dot-dot stops at the root":  {in: "/usr/lib/climb", want: "/etc/passwd"},
		"link to the real outside":   {in: "/usr/lib/out", err: os.ErrNotExist},
		"folder link":                {in: "/lib/rel", want: "/usr/lib/libcuda.so.1.real"},
		"chain":                      {in: "/usr/lib/chain", want: "/usr/lib/libcuda.so.1.real"},
		"loop":                       {in: "/usr/lib/loop", err: errTooManyLinks},
		"dangling":                   {in: "/usr/lib/dangling", err: os.ErrNotExist},
		"dot-dot in the input":       {in: "/../../usr/./lib/../lib/rel", want: "/usr/lib/libcuda.so.1.real"},
		"root":                       {in: "/", want: "/"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := h.resolve(tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Errorf("resolve(%q) = %q, %v; want error %v", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	if _, err := h.resolve("relative"); err == nil {
		t.Error("a relative path resolved")
	}
}

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
