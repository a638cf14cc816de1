package imageconfig

import (
	"context"
	"fmt"
	"strings"

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
