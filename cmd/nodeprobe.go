//go:build cgo

package cmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

type nodeProbeFlags struct {
	opts        nodeprobe.Options
	once        bool
	output      string
	configFile  string
	kubeconfig  string
	verbosity   int
	nvmlTimeout time.Duration
}

func parseNodeProbeFlags(args []string, stderr io.Writer) (*nodeProbeFlags, error) {
	f := &nodeProbeFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("nodeprobe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&f.once, "once", false, "probe once, print what would be published on the Node, and exit; non-zero when no usable layout was found")
	fs.StringVar(&o.Probe.HostRoot, "host-root", "/host", "folder where the host's / is mounted (read-only)")
	fs.StringVar(&f.output, "o", "yaml", "output format of --once: yaml or json (the Node), or layout (its "+layout.AnnotationLayout+" annotation alone, as config.pinning.pools takes it)")
	fs.StringVar(&f.configFile, "config", "", "configuration file (InjectorConfiguration); empty means defaults")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME; --once falls back to the hostname)")
	fs.DurationVar(&o.Interval, "interval", 5*time.Minute, "time between probes; SIGHUP probes at once")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, in-cluster, then ~/.kube/config")
	fs.StringVar(&o.Probe.NVMLLibrary, "nvml-library", "", "libnvidia-ml file to load (a path on this machine); empty means the host's libnvidia-ml.so.1 under --host-root")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", ":8082", "address of /healthz and /readyz; 0 disables")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8083", "address of /metrics; 0 disables")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity; 1 logs every probe's notes")
	fs.DurationVar(&f.nvmlTimeout, "nvml-timeout", nodeprobe.DefaultNVMLTimeout, "longest wait for NVML (nvmlInit to nvmlShutdown) before the node is marked wedged")
	fs.StringVar(&o.HostMountTable, "host-mount-table", nodeprobe.DefaultHostMountTable, "the host's mount table, under --host-root: the probe compares the host's driver mounts ("+strings.Join(nodeprobe.DriverMountRoots, ", ")+") with its own copy of them, and restarts when a driver mount came or went that its container cannot see")
	fs.StringVar(&o.StateDir, "state-dir", "", "folder shared with the NRI plugin: the probe writes layout.json there after every probe, and publishes the "+layout.LabelNRIPlugin+" label while the plugin's nri-plugin.json there says it is registered; empty is off")
	fs.BoolVar(&o.Probe.IgnoreRuntimeInjection, "ignore-runtime-injection", false, "plan mounts even where the container runtime or the device plugin injects the driver itself (NVIDIA toolkit as the default runtime, CDI specs, GKE's device plugin)")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	switch {
	case f.output != "yaml" && f.output != "json" && f.output != "layout":
		return nil, usageErrorf("-o must be yaml, json or layout, not %q", f.output)
	case o.Interval <= 0:
		return nil, usageErrorf("--interval must be positive")
	case f.nvmlTimeout <= 0:
		return nil, usageErrorf("--nvml-timeout must be positive")
	case !f.once && o.NodeName == "":
		return nil, usageErrorf("--node-name or $NODE_NAME is required without --once")
	}
	o.Probe.NVMLWatch = &nodeprobe.NVMLWatch{Timeout: f.nvmlTimeout}
	return f, nil
}

// NodeProbe is `gpu-injector nodeprobe`: the per-node agent, or with --once
// one probe printed.
func NodeProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseNodeProbeFlags(args, stderr)
	if err != nil {
		return err
	}
	o := f.opts
	o.Log = nodeagent.NewLogger(stderr, f.verbosity)
	nodeagent.SetMemoryLimit(o.Log)
	if o.Probe.Config, err = config.Load(f.configFile); err != nil {
		return err
	}
	if f.once {
		return nodeprobe.Once(o, f.output, stdout)
	}
	restCfg, err := restConfig(f.kubeconfig, "")
	if err != nil {
		return err
	}
	if o.Client, err = kubernetes.NewForConfig(restCfg); err != nil {
		return fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	return nodeprobe.Run(ctx, o)
}
