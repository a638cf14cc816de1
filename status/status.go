// Package status is `gpu-injector status`: what gpu-injector does in a
// cluster, read with the user's kubeconfig and shown in one screen: the
// webhook and whether the API server reaches it, the probes, every GPU node's
// driver layout, the remembered pools, the opted-in namespaces and recent
// layout mismatches. Its exit status says whether something needs an operator.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// Exit statuses of Main.
const (
	ExitOK = 0
	// ExitError: the cluster could not be read (or a usage error).
	ExitError = 1
	ExitUsage = 2
	// ExitAttention: the report lists something that needs an operator.
	ExitAttention = 3
)

// requestTimeout bounds every API call, so that status answers even when the
// API server hangs.
const requestTimeout = 30 * time.Second

type options struct {
	kubeconfig string
	context    string
	namespace  string
	dryRunNS   string
	output     string
	color      string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG, then ~/.kube/config")
	fs.StringVar(&o.context, "context", "", "kubeconfig context; default its current context")
	fs.StringVar(&o.namespace, "namespace", "", "namespace gpu-injector runs in; default: found by the chart's labels")
	fs.StringVar(&o.dryRunNS, "dry-run-namespace", "", "namespace to try the dry-run GPU pod in; default: an opted-in namespace, one whose Pod Security level allows hostPath first")
	fs.StringVar(&o.output, "o", "table", "output: table, json or yaml")
	fs.StringVar(&o.color, "color", "auto", "colour the table: auto (when stdout is a terminal and NO_COLOR is unset), always or never")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gpu-injector status [--namespace NS] [-o table|json|yaml]\n\n"+
			"What gpu-injector does in the cluster of your kubeconfig. Exit status 3 when something needs attention, 1 when the cluster cannot be read.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, fmt.Errorf("failed to start: unexpected argument %q", fs.Arg(0))
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		return nil, fmt.Errorf("failed to start: -o %q: want table, json or yaml", o.output)
	}
	switch o.color {
	case "auto", "always", "never":
	default:
		return nil, fmt.Errorf("failed to start: --color %q: want auto, always or never", o.color)
	}
	return o, nil
}

// Main runs the status command and returns its exit status; it prints its
// own errors, since its exit status carries more than success or failure.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return ExitUsage
	}
	cfg, err := restConfig(o.kubeconfig, o.context)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return ExitError
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: failed to create a Kubernetes client: %v\n", err)
		return ExitError
	}
	c := &Collector{Client: client, DryRun: clientDryRunner{cfg: cfg}, Namespace: o.namespace, DryRunNamespace: o.dryRunNS}
	r, err := c.Collect(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return ExitError
	}
	if err := write(stdout, r, o); err != nil {
		fmt.Fprintf(stderr, "gpu-injector status: %v\n", err)
		return ExitError
	}
	return exitStatus(r)
}

// exitStatus is ExitAttention when the report lists anything to act on.
func exitStatus(r *Report) int {
	if len(r.Attention) > 0 {
		return ExitAttention
	}
	return ExitOK
}

func write(w io.Writer, r *Report, o *options) error {
	switch o.output {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return fmt.Errorf("failed to encode the report: %w", err)
		}
		_, err = w.Write(append(b, '\n'))
		if err != nil {
			return fmt.Errorf("failed to write the report: %w", err)
		}
		return nil
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return fmt.Errorf("failed to encode the report: %w", err)
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("failed to write the report: %w", err)
		}
		return nil
	}
	term := terminalOf(w)
	color := o.color == "always" || (o.color == "auto" && term.isTerminal && !noColor())
	if err := Render(w, r, RenderOptions{Color: color, Width: term.width, Now: time.Now()}); err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	return nil
}

// restConfig loads the kubeconfig as kubectl does: the flag, then
// $KUBECONFIG, then ~/.kube/config.
func restConfig(kubeconfig, context string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to load the kubeconfig: %w", err)
	}
	cfg.Timeout = requestTimeout
	// A person waits for the answer: client-go's defaults (5 QPS) would
	// make the few lists here queue behind each other.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// clientDryRunner sends the dry run through a client of its own, whose
// warning handler keeps the admission warnings (the webhook's among them)
// for the report instead of printing them to stderr.
type clientDryRunner struct{ cfg *rest.Config }

type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (r clientDryRunner) DryRunPod(ctx context.Context, namespace string, pod *corev1.Pod) (*corev1.Pod, []string, error) {
	cfg := rest.CopyConfig(r.cfg)
	w := &warnings{}
	cfg.WarningHandler = w
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	out, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	w.mu.Lock()
	defer w.mu.Unlock()
	return out, w.list, err
}
