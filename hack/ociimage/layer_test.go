package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestLayer(t *testing.T) {
	host := t.TempDir()
	write := func(p, data string, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(host, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, p), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("bin/tool", "#!/bin/sh\n", 0o755)
	write("lib/libc.so.6.real", "libc", 0o644)
	if err := os.Symlink("libc.so.6.real", filepath.Join(host, "lib/libc.so.6")); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"/usr/bin/tool":          filepath.Join(host, "bin/tool"),
		"/lib/x86_64-linux-gnu":  filepath.Join(host, "lib"),
		"/etc/libc-by-link.so.6": filepath.Join(host, "lib/libc.so.6"),
	}
	data, err := Layer(files)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Layer(files)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, again) {
		t.Error("equal inputs gave different layers")
	}

	type entry struct {
		kind byte
		mode int64
		link string
		data string
	}
	got := map[string]entry{}
	var names []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		got[h.Name] = entry{kind: h.Typeflag, mode: h.Mode, link: h.Linkname, data: string(b)}
	}
	if !slices.IsSorted(names) {
		t.Errorf("entries not sorted, so parents may follow children: %v", names)
	}
	want := map[string]entry{
		"etc/":                                {kind: tar.TypeDir, mode: 0o755},
		"etc/libc-by-link.so.6":               {kind: tar.TypeReg, mode: 0o644, data: "libc"},
		"lib/":                                {kind: tar.TypeDir, mode: 0o755},
		"lib/x86_64-linux-gnu/":               {kind: tar.TypeDir, mode: 0o755},
		"lib/x86_64-linux-gnu/libc.so.6":      {kind: tar.TypeSymlink, mode: 0o777, link: "libc.so.6.real"},
		"lib/x86_64-linux-gnu/libc.so.6.real": {kind: tar.TypeReg, mode: 0o644, data: "libc"},
		"usr/":                                {kind: tar.TypeDir, mode: 0o755},
		"usr/bin/":                            {kind: tar.TypeDir, mode: 0o755},
		"usr/bin/tool":                        {kind: tar.TypeReg, mode: 0o755, data: "#!/bin/sh\n"},
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s = %+v (present %v), want %+v", name, g, ok, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("layer holds %v, want exactly %d entries", names, len(want))
	}

	if _, err := Layer(map[string]string{"/": filepath.Join(host, "bin/tool")}); err == nil {
		t.Error("a file at the image's root was accepted")
	}
}
