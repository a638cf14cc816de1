package cmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-injector/gpu-injector/podstatus"
	"github.com/gpu-injector/gpu-injector/status"
)

type statusPodFlags struct {
	opts       podstatus.Options
	kubeconfig string
	context    string
}

func parseStatusPodFlags(args []string, stderr io.Writer) (*statusPodFlags, error) {
	f := &statusPodFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("status pod", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then the in-cluster config, then ~/.kube/config")
	fs.StringVar(&f.context, "context", "", "kubeconfig context; default its current context")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace gpu-injector runs in; default: found by the chart's labels")
	fs.StringVar(&o.ManifestFile, "f", "", "the pod's manifest, for a pod the webhook refused (the API server never stored it): decided as the webhook would now")
	fs.StringVar(&o.Output, "o", "table", "output: table, json or yaml")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector status pod NAMESPACE/NAME [-f POD.yaml] [-o table|json|yaml]\n\n"+
			"What gpu-injector did to one pod, whether its node still has the driver it got, and, for a Pending or refused pod,\n"+
			"the reason the webhook would give now. Exit status 3 when something needs attention, 1 when the cluster cannot be read.")
		fs.PrintDefaults()
	}
	// NAMESPACE/NAME may come before the flags, as kubectl takes it.
	target := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		target, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		if errors.Is(err, ErrUsage) && target == "" && fs.NArg() == 1 {
			target = fs.Arg(0)
		} else {
			return nil, err
		}
	}
	ns, name, ok := strings.Cut(target, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		fs.Usage()
		return nil, usageErrorf("want NAMESPACE/NAME, not %q", target)
	}
	o.PodNamespace, o.PodName = ns, name
	switch o.Output {
	case "table", "json", "yaml":
	default:
		return nil, usageErrorf("-o %q: want table, json or yaml", o.Output)
	}
	return f, nil
}

// StatusPod is `gpu-injector status pod NAMESPACE/NAME`; its exit status is
// as Status's.
func StatusPod(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseStatusPodFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return status.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status pod: %v\n", err)
		return status.ExitUsage
	}
	if f.opts.RESTConfig, err = restConfig(f.kubeconfig, f.context); err != nil {
		fmt.Fprintf(stderr, "gpu-injector status pod: %v\n", err)
		return status.ExitError
	}
	code, err := podstatus.Run(ctx, f.opts, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status pod: %v\n", err)
	}
	return code
}
