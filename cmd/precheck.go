package cmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/precheck"
	"github.com/gpu-injector/gpu-injector/status"
)

type precheckFlags struct {
	opts       precheck.Options
	kubeconfig string
	context    string
	configFile string
}

func parsePrecheckFlags(args []string, stderr io.Writer) (*precheckFlags, error) {
	f := &precheckFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("precheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then the in-cluster config, then ~/.kube/config")
	fs.StringVar(&f.context, "context", "", "kubeconfig context; default its current context")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace gpu-injector runs in; default: found by the chart's labels (offline: unknown)")
	fs.StringVar(&o.File, "f", "", "offline: read `FILE`, the output of kubectl get nodes,ns -o yaml (a v1 List, or multi-document YAML; - for stdin), instead of the cluster")
	fs.StringVar(&f.configFile, "config", "", "the webhook's configuration file (InjectorConfiguration); default: the release's ConfigMap (offline: the defaults)")
	fs.StringVar(&o.DryRunNamespace, "dry-run-namespace", "", "namespace to try the dry-run GPU pod in; default: an opted-in namespace, one whose Pod Security level allows hostPath first")
	fs.StringVar(&o.Output, "o", "table", "output: table, json or yaml")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector precheck [--namespace NS] [--config CFG] [-o table|json|yaml]\n       gpu-injector precheck -f NODES-AND-NAMESPACES.yaml [--config CFG]\n\n"+
			"Whether GPU pods will get their driver: each GPU node's delivery and why, the device plugin, the webhook (a dry-run GPU pod),\n"+
			"and the opted-in namespaces' Pod Security levels. Exit status 3 when something needs attention, 1 when the input cannot be read.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		if errors.Is(err, ErrUsage) {
			fs.Usage()
		}
		return nil, err
	}
	switch o.Output {
	case "table", "json", "yaml":
	default:
		return nil, usageErrorf("-o %q: want table, json or yaml", o.Output)
	}
	if o.File != "" && (f.kubeconfig != "" || f.context != "" || o.DryRunNamespace != "") {
		return nil, usageErrorf("-f reads a file: --kubeconfig, --context and --dry-run-namespace are for the cluster")
	}
	return f, nil
}

// Precheck is `gpu-injector precheck`. It prints its own errors and returns
// its exit status, as Status does.
func Precheck(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	f, err := parsePrecheckFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return status.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector precheck: %v\n", err)
		return status.ExitUsage
	}
	if f.configFile != "" {
		if f.opts.Config, err = config.Load(f.configFile); err != nil {
			fmt.Fprintf(stderr, "gpu-injector precheck: %v\n", err)
			return status.ExitError
		}
		f.opts.ConfigSource = "file " + f.configFile
	}
	if f.opts.File == "" {
		if f.opts.RESTConfig, err = restConfig(f.kubeconfig, f.context); err != nil {
			fmt.Fprintf(stderr, "gpu-injector precheck: %v\n", err)
			return status.ExitError
		}
	}
	code, err := precheck.Run(ctx, f.opts, stdin, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector precheck: %v\n", err)
	}
	return code
}
