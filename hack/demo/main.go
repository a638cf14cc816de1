// Command demo is `make demo`: it brings up the e2e environment (a real local
// cluster with one real kubelet, simulated GPU nodes in the classic driver
// layouts, the chart's objects, and the real gpu-injector as webhook and
// probes), applies the classic GPU workloads of hack/demo/manifests with the
// real kubectl, waits for them, and prints what gpu-injector did to each pod
// and what the containers saw. It keeps the cluster up until Ctrl-C or
// SIGTERM, or tears it down right after the report with --exit.
//
// No GPU is involved: every driver is the e2e stand-in, which says so in
// everything it prints.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
)

// Namespaces of hack/demo/manifests/namespaces.yaml.
const (
	nsInject     = "ml"
	nsUnlabelled = "ml-unlabelled"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	exit := fs.Bool("exit", false, "tear everything down right after the report (tests, CI) instead of waiting for Ctrl-C")
	keep := fs.Bool("keep-on-failure", false, "keep the environment's folder (logs, kubeconfigs) when something fails")
	waitFor := fs.Duration("timeout", 3*time.Minute, "how long to wait for the workloads to be scheduled and to finish")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: go run ./hack/demo [--exit] [--keep-on-failure] [--timeout 3m]\n\n"+
			"A local cluster with simulated GPU nodes, gpu-injector installed, the classic GPU workloads,\n"+
			"and a report of what was injected. Needs root, Go, gcc, and what hack/tools.sh and\n"+
			"hack/install-runtime.sh provide (hack/demo.sh runs them first).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d := &demo{out: stdout, log: stderr, start: time.Now(), waitFor: *waitFor, exit: *exit}
	d.progress("bringing up the environment: a local Kubernetes %s cluster with one real kubelet, simulated GPU nodes, gpu-injector", cluster.KubernetesVersion)
	e, err := env.Up(ctx, env.Options{Progress: stderr, KeepOnFailure: *keep})
	if err != nil {
		d.failUp(ctx, err)
		return 1
	}
	d.env = e
	code := d.runWorkloads(ctx)
	if code != 0 {
		e.MarkFailed()
	}
	if ctx.Err() == nil && !*exit {
		d.say("\npress Ctrl-C to stop (everything is torn down)")
		<-ctx.Done()
		fmt.Fprintln(stderr)
	}
	stop()
	if err := e.Down(); err != nil {
		fmt.Fprintf(stderr, "demo: failed to tear the environment down: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// failUp explains why the environment did not come up, in words that say
// what to do.
func (d *demo) failUp(ctx context.Context, err error) {
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(d.log, "demo: interrupted while starting; everything started so far was stopped\n")
	default:
		fmt.Fprintf(d.log, "demo: failed to bring the environment up: %v\n", err)
	}
}
