package server

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// TestHandlerReadsImages: with images On, a GPU pod's image is read from
// its registry and its own LD_LIBRARY_PATH kept; a namespace not listed is
// not read; a registry that is down admits the pod as before, with a
// warning that names the image and what the registry answered.
func TestHandlerReadsImages(t *testing.T) {
	var manifests atomic.Int64
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") && r.Method == http.MethodGet {
			manifests.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: v1.Config{Env: []string{"LD_LIBRARY_PATH=/opt/app/lib"}}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host+"/app:v1", name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.Images.Mode = config.ImagesOn
	cfg.Images.Namespaces = []string{"ml"}
	cfg.Images.Registries = []string{host}
	cfg.Images.InsecureRegistries = []string{host}
	cfg.Images.Budget = &metav1.Duration{Duration: 2 * time.Second}
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	p := gputest.Plan("535.104.05")
	for _, n := range []string{"gpu-0", "gpu-1"} {
		idx.Add(gputest.Node(n, p, 8, nil))
	}
	srv := httptest.NewServer(Serve(NewHandler(cfg, idx, staticNamespaces{"ml": {}, "other": {}}).WithImages(NewImageReader(&cfg.Images, logr.Discard()), nil)))
	defer srv.Close()
	libDir := cfg.ContainerPaths.LibraryDir

	admit := func(ns, image string) (*corev1.Pod, []string) {
		t.Helper()
		pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.Containers[0].Image = image })
		code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, ns, pod, podKind))
		if code != http.StatusOK || !ar.Response.Allowed {
			t.Fatalf("got HTTP %d %s, want allowed", code, raw)
		}
		return applyPatch(t, pod, ar.Response), ar.Response.Warnings
	}
	ldPath := func(p *corev1.Pod) string {
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "LD_LIBRARY_PATH" {
				return e.Value
			}
		}
		return ""
	}

	got, _ := admit("ml", host+"/app:v1")
	if v := ldPath(got); v != "/opt/app/lib:"+libDir {
		t.Errorf("LD_LIBRARY_PATH = %q, want the image's, then %s", v, libDir)
	}
	if got.Spec.NodeSelector[layout.LabelFingerprint] != p.Fingerprint() {
		t.Errorf("node selector = %v, want the layout's", got.Spec.NodeSelector)
	}
	got, _ = admit("other", host+"/app:v1")
	if v := ldPath(got); v != libDir || manifests.Load() != 1 {
		t.Errorf("namespace not listed: LD_LIBRARY_PATH = %q after %d manifest reads, want %q and 1", v, manifests.Load(), libDir)
	}

	reg.Close()
	got, warnings := admit("ml", host+"/app:v2")
	if v := ldPath(got); v != libDir {
		t.Errorf("registry down: LD_LIBRARY_PATH = %q, want %q as without images", v, libDir)
	}
	all := strings.Join(warnings, "\n")
	if !strings.Contains(all, host+"/app:v2") || !strings.Contains(all, "connection refused") || !strings.Contains(all, "admitted without the image's configuration") {
		t.Errorf("warnings = %q, want one naming the image and the connection's refusal", warnings)
	}
	// The pod carries the record status lists: the image, and the
	// registry's answer without the words the record says beside it.
	rec, err := layout.DecodeImagesUnread(got.Annotations[layout.AnnotationImagesUnread])
	if err != nil {
		t.Fatalf("registry down: %v", err)
	}
	if len(rec.Images) != 1 || rec.Images[0].Image != host+"/app:v2" || !strings.Contains(rec.Images[0].Reason, "connection refused") ||
		strings.Contains(rec.Images[0].Reason, "failed to read the configuration") || got.Labels[layout.LabelImagesUnread] != layout.LabelImagesUnreadValue {
		t.Errorf("registry down: record %+v, label %q; want the image and the refusal, labelled", rec, got.Labels[layout.LabelImagesUnread])
	}
	// An image of a registry not listed is never contacted: nothing to record.
	got, _ = admit("ml", "quay.example/app:v1")
	if _, ok := got.Annotations[layout.AnnotationImagesUnread]; ok {
		t.Errorf("registry not listed: recorded %s", got.Annotations[layout.AnnotationImagesUnread])
	}
}

