package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/gpu-injector/gpu-injector/config"
)

func certSecret(crt, key string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "gpu-injector"},
		Data: map[string][]byte{certFile: []byte(crt), keyFile: []byte(key), "ca.crt": []byte("ca")}}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	sf := &secretFiles{dir: dir, log: logr.Discard()}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	// The chart creates the Secret empty; nothing to write yet.
	sf.onSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls"}})
	if _, err := os.Stat(filepath.Join(dir, certFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("wrote files from an empty Secret: %v", err)
	}

	sf.onSecret(certSecret("cert-1", "key-1"))
	if read(certFile) != "cert-1" || read(keyFile) != "key-1" {
		t.Fatalf("files = %q, %q", read(certFile), read(keyFile))
	}
	st, err := os.Stat(filepath.Join(dir, keyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode = %v, want 0600", st.Mode().Perm())
	}

	// An unchanged Secret does not touch the files (no reload storm).
	before := st.ModTime()
	time.Sleep(10 * time.Millisecond)
	sf.onSecret(certSecret("cert-1", "key-1"))
	if st, _ := os.Stat(filepath.Join(dir, keyFile)); !st.ModTime().Equal(before) {
		t.Errorf("unchanged Secret rewrote the key")
	}

	// Rotation.
	sf.onSecret(certSecret("cert-2", "key-2"))
	if read(certFile) != "cert-2" || read(keyFile) != "key-2" {
		t.Errorf("after rotation files = %q, %q", read(certFile), read(keyFile))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("folder holds %d entries, want the two files alone", len(entries))
	}
}

func TestSecretFilesWriteErrors(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := writeIfChanged(filepath.Join(notDir, certFile), []byte("x"))
	if err == nil || !strings.Contains(err.Error(), "failed to create a file beside") {
		t.Fatalf("writing under a file: error = %v", err)
	}
	// A passing error keeps the writer on; a read-only mount turns it off.
	sf := &secretFiles{dir: notDir, log: logr.Discard()}
	sf.onSecret(certSecret("c", "k"))
	if sf.disabled {
		t.Errorf("a non-permission error disabled the writer")
	}
	for name, err := range map[string]error{
		"erofs":      &os.PathError{Op: "open", Path: "/certs/tls.key", Err: syscall.EROFS},
		"permission": &os.PathError{Op: "open", Path: "/certs/tls.key", Err: syscall.EACCES},
	} {
		if !readOnly(fmt.Errorf("failed to create a file beside %q: %w", "/certs/tls.key", err)) {
			t.Errorf("%s: not taken for a read-only folder", name)
		}
	}
	if readOnly(syscall.ENOTDIR) {
		t.Errorf("ENOTDIR taken for a read-only folder")
	}
}

type fakeServer struct {
	started chan struct{}
}

func (f *fakeServer) NeedLeaderElection() bool      { return false }
func (f *fakeServer) Register(string, http.Handler) {}
func (f *fakeServer) Start(ctx context.Context) error {
	close(f.started)
	<-ctx.Done()
	return nil
}
func (f *fakeServer) StartedChecker() healthz.Checker { return healthz.Ping }
func (f *fakeServer) WebhookMux() *http.ServeMux      { return nil }

func TestStartAfter(t *testing.T) {
	ready := make(chan struct{})
	srv := &fakeServer{started: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- startAfter{ready: ready, server: srv}.Start(ctx) }()

	select {
	case <-srv.started:
		t.Fatal("server started before the certificates were ready")
	case <-time.After(50 * time.Millisecond):
	}
	close(ready)
	select {
	case <-srv.started:
	case <-time.After(5 * time.Second):
		t.Fatal("server did not start once the certificates were ready")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start returned %v", err)
	}

	// Cancelled while waiting: returns without starting.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	srv2 := &fakeServer{started: make(chan struct{})}
	if err := (startAfter{ready: make(chan struct{}), server: srv2}).Start(ctx); err != nil {
		t.Errorf("Start returned %v", err)
	}
	select {
	case <-srv2.started:
		t.Error("server started after cancellation")
	default:
	}
}

// TestElectedWork: a release without a switched policy (no --policy-binding-name) and
// without pinning by pool elects no replica, so no replica exits over a Lease it could
// not renew during an API server's outage; a switched policy elects one, where a Lease
// can be named.
func TestElectedWork(t *testing.T) {
	o := Options{Config: config.Default(), PoolMemory: "gpu-injector-pools"}
	o.Certs.Namespace = "gpu-injector"
	if el := electedWork(o, logr.Discard()); el.switches || el.any() {
		t.Errorf("no switched policy: %+v, elects %v", el, el.any())
	}
	o.PolicyBinding = "gpu-injector-runtime"
	if el := electedWork(o, logr.Discard()); !el.switches || !el.any() {
		t.Errorf("switched policy: %+v, elects %v", el, el.any())
	}
	o.Certs.Namespace = ""
	if el := electedWork(o, logr.Discard()); el.switches {
		t.Errorf("a switch without a namespace for its Lease: %+v", el)
	}
}
