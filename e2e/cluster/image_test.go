package cluster

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
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

	f, err := os.Open(tarPath)
	must(err)
	defer f.Close()
	outer, _ := readTar(t, f)

	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	must(json.Unmarshal([]byte(outer["manifest.json"]), &manifest))
	if len(manifest) != 1 || len(manifest[0].Layers) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "example.local/img:v1" {
		t.Fatalf("manifest = %+v", manifest)
	}
	var cfg struct {
		Config struct{ Entrypoint []string }
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	must(json.Unmarshal([]byte(outer[manifest[0].Config]), &cfg))
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/bin/prog" {
		t.Errorf("entrypoint = %v", cfg.Config.Entrypoint)
	}
	wantDiff := "sha256:" + filepath.Dir(manifest[0].Layers[0])
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != wantDiff {
		t.Errorf("diff_ids = %v, want [%s]", cfg.RootFS.DiffIDs, wantDiff)
	}

	layer, headers := readTar(t, bytes.NewReader([]byte(outer[manifest[0].Layers[0]])))
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
