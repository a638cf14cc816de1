// Package admitinput builds the decision's input (inject.Input) for one pod,
// in one place for every caller: the admission webhook, from the caches it
// watches, and the offline commands (`gpu-injector mutate`, `status pod`,
// `precheck`), from files or from what they read of a cluster. Each source
// is an interface: the node index's layouts and wedged nodes, the namespaces'
// labels, the DRA objects, the images' configuration. The decision itself
// (webhook/inject) and the node index (webhook/gpunodes) are its inputs; it
// never reaches into the admission server.
package admitinput

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// LayoutSource gives the current candidate layouts, the pools' remembered
// ones among them, and the nodes whose driver is wedged; *gpunodes.Index is
// one.
type LayoutSource interface {
	Layouts() []*inject.Layout
	Wedged() []*inject.WedgedNode
}

// NamespaceLabeler gives a namespace's labels for the Pod Security check.
type NamespaceLabeler interface {
	NamespaceLabels(ctx context.Context, name string) (map[string]string, error)
}

// DRASource says which extended resources GPU DeviceClasses serve and
// which of a pod's claims request a GPU class; *gpunodes.DRA is one.
type DRASource interface {
	GPUResources() []string
	// GPUClaims returns the names of the pod's resourceClaims entries that
	// request a GPU DeviceClass, and why a claim could not be read.
	GPUClaims(ctx context.Context, pod *corev1.Pod, namespace string) ([]string, []string)
}

// ImageReader reads an image's configuration; *imageconfig.Reader is one.
type ImageReader interface {
	Read(ctx context.Context, image string, creds imageconfig.Credentials) (*imageconfig.Facts, error)
}

// Builder puts together the decision's input from its sources. Config and
// Layouts are required; a nil source is one the caller does not have.
type Builder struct {
	Config  *config.Configuration
	Layouts LayoutSource
	// Namespaces, when nil, leaves the Pod Security level unchecked.
	Namespaces NamespaceLabeler
	// DRA, when nil, sees GPUs only in extended resources of the
	// configuration.
	DRA DRASource
	// Images, when nil, leaves images unread; Secrets gives the pull
	// secrets the pods name, when images.pullSecrets says to read them.
	Images  ImageReader
	Secrets imageconfig.SecretGetter
	// Offline is set by the commands that answer without an admission: the
	// images given are read for every pod (their user asked for them),
	// without the admission's budget, and an image not read is warned
	// about but never recorded on the pod, whose record says what the
	// cluster's registry answered an admission.
	Offline bool
}

// Build is the decision's input for pod, created in namespace (at CREATE
// the pod's own may be unset; namespace is the truth, and no edit touches
// it); uid names the request and seeds the Spread policy. The warnings say
// what could not be read, for the user, after the decision's own; what
// went wrong is also logged through the context's logger.
func (b *Builder) Build(ctx context.Context, pod *corev1.Pod, namespace string, uid types.UID) (inject.Input, []string) {
	pod.Namespace = namespace
	log := logr.FromContextOrDiscard(ctx)
	in := inject.Input{Pod: pod, NamespaceLabels: b.namespaceLabels(ctx, log, namespace),
		Layouts: b.Layouts.Layouts(), Wedged: b.Layouts.Wedged(), Seed: inject.Seed(string(uid))}
	var warnings []string
	if b.DRA != nil {
		in.GPUResources = b.DRA.GPUResources()
		if len(pod.Spec.ResourceClaims) > 0 {
			var claimWarnings []string
			in.GPUClaims, claimWarnings = b.DRA.GPUClaims(ctx, pod, namespace)
			for _, w := range claimWarnings {
				log.Error(nil, "failed to read a claim of the pod; it is not counted as a GPU claim", "detail", w)
				warnings = append(warnings, inject.WarnPrefix+w+"; the claim was not counted as a GPU claim")
			}
		}
	}
	images := b.readImages(ctx, pod)
	in.Images, in.ImagesUnread = images.configs, images.unread
	for _, w := range images.warnings {
		log.Info("admitting without an image's configuration", "detail", w)
	}
	return in, append(warnings, images.warnings...)
}

// Decide is Build, then the decision on its input, with the warnings of
// Build after the decision's own, as the webhook answers.
func (b *Builder) Decide(ctx context.Context, pod *corev1.Pod, namespace string, uid types.UID) inject.Result {
	in, warnings := b.Build(ctx, pod, namespace, uid)
	res := inject.MutateContext(ctx, in, b.Config)
	res.Warnings = append(res.Warnings, warnings...)
	return res
}

func (b *Builder) namespaceLabels(ctx context.Context, log logr.Logger, namespace string) map[string]string {
	if b.Namespaces == nil {
		return nil
	}
	labels, err := b.Namespaces.NamespaceLabels(ctx, namespace)
	if err != nil {
		// The API server's own Pod Security admission still enforces the
		// level; only our early warning is lost.
		log.Error(err, "failed to get the namespace's labels; the Pod Security check is skipped")
	}
	return labels
}
