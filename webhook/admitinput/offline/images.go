package offline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
)

// LocalImages are the images of OCI layout folders and `docker save`
// tarballs, by the references they were saved under (an OCI layout's
// io.containerd.image.name or org.opencontainers.image.ref.name
// annotation, a tarball's RepoTags): a pipeline reads what it built,
// without a registry or cluster credentials.
type LocalImages map[string]*imageconfig.Facts

// ReadLocalImages reads every image of the paths: a folder is an OCI
// layout, a file a tarball.
func ReadLocalImages(paths []string) (LocalImages, error) {
	out := LocalImages{}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("failed to read images: %w", err)
		}
		if st.IsDir() {
			err = out.readLayout(p)
		} else {
			err = out.readTarball(p)
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read images from %s: %w", p, err)
		}
	}
	return out, nil
}

func (li LocalImages) readLayout(dir string) error {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return err
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		ref := d.Annotations["io.containerd.image.name"]
		if ref == "" {
			ref = d.Annotations["org.opencontainers.image.ref.name"]
		}
		if ref == "" {
			continue
		}
		img, err := layoutImage(idx, d)
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		if err := li.add(ref, img); err != nil {
			return err
		}
	}
	return nil
}

// layoutImage is the descriptor's image, or its index's image for linux
// and this machine's architecture (the first image when none is).
func layoutImage(idx v1.ImageIndex, d v1.Descriptor) (v1.Image, error) {
	if !d.MediaType.IsIndex() {
		return idx.Image(d.Digest)
	}
	child, err := idx.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	cm, err := child.IndexManifest()
	if err != nil {
		return nil, err
	}
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	var first *v1.Descriptor
	for i := range cm.Manifests {
		m := &cm.Manifests[i]
		if m.MediaType.IsIndex() || m.MediaType == types.MediaType("") {
			continue
		}
		if first == nil {
			first = m
		}
		if m.Platform != nil && m.Platform.OS == want.OS && m.Platform.Architecture == want.Architecture {
			return child.Image(m.Digest)
		}
	}
	if first == nil {
		return nil, errors.New("the index holds no image")
	}
	return child.Image(first.Digest)
}

func (li LocalImages) readTarball(file string) error {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return err
	}
	for _, d := range m {
		for _, t := range d.RepoTags {
			tag, err := name.NewTag(t, name.WeakValidation)
			if err != nil {
				return fmt.Errorf("tag %q: %w", t, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return fmt.Errorf("image %s: %w", t, err)
			}
			if err := li.add(t, img); err != nil {
				return err
			}
		}
	}
	return nil
}

func (li LocalImages) add(ref string, img v1.Image) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image %s: failed to read its configuration: %w", ref, err)
	}
	key, err := normalize(ref)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	li[key] = &imageconfig.Facts{Env: cf.Config.Env, Labels: cf.Config.Labels}
	return nil
}

// normalize spells a reference as the registry would name it, so that
// nginx, docker.io/library/nginx:latest and index.docker.io/library/nginx
// are one image.
func normalize(ref string) (string, error) {
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return "", err
	}
	return r.Name(), nil
}

// Read implements admitinput.ImageReader; the credentials are not asked
// for.
func (li LocalImages) Read(_ context.Context, image string, _ imageconfig.Credentials) (*imageconfig.Facts, error) {
	key, err := normalize(image)
	if err != nil {
		return nil, err
	}
	if c, ok := li[key]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("image %q is in none of the --images given", image)
}

// pullTimeout bounds one image's read with --pull: offline, no admission
// waits, yet a registry that never answers must not hang a pipeline.
const pullTimeout = 30 * time.Second

// PulledImages read images' configuration from their registries, with the
// credentials of the user's docker configuration (authn.DefaultKeychain),
// never a cluster's.
type PulledImages struct {
	reader *imageconfig.Reader
}

// NewPulledImages reads from the registries of im, or from any registry
// when it lists none.
func NewPulledImages(im *config.Images) *PulledImages {
	o := imageconfig.Options{
		Registries: im.Registries, Insecure: im.InsecureRegistries, AnyRegistry: len(im.Registries) == 0,
		TagTTL: time.Hour, MaxEntries: 1000, MaxBytes: 64 << 20,
	}
	return &PulledImages{reader: imageconfig.New(o)}
}

// Read implements admitinput.ImageReader, with the user's docker
// credentials in place of the pod's.
func (p *PulledImages) Read(ctx context.Context, image string, _ imageconfig.Credentials) (*imageconfig.Facts, error) {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	return p.reader.Read(ctx, image, imageconfig.Credentials{Keychain: authn.DefaultKeychain, ID: "docker-config"})
}
