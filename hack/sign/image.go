package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// What cosign writes and reads: the layer of a signature image, its
// annotation, and the "kind" annotations of `cosign save`'s OCI image
// layout, which `cosign verify --local-image` and `cosign load` read.
const (
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	signatureAnnotation    = "dev.cosignproject.cosign/signature"
	kindAnnotation         = "kind"
	kindImageIndex         = "dev.cosignproject.cosign/imageIndex"
	kindSignatures         = "dev.cosignproject.cosign/sigs"
	refNameAnnotation      = "org.opencontainers.image.ref.name"
)

// signatureTag is where cosign keeps the signatures of digest in its
// repository: sha256-<hex>.sig.
func signatureTag(digest v1.Hash) string {
	return digest.Algorithm + "-" + digest.Hex + ".sig"
}

// signatureImage is the image `cosign sign --key --tlog-upload=false` pushes
// for digest: one layer, the simple-signing payload naming repo and digest,
// annotated with the payload's signature.
func signatureImage(s signature.Signer, repo name.Repository, digest v1.Hash) (v1.Image, error) {
	d, err := name.NewDigest(repo.Name() + "@" + digest.String())
	if err != nil {
		return nil, fmt.Errorf("failed to name %s@%s: %w", repo, digest, err)
	}
	p, err := payload.Cosign{Image: d}.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("failed to write the signature payload: %w", err)
	}
	sig, err := signBlob(s, p)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(p, simpleSigningMediaType),
		Annotations: map[string]string{signatureAnnotation: sig},
	})
	if err != nil {
		return nil, fmt.Errorf("failed to build the signature image: %w", err)
	}
	return img, nil
}

// layoutIndex finds the one image index a layout holds and its descriptor.
func layoutIndex(p layout.Path) (v1.ImageIndex, v1.Descriptor, error) {
	top, err := p.ImageIndex()
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("failed to read the layout's index.json: %w", err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("failed to read the layout's index.json: %w", err)
	}
	var found []v1.Descriptor
	for _, d := range m.Manifests {
		if d.MediaType.IsIndex() {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		return nil, v1.Descriptor{}, fmt.Errorf("the layout holds %d image indexes, want 1", len(found))
	}
	idx, err := top.ImageIndex(found[0].Digest)
	if err != nil {
		return nil, v1.Descriptor{}, fmt.Errorf("failed to read the image index %s: %w", found[0].Digest, err)
	}
	return idx, found[0], nil
}

// signLayout signs the image index of the OCI image layout in dir and
// writes the layout again into out as `cosign save` would have: the index
// marked as cosign's imageIndex, its signature image beside it marked as
// cosign's sigs and named sha256-<hex>.sig. Other entries (an earlier
// signature) are dropped. It returns the index's digest and the signature.
func signLayout(dir, out string, s signature.Signer, repo name.Repository) (v1.Hash, v1.Image, error) {
	idx, desc, err := layoutIndex(layout.Path(dir))
	if err != nil {
		return v1.Hash{}, nil, err
	}
	sig, err := signatureImage(s, repo, desc.Digest)
	if err != nil {
		return v1.Hash{}, nil, err
	}
	ann := map[string]string{kindAnnotation: kindImageIndex}
	for k, v := range desc.Annotations {
		ann[k] = v
	}
	top := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{Annotations: ann}},
		mutate.IndexAddendum{Add: sig, Descriptor: v1.Descriptor{Annotations: map[string]string{
			kindAnnotation: kindSignatures, refNameAnnotation: signatureTag(desc.Digest),
		}}},
	)
	if _, err := layout.Write(out, top); err != nil {
		return v1.Hash{}, nil, fmt.Errorf("failed to write the signed layout: %w", err)
	}
	return desc.Digest, sig, nil
}

