// Package credprovider gets registry credentials from the kubelet's image
// credential provider plugins (credentialprovider.kubelet.k8s.io), the
// programs a managed cluster's nodes pull their cloud registry's images with
// (ecr-credential-provider, auth-provider-gcp, acr-credential-provider): it
// reads the node's CredentialProviderConfig, and for an image that a
// provider's matchImages match, execs the provider's binary as the kubelet
// does, caches its answer as the kubelet does (by image, registry or
// globally, for the answer's cacheDuration or the provider's default), and
// picks the answer's credentials the kubelet would. A plugin that fails, is
// slow or answers nonsense gives no credentials and a log line: the read
// goes on anonymously.
package credprovider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	"golang.org/x/sync/singleflight"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1 "k8s.io/kubelet/config/v1"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
)

// Options configure a Keychain.
type Options struct {
	// Config is the CredentialProviderConfig file (the kubelet's
	// --image-credential-provider-config).
	Config string
	// BinDir is the plugins' folder (the kubelet's
	// --image-credential-provider-bin-dir).
	BinDir string
	// Timeout bounds one exec of a plugin.
	Timeout time.Duration
	// MaxEntries bounds each provider's cache of answers.
	MaxEntries int
	// Environ is the environment a plugin starts with, before the
	// configuration's env; os.Environ when nil.
	Environ func() []string
	// Now is the clock; the real one when nil.
	Now func() time.Time
	// Log says why a plugin gave no credentials.
	Log logr.Logger
}

// Defaults of Options.
const (
	DefaultTimeout    = 10 * time.Second
	DefaultMaxEntries = 1000
	// maxConfigBytes bounds the configuration file: a node's names a few
	// providers.
	maxConfigBytes = 1 << 20
	// maxConfigFiles bounds the files of a configuration folder.
	maxConfigFiles = 64
	// failureTTL is how long a plugin's failure for an image is remembered:
	// a broken plugin costs one exec per image per this long, not one per
	// pod.
	failureTTL = 10 * time.Second
	globalKey  = "global"
)

// The API versions the kubelet reads and speaks; their shapes are v1's.
var (
	configVersions  = []string{"kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"}
	requestVersions = []string{credentialproviderv1.SchemeGroupVersion.String(), "credentialprovider.kubelet.k8s.io/v1beta1", "credentialprovider.kubelet.k8s.io/v1alpha1"}
)

// Keychain resolves a repository's credentials through the providers whose
// matchImages match it. It is an authn.Keychain and an authn.ContextKeychain.
type Keychain struct {
	providers []*provider
	log       logr.Logger
}

// Providers names the providers the keychain runs, in the configuration's
// order.
func (k *Keychain) Providers() []string {
	names := make([]string, len(k.providers))
	for i, p := range k.providers {
		names[i] = p.name
	}
	return names
}

type provider struct {
	name         string
	path         string
	apiVersion   string
	matchImages  []string
	defaultCache time.Duration
	args, env    []string
	timeout      time.Duration
	maxEntries   int
	environ      func() []string
	now          func() time.Time

	flights singleflight.Group
	mu      sync.Mutex
	cache   map[string]cacheEntry
	failed  map[string]time.Time
}

type cacheEntry struct {
	auth    map[string]authn.AuthConfig
	expires time.Time
}

// Load reads the configuration and returns a keychain of its providers. A
// provider the webhook cannot run as the kubelet would (a service account
// token provider, whose token is minted for the pod being pulled) is left
// out and named in the skipped messages; a configuration that does not
// validate is an error.
func Load(o Options) (*Keychain, []string, error) {
	cfg, err := readConfig(o.Config)
	if err != nil {
		return nil, nil, err
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Environ == nil {
		o.Environ = os.Environ
	}
	if o.Now == nil {
		o.Now = wallclock.Real().Now
	}
	k := &Keychain{log: o.Log}
	var skipped []string
	for _, cp := range cfg.Providers {
		if cp.TokenAttributes != nil {
			skipped = append(skipped, fmt.Sprintf("provider %q takes the pulling pod's service account token (tokenAttributes), which only the kubelet can mint", cp.Name))
			continue
		}
		path, err := exec.LookPath(filepath.Join(o.BinDir, cp.Name))
		if err != nil {
			return nil, nil, fmt.Errorf("failed to find provider %q in %s: %w", cp.Name, o.BinDir, err)
		}
		p := &provider{
			name: cp.Name, path: path, apiVersion: cp.APIVersion, matchImages: cp.MatchImages,
			defaultCache: cp.DefaultCacheDuration.Duration, args: cp.Args, timeout: o.Timeout,
			maxEntries: o.MaxEntries, environ: o.Environ, now: o.Now,
			cache: map[string]cacheEntry{}, failed: map[string]time.Time{},
		}
		for _, e := range cp.Env {
			p.env = append(p.env, e.Name+"="+e.Value)
		}
		k.providers = append(k.providers, p)
	}
	return k, skipped, nil
}

// readConfig reads and validates the kubelet's CredentialProviderConfig, as
// the kubelet does: a file, YAML or JSON, or a folder whose *.json, *.yaml
// and *.yml files are read in lexical order and their providers merged;
// strictly, every provider named once, with matchImages, a
// defaultCacheDuration and an apiVersion it speaks.
func readConfig(path string) (*kubeletconfigv1.CredentialProviderConfig, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration: %w", err)
	}
	files := []string{path}
	if info.IsDir() {
		if files, err = configFiles(path); err != nil {
			return nil, err
		}
	}
	merged := &kubeletconfigv1.CredentialProviderConfig{}
	for _, f := range files {
		cfg, err := readConfigFile(f)
		if err != nil {
			return nil, err
		}
		merged.TypeMeta = cfg.TypeMeta
		merged.Providers = append(merged.Providers, cfg.Providers...)
	}
	if err := validateConfig(merged); err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration %s: %w", path, err)
	}
	return merged, nil
}

