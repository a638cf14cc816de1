package cmd

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/mutate"
)

type mutateFlags struct {
	opts       mutate.Options
	configFile string
	images     imageFlags
}

func parseMutateFlags(args []string, stderr io.Writer) (*mutateFlags, error) {
	f := &mutateFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// A back-quoted word of a usage string is the flag's argument name in
	// -h (flag.UnquoteUsage): only argument names are back-quoted here.
	fs.StringVar(&o.File, "f", "", "a `file` of manifests to mutate: multi-document YAML or JSON of Pods and workloads, with the Namespaces and claims applied beside them; - for stdin (required)")
	fs.Var((*stringList)(&o.NodeFiles), "nodes", "a `file` of the cluster, YAML or JSON: Node objects as kubectl get nodes -o yaml or gpu-injector nodeprobe --once print them, Namespaces, DRA objects, the pool memory's ConfigMap; repeatable (required)")
	fs.StringVar(&f.configFile, "config", "", "configuration `file` (InjectorConfiguration); defaults when empty")
	fs.StringVar(&o.Namespace, "namespace", "default", "`namespace` of documents that name none")
	f.images.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector mutate -f FILE --nodes FILE [--config FILE] [--images PATH ... | --pull]\n\nPrints the documents of FILE as the webhook would mutate them; warnings go to stderr.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if o.File == "" || len(o.NodeFiles) == 0 {
		fs.Usage()
		return nil, usageErrorf("-f and --nodes are required")
	}
	if f.images.pull && len(f.images.files) > 0 {
		fs.Usage()
		return nil, usageErrorf("--images and --pull exclude each other")
	}
	return f, nil
}

// Mutate is `gpu-injector mutate`: the webhook's mutation, offline.
func Mutate(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f, err := parseMutateFlags(args, stderr)
	if err != nil {
		return err
	}
	if f.opts.Config, err = config.Load(f.configFile); err != nil {
		return err
	}
	if f.opts.Images, err = f.images.reader(f.opts.Config); err != nil {
		return err
	}
	return mutate.Run(f.opts, stdin, stdout, stderr)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
