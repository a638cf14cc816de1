package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/bcrypt"
	"k8s.io/apimachinery/pkg/util/wait"
)

// RegistryVersion is the CNCF distribution registry that hack/tools.sh
// builds (its REGISTRY_VERSION names the same).
const RegistryVersion = "v3.1.0"

// FindRegistry locates the registry binary of hack/tools.sh, with an error
// that says how to build it.
func FindRegistry(cacheDir string) (string, error) {
	p := filepath.Join(cacheDir, "registry-"+RegistryVersion, "registry")
	if !executable(p) {
		return "", fmt.Errorf("%s is missing: run hack/tools.sh registry first", p)
	}
	return p, nil
}

// registryConfig is the distribution registry's configuration: the
// filesystem storage in the cluster's folder, plain HTTP on loopback, no
// authentication, as a private registry behind a cluster's network is often
// run. Deletes are on, so a test can remove what it pushed.
func registryConfig(dataDir, addr, htpasswd string) string {
	auth := ""
	if htpasswd != "" {
		auth = fmt.Sprintf(`auth:
  htpasswd:
    realm: gpu-injector-e2e
    path: %q
`, htpasswd)
	}
	return fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  delete:
    enabled: true
http:
  addr: %q
%s`, dataDir, addr, auth)
}

// registryHosts is containerd's hosts.toml for the registry at host
// (127.0.0.1:PORT): pull and resolve over plain HTTP, as a user of a private
// registry without TLS configures it (containerd's config_path).
func registryHosts(host string) string {
	return fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
`, host)
}

// registryHostsDir is the containerd config_path folder of the runtime whose
// state is under dir: one hosts.toml per registry host.
func registryHostsDir(dir string) string { return filepath.Join(dir, "certs.d") }

// Registry is a running distribution registry on loopback.
type Registry struct {
	// Host is 127.0.0.1:<port>: push to and pull from Host/<repository>:<tag>
	// over plain HTTP, without credentials.
	Host string
	proc *process
}

// StartRegistry starts the registry of hack/tools.sh on a free loopback port,
// its configuration, storage and log under dir, and returns once it serves.
// Stop it. A cluster with Options.Registry runs its own.
func StartRegistry(ctx context.Context, cacheDir, dir string) (*Registry, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	return startRegistry(ctx, cacheDir, dir, dir, fmt.Sprintf("127.0.0.1:%d", ports[0]), "")
}

func startRegistry(ctx context.Context, cacheDir, dir, logsDir, host, htpasswd string) (*Registry, error) {
	bin, err := FindRegistry(cacheDir)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", data, err)
	}
	conf := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(conf, []byte(registryConfig(data, host, htpasswd)), 0o644); err != nil {
		return nil, fmt.Errorf("failed to write the registry config: %w", err)
	}
	name := "registry"
	if htpasswd != "" {
		name = "registry-private"
	}
	p, err := startProcess(logsDir, name, bin, []string{"serve", conf}, nil)
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: host, proc: p}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if gone, err := p.exited(); gone {
			return false, fmt.Errorf("the registry exited: %v", err)
		}
		return registryServes(ctx, "http://"+host+"/v2/"), nil
	})
	if err != nil {
		r.Stop()
		return nil, withLog(fmt.Errorf("failed to wait for the registry's /v2/ at %s: %w", host, err), p)
	}
	return r, nil
}

// Stop stops the registry; its storage stays in its folder.
func (r *Registry) Stop() { r.proc.stop(10 * time.Second) }

// startRegistry starts the cluster's registry on its loopback port and tells
// the node's containerd, through a hosts.toml in its config_path, to pull
// from it. Stop stops it with the other components.
func (c *Cluster) startRegistry(ctx context.Context) error {
	if !c.opts.Registry {
		return nil
	}
	host := fmt.Sprintf("127.0.0.1:%d", c.ports["registry"])
	if err := c.trustRegistry(host); err != nil {
		return err
	}
	r, err := startRegistry(ctx, c.CacheDir, filepath.Join(c.Dir, "registry"), c.LogsDir, host, "")
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.procs["registry"] = r.proc
	c.order = append(c.order, "registry")
	c.mu.Unlock()
	c.RegistryHost = host
	c.log.Info("registry ready", "host", host)
	return nil
}

// trustRegistry tells the node's containerd, through a hosts.toml in its
// config_path, to pull from the registry at host over plain HTTP.
func (c *Cluster) trustRegistry(host string) error {
	hosts := filepath.Join(registryHostsDir(filepath.Join(c.Dir, "containerd")), host)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return fmt.Errorf("failed to create %s: %w", hosts, err)
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(registryHosts(host)), 0o644); err != nil {
		return fmt.Errorf("failed to write containerd's hosts.toml for %s: %w", host, err)
	}
	return nil
}

// relayRegistry makes the registry reachable from pods: a policy engine or
// admission webhook reads images from inside the cluster, and the host's
// loopback is not the pods'. A TCP relay (serviceProxy) on this host's
// bridge address, the pods' gateway, at the registry's port hands each
// connection to the registry on loopback; containerd pulls through it too,
// so an image named RegistryPodHost/<repository>:<tag> is the same for
// the pod that reads it and the node that runs it. It needs the bridge.
func (c *Cluster) relayRegistry() error {
	if c.RegistryHost == "" {
		return nil
	}
	host := fmt.Sprintf("%s:%d", c.BridgeIP, c.ports["registry"])
	if err := c.trustRegistry(host); err != nil {
		return err
	}
	proxy, err := startServiceProxy(host, c.RegistryHost)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.registryProxy = proxy
	c.mu.Unlock()
	c.RegistryPodHost = host
	return nil
}

// StartPrivateRegistry starts a second registry that answers only user with
// password (HTTP basic authentication against a bcrypt htpasswd file, as a
// registry behind a login is often run), on this host's bridge address so
// that pods and the node's containerd both reach it, its storage under the
// cluster's folder. Stop it; the cluster's own registry stays anonymous.
func (c *Cluster) StartPrivateRegistry(ctx context.Context, user, password string) (*Registry, error) {
	if c.BridgeIP == "" {
		return nil, fmt.Errorf("the cluster has no bridge address yet")
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.Dir, "registry-private")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", dir, err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return nil, fmt.Errorf("failed to hash the registry's password: %w", err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("failed to write %s: %w", htpasswd, err)
	}
	host := fmt.Sprintf("%s:%d", c.BridgeIP, ports[0])
	if err := c.trustRegistry(host); err != nil {
		return nil, err
	}
	return startRegistry(ctx, c.CacheDir, dir, c.LogsDir, host, htpasswd)
}

// registryServes says whether the registry at url answers its /v2/ check:
// 200 without authentication, 401 with.
func registryServes(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized
}
