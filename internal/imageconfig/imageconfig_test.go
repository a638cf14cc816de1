package imageconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testRegistry is go-containerregistry's in-process registry behind an
// httptest server, with basic authentication when user is set, a delay
// before every answer, and a count of the manifest requests it served.
type testRegistry struct {
	srv       *httptest.Server
	host      string
	user      string
	pass      string
	delay     atomic.Int64
	manifests atomic.Int64
}

func newTestRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	tr := &testRegistry{user: user, pass: pass}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(tr.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if tr.user != "" {
			u, p, ok := r.BasicAuth()
			if !ok || u != tr.user || p != tr.pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if strings.Contains(r.URL.Path, "/manifests/") && r.Method == http.MethodGet {
			tr.manifests.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

// push writes an image with the environment and labels to repo:tag and
// returns its digest reference.
func (tr *testRegistry) push(t *testing.T, repoTag string, env []string, labels map[string]string) string {
	t.Helper()
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		OS: "linux", Architecture: "amd64",
		Config: v1.Config{Env: env, Labels: labels},
	})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(tr.host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{}
	if tr.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: tr.user, Password: tr.pass}))
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref.Context().Name() + "@" + d.String()
}

func (tr *testRegistry) reader(o Options) *Reader {
	o.Registries = append(o.Registries, tr.host)
	o.Insecure = append(o.Insecure, tr.host)
	if o.TagTTL == 0 {
		o.TagTTL = time.Minute
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = 100
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = 1 << 20
	}
	o.Platform = &v1.Platform{OS: "linux", Architecture: "amd64"}
	return New(o)
}

func read(t *testing.T, r *Reader, image string, creds Credentials, budget time.Duration) (*Facts, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	return r.Read(ctx, image, creds)
}

func counter(result string) float64 { return testutil.ToFloat64(readsTotal.WithLabelValues(result)) }

