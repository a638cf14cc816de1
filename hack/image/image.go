package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

// Options say what Build makes and where it goes; an empty path skips that output.
type Options struct {
	// Ref names the image in the archives (repository:tag).
	Ref string
	// Version is stamped in the binary.
	Version string
	// Archs are the index's linux platforms, in its order.
	Archs []string
	// Created is every timestamp of the images.
	Created time.Time

	// Archive is this machine's platform as a docker-archive tar.
	Archive string
	// OCITar is the index as a tar of an OCI image layout.
	OCITar string
	// Layout is the index as an OCI image layout folder.
	Layout string
	// Push is a reference to push the index to; Insecure speaks plain HTTP
	// to any registry (loopback and private addresses always do).
	Push     string
	Insecure bool
	// DigestFile receives the index's digest.
	DigestFile string
}

// Result is what Build made.
type Result struct {
	// Index is the multi-platform image index (nil when no output needs it).
	Index v1.ImageIndex
	// Images are the platform images by architecture.
	Images map[string]v1.Image
}

// Build builds the binaries and the images, and writes or pushes them.
func Build(ctx context.Context, o Options) (*Result, error) {
	ref, err := name.NewTag(o.Ref)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the image reference %q: %w", o.Ref, err)
	}
	needIndex := o.OCITar != "" || o.Layout != "" || o.Push != "" || o.DigestFile != ""
	var archs []string
	if needIndex {
		archs = slices.Clone(o.Archs)
	}
	if o.Archive != "" && !slices.Contains(archs, runtime.GOARCH) {
		archs = append(archs, runtime.GOARCH)
	}
	tmp, err := os.MkdirTemp("", "gpu-injector-image-")
	if err != nil {
		return nil, fmt.Errorf("failed to create a temp folder: %w", err)
	}
	defer os.RemoveAll(tmp)

	res := &Result{Images: map[string]v1.Image{}}
	for _, arch := range archs {
		p, ok := platforms[arch]
		if !ok {
			return nil, fmt.Errorf("unknown platform linux/%s (known: amd64, arm64)", arch)
		}
		files, err := platformFiles(p, tmp, o.Version)
		if err != nil {
			return nil, err
		}
		img, err := platformImage(arch, files, o.Created)
		if err != nil {
			return nil, fmt.Errorf("failed to build the linux/%s image: %w", arch, err)
		}
		res.Images[arch] = img
	}

	if o.Archive != "" {
		if err := writeArchive(o.Archive, ref, res.Images[runtime.GOARCH]); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "image: wrote %s (%s, linux/%s, docker-archive)\n", o.Archive, ref, runtime.GOARCH)
	}
	if !needIndex {
		return res, nil
	}
	res.Index = imageIndex(o.Archs, res.Images)
	digest, err := res.Index.Digest()
	if err != nil {
		return nil, fmt.Errorf("failed to compute the image index's digest: %w", err)
	}
	what := fmt.Sprintf("%s@%s, linux/%s", ref, digest, strings.Join(o.Archs, ", linux/"))
	if o.Layout != "" {
		if err := writeLayout(o.Layout, ref, res.Index); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "image: wrote %s (%s, OCI image layout)\n", o.Layout, what)
	}
	if o.OCITar != "" {
		if err := writeLayoutTar(o.OCITar, tmp, ref, res.Index); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "image: wrote %s (%s, OCI image layout tar)\n", o.OCITar, what)
	}
	if o.Push != "" {
		if err := push(ctx, o.Push, o.Insecure, res.Index); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "image: pushed %s@%s\n", o.Push, digest)
	}
	if o.DigestFile != "" {
		if err := os.WriteFile(o.DigestFile, []byte(digest.String()+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("failed to write %s: %w", o.DigestFile, err)
		}
	}
	return res, nil
}

// platformImage is one platform's image: one layer with the files
// (container path -> host path), the binary as entrypoint, OCI media types.
func platformImage(arch string, files map[string]string, created time.Time) (v1.Image, error) {
	// The layer tar is the one every test image of e2e/cluster has: sorted
	// entries, no timestamps, owners or host modes beyond the permissions.
	data, err := ociimage.Layer(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: created},
		CreatedBy: "hack/image: " + binaryPath + " and the glibc files it links",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = []string{binaryPath}
	return mutate.ConfigFile(img, cf)
}

// imageIndex lists the images in archs' order, each with its platform.
func imageIndex(archs []string, images map[string]v1.Image) v1.ImageIndex {
	idx := v1.ImageIndex(empty.Index)
	for _, arch := range archs {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        images[arch],
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	return idx
}

func writeArchive(out string, ref name.Tag, img v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", filepath.Dir(out), err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("failed to write %s: %w", out, err)
	}
	return nil
}

// writeLayout writes the index as an OCI image layout whose index.json names
// it ref, as `ctr images import` (io.containerd.image.name) and skopeo
// (org.opencontainers.image.ref.name) read the name.
func writeLayout(dir string, ref name.Tag, idx v1.ImageIndex) error {
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err == nil {
		// Replaced, not appended to: blobs of an earlier build would stay.
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("failed to remove the earlier layout %s: %w", dir, err)
		}
	}
	top := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: idx,
		Descriptor: v1.Descriptor{Annotations: map[string]string{
			"io.containerd.image.name":          ref.Name(),
			"org.opencontainers.image.ref.name": ref.TagStr(),
		}},
	})
	if _, err := layout.Write(dir, top); err != nil {
		return fmt.Errorf("failed to write the OCI image layout %s: %w", dir, err)
	}
	return nil
}

// writeLayoutTar writes the layout in tmp and tars it: sorted entries, no
// timestamps or owners, so equal indexes give equal tars.
func writeLayoutTar(out, tmp string, ref name.Tag, idx v1.ImageIndex) error {
	dir := filepath.Join(tmp, "layout")
	if err := writeLayout(dir, ref, idx); err != nil {
		return err
	}
	return ociimage.WriteLayoutTar(dir, out)
}

// push writes the index, its images and their blobs to a registry.
func push(ctx context.Context, target string, insecure bool, idx v1.ImageIndex) error {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(target, opts...)
	if err != nil {
		return fmt.Errorf("failed to parse the push reference %q: %w", target, err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("failed to push the image index to %s: %w", ref, err)
	}
	return nil
}