// configFiles are the configuration files of a folder, as the kubelet
// picks them.
func configFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration folder %s: %w", dir, err)
	}
	var files []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".json", ".yaml", ".yml":
			if !e.IsDir() {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	switch {
	case len(files) == 0:
		return nil, fmt.Errorf("the credential provider configuration folder %s holds no *.json, *.yaml or *.yml file", dir)
	case len(files) > maxConfigFiles:
		return nil, fmt.Errorf("the credential provider configuration folder %s holds %d files, more than %d", dir, len(files), maxConfigFiles)
	}
	slices.Sort(files)
	return files, nil
}

func readConfigFile(path string) (*kubeletconfigv1.CredentialProviderConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("the credential provider configuration %s is larger than %d bytes", path, maxConfigBytes)
	}
	cfg, err := decodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("failed to read the credential provider configuration %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes and validates a CredentialProviderConfig.
func ParseConfig(data []byte) (*kubeletconfigv1.CredentialProviderConfig, error) {
	cfg, err := decodeConfig(data)
	if err != nil {
		return nil, err
	}
	if err := validateConfig(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

func decodeConfig(data []byte) (*kubeletconfigv1.CredentialProviderConfig, error) {
	var cfg kubeletconfigv1.CredentialProviderConfig
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return nil, fmt.Errorf("failed to decode: %w", err)
	}
	if !slices.Contains(configVersions, cfg.APIVersion) || cfg.Kind != "CredentialProviderConfig" {
		return nil, fmt.Errorf("not a CredentialProviderConfig of %s: apiVersion %q, kind %q", strings.Join(configVersions, ", "), cfg.APIVersion, cfg.Kind)
	}
	return &cfg, nil
}

func validateConfig(cfg *kubeletconfigv1.CredentialProviderConfig) error {
	if len(cfg.Providers) == 0 {
		return fmt.Errorf("no providers")
	}
	seen := map[string]bool{}
	for i, p := range cfg.Providers {
		where := fmt.Sprintf("providers[%d]", i)
		switch {
		case p.Name == "" || p.Name == "." || p.Name == ".." || strings.ContainsAny(p.Name, `/\ `):
			return fmt.Errorf("%s: name %q is not a file name", where, p.Name)
		case seen[p.Name]:
			return fmt.Errorf("%s: name %q is not unique", where, p.Name)
		case len(p.MatchImages) == 0:
			return fmt.Errorf("%s (%s): matchImages is required", where, p.Name)
		case p.DefaultCacheDuration == nil:
			return fmt.Errorf("%s (%s): defaultCacheDuration is required", where, p.Name)
		case p.DefaultCacheDuration.Duration < 0:
			return fmt.Errorf("%s (%s): defaultCacheDuration must not be negative", where, p.Name)
		case !slices.Contains(requestVersions, p.APIVersion):
			return fmt.Errorf("%s (%s): apiVersion %q is not one of %s", where, p.Name, p.APIVersion, strings.Join(requestVersions, ", "))
		}
		seen[p.Name] = true
		for _, m := range p.MatchImages {
			if _, err := parseSchemeless(m); err != nil {
				return fmt.Errorf("%s (%s): matchImages entry %q is not an image pattern", where, p.Name, m)
			}
		}
	}
	return nil
}

// Resolve implements authn.Keychain.
func (k *Keychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), target)
}

