// Package cmd is gpu-injector's command line: each command's flags, checked
// and turned into the options of the package that does the work (webhook,
// nodeprobe, nriplugin, mutate, status, precheck), and the wiring the commands
// share.
// Those packages parse no flags; main dispatches to the functions here.
package cmd

import (
	"errors"
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
)

// ErrUsage marks a bad command line: the command exits with status 2.
var ErrUsage = errors.New("usage error")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// parse parses args into fs: -h returns flag.ErrHelp, a bad flag or a stray
// argument ErrUsage.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// restConfig finds the API server: the kubeconfig file given, else as
// controller-runtime does ($KUBECONFIG, the in-cluster config, then
// ~/.kube/config). A non-empty context picks one of the kubeconfig's
// contexts instead of its current one.
func restConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := ctrlconfig.GetConfigWithContext(context)
		if err != nil {
			return nil, fmt.Errorf("failed to find a kubeconfig or in-cluster config: %w", err)
		}
		return c, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to load kubeconfig %q: %w", kubeconfig, err)
	}
	return c, nil
}
