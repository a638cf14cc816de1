package cluster

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// readTar returns name -> content (or link target) of every entry.
func readTar(t *testing.T, r io.Reader) (map[string]string, map[string]*tar.Header) {
	t.Helper()
	tr := tar.NewReader(r)
	files := map[string]string{}
	headers := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		headers[h.Name] = h
		if h.Typeflag == tar.TypeSymlink {
			files[h.Name] = "-> " + h.Linkname
		} else {
			files[h.Name] = string(data)
		}
	}
}

func TestWriteImage(t *testing.T) {
	host := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(host, "prog"), []byte("binary"), 0o755))
	must(os.Symlink("prog", filepath.Join(host, "prog-link")))
	must(os.MkdirAll(filepath.Join(host, "lib", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(host, "lib", "libc.so.6"), []byte("libc"), 0o644))
	must(os.Symlink("libc.so.6", filepath.Join(host, "lib", "libc.so")))

	tarPath := filepath.Join(t.TempDir(), "img.tar")
	err := WriteImage(tarPath, "example.local/img:v1", map[string]string{
		"/usr/bin/prog":     filepath.Join(host, "prog-link"), // top-level link: followed
		"/lib/x86_64-linux": filepath.Join(host, "lib"),       // folder: copied, inner link kept
	}, ImageConfig{Entrypoint: []string{"/usr/bin/prog"}})
	must(err)

	tag, err := name.NewTag("example.local/img:v1")
	must(err)
	img, err := tarball.ImageFromPath(tarPath, &tag)
	must(err)
	cf, err := img.ConfigFile()
	must(err)
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/bin/prog" || cf.Architecture != "amd64" || cf.OS != "linux" {
		t.Errorf("config: entrypoint %v, platform %s/%s", cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	must(err)
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	must(err)
	defer rc.Close()
	layer, headers := readTar(t, rc)
	want := map[string]string{
		"usr/":                       "",
		"usr/bin/":                   "",
		"usr/bin/prog":               "binary",
		"lib/":                       "",
		"lib/x86_64-linux/":          "",
		"lib/x86_64-linux/libc.so.6": "libc",
		"lib/x86_64-linux/libc.so":   "-> libc.so.6",
		"lib/x86_64-linux/sub/":      "",
	}
	var got, wantNames []string
	for n := range layer {
		got = append(got, n)
	}
	for n := range want {
		wantNames = append(wantNames, n)
	}
	sort.Strings(got)
	sort.Strings(wantNames)
	if len(got) != len(wantNames) {
		t.Fatalf("layer entries = %v, want %v", got, wantNames)
	}
	for n, content := range want {
		if layer[n] != content {
			t.Errorf("layer %s = %q, want %q", n, layer[n], content)
		}
	}
	if m := headers["usr/bin/prog"].Mode; m != 0o755 {
		t.Errorf("prog mode = %o, want 755", m)
	}
}

func TestWriteImageErrors(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"missing host file": {"/x": "/nonexistent/file"},
		"root as target":    {"/": "/etc/hostname"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := WriteImage(filepath.Join(t.TempDir(), "x.tar"), "x:v1", files, ImageConfig{}); err == nil {
				t.Fatal("WriteImage succeeded, want error")
			}
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"plain": {"/run/netns/cni-1", "/run/netns/cni-1"},
		"space": {`/tmp/a\040b`, "/tmp/a b"},
		"tab":   {`/tmp/a\011b`, "/tmp/a\tb"},
		"short": {`/tmp/a\04`, `/tmp/a\04`},
	} {
		t.Run(name, func(t *testing.T) {
			if got := unescapeMount(tc.in); got != tc.want {
				t.Errorf("unescapeMount(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestJoinLabels(t *testing.T) {
	got := joinLabels(map[string]string{"b": "2", "a": "1"})
	if got != "a=1,b=2" {
		t.Errorf("joinLabels = %q", got)
	}
}
