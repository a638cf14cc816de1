package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Certificate modes.
const (
	// CertModeSelf: cert-controller keeps a CA and serving certificate in a
	// Secret, rotates them and injects the CA into the webhook configuration.
	CertModeSelf = "self"
	// CertModeExternal: someone else (cert-manager) fills CertDir; the server
	// only reloads the files when they change.
	CertModeExternal = "external"
)

const (
	certFile = "tls.crt"
	keyFile  = "tls.key"
)

// CertOptions say where the serving certificate comes from.
type CertOptions struct {
	// Mode is CertModeSelf or CertModeExternal.
	Mode string
	// Dir holds the serving certificate files tls.crt and tls.key.
	Dir string
	// SecretName is the Secret that holds the CA and serving certificate in
	// self mode.
	SecretName string
	// Namespace is the webhook's own namespace: the Secret's, and one the
	// webhook never mutates.
	Namespace string
	// ServiceName is the Service in front of the webhook: the certificate's
	// DNS name.
	ServiceName string
	// WebhookConfigName is the MutatingWebhookConfiguration whose caBundle
	// self mode keeps current.
	WebhookConfigName string
	// ExtraDNSNames are further names of the self-made certificate.
	ExtraDNSNames []string
}

// setupCerts adds what serves certificates in the chosen mode and returns the
// channel that closes once the webhook server may start: at once in external
// mode, and once the certificate is in CertDir and the CA is injected in self mode.
func setupCerts(mgr manager.Manager, o CertOptions, log logr.Logger) (<-chan struct{}, error) {
	switch o.Mode {
	case CertModeExternal:
		ready := make(chan struct{})
		close(ready)
		return ready, nil
	case CertModeSelf:
	default:
		return nil, fmt.Errorf("unknown certificate mode %q: want %s or %s", o.Mode, CertModeSelf, CertModeExternal)
	}
	if o.Namespace == "" {
		return nil, fmt.Errorf("--cert-mode=self needs --namespace or POD_NAMESPACE: the certificate Secret lives there")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		log.V(1).Info("cannot create the certificate folder; expecting a mounted Secret", "certDir", o.Dir, "error", err.Error())
	}
	ready := make(chan struct{})
	dns := fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace)
	r := &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName},
		CertDir:        o.Dir,
		CAName:         "gpu-injector-ca",
		CAOrganization: "gpu-injector",
		DNSName:        dns,
		ExtraDNSNames:  append([]string{o.ServiceName, fmt.Sprintf("%s.%s", o.ServiceName, o.Namespace), dns + ".cluster.local"}, o.ExtraDNSNames...),
		IsReady:        ready,
		Webhooks:       []rotator.WebhookInfo{{Name: o.WebhookConfigName, Type: rotator.Mutating}},
		FieldOwner:     "gpu-injector",
		// Every replica rotates on its own; they converge on the Secret.
		RequireLeaderElection: false,
		// The server reloads rotated files by itself: no restart.
		RestartOnSecretRefresh: false,
	}
	if err := rotator.AddRotator(mgr, r); err != nil {
		return nil, fmt.Errorf("failed to add the certificate rotator: %w", err)
	}
	return ready, nil
}

// secretFiles copies the serving certificate from the Secret into CertDir,
// so self mode works where CertDir is a writable folder rather than a mount
// of the Secret (a local run, an emptyDir), and without the kubelet's sync
// delay. On a read-only mount it steps aside after the first failure.
type secretFiles struct {
	dir string
	log logr.Logger

	mu       sync.Mutex
	disabled bool
}

// watchSecretFiles feeds secretFiles from the cache's Secret informer, which
// CacheOptions limits to the one Secret.
func watchSecretFiles(ctx context.Context, c cache.Cache, dir string, log logr.Logger) error {
	inf, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return fmt.Errorf("failed to get the secret informer: %w", err)
	}
	sf := &secretFiles{dir: dir, log: log}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    sf.onSecret,
		UpdateFunc: func(_, o any) { sf.onSecret(o) },
	})
	if err != nil {
		return fmt.Errorf("failed to add the secret event handler: %w", err)
	}
	return nil
}

func (sf *secretFiles) onSecret(obj any) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	crt, key := s.Data[certFile], s.Data[keyFile]
	if len(crt) == 0 || len(key) == 0 {
		return
	}
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.disabled {
		return
	}
	// The key first: the rotator and the server both wait for the
	// certificate file, and must then find its key beside it.
	for _, f := range []struct {
		name string
		data []byte
	}{{keyFile, key}, {certFile, crt}} {
		changed, err := writeIfChanged(filepath.Join(sf.dir, f.name), f.data)
		if err != nil {
			if readOnly(err) {
				sf.disabled = true
				sf.log.Info("certificate folder is not writable; expecting the Secret to be mounted there", "certDir", sf.dir)
				return
			}
			sf.log.Error(err, "failed to write the serving certificate", "certDir", sf.dir)
			return
		}
		if changed {
			sf.log.Info("wrote the serving certificate from its Secret", "file", f.name, "secret", s.Name)
		}
	}
}

// readOnly: the folder is a read-only mount (a Secret volume) or not ours.
func readOnly(err error) bool {
	return errors.Is(err, syscall.EROFS) || errors.Is(err, os.ErrPermission)
}

// writeIfChanged replaces a file atomically, only when its content differs,
// so the certificate watcher sees one complete change.
func writeIfChanged(path string, data []byte) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return false, fmt.Errorf("failed to create a file beside %q: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, fmt.Errorf("failed to write %q: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("failed to close %q: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("failed to replace %q: %w", path, err)
	}
	return true, nil
}

// startAfter starts the webhook server once ready closes: in self mode the
// server's certificate watcher fails at once if it finds no files.
type startAfter struct {
	ready  <-chan struct{}
	server webhook.Server
}

func (s startAfter) Start(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	return s.server.Start(ctx)
}

// NeedLeaderElection: every replica serves.
func (startAfter) NeedLeaderElection() bool { return false }
