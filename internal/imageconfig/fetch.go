package imageconfig

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// manifestTypes are the manifests the reader asks for: images and their
// multi-platform indexes, OCI and Docker's.
var manifestTypes = strings.Join([]string{
	string(types.OCIImageIndex), string(types.DockerManifestList),
	string(types.OCIManifestSchema1), string(types.DockerManifestSchema2),
}, ", ")

// StatusError is a registry's answer other than 200 OK: its status alone,
// for the answer's body is the registry's text, which reaches neither a
// pod's author nor its annotations.
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("the registry answered %d %s", e.Code, http.StatusText(e.Code))
}

// get reads the image's configuration: its manifest (through its index
// for a multi-platform image), then its configuration blob, each decoded
// as it arrives and checked against its digest. go-containerregistry's
// transport does the authentication handshake, under the reader's
// limitedTransport.
func (r *Reader) get(ctx context.Context, ref name.Reference, creds Credentials) (*Facts, error) {
	if r.insecure[ref.Context().RegistryStr()] {
		// Parse again with the insecure option, which the scheme follows.
		var err error
		if ref, err = name.ParseReference(ref.Name(), name.Insecure); err != nil {
			return nil, fmt.Errorf("failed to parse the reference: %w", err)
		}
	}
	kc := creds.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain()
	}
	if r.opts.NodeKeychain != nil {
		kc = authn.NewMultiKeychain(kc, r.opts.NodeKeychain)
	}
	repo := ref.Context()
	auth, err := kc.Resolve(repo)
	if err != nil {
		return nil, fmt.Errorf("failed to find the credentials for %s: %w", repo.RegistryStr(), err)
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, r.transport, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, fmt.Errorf("failed to authenticate with the registry: %w", registryError(err))
	}
	client := &http.Client{Transport: rt}
	want := ""
	if d, ok := ref.(name.Digest); ok {
		want = d.DigestStr()
	}
	m, digest, err := r.manifest(ctx, client, repo, ref.Identifier(), want)
	if err != nil {
		return nil, err
	}
	if m.isIndex() {
		child, err := r.pick(m)
		if err != nil {
			return nil, err
		}
		if m, _, err = r.manifest(ctx, client, repo, child.Digest, child.Digest); err != nil {
			return nil, err
		}
		if m.isIndex() {
			return nil, fmt.Errorf("the index's manifest for %s/%s is an index itself", r.opts.Platform.OS, r.opts.Platform.Architecture)
		}
	}
	c, err := r.config(ctx, client, repo, m.Config)
	if err != nil {
		return nil, err
	}
	f := &Facts{Digest: digest, Env: c.Env, Labels: c.Labels}
	if n := f.size(); n > MaxFactsBytes {
		return nil, fmt.Errorf("the configuration's ENV and labels take %d bytes, more than %d", n, MaxFactsBytes)
	}
	return f, nil
}

func (m *manifest) isIndex() bool {
	switch types.MediaType(m.MediaType) {
	case types.OCIImageIndex, types.DockerManifestList:
		return true
	case "":
		// An OCI index may leave its media type out.
		return m.HasManifests
	}
	return false
}

// pick is the index's first manifest of the reader's platform, as
// go-containerregistry picks it.
func (r *Reader) pick(m *manifest) (descriptor, error) {
	p := r.opts.Platform
	for _, d := range m.Manifests {
		if d.OS == p.OS && d.Arch == p.Architecture && (p.Variant == "" || d.Variant == p.Variant) {
			if !validDigest(d.Digest) {
				return descriptor{}, fmt.Errorf("the index's manifest for %s/%s has no sha256 digest", p.OS, p.Architecture)
			}
			return d, nil
		}
	}
	return descriptor{}, fmt.Errorf("failed to pick the image for %s/%s: the index has no manifest for it", p.OS, p.Architecture)
}

// manifest reads a manifest or an index by tag or digest, and returns its
// digest; want, when set, is the digest it must have.
func (r *Reader) manifest(ctx context.Context, client *http.Client, repo name.Repository, id, want string) (*manifest, string, error) {
	var m *manifest
	got, err := r.fetchDecoded(ctx, client, repo, "manifests", id, want, manifestTypes, func(body io.Reader) error {
		var err error
		m, err = decodeManifest(body)
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("failed to read the manifest %s: %w", id, err)
	}
	return m, got, nil
}

func (r *Reader) config(ctx context.Context, client *http.Client, repo name.Repository, d descriptor) (*config, error) {
	if !validDigest(d.Digest) {
		return nil, errors.New("the manifest's config has no sha256 digest")
	}
	if d.Size > maxResponseBytes {
		return nil, fmt.Errorf("the manifest's config is %d bytes, more than %d", d.Size, maxResponseBytes)
	}
	var c *config
	_, err := r.fetchDecoded(ctx, client, repo, "blobs", d.Digest, d.Digest, "*/*", func(body io.Reader) error {
		var err error
		c, err = decodeConfig(body)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read the configuration blob: %w", err)
	}
	return c, nil
}

// fetchDecoded gets /v2/<repo>/<kind>/<id> and decodes its answer as it
// arrives; the answer is hashed, to the end, and refused when want is set
// and the digest differs. It returns the answer's digest.
func (r *Reader) fetchDecoded(ctx context.Context, client *http.Client, repo name.Repository, kind, id, want, accept string, decode func(io.Reader) error) (string, error) {
	if want != "" && !validDigest(want) {
		return "", errors.New("the digest asked for is not sha256")
	}
	u := url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: fmt.Sprintf("/v2/%s/%s/%s", repo.RepositoryStr(), kind, id)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("failed to build the request: %w", err)
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		return "", registryError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", &StatusError{Code: resp.StatusCode}
	}
	h := sha256.New()
	body := io.TeeReader(resp.Body, h)
	// The decoders' errors name the fields by the reader's words, never
	// the answer's.
	if err := decode(body); err != nil {
		return "", err
	}
	// What the decoder left unread counts for the digest.
	if _, err := io.Copy(io.Discard, body); err != nil {
		return "", registryError(err)
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		return "", fmt.Errorf("the answer's digest is %s, not %s", got, want)
	}
	return got, nil
}

func validDigest(d string) bool {
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != sha256.Size*2 {
		return false
	}
	_, err := hex.DecodeString(hexPart)
	return err == nil && strings.ToLower(hexPart) == hexPart
}

// registryError is what may be said of a failed exchange with a registry:
// its status code, the reader's own reasons, the connection's; never the
// text the registry or its token service sent, which go-containerregistry
// quotes in its errors, nor the URLs of its redirects.
func registryError(err error) error {
	var (
		te *transport.Error
		he *HostError
		se *StatusError
		ne net.Error
		ue *url.Error
	)
	switch {
	case errors.As(err, &he), errors.As(err, &se):
		return err
	case errors.As(err, &te):
		return &StatusError{Code: te.StatusCode}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("no answer in time: %w", context.DeadlineExceeded)
	case errors.As(err, &ue):
		return registryError(ue.Err)
	case errors.As(err, &ne), errors.Is(err, ErrBytesInFlight), errors.Is(err, io.ErrUnexpectedEOF):
		return err
	}
	return errors.New("the registry's answer could not be used")
}
