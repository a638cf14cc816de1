//go:build ignore

// Command kube runs one of the Kubernetes components it links, chosen by the
// name it is called by (a link named kubelet runs the kubelet) or by its
// first argument: one binary instead of five, for carrying to a machine.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	_ "time/tzdata"

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	if name == "kube" && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubeletCommand()))
	case "kubectl":
		logs.GlogSetter(logVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: kube kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl [flags]")
		os.Exit(2)
	}
}

// kubeletCommand builds the kubelet's command as every supported release spells its
// constructor: with a context (1.37) or without one (1.33, the floor).
func kubeletCommand() *cobra.Command {
	var newCommand any = kubelet.NewKubeletCommand
	switch f := newCommand.(type) {
	case func(context.Context) *cobra.Command:
		return f(context.Background())
	case func() *cobra.Command:
		return f()
	default:
		panic(fmt.Sprintf("unknown kubelet constructor %T", newCommand))
	}
}

// logVerbosity is kubectl's own GetLogVerbosity, which kubectl's main calls before it
// builds its command (so that klog logs at -v while plugins and .kuberc are read), and
// which the floor's k8s.io/kubectl (1.33) lacks.
func logVerbosity(args []string) string {
	for i, arg := range args {
		if arg == "--" {
			break
		}
		if arg == "--v" || arg == "-v" {
			if i+1 < len(args) {
				return args[i+1]
			}
		} else if strings.Contains(arg, "--v=") || strings.Contains(arg, "-v=") {
			if parg := strings.Split(arg, "="); len(parg) > 1 && parg[1] != "" {
				return parg[1]
			}
		}
	}
	return "0"
}
