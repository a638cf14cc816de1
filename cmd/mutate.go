package cmd

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/mutate"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

type mutateFlags struct {
	opts       mutate.Options
	configFile string
	images     []string
	pull       bool
}

func parseMutateFlags(args []string, stderr io.Writer) (*mutateFlags, error) {
	f := &mutateFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// A back-quoted word of a usage string is the flag's argument name in
	// -h (flag.UnquoteUsage): only argument names are back-quoted here.
	fs.StringVar(&o.File, "f", "", "a `file` of manifests to mutate: multi-document YAML or JSON of Pods and workloads; - for stdin (required)")
	fs.Var((*stringList)(&o.NodeFiles), "nodes", "a `file` of Node objects, YAML or JSON, as kubectl get nodes -o yaml prints them; repeatable (required)")
	fs.StringVar(&f.configFile, "config", "", "configuration `file` (InjectorConfiguration); defaults when empty")
	fs.StringVar(&o.Namespace, "namespace", "default", "`namespace` of documents that name none")
	fs.Var((*stringList)(&f.images), "images", "the `path` of an OCI layout folder, or of a tarball as docker save writes it, holding images the manifests run: read as the webhook reads their registry (images.mode On); repeatable")
	fs.BoolVar(&f.pull, "pull", false, "read the images' configuration from their registries (those of images.registries, or any when it lists none), with your docker credentials")
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
	if f.pull && len(f.images) > 0 {
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
	switch {
	case len(f.images) > 0:
		local, err := offline.ReadLocalImages(f.images)
		if err != nil {
			return err
		}
		f.opts.Images = local
	case f.pull:
		f.opts.Images = offline.NewPulledImages(&f.opts.Config.Images)
	}
	return mutate.Run(f.opts, stdin, stdout, stderr)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