// TestReadCachesByTagAndDigest: the first read asks the registry, the next
// ones within the tag's TTL and by digest do not; once the TTL passes the
// tag is asked again, and a moved tag gives the new image.
func TestReadCachesByTagAndDigest(t *testing.T) {
	tr := newTestRegistry(t, "", "")
	digestRef := tr.push(t, "app:v1", []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/app/lib"}, map[string]string{"com.nvidia.cuda.version": "12.4.1"})
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r := tr.reader(Options{Now: clock})
	image := tr.host + "/app:v1"

	hits, misses := counter(resultHit), counter(resultMiss)
	f, err := read(t, r, image, Anonymous, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f.Env, "LD_LIBRARY_PATH=/opt/app/lib") || f.Labels["com.nvidia.cuda.version"] != "12.4.1" {
		t.Errorf("facts = %+v, want the image's ENV and labels", f)
	}
	if _, err := read(t, r, image, Anonymous, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := read(t, r, digestRef, Anonymous, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := tr.manifests.Load(); got != 1 {
		t.Errorf("registry served %d manifest requests, want 1 (the tag, then two cache hits)", got)
	}
	if counter(resultHit)-hits != 2 || counter(resultMiss)-misses != 1 {
		t.Errorf("hits +%v misses +%v, want +2 +1", counter(resultHit)-hits, counter(resultMiss)-misses)
	}

	tr.push(t, "app:v1", []string{"LD_LIBRARY_PATH=/opt/v2/lib"}, nil)
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	f, err = read(t, r, image, Anonymous, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Env, []string{"LD_LIBRARY_PATH=/opt/v2/lib"}) {
		t.Errorf("after the TTL Env = %q, want the moved tag's", f.Env)
	}
	if got := tr.manifests.Load(); got != 2 {
		t.Errorf("registry served %d manifest requests, want 2", got)
	}
	if r.Len() != 2 {
		t.Errorf("cache holds %d digests, want 2", r.Len())
	}
}

// TestReadAuth: a private repository is read with the pod's pull secret,
// and refused without it; the refusal is remembered for the anonymous
// reader only, not for the pod that has the secret.
func TestReadAuth(t *testing.T) {
	tr := newTestRegistry(t, "alice", "s3cret")
	tr.push(t, "private/app:v1", []string{"LD_LIBRARY_PATH=/opt/app/lib"}, nil)
	r := tr.reader(Options{})
	image := tr.host + "/private/app:v1"

	_, err := read(t, r, image, Anonymous, 5*time.Second)
	var serr *StatusError
	if !errors.As(err, &serr) || serr.Code != http.StatusUnauthorized {
		t.Fatalf("anonymous read: err = %v, want the registry's 401", err)
	}
	// The registry's text stays out: only its status is said.
	if !strings.Contains(err.Error(), image) || !strings.Contains(err.Error(), "401 Unauthorized") || strings.Contains(err.Error(), "authentication required") {
		t.Errorf("error %q: want the image and the status, not the registry's text", err)
	}

	secret := dockerConfigSecret(tr.host, "alice", "s3cret")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml"}, Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "missing"}}}}
	creds, problems := PodCredentials(context.Background(), secretMap{"ml/regcred": secret}, pod)
	if len(problems) != 1 || !strings.Contains(problems[0], `"missing"`) {
		t.Errorf("problems = %q, want one naming the missing secret", problems)
	}
	f, err := read(t, r, image, creds, 5*time.Second)
	if err != nil {
		t.Fatalf("read with the pull secret: %v", err)
	}
	if !slices.Equal(f.Env, []string{"LD_LIBRARY_PATH=/opt/app/lib"}) {
		t.Errorf("Env = %q", f.Env)
	}
}

type secretMap map[string]*corev1.Secret

func (m secretMap) GetSecret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s, ok := m[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("secrets %q not found", name)
}

func dockerConfigSecret(host, user, pass string) *corev1.Secret {
	cfg := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q}}}`, host, user, pass)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: "ml"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)},
	}
}

// TestReadSlowRegistry: a registry slower than the budget costs the request
// the budget and no more; the read goes on, and the next pod finds it
// cached. Concurrent requests share one read.
func TestReadSlowRegistry(t *testing.T) {
	tr := newTestRegistry(t, "", "")
	tr.push(t, "slow:v1", []string{"A=1"}, nil)
	r := tr.reader(Options{})
	tr.delay.Store(int64(300 * time.Millisecond))
	image := tr.host + "/slow:v1"

	var wg sync.WaitGroup
	errs := make([]error, 8)
	start := time.Now()
	for i := range errs {
		wg.Go(func() { _, errs[i] = read(t, r, image, Anonymous, 50*time.Millisecond) })
	}
	wg.Wait()
	if took := time.Since(start); took > 250*time.Millisecond {
		t.Errorf("8 requests with a 50ms budget took %s", took)
	}
	for _, err := range errs {
		if !errors.Is(err, ErrBudget) {
			t.Errorf("err = %v, want ErrBudget", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := read(t, r, image, Anonymous, 50*time.Millisecond); err != nil {
		t.Errorf("after the background read: %v, want a cache hit", err)
	}
	if got := tr.manifests.Load(); got != 1 {
		t.Errorf("registry served %d manifest requests, want 1 shared by 8 requests", got)
	}
}

// TestReadRegistryDown: a registry that is down answers each request with
// an error naming the image and what the connection said, once per
// errorTTL, not once per pod.
func TestReadRegistryDown(t *testing.T) {
	tr := newTestRegistry(t, "", "")
	tr.push(t, "app:v1", nil, nil)
	r := tr.reader(Options{})
	tr.srv.Close()
	image := tr.host + "/app:v1"
	errorsBefore := counter(resultError)
	_, err := read(t, r, image, Anonymous, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), image) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("err = %v, want the image and the connection's refusal", err)
	}
	start := time.Now()
	_, err2 := read(t, r, image, Anonymous, 2*time.Second)
	if err2 == nil || time.Since(start) > 50*time.Millisecond {
		t.Errorf("second read: %v after %s, want the remembered error at once", err2, time.Since(start))
	}
	if got := counter(resultError) - errorsBefore; got != 2 {
		t.Errorf("errors +%v, want +2", got)
	}
}

// TestReadNotListed: a registry outside the list is never contacted.
func TestReadNotListed(t *testing.T) {
	tr := newTestRegistry(t, "", "")
	tr.push(t, "app:v1", nil, nil)
	r := New(Options{Registries: []string{"registry.example.com"}, MaxEntries: 10, MaxBytes: 1 << 20})
	_, err := read(t, r, tr.host+"/app:v1", Anonymous, time.Second)
	if !errors.Is(err, ErrNotListed) || tr.manifests.Load() != 0 {
		t.Errorf("err = %v after %d requests, want ErrNotListed and none", err, tr.manifests.Load())
	}
	if r := New(Options{Registries: []string{"docker.io"}}); !r.registries["index.docker.io"] {
		t.Errorf("docker.io not read as index.docker.io: %v", r.registries)
	}
}

// TestCacheBounds: entries and bytes stay within their bounds, the least
// recently used going first.
func TestCacheBounds(t *testing.T) {
	tr := newTestRegistry(t, "", "")
	big := strings.Repeat("x", 4000)
	for i := range 6 {
		tr.push(t, fmt.Sprintf("app:v%d", i), []string{"BIG=" + big, fmt.Sprintf("N=%d", i)}, nil)
	}
	r := tr.reader(Options{MaxEntries: 4, MaxBytes: 3 * 5000})
	for i := range 6 {
		if _, err := read(t, r, fmt.Sprintf("%s/app:v%d", tr.host, i), Anonymous, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if r.Len() > 4 || r.Bytes() > 3*5000 {
			t.Fatalf("cache holds %d entries, %d bytes: past its bounds", r.Len(), r.Bytes())
		}
	}
	if r.Len() != 3 {
		t.Errorf("cache holds %d entries, want 3 (the byte bound)", r.Len())
	}
	before := tr.manifests.Load()
	if _, err := read(t, r, tr.host+"/app:v5", Anonymous, time.Second); err != nil {
		t.Fatal(err)
	}
	if tr.manifests.Load() != before {
		t.Errorf("the newest image was evicted")
	}
}

// TestResponseLimit: a registry's oversized answer is refused, not read.
func TestResponseLimit(t *testing.T) {
	huge := strings.Repeat("y", MaxFactsBytes)
	tr := newTestRegistry(t, "", "")
	tr.push(t, "huge:v1", []string{"HUGE=" + huge}, nil)
	r := tr.reader(Options{})
	_, err := read(t, r, tr.host+"/huge:v1", Anonymous, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("err = %v, want the facts refused for their size", err)
	}
}

// countingSecrets counts the Secrets got.
type countingSecrets struct {
	secretMap
	gets atomic.Int64
}

func (c *countingSecrets) GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	c.gets.Add(1)
	return c.secretMap.GetSecret(ctx, ns, name)
}

// TestLazyPodCredentials: a pod's pull secrets are got only when its image
// must be read from the registry; a cached image costs no API call.
func TestLazyPodCredentials(t *testing.T) {
	tr := newTestRegistry(t, "alice", "s3cret")
	tr.push(t, "private/app:v1", []string{"A=1"}, nil)
	r := tr.reader(Options{})
	image := tr.host + "/private/app:v1"
	secrets := &countingSecrets{secretMap: secretMap{"ml/regcred": dockerConfigSecret(tr.host, "alice", "s3cret")}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml"}, Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}}}
	for i := range 3 {
		if _, err := read(t, r, image, LazyPodCredentials(secrets, pod), 5*time.Second); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if got := secrets.gets.Load(); got != 1 {
		t.Errorf("%d Secrets got for 3 admissions of one image, want 1", got)
	}
	if c := LazyPodCredentials(secrets, &corev1.Pod{}); c.ID != "" {
		t.Errorf("a pod without pull secrets: credentials %q, want anonymous", c.ID)
	}
}

// staticKeychain gives the same credentials for every resource, and counts
// the asks.
type staticKeychain struct {
	auth  authn.Authenticator
	asked atomic.Int64
}

func (k *staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	k.asked.Add(1)
	return k.auth, nil
}

// TestReadNodeKeychain: the node's keychain serves a pod without pull
// secrets, and is asked only after the pod's own credentials gave none.
func TestReadNodeKeychain(t *testing.T) {
	tr := newTestRegistry(t, "alice", "s3cret")
	tr.push(t, "private/app:v1", []string{"A=1"}, nil)
	tr.push(t, "private/app:v2", []string{"A=2"}, nil)
	node := &staticKeychain{auth: &authn.Basic{Username: "alice", Password: "s3cret"}}
	r := tr.reader(Options{NodeKeychain: node})
	if _, err := read(t, r, tr.host+"/private/app:v1", Anonymous, 5*time.Second); err != nil {
		t.Fatalf("read with the node's credentials: %v", err)
	}
	if node.asked.Load() == 0 {
		t.Error("the node's keychain was never asked")
	}
	asked := node.asked.Load()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml"}, Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}}}
	creds, _ := PodCredentials(context.Background(), secretMap{"ml/regcred": dockerConfigSecret(tr.host, "alice", "s3cret")}, pod)
	if _, err := read(t, r, tr.host+"/private/app:v2", creds, 5*time.Second); err != nil {
		t.Fatalf("read with the pod's credentials: %v", err)
	}
	if node.asked.Load() != asked {
		t.Error("the node's keychain was asked although the pod's pull secret had credentials")
	}
}
