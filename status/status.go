// Package status is `gpu-injector status`: what gpu-injector does in a
// cluster, read with the user's kubeconfig and shown in one screen: the
// webhook and whether the API server reaches it, the probes, every GPU node's
// driver layout, the remembered pools, the opted-in namespaces and recent
// layout mismatches. Its exit status says whether something needs an operator.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
)

// Exit statuses of `gpu-injector status`.
const (
	ExitOK = 0
	// ExitError: the cluster could not be read.
	ExitError = 1
	// ExitUsage: a bad command line.
	ExitUsage = 2
	// ExitAttention: the report lists something that needs an operator.
	ExitAttention = 3
)

// requestTimeout bounds every API call, so that status answers even when the
// API server hangs.
const requestTimeout = 30 * time.Second

// Options of Run.
type Options struct {
	// RESTConfig reaches the cluster, with the user's credentials.
	RESTConfig *rest.Config
	// Namespace is the one gpu-injector runs in; empty: found by the chart's
	// labels.
	Namespace string
	// DryRunNamespace is where the dry-run GPU pod is tried; empty: an
	// opted-in namespace, one whose Pod Security level allows hostPath first.
	DryRunNamespace string
	// Output is table, json or yaml.
	Output string
	// Color colours the table: auto (when the output is a terminal and
	// NO_COLOR is unset), always or never.
	Color string
	// DryRunOnly tries the dry-run GPU pod in DryRunNamespace and reads
	// nothing else: the chart's helm test, whose ServiceAccount may only
	// create pods there.
	DryRunOnly bool
}

// Run reads the cluster, writes the report to stdout and returns the exit
// status: ExitAttention when the report lists something to act on, else
// ExitOK. An error means the cluster could not be read (ExitError).
func Run(ctx context.Context, o Options, stdout io.Writer) (int, error) {
	cfg := rest.CopyConfig(o.RESTConfig)
	cfg.Timeout = requestTimeout
	// A person waits for the answer: client-go's defaults (5 QPS) would
	// make the few lists here queue behind each other.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return ExitError, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	c := &Collector{Client: client, DryRun: NewDryRunner(cfg), Namespace: o.Namespace, DryRunNamespace: o.DryRunNamespace}
	if o.DryRunOnly {
		return dryRunOnly(ctx, c, stdout)
	}
	r, err := c.Collect(ctx)
	if err != nil {
		return ExitError, err
	}
	if err := write(stdout, r, o); err != nil {
		return ExitError, err
	}
	return exitStatus(r), nil
}

// dryRunOnly writes the dry run's outcome: ExitOK when the pod came back
// mutated, ExitAttention otherwise.
func dryRunOnly(ctx context.Context, c *Collector, stdout io.Writer) (int, error) {
	if c.DryRunNamespace == "" {
		return ExitUsage, fmt.Errorf("a dry run alone needs the namespace to try it in")
	}
	d, err := c.TryPodIn(ctx, c.DryRunNamespace)
	if err != nil {
		return ExitError, err
	}
	b, err := yaml.Marshal(d)
	if err != nil {
		return ExitError, fmt.Errorf("failed to encode the dry run: %w", err)
	}
	if _, err := stdout.Write(b); err != nil {
		return ExitError, fmt.Errorf("failed to write the dry run: %w", err)
	}
	if d.Outcome != DryRunInjected {
		return ExitAttention, nil
	}
	return ExitOK, nil
}

// TryPodIn tries the GPU pod in ns, and again while ns has no default
// ServiceAccount: a namespace just created (the helm test's) has none until
// the controller manager adds it, and the API server refuses every pod
// there until then. An error means ctx ended first.
func (c *Collector) TryPodIn(ctx context.Context, ns string) (DryRunLog, error) {
	return c.TryPodOf(ctx, ns, DryRunPod())
}

// TryPodOf is TryPodIn with another pod than DryRunPod.
func (c *Collector) TryPodOf(ctx context.Context, ns string, pod *corev1.Pod) (DryRunLog, error) {
	d := c.dryRunOf(ctx, ns, pod.DeepCopy())
	for wait := 0; d.Outcome == DryRunError && strings.Contains(d.Message, "error looking up service account") && wait < 60; wait++ {
		select {
		case <-ctx.Done():
			return d, fmt.Errorf("failed to try the GPU pod: %w", ctx.Err())
		case <-time.After(c.retryEvery()):
		}
		d = c.dryRunOf(ctx, ns, pod.DeepCopy())
	}
	return d, nil
}

// exitStatus is ExitAttention when the report lists anything to act on.
func exitStatus(r *Report) int {
	if len(r.Attention) > 0 {
		return ExitAttention
	}
	return ExitOK
}

func write(w io.Writer, r *Report, o Options) error {
	switch o.Output {
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
	color := o.Color == "always" || (o.Color == "auto" && term.isTerminal && !noColor())
	if err := Render(w, r, RenderOptions{Color: color, Width: term.width, Now: wallclock.Real().Now()}); err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	return nil
}

// clientDryRunner sends the dry run through a client of its own, whose
// warning handler keeps the admission warnings (the webhook's among them)
// for the report instead of printing them to stderr.
type clientDryRunner struct{ cfg *rest.Config }

// NewDryRunner sends dry runs to the API server cfg reaches.
func NewDryRunner(cfg *rest.Config) DryRunner { return clientDryRunner{cfg: cfg} }

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
