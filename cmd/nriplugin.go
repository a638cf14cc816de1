package cmd

import (
	"context"
	"flag"
	"io"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/nriplugin"
)

type nriPluginFlags struct {
	opts       nriplugin.Options
	configFile string
	verbosity  int
}

func parseNRIPluginFlags(args []string, stderr io.Writer) (*nriPluginFlags, error) {
	f := &nriPluginFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("nri-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Socket, "socket", nriplugin.DefaultSocket, "the container runtime's NRI socket")
	fs.StringVar(&o.StateDir, "state-dir", "/run/gpu-injector", "folder shared with the node probe: its layout.json is read, nri-plugin.json written while registered")
	fs.StringVar(&f.configFile, "config", "", "configuration file (InjectorConfiguration) whose host path rules a plan must pass; empty means defaults")
	fs.StringVar(&o.PluginIndex, "plugin-index", "50", "the plugin's index among the runtime's NRI plugins (two digits): the order in which plugins see a container")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", ":8084", "address of /healthz and /readyz (ready while registered); 0 disables")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8085", "address of /metrics; 0 disables")
	fs.StringVar(&o.ProcRoot, "proc-root", "", "the host's /proc as mounted into the plugin: the maps of the node's GPU containers' processes are read there for deleted driver libraries (needs ptrace-read access: CAP_SYS_PTRACE); empty disables the scan")
	fs.DurationVar(&o.StaleDriverInterval, "stale-driver-interval", nriplugin.DefaultStaleDriverInterval, "how often the GPU containers are scanned for deleted driver libraries")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity; 1 logs every injection")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	switch idx := o.PluginIndex; {
	case o.StateDir == "":
		return nil, usageErrorf("--state-dir is required: the plugin reads the probe's plan there")
	case o.StaleDriverInterval <= 0:
		return nil, usageErrorf("--stale-driver-interval must be positive, not %s", o.StaleDriverInterval)
	case o.Socket == "":
		return nil, usageErrorf("--socket is required")
	case len(idx) != 2 || idx[0] < '0' || idx[0] > '9' || idx[1] < '0' || idx[1] > '9':
		return nil, usageErrorf("--plugin-index must be two digits, not %q", idx)
	}
	return f, nil
}

// NRIPlugin is `gpu-injector nri-plugin`: the NRI plugin, registered with
// the container runtime until ctx ends.
func NRIPlugin(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parseNRIPluginFlags(args, stderr)
	if err != nil {
		return err
	}
	o := f.opts
	o.Log = nodeagent.NewLogger(stderr, f.verbosity)
	nodeagent.SetMemoryLimit(o.Log)
	cfg, err := config.Load(f.configFile)
	if err != nil {
		return err
	}
	o.Rules = cfg.Rules()
	o.LDLibraryPath = cfg.LDLibraryPath
	return nriplugin.Run(ctx, o)
}
