// Package ociimage holds what the release image builder (hack/image), the
// release signer (hack/sign) and the end-to-end harness's test images share:
// the layer tar of a set of files, the tar of an image layout, and the files
// a dynamically linked program needs in an image with no ld.so.cache, the
// NVIDIA driver's glibc needs among them.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// layerEntry is one node of the image's file tree.
type layerEntry struct {
	hostPath string // regular file content
	link     string // symlink target
	dir      bool
	mode     fs.FileMode
}

// Layer returns an uncompressed layer tar of files (container path -> host
// path). A host file is copied with its mode (symlinks followed, so a
// library's SONAME link becomes the library); a host folder is copied whole,
// symlinks inside it kept as links. Parent folders are created as needed.
// Equal inputs give equal bytes, so images built from it are reproducible.
func Layer(files map[string]string) ([]byte, error) {
	entries, err := layerEntries(files)
	if err != nil {
		return nil, err
	}
	return writeLayer(entries)
}

// layerEntries are the layer's entries by container path: the files, the
// folders' content and every parent folder.
func layerEntries(files map[string]string) (map[string]layerEntry, error) {
	entries := map[string]layerEntry{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = layerEntry{dir: true, mode: 0o755}
			}
		}
	}
	for ctrPath, hostPath := range files {
		ctrPath = path.Clean("/" + ctrPath)
		if ctrPath == "/" {
			return nil, fmt.Errorf("container path of %s is the root", hostPath)
		}
		st, err := os.Stat(hostPath)
		if err != nil {
			return nil, fmt.Errorf("failed to stat %s: %w", hostPath, err)
		}
		addParents(ctrPath)
		if !st.IsDir() {
			entries[ctrPath] = layerEntry{hostPath: hostPath, mode: st.Mode().Perm()}
			continue
		}
		if err := addFolder(entries, ctrPath, hostPath); err != nil {
			return nil, fmt.Errorf("failed to walk %s: %w", hostPath, err)
		}
	}
	return entries, nil
}

// addFolder adds the host folder hostPath whole at ctrPath, symlinks inside
// it kept as links.
func addFolder(entries map[string]layerEntry, ctrPath, hostPath string) error {
	return filepath.WalkDir(hostPath, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(hostPath, p)
		if err != nil {
			return err
		}
		target := path.Join(ctrPath, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			entries[target] = layerEntry{link: link}
		case d.IsDir():
			entries[target] = layerEntry{dir: true, mode: info.Mode().Perm()}
		case d.Type().IsRegular():
			entries[target] = layerEntry{hostPath: p, mode: info.Mode().Perm()}
		}
		return nil
	})
}

// writeLayer writes the entries as a tar stream.
func writeLayer(entries map[string]layerEntry) ([]byte, error) {
	// Sorted, so parents come before children and equal inputs give equal digests.
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		name := strings.TrimPrefix(n, "/")
		switch {
		case e.dir:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(e.mode)}); err != nil {
				return nil, err
			}
		case e.link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.link, Mode: 0o777}); err != nil {
				return nil, err
			}
		default:
			if err := copyIntoTar(tw, name, e); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func copyIntoTar(tw *tar.Writer, name string, e layerEntry) error {
	f, err := os.Open(e.hostPath)
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", e.hostPath, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("failed to stat %s: %w", e.hostPath, err)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(e.mode), Size: st.Size()}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("failed to copy %s: %w", e.hostPath, err)
	}
	return nil
}
