package credprovider

import (
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

const v1API = "credentialprovider.kubelet.k8s.io/v1"

// FuzzParseResponse: whatever a plugin writes, the parser returns an
// answer of the kubelet's shape or an error, never panics, and never
// quotes the answer's credentials in its error.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"6h0m0s","auth":{"123456789012.dkr.ecr.us-east-1.amazonaws.com":{"username":"AWS","password":"eyJwYXlsb2FkIjoi"}}}`,
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"*.pkg.dev":{"username":"_token","password":"ya29.x"},"gcr.io":{"username":"_token","password":"ya29.x"}}}`,
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Global","cacheDuration":"-1s"}`,
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","auth":{"a":{"username":"u","password":"p","email":"x"}}}`,
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheKeyType":"Image"}`,
		`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","kind":"CredentialProviderResponse","cacheKeyType":"Registry"}`,
		`{"kind":"CredentialProviderRequest"}`,
		`[]`, `null`, ``, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseResponse(data, v1API)
		if err != nil {
			if r != nil {
				t.Fatal("an answer with an error")
			}
			if strings.Contains(err.Error(), "s3cr3t-password") {
				t.Fatalf("the error quotes the answer: %v", err)
			}
			return
		}
		switch r.CacheKeyType {
		case credentialproviderv1.ImagePluginCacheKeyType, credentialproviderv1.RegistryPluginCacheKeyType, credentialproviderv1.GlobalPluginCacheKeyType:
		default:
			t.Fatalf("cacheKeyType %q accepted", r.CacheKeyType)
		}
		if r.CacheDuration != nil && *r.CacheDuration < 0 {
			t.Fatalf("negative cacheDuration %s accepted", *r.CacheDuration)
		}
		if len(r.Auth) > MaxAuthEntries {
			t.Fatalf("%d auth entries accepted", len(r.Auth))
		}
		// The answer's keys feed the keyring, which must take any of them.
		var k keyring
		auth := map[string]authn.AuthConfig{}
		for key, a := range r.Auth {
			auth[key] = authn.AuthConfig{Username: a.Username, Password: a.Password}
		}
		k.add(auth)
		k.lookup("docker.io/library/ubuntu")
	})
}

// FuzzMatchImage: any pattern and image, as a node's configuration and a
// pod's image give them, match or not without panicking; a pattern always
// matches an image of its own host and path, and a host-only pattern
// without globs matches only its host.
func FuzzMatchImage(f *testing.F) {
	for _, s := range [][2]string{
		{"*.dkr.ecr.*.amazonaws.com", "123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/train"},
		{"*.azurecr.io", "team.azurecr.io/app"},
		{"registry.io:8080/path", "registry.io:8080/path/app"},
		{"k8s.*.io", "k8s.gcr.io/pause"},
		{"*.io", "a.b.io/x"},
		{"[", "["},
		{"%zz", "x"},
		{"docker.io", "docker.io/library/ubuntu"},
		{"http://x", "x/y"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, image string) {
		matchImage(pattern, image)
		u, err := parseSchemeless(pattern)
		if err != nil || pattern == "" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
			return
		}
		if strings.ContainsAny(pattern, "*?[\\%") || u.Host+u.Path != pattern {
			return
		}
		if !matchImage(pattern, pattern) {
			t.Fatalf("%q does not match itself", pattern)
		}
		if u.Path == "" && matchImage(pattern, "other-"+u.Host) && !strings.Contains(u.Host, ":") {
			t.Fatalf("%q matches another host", pattern)
		}
	})
}
