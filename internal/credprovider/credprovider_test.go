package credprovider

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus/testutil"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

// The test binary is the plugin too: started with fakePluginEnv set (by the
// configuration's env, as a node's configuration passes its own), it reads
// a CredentialProviderRequest on stdin and answers as the FAKE_* variables
// say.
const fakePluginEnv = "GPU_INJECTOR_FAKE_CREDENTIAL_PROVIDER"

// fakeSleeperEnv makes the test binary a child a plugin started, which
// sleeps a minute holding the plugin's stdout.
const fakeSleeperEnv = "GPU_INJECTOR_FAKE_PLUGIN_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(fakeSleeperEnv) != "" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	if os.Getenv(fakePluginEnv) != "" {
		os.Exit(fakePlugin())
	}
	os.Exit(m.Run())
}

// fakePlugin answers one request. FAKE_MODE: ok (default), fail, slow,
// huge, wrong-version. FAKE_CACHE_KEY_TYPE and FAKE_CACHE_DURATION (empty:
// left out) go into the answer, whose auth names the request's registry
// (FAKE_AUTH_KEY overrides) with FAKE_USER and FAKE_PASSWORD. Each run
// appends the image to FAKE_LOG, and its arguments.
func fakePlugin() int {
	var req credentialproviderv1.CredentialProviderRequest
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "bad request:", err)
		return 2
	}
	if req.Kind != "CredentialProviderRequest" || req.APIVersion != "credentialprovider.kubelet.k8s.io/v1" {
		fmt.Fprintf(os.Stderr, "bad request type %s %s\n", req.APIVersion, req.Kind)
		return 2
	}
	if f, err := os.OpenFile(os.Getenv("FAKE_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintln(f, req.Image, strings.Join(os.Args[1:], " "))
		f.Close()
	}
	switch os.Getenv("FAKE_MODE") {
	case "fail":
		fmt.Fprintln(os.Stderr, "no credentials for you")
		return 1
	case "slow":
		time.Sleep(time.Minute)
	case "delay":
		time.Sleep(time.Second)
	case "fork":
		// A child that outlives the plugin unless stopped with it; its pid
		// goes to FAKE_PIDFILE.
		self, err := os.Executable()
		if err != nil {
			return 2
		}
		child := exec.Command(self)
		child.Env = []string{fakeSleeperEnv + "=1"}
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			return 2
		}
		if err := os.WriteFile(os.Getenv("FAKE_PIDFILE"), []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
			return 2
		}
		time.Sleep(time.Minute)
	case "huge":
		os.Stdout.Write([]byte(strings.Repeat(" ", 2*MaxResponseBytes)))
		return 0
	}
	key := os.Getenv("FAKE_AUTH_KEY")
	if key == "" {
		key = registryOf(req.Image)
	}
	resp := map[string]any{
		"apiVersion":   "credentialprovider.kubelet.k8s.io/v1",
		"kind":         "CredentialProviderResponse",
		"cacheKeyType": os.Getenv("FAKE_CACHE_KEY_TYPE"),
		"auth":         map[string]any{key: map[string]string{"username": os.Getenv("FAKE_USER"), "password": os.Getenv("FAKE_PASSWORD")}},
	}
	if os.Getenv("FAKE_MODE") == "wrong-version" {
		resp["apiVersion"] = "credentialprovider.kubelet.k8s.io/v1beta1"
	}
	if d := os.Getenv("FAKE_CACHE_DURATION"); d != "" {
		resp["cacheDuration"] = d
	}
	json.NewEncoder(os.Stdout).Encode(resp)
	return 0
}

// fakeNode is a node's plugin folder holding the test binary under the
// providers' names, and a configuration naming them.
type fakeNode struct {
	dir, config, binDir, log string
}

type fakeProvider struct {
	name        string
	matchImages []string
	defaultTTL  string
	args        []string
	env         map[string]string
}

