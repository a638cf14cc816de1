package cmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/cleanup"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
)

type cleanupFlags struct {
	opts       cleanup.Options
	pods       string
	kubeconfig string
}

func parseCleanupFlags(args []string, stderr io.Writer) (*cleanupFlags, error) {
	f := &cleanupFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector cleanup --namespace NS [flags]\n\n"+
			"Stops the release's webhook and probes, then removes every gpu-injector.io/ label and annotation and\n"+
			"the GPUDriverWedged condition from every Node, and the remembered pools: what helm uninstall runs first.")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then the in-cluster config, then ~/.kube/config")
	fs.StringVar(&o.Namespace, "namespace", "", "the release namespace")
	fs.StringVar(&o.WebhookConfiguration, "webhook-configuration-name", "", "MutatingWebhookConfiguration to delete first; empty: none")
	fs.StringVar(&o.WebhookDeployment, "webhook-deployment", "", "webhook Deployment to delete and wait for; empty: none")
	fs.StringVar(&o.ProbeDaemonSet, "probe-daemonset", "", "probe DaemonSet to delete and wait for; empty: none")
	fs.StringVar(&o.PoolMemory, "pool-memory-name", "", "ConfigMap and Lease of the remembered pools to delete; empty: none")
	fs.StringVar(&f.pods, "delete-pods", "", "comma-separated pods in --namespace to delete (the helm test's, which helm keeps)")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long to wait for the webhook's and the probes' pods to stop")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if o.Namespace == "" {
		return nil, usageErrorf("--namespace is required")
	}
	if f.pods != "" {
		o.Pods = strings.Split(f.pods, ",")
	}
	return f, nil
}

// Cleanup is `gpu-injector cleanup`, the chart's pre-delete hook.
func Cleanup(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parseCleanupFlags(args, stderr)
	if err != nil {
		return err
	}
	restCfg, err := restConfig(f.kubeconfig, "")
	if err != nil {
		return err
	}
	o := f.opts
	if o.Client, err = kubernetes.NewForConfig(restCfg); err != nil {
		return fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	o.Log = nodeagent.NewLogger(stderr, 0)
	return cleanup.Run(ctx, o)
}
