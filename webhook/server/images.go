package server

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/credprovider"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
)

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
func (h *Handler) WithImages(r admitinput.ImageReader, secrets imageconfig.SecretGetter) *Handler {
	h.input.Images, h.input.Secrets = r, secrets
	return h
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