// BenchmarkHandlerCachedImage is what reading a cached image adds to one
// GPU pod's admission in process: the admission.Handler with images Off,
// and On with the pod's image (an NGC-like ENV) in the reader's cache.
// docs/benchmarks.md.
func BenchmarkHandlerCachedImage(b *testing.B) {
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg := httptest.NewServer(inner)
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	env := []string{"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin:/bin", "CUDA_VERSION=12.4.1",
		"LD_LIBRARY_PATH=/usr/local/lib/python3.10/dist-packages/torch/lib:/usr/local/cuda/compat/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		"NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471"}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: v1.Config{Env: env}})
	if err != nil {
		b.Fatal(err)
	}
	image := host + "/nvidia/pytorch:24.05-py3"
	ref, _ := name.ParseReference(image, name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		b.Fatal(err)
	}
	idx := func(cfg *config.Configuration) *gpunodes.Index {
		i := gpunodes.NewIndex(cfg, logr.Discard())
		p := gputest.Plan("550.54.15")
		for _, n := range []string{"gpu-0", "gpu-1"} {
			i.Add(gputest.Node(n, p, 8, func(n *corev1.Node) {
				n.Labels[layout.LabelCUDADriverVersionNumber] = "12040"
			}))
		}
		return i
	}
	ns := staticNamespaces{"ml": {}}
	plain := host + "/team/app:v1"
	img, err = mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "amd64", Config: v1.Config{Env: []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/opt/app/lib"}}})
	if err != nil {
		b.Fatal(err)
	}
	ref, _ = name.ParseReference(plain, name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		mode  config.ImagesMode
		image string
	}{
		{"images-Off", config.ImagesOff, image},
		{"images-On/cuda-steered", config.ImagesOn, image},
		{"images-On/ld-library-path", config.ImagesOn, plain},
	} {
		pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.Containers[0].Image = c.image })
		cfg := config.Default()
		cfg.Images.Mode = c.mode
		cfg.Images.Registries = []string{host}
		cfg.Images.InsecureRegistries = []string{host}
		h := NewHandler(cfg, idx(cfg), ns).WithImages(NewImageReader(&cfg.Images, logr.Discard()), nil)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res := h.admit(context.Background(), "ml", "uid", pod.DeepCopy())
				if !res.Allowed || len(res.Patches) == 0 {
					b.Fatalf("not injected: %+v", res.Result)
				}
			}
		})
	}
}

// TestRegistryTextNotInWarnings: a registry's error body, which it
// writes as it likes, reaches neither the pod author's warning nor the
// pod's images-unread record: only its status does.
func TestRegistryTextNotInWarnings(t *testing.T) {
	const secret = "AKIAIOSFODNN7EXAMPLE-leaked"
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			http.Error(w, `{"errors":[{"code":"UNKNOWN","message":"`+secret+`"}]}`, http.StatusInternalServerError)
		}
	}))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	cfg := config.Default()
	cfg.Images.Mode = config.ImagesOn
	cfg.Images.Namespaces = []string{"ml"}
	cfg.Images.Registries = []string{host}
	cfg.Images.InsecureRegistries = []string{host}
	cfg.Images.Budget = &metav1.Duration{Duration: 2 * time.Second}
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	p := gputest.Plan("535.104.05")
	for _, n := range []string{"gpu-0", "gpu-1"} {
		idx.Add(gputest.Node(n, p, 8, nil))
	}
	srv := httptest.NewServer(Serve(NewHandler(cfg, idx, staticNamespaces{"ml": {}}).WithImages(NewImageReader(&cfg.Images, logr.Discard()), nil)))
	defer srv.Close()

	pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.Containers[0].Image = host + "/app:v1" })
	code, ar, raw := post(t, srv.URL, "application/json", review(t, admissionv1.Create, "ml", pod, podKind))
	if code != http.StatusOK || !ar.Response.Allowed {
		t.Fatalf("got HTTP %d %s, want allowed", code, raw)
	}
	got := applyPatch(t, pod, ar.Response)
	warnings := strings.Join(ar.Response.Warnings, "\n")
	record := got.Annotations[layout.AnnotationImagesUnread]
	if !strings.Contains(warnings, "500 Internal Server Error") || !strings.Contains(record, "500 Internal Server Error") {
		t.Errorf("warnings %q, record %q: want the registry's status in both", warnings, record)
	}
	if strings.Contains(warnings, secret) || strings.Contains(record, secret) {
		t.Errorf("warnings %q, record %q: the registry's body leaked", warnings, record)
	}
}