func newFakeNode(t testing.TB, providers ...fakeProvider) *fakeNode {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{dir: t.TempDir()}
	n.binDir = filepath.Join(n.dir, "bin")
	n.config = filepath.Join(n.dir, "config.yaml")
	n.log = filepath.Join(n.dir, "execs.log")
	if err := os.Mkdir(n.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	cfg.WriteString("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n")
	for _, p := range providers {
		if err := os.Symlink(self, filepath.Join(n.binDir, p.name)); err != nil {
			t.Fatal(err)
		}
		ttl := p.defaultTTL
		if ttl == "" {
			ttl = "1h"
		}
		fmt.Fprintf(&cfg, "- name: %s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  defaultCacheDuration: %s\n  matchImages: [%s]\n", p.name, ttl, quoteAll(p.matchImages))
		if len(p.args) > 0 {
			fmt.Fprintf(&cfg, "  args: [%s]\n", quoteAll(p.args))
		}
		fmt.Fprintf(&cfg, "  env:\n  - {name: %s, value: \"1\"}\n  - {name: FAKE_LOG, value: %q}\n", fakePluginEnv, n.log)
		for k, v := range p.env {
			fmt.Fprintf(&cfg, "  - {name: %s, value: %q}\n", k, v)
		}
	}
	if err := os.WriteFile(n.config, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// execs are the images the plugins were run for, in order.
func (n *fakeNode) execs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(n.log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (n *fakeNode) load(t testing.TB, o Options) *Keychain {
	t.Helper()
	o.Config, o.BinDir = n.config, n.binDir
	o.Log = testr.NewWithInterface(t, testr.Options{})
	// Only the configuration's env: the test's own must not reach the plugin.
	o.Environ = func() []string { return []string{"PATH=/usr/bin:/bin"} }
	k, skipped, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) > 0 {
		t.Fatalf("skipped: %q", skipped)
	}
	return k
}

// resolve returns the user the keychain resolves the repository to; ""
// for anonymous.
func resolve(t *testing.T, k *Keychain, repo string) string {
	t.Helper()
	r, err := name.NewRepository(repo)
	if err != nil {
		t.Fatal(err)
	}
	a, err := k.ResolveContext(context.Background(), r)
	if err != nil {
		t.Fatalf("resolve %s: %v", repo, err)
	}
	if a == authn.Anonymous {
		return ""
	}
	cfg, err := a.Authorization()
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Username + ":" + cfg.Password
}

// TestMatchImages: a provider runs only for images its matchImages match
// (globs per host part, port, path prefix), with its args, and Docker Hub's
// short names reach it as docker.io.
func TestMatchImages(t *testing.T) {
	n := newFakeNode(t, fakeProvider{
		name:        "ecr",
		matchImages: []string{"*.dkr.ecr.*.amazonaws.com", "registry.example.com:5000/team", "docker.io"},
		args:        []string{"get-credentials", "--verbose"},
		env:         map[string]string{"FAKE_CACHE_KEY_TYPE": "Image", "FAKE_USER": "AWS", "FAKE_PASSWORD": "token", "FAKE_CACHE_DURATION": "0s"},
	})
	k := n.load(t, Options{})
	for repo, want := range map[string]string{
		"123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/train": "AWS:token",
		"123456789012.dkr.ecr.amazonaws.com/ml/train":           "",
		"a.b.dkr.ecr.us-east-1.amazonaws.com/ml/train":          "",
		"registry.example.com:5000/team/app":                    "AWS:token",
		"registry.example.com:5000/other/app":                   "",
		"registry.example.com/team/app":                         "",
		"ubuntu":                                                "AWS:token",
		"nvcr.io/nvidia/pytorch":                                "",
	} {
		if got := resolve(t, k, repo); got != want {
			t.Errorf("%s: credentials %q, want %q", repo, got, want)
		}
	}
	execs := n.execs(t)
	want := []string{
		"123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/train get-credentials --verbose",
		"registry.example.com:5000/team/app get-credentials --verbose",
		"docker.io/library/ubuntu get-credentials --verbose",
	}
	if len(execs) != len(want) || !containsAll(execs, want) {
		t.Errorf("execs = %q, want %q", execs, want)
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestCacheKeyTypes: an answer is reused, within its duration, for what its
// cacheKeyType covers: the same image, any image of the registry, or every
// image; past the duration, or with a duration of 0, the plugin runs again;
// without one, the provider's defaultCacheDuration holds.
func TestCacheKeyTypes(t *testing.T) {
	for keyType, tc := range map[string]struct {
		duration string
		// images resolved in turn, and how many execs after each
		images []string
		execs  []int
	}{
		"Image":            {"10m", []string{"r.example.com/a", "r.example.com/a", "r.example.com/b", "other.example.com/a"}, []int{1, 1, 2, 3}},
		"Registry":         {"10m", []string{"r.example.com/a", "r.example.com/a", "r.example.com/b", "other.example.com/a"}, []int{1, 1, 1, 2}},
		"Global":           {"10m", []string{"r.example.com/a", "r.example.com/a", "r.example.com/b", "other.example.com/a"}, []int{1, 1, 1, 1}},
		"Registry/zero":    {"0s", []string{"r.example.com/a", "r.example.com/a"}, []int{1, 2}},
		"Registry/default": {"", []string{"r.example.com/a", "r.example.com/b"}, []int{1, 1}},
	} {
		t.Run(keyType, func(t *testing.T) {
			typ, _, _ := strings.Cut(keyType, "/")
			env := map[string]string{"FAKE_CACHE_KEY_TYPE": typ, "FAKE_USER": "u", "FAKE_PASSWORD": "p", "FAKE_CACHE_DURATION": tc.duration, "FAKE_AUTH_KEY": "*.example.com"}
			n := newFakeNode(t, fakeProvider{name: "cloud", matchImages: []string{"*.example.com"}, env: env, defaultTTL: "30m"})
			c := &clock{now: time.Unix(1e9, 0)}
			k := n.load(t, Options{Now: c.Now})
			for i, image := range tc.images {
				if got := resolve(t, k, image); got != "u:p" {
					t.Fatalf("%s: credentials %q", image, got)
				}
				if got := len(n.execs(t)); got != tc.execs[i] {
					t.Fatalf("after %s (#%d): %d execs, want %d", image, i, got, tc.execs[i])
				}
			}
			// Past the answer's duration (or the default's), it runs again.
			c.Add(31 * time.Minute)
			before := len(n.execs(t))
			resolve(t, k, tc.images[0])
			if got := len(n.execs(t)); got != before+1 {
				t.Errorf("after expiry: %d execs, want %d", got, before+1)
			}
		})
	}
}

// TestProvidersInOrder: two providers matching one image both run; for the
// same key the earlier one's credentials win, and a more specific key wins
// over the order.
func TestProvidersInOrder(t *testing.T) {
	common := map[string]string{"FAKE_CACHE_KEY_TYPE": "Global", "FAKE_CACHE_DURATION": "1h"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	n := newFakeNode(t,
		fakeProvider{name: "first", matchImages: []string{"r.example.com"}, env: with(map[string]string{"FAKE_USER": "first", "FAKE_AUTH_KEY": "r.example.com"})},
		fakeProvider{name: "second", matchImages: []string{"r.example.com"}, env: with(map[string]string{"FAKE_USER": "second", "FAKE_AUTH_KEY": "r.example.com"})},
		fakeProvider{name: "third", matchImages: []string{"r.example.com/team"}, env: with(map[string]string{"FAKE_USER": "third", "FAKE_AUTH_KEY": "https://r.example.com/v2/team"})},
	)
	k := n.load(t, Options{})
	if got := resolve(t, k, "r.example.com/app"); got != "first:" {
		t.Errorf("r.example.com/app: %q, want the first provider's", got)
	}
	if got := resolve(t, k, "r.example.com/team/app"); got != "third:" {
		t.Errorf("r.example.com/team/app: %q, want the one keyed by its path", got)
	}
	if got := len(n.execs(t)); got != 3 {
		t.Errorf("%d execs, want 3 (each provider once, then cached)", got)
	}
}

// TestPluginFailures: a plugin that fails, outlasts the timeout, writes too
// much or answers in another version gives no credentials, is counted, and
// is not run again for the same image for a while.
func TestPluginFailures(t *testing.T) {
	for mode, want := range map[string]string{
		"fail":          "no credentials for you",
		"slow":          "no answer within",
		"huge":          "longer than",
		"wrong-version": "apiVersion",
		"bad-key-type":  "cacheKeyType",
	} {
		t.Run(mode, func(t *testing.T) {
			env := map[string]string{"FAKE_MODE": mode, "FAKE_CACHE_KEY_TYPE": "Registry", "FAKE_USER": "u"}
			if mode == "bad-key-type" {
				env["FAKE_MODE"], env["FAKE_CACHE_KEY_TYPE"] = "ok", "Pod"
			}
			n := newFakeNode(t, fakeProvider{name: "broken-" + mode, matchImages: []string{"r.example.com"}, env: env})
			c := &clock{now: time.Unix(1e9, 0)}
			k := n.load(t, Options{Timeout: 2 * time.Second, Now: c.Now})
			var logged []string
			k.log = funcLog(func(msg string, kv ...any) { logged = append(logged, fmt.Sprint(msg, kv)) })
			errors := testutil.ToFloat64(execsTotal.WithLabelValues("broken-"+mode, resultError))
			start := time.Now()
			if got := resolve(t, k, "r.example.com/app"); got != "" {
				t.Errorf("credentials %q from a broken plugin", got)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("resolve took %s, past the timeout", d)
			}
			if len(logged) != 1 || !strings.Contains(logged[0], want) {
				t.Errorf("logged %q, want one line with %q", logged, want)
			}
			if got := testutil.ToFloat64(execsTotal.WithLabelValues("broken-"+mode, resultError)) - errors; got != 1 {
				t.Errorf("errors counted %v, want 1", got)
			}
			resolve(t, k, "r.example.com/app")
			if got := len(n.execs(t)); got != 1 || len(logged) != 1 {
				t.Errorf("%d execs and %d log lines right after a failure, want 1 and 1", got, len(logged))
			}
			c.Add(failureTTL + time.Second)
			resolve(t, k, "r.example.com/app")
			if got := len(n.execs(t)); got != 2 {
				t.Errorf("%d execs once the failure is forgotten, want 2", got)
			}
		})
	}
}

// TestLoadConfigFolder: a configuration folder is read as the kubelet
// reads one: its *.json, *.yaml and *.yml files in lexical order, their
// providers merged, each named once across the files.
func TestLoadConfigFolder(t *testing.T) {
	n := newFakeNode(t, fakeProvider{name: "cloud", matchImages: []string{"r.example.com"}}, fakeProvider{name: "other", matchImages: []string{"o.example.com"}})
	provider := func(name string) string {
		return fmt.Sprintf(`{"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig", "providers": [{"name": %q, "apiVersion": "credentialprovider.kubelet.k8s.io/v1", "defaultCacheDuration": "1m", "matchImages": ["x.io"]}]}`, name)
	}
	write := func(dir string, files map[string]string) {
		t.Helper()
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := t.TempDir()
	write(dir, map[string]string{"20-other.yaml": provider("other"), "10-cloud.json": provider("cloud"), "README.md": "not a configuration", "30-none.yml": "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n"})
	if err := os.Mkdir(filepath.Join(dir, "40-folder.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	k, _, err := Load(Options{Config: dir, BinDir: n.binDir})
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Providers(); !slices.Equal(got, []string{"cloud", "other"}) {
		t.Errorf("providers %q, want cloud then other", got)
	}
	for name, tc := range map[string]struct {
		files map[string]string
		want  string
	}{
		"empty":        {map[string]string{"README.md": "x"}, "holds no"},
		"twice":        {map[string]string{"a.yaml": provider("cloud"), "b.yaml": provider("cloud")}, "not unique"},
		"no providers": {map[string]string{"a.yaml": "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n"}, "no providers"},
		"bad file":     {map[string]string{"a.yaml": provider("cloud"), "b.yaml": "kind: ConfigMap\n"}, "b.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write(dir, tc.files)
			if _, _, err := Load(Options{Config: dir, BinDir: n.binDir}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCacheGaugeFollowsExpiry: the cache entries gauge drops with the
// answers that expire.
func TestCacheGaugeFollowsExpiry(t *testing.T) {
	env := map[string]string{"FAKE_CACHE_KEY_TYPE": "Image", "FAKE_CACHE_DURATION": "1m", "FAKE_USER": "u"}
	n := newFakeNode(t, fakeProvider{name: "expiring", matchImages: []string{"r.example.com"}, env: env})
	c := &clock{now: time.Unix(1e9, 0)}
	k := n.load(t, Options{Now: c.Now})
	resolve(t, k, "r.example.com/app")
	gauge := func() float64 { return testutil.ToFloat64(cacheEntries.WithLabelValues("expiring")) }
	if got := gauge(); got != 1 {
		t.Fatalf("gauge %v with one answer cached, want 1", got)
	}
	c.Add(2 * time.Minute)
	if _, ok := k.providers[0].cached("r.example.com/app"); ok {
		t.Fatal("an expired answer served")
	}
	if got := gauge(); got != 0 {
		t.Errorf("gauge %v once the answer expired, want 0", got)
	}
}

// TestCallerGivesUp: a caller that stops waiting leaves the plugin's run
// to the others: it is neither killed nor remembered as a failure, and
// its answer serves the next caller.
func TestCallerGivesUp(t *testing.T) {
	env := map[string]string{"FAKE_MODE": "delay", "FAKE_CACHE_KEY_TYPE": "Registry", "FAKE_USER": "u", "FAKE_PASSWORD": "p"}
	n := newFakeNode(t, fakeProvider{name: "cloud", matchImages: []string{"r.example.com"}, env: env})
	k := n.load(t, Options{Timeout: 20 * time.Second})
	repo, err := name.NewRepository("r.example.com/app")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if a, err := k.ResolveContext(ctx, repo); err != nil || a != authn.Anonymous {
		t.Errorf("a caller past its deadline got %v, %v; want anonymous", a, err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("a caller past its deadline waited %s for the plugin", d)
	}
	if got := resolve(t, k, "r.example.com/app"); got != "u:p" {
		t.Errorf("the next caller got %q, want the plugin's answer u:p", got)
	}
	if got := n.execs(t); len(got) != 1 {
		t.Errorf("execs %q, want one shared by both callers", got)
	}
}

// TestCacheBounded: answers past MaxEntries evict, none lives on.
func TestCacheBounded(t *testing.T) {
	env := map[string]string{"FAKE_CACHE_KEY_TYPE": "Image", "FAKE_CACHE_DURATION": "1h", "FAKE_USER": "u"}
	n := newFakeNode(t, fakeProvider{name: "cloud", matchImages: []string{"r.example.com"}, env: env})
	k := n.load(t, Options{MaxEntries: 3})
	for i := range 10 {
		resolve(t, k, fmt.Sprintf("r.example.com/app%d", i))
		if got := len(k.providers[0].cache); got > 3 {
			t.Fatalf("%d cached answers, more than 3", got)
		}
	}
}

// TestReadPrivateRegistry: go-containerregistry reads an image of a
// registry that wants a login, with the credentials a node's plugin gives,
// and is refused without them.
func TestReadPrivateRegistry(t *testing.T) {
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "AWS" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host+"/private/app:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, empty.Image, remote.WithAuth(&authn.Basic{Username: "AWS", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Get(ref); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("anonymous read: err = %v, want the registry's refusal", err)
	}
	env := map[string]string{"FAKE_CACHE_KEY_TYPE": "Registry", "FAKE_USER": "AWS", "FAKE_PASSWORD": "s3cret"}
	n := newFakeNode(t, fakeProvider{name: "ecr-credential-provider", matchImages: []string{host}, env: env})
	k := n.load(t, Options{})
	if _, err := remote.Get(ref, remote.WithAuthFromKeychain(k)); err != nil {
		t.Fatalf("read with the plugin's credentials: %v", err)
	}
}

// TestLoadConfig: the configuration is validated as the kubelet does, and a
// service account token provider is left out, said so.
func TestLoadConfig(t *testing.T) {
	n := newFakeNode(t, fakeProvider{name: "cloud", matchImages: []string{"r.example.com"}})
	cfg, err := os.ReadFile(n.config)
	if err != nil {
		t.Fatal(err)
	}
	token := string(cfg) + `- name: cloud-token
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  defaultCacheDuration: 1m
  matchImages: ["t.example.com"]
  tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true}
`
	if err := os.WriteFile(n.config, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	k, skipped, err := Load(Options{Config: n.config, BinDir: n.binDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "cloud-token") || len(k.Providers()) != 1 {
		t.Errorf("skipped %q, providers %q: want cloud-token skipped, cloud kept", skipped, k.Providers())
	}
	base := "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n"
	for name, tc := range map[string]struct{ config, want string }{
		"missing file":    {"", "no such file"},
		"no providers":    {base, "no providers"},
		"unknown field":   {base + "- {name: a, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [x.io], matchImage: y}\n", "unknown field"},
		"no cache":        {base + "- {name: a, apiVersion: credentialprovider.kubelet.k8s.io/v1, matchImages: [x.io]}\n", "defaultCacheDuration"},
		"bad version":     {base + "- {name: a, apiVersion: v2, defaultCacheDuration: 1m, matchImages: [x.io]}\n", "apiVersion"},
		"path name":       {base + "- {name: ../a, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [x.io]}\n", "not a file name"},
		"duplicate":       {base + "- {name: cloud, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [x.io]}\n- {name: cloud, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [x.io]}\n", "not unique"},
		"binary missing":  {base + "- {name: absent, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [x.io]}\n", "failed to find provider"},
		"not a config":    {"apiVersion: v1\nkind: ConfigMap\n", "not a CredentialProviderConfig"},
		"bad match image": {base + "- {name: cloud, apiVersion: credentialprovider.kubelet.k8s.io/v1, defaultCacheDuration: 1m, matchImages: [\"%zz\"]}\n", "not an image pattern"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			if tc.config != "" {
				if err := os.WriteFile(path, []byte(tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, _, err := Load(Options{Config: path, BinDir: n.binDir})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// funcLog is a logr.Logger that hands each Info line to a function.
func funcLog(f func(msg string, kv ...any)) logr.Logger {
	return logr.New(&funcSink{f: f})
}

type funcSink struct{ f func(string, ...any) }

func (s *funcSink) Init(logr.RuntimeInfo)                  {}
func (s *funcSink) Enabled(int) bool                       { return true }
func (s *funcSink) Info(_ int, msg string, kv ...any)      { s.f(msg, kv...) }
func (s *funcSink) Error(err error, msg string, kv ...any) { s.f(msg, append(kv, "error", err)...) }
func (s *funcSink) WithValues(...any) logr.LogSink         { return s }
func (s *funcSink) WithName(string) logr.LogSink           { return s }

// BenchmarkResolveCached: what the keychain adds to a read whose plugin
// answer is cached (a registry's token, for hours): match, look up, pick.
func BenchmarkResolveCached(b *testing.B) {
	n := newFakeNode(b, fakeProvider{name: "ecr", matchImages: []string{"*.dkr.ecr.*.amazonaws.com"},
		env: map[string]string{"FAKE_CACHE_KEY_TYPE": "Registry", "FAKE_CACHE_DURATION": "12h", "FAKE_USER": "AWS", "FAKE_PASSWORD": "token"}})
	k := n.load(b, Options{})
	repo, err := name.NewRepository("123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/train")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := k.ResolveContext(context.Background(), repo); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if a, _ := k.ResolveContext(context.Background(), repo); a == authn.Anonymous {
			b.Fatal("anonymous")
		}
	}
}
