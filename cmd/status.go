package cmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/gpu-injector/gpu-injector/status"
)

type statusFlags struct {
	opts       status.Options
	kubeconfig string
	context    string
}

func parseStatusFlags(args []string, stderr io.Writer) (*statusFlags, error) {
	f := &statusFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then the in-cluster config, then ~/.kube/config")
	fs.StringVar(&f.context, "context", "", "kubeconfig context; default its current context")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace gpu-injector runs in; default: found by the chart's labels")
	fs.StringVar(&o.DryRunNamespace, "dry-run-namespace", "", "namespace to try the dry-run GPU pod in; default: an opted-in namespace, one whose Pod Security level allows hostPath first")
	fs.BoolVar(&o.DryRunOnly, "dry-run-only", false, "only try the dry-run GPU pod in --dry-run-namespace, print what the API server returned, exit 0 when the webhook mutated it (3 otherwise); reads nothing else")
	fs.StringVar(&o.Output, "o", "table", "output: table, json or yaml")
	fs.StringVar(&o.Color, "color", "auto", "colour the table: auto (when stdout is a terminal and NO_COLOR is unset), always or never")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector status [--namespace NS] [-o table|json|yaml]\n       gpu-injector status pod NAMESPACE/NAME [--manifest FILE] [-o table|json|yaml]\n       gpu-injector status pod [NAMESPACE/NAME] -f FILE [--nodes FILE ...] [-o table|json|yaml]\n\n"+
			"What gpu-injector does in the cluster of your kubeconfig. Exit status 3 when something needs attention, 1 when the cluster cannot be read.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if o.DryRunOnly && o.DryRunNamespace == "" {
		return nil, usageErrorf("--dry-run-only needs --dry-run-namespace")
	}
	switch o.Output {
	case "table", "json", "yaml":
	default:
		return nil, usageErrorf("-o %q: want table, json or yaml", o.Output)
	}
	switch o.Color {
	case "auto", "always", "never":
	default:
		return nil, usageErrorf("--color %q: want auto, always or never", o.Color)
	}
	return f, nil
}

// Status is `gpu-injector status` (also `kubectl gpu-injector`). It prints
// its own errors and returns its exit status, which carries more than
// success or failure: status.ExitAttention when something needs an operator.
func Status(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "pod" {
		return StatusPod(ctx, args[1:], stdout, stderr)
	}
	f, err := parseStatusFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return status.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return status.ExitUsage
	}
	if f.opts.RESTConfig, err = restConfig(f.kubeconfig, f.context); err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return status.ExitError
	}
	code, err := status.Run(ctx, f.opts, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
	}
	return code
}
