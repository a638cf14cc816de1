// Package imageconfig reads what an image says of itself, the ENV and labels
// of its configuration, from its registry, as policy engines do from an
// admission webhook (Kyverno's imageData, sigstore's policy-controller):
// through go-containerregistry, with the pod's pull credentials.
//
// Admission waits for it, so every read is bounded: a cache by digest,
// bounded in entries and bytes; a tag's digest believed for a short while;
// one read per reference in flight, shared by every request that waits for
// it; a budget per request, past which the read goes on in the background
// and fills the cache for the next pod; and a short memory of failures, so
// that a registry that is down costs each pod nothing but a warning. Only
// listed registries are contacted, and only for manifests and configuration
// blobs, each bounded in size: never a layer.
package imageconfig

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
)

// Facts is what admission reads of an image's configuration.
type Facts struct {
	// Digest is the manifest's digest the facts were read from.
	Digest string
	// Env is the configuration's Env, NAME=VALUE, in its order.
	Env []string
	// Labels are the configuration's labels.
	Labels map[string]string

	viewOnce sync.Once
	view     any
}

// View is what build makes of the facts, made on the first call only: the
// facts are cached and shared by every admission that names the image, so
// what admission derives from them (a parsed requirement) is derived once
// per image, not per pod. Every caller passes the same build.
func (f *Facts) View(build func(*Facts) any) any {
	f.viewOnce.Do(func() { f.view = build(f) })
	return f.view
}

// size is what the facts cost the cache, roughly: their strings and a
// fixed overhead per entry and per string, set so that 10,000 images of an
// NGC image's ENV and labels come within a few percent of the heap they
// hold (BenchmarkCacheMemory).
func (f *Facts) size() int64 {
	n := int64(entryOverhead + len(f.Digest))
	for _, e := range f.Env {
		n += int64(32 + len(e))
	}
	for k, v := range f.Labels {
		n += int64(64 + len(k) + len(v))
	}
	return n
}

const (
	entryOverhead = 512
	// MaxFactsBytes bounds one image's facts: NVIDIA's CUDA images carry
	// about 2 KiB of ENV and labels.
	MaxFactsBytes = 256 << 10
	// maxResponseBytes bounds any one registry answer the reader takes: a
	// manifest, an index or a configuration blob.
	maxResponseBytes = 4 << 20
	// errorTTL is how long a failed read is remembered: a registry that is
	// down or refuses costs one read per image per this long, not one per pod.
	errorTTL = 10 * time.Second
	// fetchTimeout bounds a read that outlives the request that started it.
	fetchTimeout = 30 * time.Second
	// maxInFlight bounds the reads under way at once; one past it fails at
	// once rather than queue.
	maxInFlight = 32
	// maxBytesInFlight bounds the bytes of registry answers that every
	// read under way holds at once: a read past it fails at once. Honest
	// answers are kilobytes; hostile ones take this and a few times it in
	// the decoders' buffers (eight answers at the 4 MiB cap), within the
	// chart's memory limit beside the cache.
	maxBytesInFlight = 32 << 20
)

// Options configure a Reader.
type Options struct {
	// Registries are the hosts (as name.Registry spells them; docker.io is
	// index.docker.io) the reader may contact.
	Registries []string
	// Insecure are those of Registries reached over plain HTTP.
	Insecure []string
	// AnyRegistry reads from every registry: for the offline mutation,
	// whose user asked for it, never for the webhook.
	AnyRegistry bool
	// TagTTL is how long a tag's digest is believed.
	TagTTL time.Duration
	// MaxEntries and MaxBytes bound the cache.
	MaxEntries int
	MaxBytes   int64
	// Platform picks the image of a multi-platform index; by default
	// linux and this binary's architecture.
	Platform *v1.Platform
	// NodeKeychain, when set, is asked for credentials after the pod's
	// (the kubelet's order: pull secrets, then the node's credential
	// provider plugins), and is the same for every pod.
	NodeKeychain authn.Keychain
	// Transport is the HTTP transport; remote.DefaultTransport when nil.
	Transport http.RoundTripper
	// Now is the clock; the real one when nil.
	Now func() time.Time
}

// Credentials are a pod's keychain and a key that says whose it is: reads
// of the same reference share a flight only when their keys are equal, so
// one pod's failure to authenticate is never another's answer.
type Credentials struct {
	Keychain authn.Keychain
	// ID names the credentials (namespace and secret names); "" anonymous.
	ID string
}

