package imageconfig

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"golang.org/x/sync/semaphore"
)

// limitedTransport is under every request of a read, the registry's
// redirects and its token service's included: it refuses a host the
// reader may not contact, plain HTTP to a host not listed as insecure, and
// an answer longer than maxResponseBytes; and it counts the bytes of the
// answers being read against the reader's bytes in flight, so that every
// read together stays within memory whatever the registries answer.
type limitedTransport struct {
	next http.RoundTripper
	// allowed says whether a request may go to a host over a scheme.
	allowed func(scheme, host string) bool
	// inFlight is shared by every read of the reader; nil is unbounded.
	inFlight *semaphore.Weighted
}

// HostError says that a read was sent to a host the reader may not
// contact: a registry's redirect, or its token service's realm.
type HostError struct {
	Host   string
	Scheme string
}

func (e *HostError) Error() string {
	return fmt.Sprintf("the registry sent the read to %s://%s, which is not listed in images.registries (insecureRegistries for http)", e.Scheme, e.Host)
}

// ErrBytesInFlight: the reads under way hold as many bytes as the reader
// allows; this one fails rather than wait, as past maxInFlight.
var ErrBytesInFlight = fmt.Errorf("the image reads under way hold %d bytes of registry answers already", maxBytesInFlight)

func (t limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := strings.ToLower(req.URL.Host)
	if !t.allowed(req.URL.Scheme, host) {
		if req.Body != nil {
			req.Body.Close()
		}
		// A host name is at most 253 bytes; a longer one is no host's.
		if len(host) > 260 {
			host = host[:260]
		}
		return nil, &HostError{Host: host, Scheme: req.URL.Scheme}
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > maxResponseBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("the registry's answer to %s is %d bytes, more than %d", req.URL.Path, resp.ContentLength, maxResponseBytes)
	}
	resp.Body = &limitedBody{rc: resp.Body, left: maxResponseBytes, inFlight: t.inFlight}
	return resp, nil
}

// readChunk bounds one read of an answer, so that bytes are counted in
// flight as they arrive, not as a reader's buffer asks.
const readChunk = 64 << 10

type limitedBody struct {
	rc       io.ReadCloser
	left     int64
	inFlight *semaphore.Weighted

	mu   sync.Mutex
	held int64
	done bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("the registry's answer is longer than %d bytes", maxResponseBytes)
	}
	p = p[:min(int64(len(p)), b.left, readChunk)]
	if err := b.acquire(int64(len(p))); err != nil {
		return 0, err
	}
	n, err := b.rc.Read(p)
	b.release(int64(len(p) - n))
	b.left -= int64(n)
	return n, err
}

// acquire counts n more bytes of this answer in flight; they stay counted
// until the answer is closed, when its reader has done with them.
func (b *limitedBody) acquire(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return errors.New("the registry's answer is closed")
	}
	if b.inFlight != nil && !b.inFlight.TryAcquire(n) {
		return ErrBytesInFlight
	}
	b.held += n
	return nil
}

func (b *limitedBody) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		// Close released every byte held.
		return
	}
	b.held -= n
	if b.inFlight != nil {
		b.inFlight.Release(n)
	}
}

func (b *limitedBody) Close() error {
	b.mu.Lock()
	if !b.done {
		b.done = true
		if b.inFlight != nil {
			b.inFlight.Release(b.held)
		}
		b.held = 0
	}
	b.mu.Unlock()
	return b.rc.Close()
}
