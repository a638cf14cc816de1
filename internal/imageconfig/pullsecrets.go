package imageconfig

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
)

// SecretGetter gets one Secret by name: the webhook's least privilege is get
// on the Secrets a pod names, never list or watch.
type SecretGetter interface {
	GetSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

// PodCredentials are the credentials of the pod's imagePullSecrets (to
// which the API server's ServiceAccount admission has already added its
// service account's, before any webhook). A Secret that cannot be read is
// left out, and said so: the read goes on with the others, anonymous at
// worst, and the registry's refusal names the image.
func PodCredentials(ctx context.Context, secrets SecretGetter, pod *corev1.Pod) (Credentials, []string) {
	if secrets == nil || len(pod.Spec.ImagePullSecrets) == 0 {
		return Anonymous, nil
	}
	var (
		got      []corev1.Secret
		names    []string
		problems []string
	)
	for _, ref := range pod.Spec.ImagePullSecrets {
		if ref.Name == "" {
			continue
		}
		s, err := secrets.GetSecret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			problems = append(problems, fmt.Sprintf("failed to get the pull secret %q: %v", ref.Name, err))
			continue
		}
		got = append(got, *s)
		names = append(names, ref.Name)
	}
	if len(got) == 0 {
		return Anonymous, problems
	}
	kc, err := kauth.NewFromPullSecrets(ctx, got)
	if err != nil {
		return Anonymous, append(problems, fmt.Sprintf("failed to read the pull secrets %s: %v", strings.Join(names, ", "), err))
	}
	return Credentials{Keychain: kc, ID: pod.Namespace + "/" + strings.Join(names, ",")}, problems
}

// secretsTimeout bounds getting a pod's pull secrets for a read that
// outlives its admission.
const secretsTimeout = 5 * time.Second

// LazyPodCredentials are the pod's pull secrets' credentials, got from the
// API server only when a read reaches a registry: an image found in the
// cache costs no API call. The ID names them without reading them. A
// Secret that cannot be read is left out; the registry's refusal then says
// so, in the warning that names the image.
func LazyPodCredentials(secrets SecretGetter, pod *corev1.Pod) Credentials {
	if secrets == nil || len(pod.Spec.ImagePullSecrets) == 0 {
		return Anonymous
	}
	var names []string
	for _, ref := range pod.Spec.ImagePullSecrets {
		if ref.Name != "" {
			names = append(names, ref.Name)
		}
	}
	if len(names) == 0 {
		return Anonymous
	}
	// Only what the lookup needs: the pod itself is not kept.
	p := &corev1.Pod{}
	p.Namespace, p.Spec.ImagePullSecrets = pod.Namespace, pod.Spec.ImagePullSecrets
	return Credentials{Keychain: &lazyKeychain{secrets: secrets, pod: p}, ID: pod.Namespace + "/" + strings.Join(names, ",")}
}

type lazyKeychain struct {
	secrets SecretGetter
	pod     *corev1.Pod
	once    sync.Once
	kc      authn.Keychain
}

func (l *lazyKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), secretsTimeout)
		defer cancel()
		creds, _ := PodCredentials(ctx, l.secrets, l.pod)
		l.kc = creds.Keychain
	})
	return l.kc.Resolve(r)
}