// ResolveContext implements authn.ContextKeychain: the credentials the
// kubelet would pull the repository with, from every provider that matches
// it, earlier providers first; anonymous when none gives any. It never
// fails: a provider's failure is logged and leaves it out.
func (k *Keychain) ResolveContext(ctx context.Context, target authn.Resource) (authn.Authenticator, error) {
	image := imageName(target)
	var ring keyring
	for _, p := range k.providers {
		if !p.matches(image) {
			continue
		}
		auth, err := p.provide(ctx, image)
		if err != nil {
			execsTotal.WithLabelValues(p.name, resultError).Inc()
			if !errors.Is(err, errRecentFailure) {
				k.log.Info("credential provider gave no credentials", "provider", p.name, "image", image, "error", err.Error())
			}
			continue
		}
		ring.add(auth)
	}
	if a, ok := ring.lookup(image); ok {
		return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password}), nil
	}
	return authn.Anonymous, nil
}

func (p *provider) matches(image string) bool {
	for _, m := range p.matchImages {
		if matchImage(m, image) {
			return true
		}
	}
	return false
}

// provide is the provider's answer for the image, cached or from an exec,
// one exec per image at a time.
func (p *provider) provide(ctx context.Context, image string) (map[string]authn.AuthConfig, error) {
	if auth, ok := p.cached(image); ok {
		execsTotal.WithLabelValues(p.name, resultCached).Inc()
		return auth, nil
	}
	if err := p.recentFailure(image); err != nil {
		return nil, err
	}
	// The run is shared by every caller that asks meanwhile, so the caller
	// that started it does not own it: one giving up must neither kill the
	// plugin for the others nor be remembered as the plugin's failure. The
	// run is bounded by the provider's timeout alone, as the kubelet's.
	runCtx := context.WithoutCancel(ctx)
	ch := p.flights.DoChan(image, func() (any, error) {
		start := p.now()
		r, err := p.run(runCtx, image)
		execSeconds.WithLabelValues(p.name).Observe(p.now().Sub(start).Seconds())
		if err != nil {
			p.mu.Lock()
			p.pruneLocked()
			p.failed[image] = p.now().Add(failureTTL)
			p.mu.Unlock()
			return nil, err
		}
		execsTotal.WithLabelValues(p.name, resultOK).Inc()
		return p.store(image, r), nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(map[string]authn.AuthConfig), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("failed to wait for the plugin's answer: %w", context.Cause(ctx))
	}
}

// cached looks the image up as the kubelet does: by image, by registry,
// then the global answer.
func (p *provider) cached(image string) (map[string]authn.AuthConfig, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, key := range []string{"i:" + image, "r:" + registryOf(image), globalKey} {
		e, ok := p.cache[key]
		if !ok {
			continue
		}
		if now.After(e.expires) {
			delete(p.cache, key)
			cacheEntries.WithLabelValues(p.name).Set(float64(len(p.cache)))
			continue
		}
		return e.auth, true
	}
	return nil, false
}

func (p *provider) recentFailure(image string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.failed[image]
	if !ok {
		return nil
	}
	if !p.now().Before(until) {
		delete(p.failed, image)
		return nil
	}
	return errRecentFailure
}

// errRecentFailure: the provider failed for the image less than failureTTL
// ago, which was logged then.
var errRecentFailure = fmt.Errorf("it failed less than %s ago; not run again yet", failureTTL)

// store caches an answer under the key its cacheKeyType says, for its
// cacheDuration (the provider's default when it gives none; never when 0).
func (p *provider) store(image string, r *Response) map[string]authn.AuthConfig {
	auth := make(map[string]authn.AuthConfig, len(r.Auth))
	for k, a := range r.Auth {
		auth[k] = authn.AuthConfig{Username: a.Username, Password: a.Password}
	}
	d := p.defaultCache
	if r.CacheDuration != nil {
		d = *r.CacheDuration
	}
	if d <= 0 {
		return auth
	}
	key := globalKey
	switch r.CacheKeyType {
	case credentialproviderv1.ImagePluginCacheKeyType:
		key = "i:" + image
	case credentialproviderv1.RegistryPluginCacheKeyType:
		key = "r:" + registryOf(image)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.cache[key]; !ok && len(p.cache) >= p.maxEntries {
		p.pruneLocked()
	}
	p.cache[key] = cacheEntry{auth: auth, expires: p.now().Add(d)}
	cacheEntries.WithLabelValues(p.name).Set(float64(len(p.cache)))
	return auth
}

// pruneLocked drops expired answers and failures, and all of either if
// none had expired: an answer costs one exec to get again.
func (p *provider) pruneLocked() {
	now := p.now()
	for k, e := range p.cache {
		if now.After(e.expires) {
			delete(p.cache, k)
		}
	}
	if len(p.cache) >= p.maxEntries {
		clear(p.cache)
	}
	cacheEntries.WithLabelValues(p.name).Set(float64(len(p.cache)))
	for k, until := range p.failed {
		if !now.Before(until) {
			delete(p.failed, k)
		}
	}
	if len(p.failed) >= p.maxEntries {
		clear(p.failed)
	}
}

func metaOf(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}