// verifyLayout checks the layout's signature as `cosign verify --key
// --insecure-ignore-tlog --local-image` does: the signature image marked
// sigs holds a payload signed by v whose digest is the index's, and, more
// than cosign asks, whose repository is repo. It returns the digest.
func verifyLayout(dir string, v signature.Verifier, repo name.Repository) (v1.Hash, error) {
	p := layout.Path(dir)
	_, desc, err := layoutIndex(p)
	if err != nil {
		return v1.Hash{}, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return v1.Hash{}, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	var errs []error
	for _, d := range m.Manifests {
		if d.Annotations[kindAnnotation] != kindSignatures {
			continue
		}
		img, err := top.Image(d.Digest)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("failed to read the signature image: %w", err)
		}
		if err := verifySignatureImage(img, v, repo, desc.Digest); err != nil {
			errs = append(errs, err)
			continue
		}
		return desc.Digest, nil
	}
	if len(errs) == 0 {
		return v1.Hash{}, fmt.Errorf("no signature of %s in the layout", desc.Digest)
	}
	return v1.Hash{}, fmt.Errorf("no valid signature of %s: %w", desc.Digest, errors.Join(errs...))
}

// verifySignatureImage accepts img when one of its simple-signing layers is
// a payload for repo@digest with a signature v verifies.
func verifySignatureImage(img v1.Image, v signature.Verifier, repo name.Repository, digest v1.Hash) error {
	m, err := img.Manifest()
	if err != nil {
		return fmt.Errorf("failed to read the signature manifest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("failed to read the signature layers: %w", err)
	}
	errs := []error{errors.New("no simple-signing layer")}
	for i, l := range m.Layers {
		if l.MediaType != simpleSigningMediaType {
			continue
		}
		rc, err := layers[i].Compressed()
		if err != nil {
			return fmt.Errorf("failed to read the signature payload: %w", err)
		}
		p, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("failed to read the signature payload: %w", err)
		}
		if err := checkPayload(p, l.Annotations[signatureAnnotation], v, repo, digest); err != nil {
			errs = append(errs, err)
			continue
		}
		return nil
	}
	return errors.Join(errs...)
}

func checkPayload(p []byte, b64sig string, v signature.Verifier, repo name.Repository, digest v1.Hash) error {
	if err := verifyBlob(v, p, b64sig); err != nil {
		return err
	}
	var c payload.SimpleContainerImage
	if err := json.Unmarshal(p, &c); err != nil {
		return fmt.Errorf("failed to parse the signature payload: %w", err)
	}
	switch {
	case c.Critical.Type != payload.CosignSignatureType:
		return fmt.Errorf("the payload's type is %q, not %q", c.Critical.Type, payload.CosignSignatureType)
	case c.Critical.Image.DockerManifestDigest != digest.String():
		return fmt.Errorf("the payload signs %s, not %s", c.Critical.Image.DockerManifestDigest, digest)
	case c.Critical.Identity.DockerReference != repo.Name():
		return fmt.Errorf("the payload names %s, not %s", c.Critical.Identity.DockerReference, repo.Name())
	}
	return nil
}

// pushSignature pushes the signature image where cosign looks for it:
// repo:sha256-<hex>.sig.
func pushSignature(ctx context.Context, repo name.Repository, digest v1.Hash, sig v1.Image) error {
	ref := repo.Tag(signatureTag(digest))
	if err := remote.Write(ref, sig, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("failed to push the signature to %s: %w", ref, err)
	}
	return nil
}

// untar unpacks an OCI image layout tar (regular files and folders only)
// into dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", file, err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed to read %s: %w", file, err)
		}
		rel := path.Clean(h.Name)
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("failed to read %s: entry %q leaves the folder", file, h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(rel))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = writeFrom(target, tr)
			}
		default:
			err = fmt.Errorf("entry %q is neither a file nor a folder", h.Name)
		}
		if err != nil {
			return fmt.Errorf("failed to unpack %s: %w", file, err)
		}
	}
}

func writeFrom(target string, r io.Reader) error {
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}

// isLayoutTar says whether a release file is an image layout tar.
func isLayoutTar(file string) bool { return strings.HasSuffix(file, ".oci.tar") }
