package credprovider

import (
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// The matching below is the kubelet's (k8s.io/kubernetes
// pkg/credentialprovider/keyring.go), which a plugin's matchImages and the
// keys of its answer are written for: a node's plugin must match here
// exactly the images it matches there.

// parseSchemeless parses an image or pattern, which has no scheme.
func parseSchemeless(s string) (*url.URL, error) {
	u, err := url.Parse("https://" + s)
	if err != nil {
		return nil, err
	}
	u.Scheme = ""
	return u, nil
}

// splitHost splits a URL's host into its dot-separated parts and its port.
func splitHost(u *url.URL) ([]string, string) {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, ""
	}
	return strings.Split(host, "."), port
}

// matchImage reports whether image matches pattern, a matchImages entry or
// a key of a plugin's auth map: the same number of host parts, each
// matching its glob (one part per glob: *.io does not match a.b.io), the
// same port, and the pattern's path a prefix of the image's.
func matchImage(pattern, image string) bool {
	p, err := parseSchemeless(pattern)
	if err != nil {
		return false
	}
	i, err := parseSchemeless(image)
	if err != nil {
		return false
	}
	pParts, pPort := splitHost(p)
	iParts, iPort := splitHost(i)
	if pPort != iPort || len(pParts) != len(iParts) || !strings.HasPrefix(i.Path, p.Path) {
		return false
	}
	for k, part := range pParts {
		if ok, err := filepath.Match(part, iParts[k]); err != nil || !ok {
			return false
		}
	}
	return true
}

// imageName is how the kubelet names the image to its plugins and matches
// it: the repository without tag or digest, Docker Hub's as docker.io.
func imageName(target authn.Resource) string {
	s := target.String()
	if target.RegistryStr() == name.DefaultRegistry {
		s = "docker.io" + strings.TrimPrefix(s, name.DefaultRegistry)
	}
	return s
}

// registryOf is the first part of an image name, as the kubelet keys a
// Registry answer.
func registryOf(image string) string {
	reg, _, _ := strings.Cut(image, "/")
	return reg
}

// keyring holds the credentials of the plugins' answers, by key, most
// specific first.
type keyring struct {
	keys []keyed
}

type keyed struct {
	key  string
	auth authn.AuthConfig
}

// add adds a plugin's answer after those of earlier plugins, whose equal
// keys stay first. A key is a host with an optional path; a scheme and a
// leading /v1/ or /v2/ are dropped, as the Docker client does.
func (k *keyring) add(auth map[string]authn.AuthConfig) {
	for loc, a := range auth {
		value := loc
		if !strings.HasPrefix(value, "https://") && !strings.HasPrefix(value, "http://") {
			value = "https://" + value
		}
		u, err := url.Parse(value)
		if err != nil {
			continue
		}
		p := u.Path
		if strings.HasPrefix(p, "/v2/") || strings.HasPrefix(p, "/v1/") {
			p = p[3:]
		}
		key := u.Host
		if p != "" && p != "/" {
			key += p
		}
		k.keys = append(k.keys, keyed{key: key, auth: a})
	}
	// Reverse order, so that quay.io/coreos comes before quay.io.
	sort.SliceStable(k.keys, func(i, j int) bool { return k.keys[i].key > k.keys[j].key })
}

// lookup is the first credentials whose key matches the image; Docker
// Hub's may be keyed index.docker.io.
func (k *keyring) lookup(image string) (authn.AuthConfig, bool) {
	for _, e := range k.keys {
		if matchImage(e.key, image) {
			return e.auth, true
		}
	}
	if isDockerHub(image) {
		for _, e := range k.keys {
			if e.key == name.DefaultRegistry {
				return e.auth, true
			}
		}
	}
	return authn.AuthConfig{}, false
}

// isDockerHub reports whether an image name is Docker Hub's.
func isDockerHub(image string) bool {
	first, _, found := strings.Cut(image, "/")
	switch {
	case first == "":
		return false
	case !found, first == "docker.io", first == name.DefaultRegistry:
		return true
	}
	return !strings.ContainsAny(first, ".:")
}
