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
			data, err := os.ReadFile(filepath.Join(root, "etc/ld.so.cache"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := ldcache.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Lookup("libc.so.6")) == 0 {
				t.Errorf("the cache lacks libc.so.6: %+v", c.Entries)
			}
			// GKE's and the GPU operator's drivers sit outside the host's loader cache.
			if l.DriverVersion != "" && len(c.Lookup("libcuda.so.1")) == 0 && !strings.HasPrefix(name, "gke") && name != "gpu-operator" {
				t.Errorf("the cache lacks libcuda.so.1: %+v", c.Entries)
			}
			// Every library file carries the SONAME it was built with.
			for _, n := range l.nodes {
				if n.kind != kindLib {
					continue
				}
				if got, err := readSONAME(filepath.Join(root, n.path)); err != nil || got != n.soname {
					t.Errorf("%s: SONAME %q, %v; want %q", n.path, got, err, n.soname)
				}
			}
		})
	}
	if _, err := Build(t.TempDir(), "nope"); err == nil {
		t.Error("an unknown layout built")
	}
}
