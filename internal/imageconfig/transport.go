package imageconfig

import (
	"fmt"
	"io"
	"net/http"
)

// limitedTransport refuses a registry answer longer than maxResponseBytes:
// the reader takes manifests and configuration blobs only, and a registry
// is untrusted input.
type limitedTransport struct {
	next http.RoundTripper
}

func (t limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > maxResponseBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("the registry's answer to %s is %d bytes, more than %d", req.URL.Path, resp.ContentLength, maxResponseBytes)
	}
	resp.Body = &limitedBody{rc: resp.Body, left: maxResponseBytes}
	return resp, nil
}

type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("the registry's answer is longer than %d bytes", maxResponseBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
