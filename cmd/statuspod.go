package cmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/podstatus"
	"github.com/gpu-injector/gpu-injector/status"
)

type statusPodFlags struct {
	opts       podstatus.Options
	kubeconfig string
	context    string
	configFile string
	images     imageFlags
}

func parseStatusPodFlags(args []string, stderr io.Writer) (*statusPodFlags, error) {
	f := &statusPodFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("status pod", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then the in-cluster config, then ~/.kube/config")
	fs.StringVar(&f.context, "context", "", "kubeconfig context; default its current context")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace gpu-injector runs in; default: found by the chart's labels")
	// A back-quoted word of a usage string is the flag's argument name in
	// -h (flag.UnquoteUsage): only argument names are back-quoted here.
	fs.StringVar(&o.ManifestFile, "manifest", "", "the pod's manifest `file`, for a pod the webhook refused (the API server never stored it): decided as the webhook would now, against the cluster")
	fs.StringVar(&o.File, "f", "", "offline: a `file` of the pod (a manifest, or kubectl get pod -o yaml output) and, beside it, the cluster: Nodes, Namespaces, DRA objects, the pool memory's ConfigMap; no API server is contacted")
	fs.Var((*stringList)(&o.ClusterFiles), "nodes", "with -f: a `file` of more of the cluster (Nodes as kubectl get nodes -o yaml or gpu-injector nodeprobe --once print them, Namespaces, DRA objects, the pool memory's ConfigMap); repeatable")
	fs.StringVar(&f.configFile, "config", "", "with -f: the configuration `file` (InjectorConfiguration); defaults when empty")
	f.images.register(fs)
	fs.StringVar(&o.Output, "o", "table", "output: table, json or yaml")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector status pod NAMESPACE/NAME [--manifest FILE] [-o table|json|yaml]\n"+
			"       gpu-injector status pod [NAMESPACE/NAME] -f FILE [--nodes FILE ...] [--config FILE] [--images PATH ... | --pull] [-o table|json|yaml]\n\n"+
			"What gpu-injector did to one pod, whether its node still has the driver it got, and, for a Pending or refused pod,\n"+
			"the reason the webhook would give now; with -f, from files alone. Exit status 3 when something needs attention,\n"+
			"1 when the cluster or the files cannot be read.")
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
	if err := f.check(fs, target); err != nil {
		return nil, err
	}
	return f, nil
}

// check checks the flags together and reads the target.
func (f *statusPodFlags) check(fs *flag.FlagSet, target string) error {
	o := &f.opts
	switch {
	case o.File == "" && (len(o.ClusterFiles) > 0 || f.configFile != "" || f.images.given()):
		fs.Usage()
		return usageErrorf("--nodes, --config, --images and --pull go with -f")
	case o.File != "" && (o.ManifestFile != "" || f.kubeconfig != "" || f.context != "" || o.Namespace != ""):
		fs.Usage()
		return usageErrorf("-f reads no cluster: --manifest, --kubeconfig, --context and --namespace go without it")
	case f.images.pull && len(f.images.files) > 0:
		fs.Usage()
		return usageErrorf("--images and --pull exclude each other")
	}
	switch o.Output {
	case "table", "json", "yaml":
	default:
		return usageErrorf("-o %q: want table, json or yaml", o.Output)
	}
	if target == "" && o.File != "" {
		// The file's one pod.
		return nil
	}
	ns, name, ok := strings.Cut(target, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		fs.Usage()
		return usageErrorf("want NAMESPACE/NAME, not %q", target)
	}
	o.PodNamespace, o.PodName = ns, name
	return nil
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
	if err := f.setup(); err != nil {
		fmt.Fprintf(stderr, "gpu-injector status pod: %v\n", err)
		return status.ExitError
	}
	code, err := podstatus.Run(ctx, f.opts, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status pod: %v\n", err)
	}
	return code
}

// setup loads what the flags name: the configuration and the images with
// -f, the cluster's client without it.
func (f *statusPodFlags) setup() error {
	var err error
	if f.opts.File == "" {
		f.opts.RESTConfig, err = restConfig(f.kubeconfig, f.context)
		return err
	}
	if f.opts.Config, err = config.Load(f.configFile); err != nil {
		return err
	}
	f.opts.Images, err = f.images.reader(f.opts.Config)
	return err
}
