// Command cluster-up starts the local one-node cluster (see docs/local-cluster.md),
// prints how to reach it, and stops it on Ctrl-C or SIGTERM. It builds nothing:
// run hack/tools.sh and hack/install-runtime.sh first.
//
// --write-env leaves the cluster's paths in a file a shell can source; on a GPU
// machine, hack/gpu-cluster.sh then runs NVIDIA's device plugin in it as a pod.
// --runtime nri runs containerd 2.x with NRI on the node (hack/tools.sh
// containerd runc), for gpu-injector's NRI plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		nodeName   = flag.String("node-name", cluster.DefaultNodeName, "name of the kubelet's Node")
		nodeLabels = flag.String("node-labels", "", "labels for the Node, k=v[,k=v...]")
		logsDir    = flag.String("logs-dir", "", "write component logs here (kept after stop); default: inside the cluster folder")
		keep       = flag.Bool("keep-on-failure", false, "keep the cluster folder when start fails")
		kubeconfig = flag.String("write-kubeconfig", "", "also copy the admin kubeconfig to this path")
		timeout    = flag.Duration("timeout", 3*time.Minute, "how long start may take")
		verbose    = flag.Bool("v", false, "log every step")
		envFile    = flag.String("write-env", "", "write KUBECONFIG, CONTAINERD_SOCKET, ... of the running cluster to this file (shell syntax), once it is ready")
		runtime    = flag.String("runtime", string(cluster.RuntimeDebian), "the node's container runtime: debian (Debian's containerd, no NRI), nri (containerd 2.x with NRI, built by hack/tools.sh) or crio (CRI-O with NRI, built by hack/tools.sh crio)")
		images     []string
	)
	flag.Func("import-image", "docker-archive tar (make image) to import into the node's runtime; repeatable", func(v string) error {
		images = append(images, v)
		return nil
	})
	flag.Parse()

	zcfg := zap.NewDevelopmentConfig()
	zcfg.DisableStacktrace = true
	if !*verbose {
		zcfg.Level = zap.NewAtomicLevelAt(zap.InfoLevel)
	}
	zl, err := zcfg.Build()
	if err != nil {
		return fmt.Errorf("failed to build logger: %w", err)
	}
	defer zl.Sync() //nolint:errcheck // nothing to do about a failed flush
	log := zapr.NewLogger(zl)

	rt, err := parseRuntime(*runtime)
	if err != nil {
		return err
	}
	labels, err := parseLabels(*nodeLabels)
	if err != nil {
		return err
	}
	if *logsDir != "" {
		if err := os.MkdirAll(*logsDir, 0o755); err != nil {
			return fmt.Errorf("failed to create logs dir: %w", err)
		}
	}

	// The first signal stops the cluster; Start is cancelled too if it comes early.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := cluster.Start(ctx, cluster.Options{
		NodeName:      *nodeName,
		NodeLabels:    labels,
		Runtime:       rt,
		LogsDir:       *logsDir,
		KeepOnFailure: *keep,
		Timeout:       *timeout,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	for _, tar := range images {
		if err := c.ImportImage(ctx, tar); err != nil {
			_ = c.Stop()
			return err
		}
		log.Info("imported image", "tar", tar)
	}
	if *kubeconfig != "" {
		data, err := os.ReadFile(c.Kubeconfig)
		if err == nil {
			err = os.WriteFile(*kubeconfig, data, 0o600)
		}
		if err != nil {
			_ = c.Stop()
			return fmt.Errorf("failed to write kubeconfig %s: %w", *kubeconfig, err)
		}
	}
	if *envFile != "" {
		if err := writeEnv(*envFile, c); err != nil {
			_ = c.Stop()
			return err
		}
	}
	fmt.Printf(`
local cluster is up: node %s (%s), API server %s
  pods:              %s on bridge %s; the API server calls webhook Services at their endpoints
  kubernetes svc:    %s:443 (relayed to the API server; pods' in-cluster config)
  kubeconfig:        %s
  containerd socket: %s
  runtime:           %s%s
  device plugins:    %s
  logs:              %s

  export KUBECONFIG=%s
  %s get nodes -o wide

press Ctrl-C to stop it (everything it started is stopped and its folder removed)
`, c.NodeName, c.NodeIP, c.APIServerURL, c.PodSubnet, c.BridgeIP, c.KubernetesServiceIP, c.Kubeconfig, c.ContainerdSocket, c.Runtime, nriNote(c), c.DevicePluginDir, c.LogsDir,
		c.Kubeconfig, c.Binaries.Kubectl)

	<-ctx.Done()
	fmt.Println("stopping local cluster...")
	if err := c.Stop(); err != nil {
		return fmt.Errorf("failed to stop cluster cleanly: %w", err)
	}
	return nil
}

// writeEnv writes what a script needs to reach the cluster, one NAME='value'
// per line.
func writeEnv(path string, c *cluster.Cluster) error {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"KUBECONFIG", c.Kubeconfig},
		{"CONTAINERD_SOCKET", c.ContainerdSocket},
		{"DEVICE_PLUGIN_DIR", c.DevicePluginDir},
		{"NODE_NAME", c.NodeName},
		{"NODE_IP", c.NodeIP},
		{"API_SERVER", c.APIServerURL},
		{"LOGS_DIR", c.LogsDir},
		{"KUBECTL", c.Binaries.Kubectl},
		{"CTR", c.Binaries.Ctr},
		{"RUNTIME", string(c.Runtime)},
		// Empty with Debian's containerd, which has no NRI.
		{"NRI_SOCKET", c.NRISocket},
	} {
		fmt.Fprintf(&b, "%s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	return nil
}

// nriNote names the NRI socket, as plugins outside the node reach it.
func nriNote(c *cluster.Cluster) string {
	if c.NRISocket == "" {
		return ""
	}
	return " (NRI socket " + c.NRISocket + ")"
}

// parseRuntime checks --runtime against e2e/cluster's runtimes.
func parseRuntime(s string) (cluster.Runtime, error) {
	switch r := cluster.Runtime(s); r {
	case cluster.RuntimeDebian, cluster.RuntimeNRI, cluster.RuntimeCRIO:
		return r, nil
	}
	return "", fmt.Errorf("--runtime wants %s, %s or %s, got %q", cluster.RuntimeDebian, cluster.RuntimeNRI, cluster.RuntimeCRIO, s)
}

func parseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, errors.New("--node-labels wants k=v[,k=v...], got " + s)
		}
		out[k] = v
	}
	return out, nil
}
