package fakeroot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/nodeprobe/ldcache"
)

func TestBuildEveryLayout(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			l, err := Build(root, name)
			if err != nil {
				t.Fatal(err)
			}
			dir := l.CacheDir
			switch dir {
			case "none":
				if _, err := os.Stat(filepath.Join(root, "etc/ld.so.cache")); err == nil {
					t.Error("a layout without a loader cache has one")
				}
				return
			case "":
				dir = "/etc"
			}
			data, err := os.ReadFile(filepath.Join(root, dir, "ld.so.cache"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := ldcache.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Lookup("libc.so.6")) == 0 && name != "talos-nvidia-extension" {
				t.Errorf("the cache lacks libc.so.6: %+v", c.Entries)
			}
			// GKE's and the GPU operator's drivers sit outside the host's loader cache.
			if l.DriverVersion != "" && len(c.Lookup("libcuda.so.1")) == 0 && !strings.HasPrefix(name, "gke") && !strings.HasPrefix(name, "gpu-operator") {
				t.Errorf("the cache lacks libcuda.so.1: %+v", c.Entries)
			}
			// Every library file carries the SONAME it was built with.
			for _, n := range l.nodes {
				if n.kind != kindLib {
					continue
				}
				if got, _, err := readELF(filepath.Join(root, n.path)); err != nil || got != n.soname {
					t.Errorf("%s: SONAME %q, %v; want %q", n.path, got, err, n.soname)
				}
			}
		})
	}
	if _, err := Build(t.TempDir(), "nope"); err == nil {
		t.Error("an unknown layout built")
	}
}
