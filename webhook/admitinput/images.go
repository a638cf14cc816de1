package admitinput

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// MaxImagesPerPod bounds the distinct images one pod's input reads; a pod
// with more is read for the first ones, in container order.
const MaxImagesPerPod = 16

// podImages are what the registries said of a pod's images, and which
// could not be read and why: the warnings for the user, the record for the
// pod.
type podImages struct {
	configs  map[string]*inject.ImageConfig
	warnings []string
	unread   []layout.ImageUnread
}

// readsImages says whether the pod's images are read at all.
func (b *Builder) readsImages(pod *corev1.Pod) bool {
	return b.Images != nil && (b.Offline || b.Config.Images.ReadsImages(pod.Namespace))
}

// readImages reads the configuration of the pod's images, all at once
// within the budget, and says which it could not read and why: a pod is
// admitted as if its images were not read, only warned, and carries the
// record of them.
func (b *Builder) readImages(ctx context.Context, pod *corev1.Pod) podImages {
	if !b.readsImages(pod) {
		return podImages{}
	}
	if !b.Offline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.Config.Images.Budget.Duration)
		defer cancel()
	}
	var images []string
	for _, c := range inject.AllContainers(pod) {
		if c.Image != "" && !slices.Contains(images, c.Image) && len(images) < MaxImagesPerPod {
			images = append(images, c.Image)
		}
	}
	if len(images) == 0 {
		return podImages{}
	}
	var secrets imageconfig.SecretGetter
	if b.Config.Images.PullSecrets == config.PullSecretsRead {
		secrets = b.Secrets
	}
	creds := imageconfig.LazyPodCredentials(secrets, pod)
	facts := make([]*imageconfig.Facts, len(images))
	errs := make([]error, len(images))
	if len(images) == 1 {
		// Most pods have one image: no goroutine for it.
		facts[0], errs[0] = b.Images.Read(ctx, images[0], creds)
	} else {
		var wg sync.WaitGroup
		for i, image := range images {
			wg.Go(func() { facts[i], errs[i] = b.Images.Read(ctx, image, creds) })
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
			if !b.Offline {
				out.unread = append(out.unread, layout.ImageUnread{Image: image, Reason: registryAnswer(errs[i])})
			}
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
