package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/credprovider"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// maxImagesPerPod bounds the distinct images one admission reads; a pod
// with more is read for the first ones, in container order.
const maxImagesPerPod = 16

// ImageReader reads an image's configuration; *imageconfig.Reader is one.
type ImageReader interface {
	Read(ctx context.Context, image string, creds imageconfig.Credentials) (*imageconfig.Facts, error)
}

// NewImageReader is the reader images configures. Credential providers
// that cannot be loaded are logged and left out: reads go on with the pods'
// pull secrets alone, as every read failure is fail-soft.
func NewImageReader(im *config.Images, log logr.Logger) *imageconfig.Reader {
	o := imageconfig.Options{
		Registries: im.Registries, Insecure: im.InsecureRegistries,
		TagTTL: im.TagTTL.Duration, MaxEntries: im.MaxEntries, MaxBytes: im.MaxBytes,
	}
	if cp := im.CredentialProviders; cp.Enabled() {
		kc, skipped, err := credprovider.Load(credprovider.Options{
			Config: cp.Config, BinDir: cp.BinDir, Timeout: cp.Timeout.Duration, Log: log,
		})
		for _, s := range skipped {
			log.Info("credential provider left out", "reason", s)
		}
		if err != nil {
			log.Error(err, "failed to load the credential providers; images are read without them", "config", cp.Config, "binDir", cp.BinDir)
		} else {
			log.Info("credential providers loaded", "providers", kc.Providers())
			o.NodeKeychain = kc
		}
	}
	return imageconfig.New(o)
}

// WithImages makes the handler read the images of the pods of the
// namespaces images.mode and images.namespaces say; secrets, when not nil,
// gives the pull secrets the pods name.
func (h *Handler) WithImages(r ImageReader, secrets imageconfig.SecretGetter) *Handler {
	h.images, h.secrets = r, secrets
	return h
}

// podImages are what the registries said of a pod's images, and which
// could not be read and why: the warnings for the user, the record for the
// pod.
type podImages struct {
	configs  map[string]*inject.ImageConfig
	warnings []string
	unread   []layout.ImageUnread
}

// readImages reads the configuration of the pod's images, all at once
// within the budget, and says which it could not read and why: a pod is
// admitted as if its images were not read, only warned, and carries the
// record of them.
func (h *Handler) readImages(ctx context.Context, pod *corev1.Pod) podImages {
	if h.images == nil || !h.cfg.Images.ReadsImages(pod.Namespace) {
		return podImages{}
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Images.Budget.Duration)
	defer cancel()
	var images []string
	for _, c := range inject.AllContainers(pod) {
		if c.Image != "" && !slices.Contains(images, c.Image) && len(images) < maxImagesPerPod {
			images = append(images, c.Image)
		}
	}
	if len(images) == 0 {
		return podImages{}
	}
	var secrets imageconfig.SecretGetter
	if h.cfg.Images.PullSecrets == config.PullSecretsRead {
		secrets = h.secrets
	}
	creds := imageconfig.LazyPodCredentials(secrets, pod)
	facts := make([]*imageconfig.Facts, len(images))
	errs := make([]error, len(images))
	if len(images) == 1 {
		// Most pods have one image: no goroutine for it.
		facts[0], errs[0] = h.images.Read(ctx, images[0], creds)
	} else {
		var wg sync.WaitGroup
		for i, image := range images {
			wg.Go(func() { facts[i], errs[i] = h.images.Read(ctx, image, creds) })
		}
		wg.Wait()
	}
	out := podImages{configs: make(map[string]*inject.ImageConfig, len(images))}
	for i, image := range images {
		switch {
		case errs[i] == nil:
			out.configs[image] = facts[i].View(imageView).(*inject.ImageConfig)
		case errors.Is(errs[i], imageconfig.ErrNotListed):
			// Counted by the reads metric; a warning on every pod of an
			// unlisted registry would teach users to ignore them.
		default:
			out.warnings = append(out.warnings, inject.WarnPrefix+imageWarning(errs[i]))
			out.unread = append(out.unread, layout.ImageUnread{Image: image, Reason: registryAnswer(errs[i])})
		}
	}
	return out
}

// registryAnswer is why an image was not read, without the image's name,
// which the record holds beside it.
func registryAnswer(err error) string {
	var ie *imageconfig.Error
	if errors.As(err, &ie) {
		return ie.Err.Error()
	}
	return err.Error()
}

// imageView is the mutation's view of an image's facts, kept with them in
// the reader's cache.
func imageView(f *imageconfig.Facts) any {
	return &inject.ImageConfig{Env: f.Env, Labels: f.Labels}
}

// imageWarning says what a pod lost when its image was not read.
func imageWarning(err error) string {
	return fmt.Sprintf("%v; admitted without the image's configuration (its own LD_LIBRARY_PATH is not kept)", err)
}

// apiSecrets gets Secrets straight from the API server, by name: nothing is
// listed, watched or cached.
type apiSecrets struct {
	reader client.Reader
}

func (s apiSecrets) GetSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	var sec corev1.Secret
	if err := s.reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &sec); err != nil {
		return nil, err
	}
	return &sec, nil
}
