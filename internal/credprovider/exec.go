package credprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
	sigsjson "sigs.k8s.io/json"
)

const (
	// MaxResponseBytes bounds a plugin's answer: ECR's and Artifact
	// Registry's are a few KiB.
	MaxResponseBytes = 1 << 20
	// MaxAuthEntries bounds the keys of one answer: auth-provider-gcp names
	// about twenty registries.
	MaxAuthEntries = 256
	// maxStderrBytes is how much of a failing plugin's stderr is said.
	maxStderrBytes = 2048
	// waitDelay bounds the wait for a killed plugin's output pipes, which a
	// child it started may hold open.
	waitDelay = time.Second
)

// errTooLong: the plugin wrote more than MaxResponseBytes.
var errTooLong = fmt.Errorf("the answer is longer than %d bytes", MaxResponseBytes)

// Response is a plugin's answer, decoded and checked.
type Response struct {
	CacheKeyType credentialproviderv1.PluginCacheKeyType
	// CacheDuration is nil when the plugin left it to defaultCacheDuration.
	CacheDuration *time.Duration
	Auth          map[string]credentialproviderv1.AuthConfig
}

// ParseResponse decodes a plugin's stdout as the kubelet does: a
// CredentialProviderResponse of apiVersion, strictly (no unknown or
// duplicate fields), with a cacheKeyType of Image, Registry or Global. The
// error never quotes the answer, which may hold credentials.
func ParseResponse(data []byte, apiVersion string) (*Response, error) {
	if len(data) > MaxResponseBytes {
		return nil, errTooLong
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, errors.New("the answer is not a JSON object")
	}
	if meta.APIVersion != apiVersion {
		return nil, fmt.Errorf("the answer's apiVersion is %.64q, not %q", meta.APIVersion, apiVersion)
	}
	if meta.Kind != "CredentialProviderResponse" {
		return nil, fmt.Errorf("the answer's kind is %.64q, not CredentialProviderResponse", meta.Kind)
	}
	var r credentialproviderv1.CredentialProviderResponse
	strict, err := sigsjson.UnmarshalStrict(data, &r)
	if err != nil || len(strict) > 0 {
		return nil, errors.New("the answer does not decode as a CredentialProviderResponse")
	}
	switch r.CacheKeyType {
	case credentialproviderv1.ImagePluginCacheKeyType, credentialproviderv1.RegistryPluginCacheKeyType, credentialproviderv1.GlobalPluginCacheKeyType:
	default:
		return nil, fmt.Errorf("the answer's cacheKeyType is %.64q, not Image, Registry or Global", r.CacheKeyType)
	}
	if len(r.Auth) > MaxAuthEntries {
		return nil, fmt.Errorf("the answer names %d registries, more than %d", len(r.Auth), MaxAuthEntries)
	}
	out := &Response{CacheKeyType: r.CacheKeyType, Auth: r.Auth}
	if r.CacheDuration != nil {
		d := max(r.CacheDuration.Duration, 0)
		out.CacheDuration = &d
	}
	return out, nil
}

// run execs the plugin for an image, as the kubelet does: the request on
// stdin, the answer on stdout, the process's environment and the
// configuration's env; bounded in time and in output.
func (p *provider) run(ctx context.Context, image string) (*Response, error) {
	req, err := json.Marshal(credentialproviderv1.CredentialProviderRequest{
		TypeMeta: metaOf(p.apiVersion, "CredentialProviderRequest"),
		Image:    image,
	})
	if err != nil {
		return nil, fmt.Errorf("failed to encode the request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	stdout := &capped{max: MaxResponseBytes, overflow: cancel}
	stderr := &capped{max: maxStderrBytes}
	cmd := exec.CommandContext(ctx, p.path, p.args...)
	stopGroup(cmd)
	// A copy: Environ's slice may be shared by every run.
	cmd.Env = slices.Concat(p.environ(), p.env)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), stdout, stderr
	cmd.WaitDelay = waitDelay
	err = cmd.Run()
	switch {
	case stdout.over:
		return nil, errTooLong
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("no answer within %s", p.timeout)
	case err != nil:
		if msg := strings.TrimSpace(stderr.buf.String()); msg != "" {
			return nil, fmt.Errorf("failed to run the plugin: %w: %s", err, msg)
		}
		return nil, fmt.Errorf("failed to run the plugin: %w", err)
	}
	return ParseResponse(stdout.buf.Bytes(), p.apiVersion)
}

// capped keeps the first max bytes written to it; past them it keeps
// nothing more and calls overflow, which stops the plugin.
type capped struct {
	buf      bytes.Buffer
	max      int
	over     bool
	overflow func()
}

func (c *capped) Write(b []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(b) > room {
		c.buf.Write(b[:max(room, 0)])
		if c.overflow != nil && !c.over {
			c.over = true
			c.overflow()
		}
		return len(b), nil
	}
	return c.buf.Write(b)
}
