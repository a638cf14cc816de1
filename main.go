// Command gpu-injector injects each node's NVIDIA driver into GPU pods: the
// admission webhook, the per-node probe, and the same mutation offline.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/gpu-injector/gpu-injector/cmd"
	"github.com/gpu-injector/gpu-injector/version"
)

const usage = `gpu-injector: users write only a GPU limit; the cluster injects the node's NVIDIA driver.

Usage:
  gpu-injector webhook   [flags]   run the mutating admission webhook
  gpu-injector nodeprobe [flags]   find this node's driver and publish its layout on the Node
  gpu-injector nri-plugin [flags]  add the node's driver mounts to marked GPU containers (NRI)
  gpu-injector mutate -f FILE --nodes FILE [--config FILE]
                                   the webhook's mutation, offline, for review and GitOps
  gpu-injector config validate -f FILE
                                   check a configuration file (or the chart's rendered ConfigMap) as the webhook would
  gpu-injector status [flags]      what gpu-injector does in your cluster; exit 3 when something needs attention
  gpu-injector status pod NAMESPACE/NAME [--manifest FILE]
  gpu-injector status pod [NAMESPACE/NAME] -f FILE [--nodes FILE]
                                   one pod: its injection, its node's driver, why it waits or was refused;
                                   with -f, offline from the pod's and the cluster's files
  gpu-injector precheck [flags]    before or after helm install: how each GPU node gets the driver, the device plugin,
                                   the webhook, Pod Security; -f reads kubectl get nodes,ns -o yaml offline
  gpu-injector cleanup [flags]     remove what gpu-injector wrote to the Nodes (the chart's uninstall hook)
  gpu-injector version             print the version

Run "gpu-injector COMMAND -h" for a command's flags.
`

// kubectlPlugin is the name under which kubectl finds the binary as its
// plugin "kubectl gpu-injector" (a link of that name on PATH will do).
const kubectlPlugin = "kubectl-gpu_injector"

func main() {
	os.Exit(run(commandLine(os.Args[0], os.Args[1:]), os.Stdin, os.Stdout, os.Stderr))
}

// commandLine is the command line that run takes. kubectl execs a plugin as
// its file on PATH (krew's link kubectl-gpu_injector) with only the arguments
// after "kubectl gpu-injector", and what a kubectl user asks of gpu-injector
// is its status: "kubectl gpu-injector" and "kubectl gpu-injector -o json"
// mean status, "kubectl gpu-injector status ..." and "... version" say so.
func commandLine(argv0 string, args []string) []string {
	if filepath.Base(argv0) != kubectlPlugin || (len(args) > 0 && (args[0] == "status" || args[0] == "version")) {
		return args
	}
	return append([]string{"status"}, args...)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch args[0] {
	case "webhook":
		err = cmd.Webhook(ctx, args[1:], stderr)
	case "nodeprobe":
		err = cmd.NodeProbe(ctx, args[1:], stdout, stderr)
	case "nri-plugin":
		err = cmd.NRIPlugin(ctx, args[1:], stderr)
	case "mutate":
		err = cmd.Mutate(args[1:], stdin, stdout, stderr)
	case "status":
		return cmd.Status(ctx, args[1:], stdout, stderr)
	case "precheck":
		return cmd.Precheck(ctx, args[1:], stdin, stdout, stderr)
	case "config":
		return cmd.Config(args[1:], stdin, stdout, stderr)
	case "cleanup":
		err = cmd.Cleanup(ctx, args[1:], stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version.String())
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "gpu-injector: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "gpu-injector %s: %v\n", args[0], err)
	if errors.Is(err, cmd.ErrUsage) {
		return 2
	}
	return 1
}
