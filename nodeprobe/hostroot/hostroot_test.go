package hostroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
	for i := range MaxSymlinks + 1 {
		ln(fmt.Sprintf("usr/lib/c%d", i), fmt.Sprintf("c%d", i+1))
	}
	mk(fmt.Sprintf("usr/lib/c%d", MaxSymlinks+1))
	for name, tc := range map[string]struct {
		in, want string
		err      error
	}{
		"absolute link is re-rooted": {in: "/usr/lib/abs", want: "/etc/passwd"},
		"dot-dot stops at the root":  {in: "/usr/lib/climb", want: "/etc/passwd"},
		"link to the real outside":   {in: "/usr/lib/out", err: os.ErrNotExist},
		"folder link":                {in: "/lib/rel", want: "/usr/lib/libcuda.so.1.real"},
		"chain":                      {in: "/usr/lib/chain", want: "/usr/lib/libcuda.so.1.real"},
		"loop":                       {in: "/usr/lib/loop", err: ErrTooManyLinks},
		"dangling":                   {in: "/usr/lib/dangling", err: os.ErrNotExist},
		"dot-dot in the input":       {in: "/../../usr/./lib/../lib/rel", want: "/usr/lib/libcuda.so.1.real"},
		"root":                       {in: "/", want: "/"},
		// As the host's kernel, not as a lexical join: a missing folder
		// fails the lookup even when a '..' leaves it.
		"dot-dot after a missing folder": {in: "/nowhere/../etc/passwd", err: os.ErrNotExist},
		"a chain longer than Linux's":    {in: "/usr/lib/c0", err: ErrTooManyLinks},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Resolve(root, tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Errorf("Resolve(%q) = %q, %v; want error %v", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	if _, err := Resolve(root, "relative"); err == nil {
		t.Error("a relative path resolved")
	}
}