// Anonymous reads public images only.
var Anonymous = Credentials{Keychain: authn.NewMultiKeychain()}

// Reader reads images' configuration, through its cache.
type Reader struct {
	opts       Options
	registries map[string]bool
	insecure   map[string]bool
	transport  http.RoundTripper
	now        func() time.Time
	flights    singleflight.Group
	slots      chan struct{}

	mu    sync.Mutex
	tags  map[string]tagEntry
	byKey map[string]*list.Element
	lru   *list.List
	bytes int64
	// failed remembers failed reads by reference and credentials.
	failed map[string]failure
}

type tagEntry struct {
	digest  string
	expires time.Time
}

type failure struct {
	err     error
	expires time.Time
}

type cached struct {
	key   string
	facts *Facts
}

// New returns a Reader.
func New(o Options) *Reader {
	r := &Reader{
		opts: o, registries: map[string]bool{}, insecure: map[string]bool{},
		transport: o.Transport, now: o.Now, slots: make(chan struct{}, maxInFlight),
		tags: map[string]tagEntry{}, byKey: map[string]*list.Element{}, lru: list.New(), failed: map[string]failure{},
	}
	for _, h := range o.Registries {
		r.registries[registryName(h)] = true
	}
	for _, h := range o.Insecure {
		r.insecure[registryName(h)] = true
	}
	if r.transport == nil {
		r.transport = remote.DefaultTransport
	}
	r.transport = limitedTransport{next: r.transport, allowed: r.allowed, inFlight: semaphore.NewWeighted(maxBytesInFlight)}
	if r.now == nil {
		r.now = wallclock.Real().Now
	}
	if r.opts.Platform == nil {
		r.opts.Platform = &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	return r
}

// allowed says whether a request of a read may go to the host: only to
// the listed registries, over https or, for those listed insecure, http.
// A registry's token service and the storage its blobs redirect to are
// hosts like any other: they must be listed too.
func (r *Reader) allowed(scheme, host string) bool {
	if r.opts.AnyRegistry {
		return scheme == "https" || scheme == "http"
	}
	switch scheme {
	case "https":
		return r.registries[host]
	case "http":
		return r.registries[host] && r.insecure[host]
	}
	return false
}

// registryName spells a host as a parsed reference does (docker.io is
// index.docker.io).
func registryName(host string) string {
	reg, err := name.NewRegistry(host, name.Insecure)
	if err != nil {
		return host
	}
	return reg.RegistryStr()
}

// Error is why an image's configuration was not read: the image as the pod
// names it, its registry, and the registry's answer or the reader's reason.
type Error struct {
	Image    string
	Registry string
	Err      error
}

func (e *Error) Error() string {
	return fmt.Sprintf("failed to read the configuration of image %q from %s: %v", e.Image, e.Registry, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrNotListed: the image's registry is not one the reader may contact.
var ErrNotListed = errors.New("the registry is not listed in images.registries")

// ErrBudget: the request's budget ran out before the registry answered; the
// read goes on and fills the cache.
var ErrBudget = errors.New("no answer within the admission's budget; the read goes on for the next pod")

// Read returns the configuration facts of the image a pod names (a
// reference as in a container's image), from the cache or its registry.
// It waits at most until ctx is done. The facts are shared: never change
// them.
func (r *Reader) Read(ctx context.Context, image string, creds Credentials) (*Facts, error) {
	start := r.now()
	ref, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		readsTotal.WithLabelValues(resultError).Inc()
		return nil, &Error{Image: image, Registry: "?", Err: fmt.Errorf("failed to parse the reference: %w", err)}
	}
	host := ref.Context().RegistryStr()
	if !r.registries[host] && !r.opts.AnyRegistry {
		readsTotal.WithLabelValues(resultNotListed).Inc()
		return nil, &Error{Image: image, Registry: host, Err: ErrNotListed}
	}
	if f := r.lookup(ref); f != nil {
		readsTotal.WithLabelValues(resultHit).Inc()
		return f, nil
	}
	flightKey := ref.Name() + "\x00" + creds.ID
	if err := r.recentFailure(flightKey); err != nil {
		readsTotal.WithLabelValues(resultError).Inc()
		return nil, &Error{Image: image, Registry: host, Err: err}
	}
	ch := r.flights.DoChan(flightKey, func() (any, error) {
		return r.fetch(ref, creds, flightKey)
	})
	select {
	case res := <-ch:
		readSeconds.Observe(r.now().Sub(start).Seconds())
		if res.Err != nil {
			readsTotal.WithLabelValues(resultError).Inc()
			return nil, &Error{Image: image, Registry: host, Err: res.Err}
		}
		readsTotal.WithLabelValues(resultMiss).Inc()
		return res.Val.(*Facts), nil
	case <-ctx.Done():
		readSeconds.Observe(r.now().Sub(start).Seconds())
		readsTotal.WithLabelValues(resultError).Inc()
		return nil, &Error{Image: image, Registry: host, Err: ErrBudget}
	}
}

// lookup answers from the cache: a digest reference while its entry
// lasts, a tag while its digest is believed.
func (r *Reader) lookup(ref name.Reference) *Facts {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := ""
	switch ref := ref.(type) {
	case name.Digest:
		key = ref.Context().Name() + "@" + ref.DigestStr()
	default:
		t, ok := r.tags[ref.Name()]
		if !ok || !r.now().Before(t.expires) {
			return nil
		}
		key = ref.Context().Name() + "@" + t.digest
	}
	el, ok := r.byKey[key]
	if !ok {
		return nil
	}
	r.lru.MoveToFront(el)
	return el.Value.(*cached).facts
}

func (r *Reader) recentFailure(key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.failed[key]
	if !ok {
		return nil
	}
	if !r.now().Before(f.expires) {
		delete(r.failed, key)
		return nil
	}
	return f.err
}

// fetch reads the image from its registry, detached from the request that
// started it so that the answer fills the cache even past that request's
// budget.
func (r *Reader) fetch(ref name.Reference, creds Credentials, flightKey string) (*Facts, error) {
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	default:
		return nil, fmt.Errorf("%d reads already under way", maxInFlight)
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	start := r.now()
	f, err := r.get(ctx, ref, creds)
	registrySeconds.Observe(r.now().Sub(start).Seconds())
	if err != nil {
		r.mu.Lock()
		r.failed[flightKey] = failure{err: err, expires: r.now().Add(errorTTL)}
		r.pruneFailuresLocked()
		r.mu.Unlock()
		return nil, err
	}
	r.store(ref, f)
	return f, nil
}

// store caches the facts by digest, and the tag's digest with its TTL,
// evicting the least recently used past the bounds.
func (r *Reader) store(ref name.Reference, f *Facts) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := ref.Context().Name() + "@" + f.Digest
	if _, isDigest := ref.(name.Digest); !isDigest && r.opts.TagTTL > 0 {
		if len(r.tags) >= r.opts.MaxEntries {
			r.pruneTagsLocked()
		}
		r.tags[ref.Name()] = tagEntry{digest: f.Digest, expires: r.now().Add(r.opts.TagTTL)}
	}
	if el, ok := r.byKey[key]; ok {
		r.lru.MoveToFront(el)
		return
	}
	r.byKey[key] = r.lru.PushFront(&cached{key: key, facts: f})
	r.bytes += f.size()
	for r.lru.Len() > max(r.opts.MaxEntries, 1) || (r.bytes > r.opts.MaxBytes && r.lru.Len() > 1) {
		old := r.lru.Back()
		c := old.Value.(*cached)
		r.lru.Remove(old)
		delete(r.byKey, c.key)
		r.bytes -= c.facts.size()
	}
	cacheEntries.Set(float64(r.lru.Len()))
	cacheBytes.Set(float64(r.bytes))
}

// pruneTagsLocked drops expired tags, and every tag if none had expired:
// a tag costs one read to learn again.
func (r *Reader) pruneTagsLocked() {
	now := r.now()
	for k, t := range r.tags {
		if !now.Before(t.expires) {
			delete(r.tags, k)
		}
	}
	if len(r.tags) >= r.opts.MaxEntries {
		clear(r.tags)
	}
}

func (r *Reader) pruneFailuresLocked() {
	if len(r.failed) < r.opts.MaxEntries {
		return
	}
	now := r.now()
	for k, f := range r.failed {
		if !now.Before(f.expires) {
			delete(r.failed, k)
		}
	}
	if len(r.failed) >= r.opts.MaxEntries {
		clear(r.failed)
	}
}

// Len and Bytes say what the cache holds.
func (r *Reader) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

// Bytes is the cache's estimated size.
func (r *Reader) Bytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}
