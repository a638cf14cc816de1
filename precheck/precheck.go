// Package precheck is `gpu-injector precheck`: what a user runs before or
// right after installing gpu-injector, as istioctl x precheck and cilium
// status are run. For each GPU node it says how a GPU pod that lands there
// gets the driver (gpu-injector's NRI plugin, the node's own runtime,
// hostPath volumes, or nothing yet) and why, decided by the webhook's own
// node index and mutation; whether the device plugin advertises GPUs there;
// whether the API server reaches the webhook (online, by a dry-run GPU pod);
// and whether each opted-in namespace's Pod Security level lets its GPU pods
// have what the nodes deliver. It reads the cluster, or offline the output of
// `kubectl get nodes,ns -o yaml`. Its exit status is `gpu-injector status`'s.
package precheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// Options of Run.
type Options struct {
	// RESTConfig reaches the cluster, with the user's credentials; unused
	// offline.
	RESTConfig *rest.Config
	// File, when set, holds `kubectl get nodes,ns -o yaml` ("-": stdin):
	// the check runs offline, the webhook not asked.
	File string
	// Namespace is the one gpu-injector runs in; empty: found by the
	// chart's labels online, unknown offline.
	Namespace string
	// Config is the webhook's configuration; nil: the release's ConfigMap
	// online, the defaults offline.
	Config *config.Configuration
	// ConfigSource says where Config came from.
	ConfigSource string
	// DryRunNamespace is where the dry-run GPU pod is tried; empty: an
	// opted-in namespace, one whose Pod Security level allows hostPath first.
	DryRunNamespace string
	// Output is table, json or yaml.
	Output string
	// Clock ages the index's remembered pools; nil: the real clock.
	Clock clock.PassiveClock
}

// requestTimeout bounds every API call, as status's do.
const requestTimeout = 30 * time.Second

// Run checks the cluster (or the file), writes the report to stdout and
// returns the exit status: status.ExitAttention when the report lists
// something to act on, else status.ExitOK. An error means the input could
// not be read (status.ExitError).
func Run(ctx context.Context, o Options, stdin io.Reader, stdout io.Writer) (int, error) {
	var r *Report
	if o.File != "" {
		nodes, namespaces, err := readFile(o.File, stdin)
		if err != nil {
			return status.ExitError, err
		}
		source := o.ConfigSource
		if o.Config == nil {
			source = "the defaults (pass -config with the release's configuration)"
		}
		r = Check(Input{Nodes: nodes, Namespaces: namespaces, Config: o.Config, ConfigSource: source, ReleaseNamespace: o.Namespace, Clock: o.Clock})
		r.Offline = true
		r.summarize()
	} else {
		cfg := rest.CopyConfig(o.RESTConfig)
		cfg.Timeout = requestTimeout
		cfg.QPS, cfg.Burst = 50, 100
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return status.ExitError, fmt.Errorf("failed to create a Kubernetes client: %w", err)
		}
		c := &Collector{Client: client, DryRun: status.NewDryRunner(cfg), Namespace: o.Namespace, Config: o.Config,
			ConfigSource: o.ConfigSource, DryRunNamespace: o.DryRunNamespace, Clock: o.Clock}
		if r, err = c.Collect(ctx); err != nil {
			return status.ExitError, err
		}
	}
	if err := Write(stdout, r, o.Output); err != nil {
		return status.ExitError, err
	}
	if len(r.Attention) > 0 {
		return status.ExitAttention, nil
	}
	return status.ExitOK, nil
}

// Collector reads the cluster and tries the dry-run pod.
type Collector struct {
	Client kubernetes.Interface
	DryRun status.DryRunner
	// Namespace is where gpu-injector runs; empty: found by the chart's
	// labels, as `status` finds it.
	Namespace string
	// Config is the webhook's configuration; nil: the release's ConfigMap.
	Config       *config.Configuration
	ConfigSource string
	// DryRunNamespace is where the GPU pod is tried; empty: an opted-in one.
	DryRunNamespace string
	Clock           clock.PassiveClock
	// RetryEvery is how often a dry run refused for a namespace's missing
	// ServiceAccount is tried again; zero: status's default.
	RetryEvery time.Duration
}

// Collect reads the Nodes and the opted-in Namespaces, checks them, and
// asks the API server about a dry-run GPU pod.
func (c *Collector) Collect(ctx context.Context) (*Report, error) {
	sc := &status.Collector{Client: c.Client, DryRun: c.DryRun, Namespace: c.Namespace, DryRunNamespace: c.DryRunNamespace, RetryEvery: c.RetryEvery}
	cfg, source, release := c.Config, c.ConfigSource, c.Namespace
	if cfg == nil {
		cfg, source, release = c.releaseConfig(ctx, sc)
	}
	nodes, err := c.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	sel := layout.LabelInject + "=" + layout.InjectEnabled
	nsList, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("failed to list the namespaces labelled %s: %w", sel, err)
	}
	r := Check(Input{Nodes: nodes, Namespaces: nsList.Items, Config: cfg, ConfigSource: source, ReleaseNamespace: release, Clock: c.Clock})
	if r.Webhook, err = c.webhook(ctx, sc, r.Namespaces); err != nil {
		return nil, err
	}
	r.summarize()
	return r, nil
}

// releaseConfig is the release's configuration as `status` finds it, the
// words that say where it came from, and the release's namespace. A user
// who may not read the release (a precheck before the install, or with
// rights to Nodes and Namespaces alone) is checked against the defaults,
// and told so, rather than refused.
func (c *Collector) releaseConfig(ctx context.Context, sc *status.Collector) (*config.Configuration, string, string) {
	rel, err := sc.Config(ctx)
	switch {
	case err != nil:
		return config.Default(), "the defaults (" + err.Error() + "; pass --config)", c.Namespace
	case rel.Note != "":
		return rel.Config, rel.Note, rel.Namespace
	}
	return rel.Config, "the release's ConfigMap in " + rel.Namespace, rel.Namespace
}

// listNodes lists every Node, a page at a time, bounded as a file is.
func (c *Collector) listNodes(ctx context.Context) ([]corev1.Node, error) {
	var nodes []corev1.Node
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := c.Client.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("failed to list nodes: %w", err)
		}
		nodes = append(nodes, list.Items...)
		if len(nodes) > offline.MaxObjects {
			return nil, fmt.Errorf("failed to list nodes: more than %d", offline.MaxObjects)
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return nodes, nil
		}
	}
}

// Write writes the report as table, json or yaml.
func Write(w io.Writer, r *Report, output string) error {
	var b []byte
	var err error
	switch output {
	case "json":
		b, err = json.MarshalIndent(r, "", "  ")
		b = append(b, '\n')
	case "yaml":
		b, err = yaml.Marshal(r)
	default:
		return render(w, r)
	}
	if err != nil {
		return fmt.Errorf("failed to encode the report: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	return nil
}
