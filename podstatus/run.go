package podstatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
)

// Options of Run.
type Options struct {
	RESTConfig *rest.Config
	// Namespace is the one gpu-injector runs in; empty: found by the
	// chart's labels.
	Namespace string
	// Pod is NAMESPACE/NAME; empty with File: the file's one pod.
	PodNamespace, PodName string
	// ManifestFile holds the pod's manifest, for a pod the webhook refused
	// (the API server never stored it); empty: none.
	ManifestFile string
	// File, when set, holds the pod and, beside it, the cluster (Nodes,
	// Namespaces, DRA objects, the pool memory's ConfigMap); ClusterFiles
	// hold more of the cluster. With File no API server is contacted and
	// RESTConfig is not used.
	File         string
	ClusterFiles []string
	// Config is the configuration with File; nil: the defaults.
	Config *config.Configuration
	// Images, when set, give the images' configuration to the decision.
	Images admitinput.ImageReader
	// Output is table, json or yaml.
	Output string
}

// maxManifestBytes bounds the manifest read: a pod is at most the API
// server's 1.5 MiB request limit.
const maxManifestBytes = 3 << 20

// ErrWhichPod: the file holds more than one pod and none was named.
var ErrWhichPod = errors.New("the file holds more than one pod: name one as NAMESPACE/NAME")

// Run reads the pod, writes the report and returns the exit status as
// `status` has it: status.ExitAttention when something needs someone.
func Run(ctx context.Context, o Options, stdout io.Writer) (int, error) {
	c, err := o.collector()
	if err != nil {
		return status.ExitError, err
	}
	if c.Files != nil && o.PodName == "" {
		var ok bool
		if o.PodNamespace, o.PodName, ok = c.Files.Only(); !ok {
			return status.ExitError, fmt.Errorf("failed to read %s: %w", o.File, ErrWhichPod)
		}
	}
	r, err := c.Collect(ctx, o.PodNamespace, o.PodName)
	if err != nil {
		return status.ExitError, err
	}
	if err := Write(stdout, r, o.Output); err != nil {
		return status.ExitError, err
	}
	if len(r.Attention) > 0 {
		return status.ExitAttention, nil
	}
	return status.ExitOK, nil
}

// collector reads the files, or makes the API server's client.
func (o Options) collector() (*Collector, error) {
	c := &Collector{Namespace: o.Namespace, Images: o.Images}
	if o.File != "" {
		files, err := ReadFiles(o.File, o.ClusterFiles)
		if err != nil {
			return nil, err
		}
		files.Config = o.Config
		c.Files = files
		return c, nil
	}
	cfg := rest.CopyConfig(o.RESTConfig)
	cfg.Timeout = 30 * time.Second
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	c.Client = client
	if o.ManifestFile != "" {
		if c.Manifest, err = readManifest(o.ManifestFile); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func readManifest(file string) (*corev1.Pod, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", file, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", file, err)
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("failed to read %s: larger than %d bytes", file, maxManifestBytes)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(data, &pod); err != nil {
		return nil, fmt.Errorf("failed to read a Pod from %s: %w", file, err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("failed to read a Pod from %s: it holds a %s", file, pod.Kind)
	}
	return &pod, nil
}

// Write writes the report as table, json or yaml.
func Write(w io.Writer, r *Report, output string) error {
	switch output {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return fmt.Errorf("failed to encode the report: %w", err)
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return fmt.Errorf("failed to encode the report: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	return render(w, r)
}

// render writes the report as a person reads it: a row per fact, aligned,
// then what needs attention.
func render(out io.Writer, r *Report) error {
	tw := rows{tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)}
	where := r.Phase
	if r.Node != "" {
		where += " on " + r.Node
	}
	tw.row("POD", "%s  %s", r.Pod, where)
	tw.injection(r)
	tw.imagesUnread(r)
	if nl := r.NodeLayout; nl != nil {
		tw.nodeLayout(nl)
	}
	tw.row("STALE DRIVER", "%s", r.StaleDriver)
	if r.Scheduling != "" {
		tw.row("SCHEDULING", "%s", r.Scheduling)
	}
	tw.containers(r.Containers)
	if a := r.Admission; a != nil {
		tw.admission(a)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return renderAttention(out, r.Attention)
}

// rows are the report's label and value rows, aligned in columns.
type rows struct{ *tabwriter.Writer }

func (w rows) row(label, format string, args ...any) {
	// Values quote what nodes and pods wrote.
	fmt.Fprintf(w, "%s\t%s\n", label, layout.Printable(fmt.Sprintf(format, args...)))
}

// injection writes what the pod was injected with, as its record says, and
// the host paths it mounts.
func (w rows) injection(r *Report) {
	switch rec := r.Record; {
	case rec == nil:
		w.row("INJECTION", "none: %s", r.RecordNote)
	case r.Delivery == DeliveryNRI:
		w.row("INJECTION", "at the runtime by the node's gpu-injector NRI plugin, containers %s", strings.Join(rec.Containers, ", "))
	default:
		got := "layout " + dash(rec.Fingerprint)
		if rec.StaticLayout != "" {
			got = "static layout " + rec.StaticLayout
		}
		w.row("INJECTION", "%s (driver %s), containers %s, delivery %s", got, dash(rec.DriverVersion), strings.Join(rec.Containers, ", "), r.Delivery)
		if rec.Pool != "" {
			w.row("", "pinned to pool %s%s", rec.Pool, map[bool]string{true: " (remembered)"}[rec.Remembered])
		}
	}
	if len(r.HostPaths) > 0 {
		w.row("", "hostPath %s", strings.Join(r.HostPaths, ", "))
	}
}

// imagesUnread writes the images the pod was admitted without reading, or
// why their record was not believed.
func (w rows) imagesUnread(r *Report) {
	for i, im := range r.ImagesUnread {
		label := ""
		if i == 0 {
			label = "IMAGES UNREAD"
		}
		w.row(label, "%s: %s", im.Image, dash(im.Reason))
	}
	switch {
	case r.ImagesUnreadNote != "":
		w.row("IMAGES UNREAD", "record ignored: %s", r.ImagesUnreadNote)
	case len(r.ImagesUnread) > 0:
		w.row("", "admitted without these images' configuration (LD_LIBRARY_PATH, CUDA need), as the pod's %s says; recreate it once the registry answers", layout.AnnotationImagesUnread)
	}
}

// nodeLayout writes the pod's node now, and whether it still has what the
// pod got.
func (w rows) nodeLayout(nl *NodeLayout) {
	has := "still has what the pod got"
	if !nl.StillHas {
		has = "NO LONGER HAS what the pod got: " + nl.Note
	} else if nl.Note != "" {
		has += " (" + nl.Note + ")"
	}
	w.row("NODE", "%s: state %s, layout %s, driver %s; %s", nl.Name, dash(nl.State), dash(nl.Fingerprint), dash(nl.DriverVersion), has)
	w.row("NRI PLUGIN", "%s", nl.Plugin)
}

// containers writes a line per container the report names.
func (w rows) containers(cs []Container) {
	for i, c := range cs {
		label := ""
		if i == 0 {
			label = "CONTAINERS"
		}
		line := c.Name + ": " + c.State
		if c.GPU {
			line += " (GPU)"
		}
		if c.Reason != "" {
			line += ", " + c.Reason
		}
		if c.Message != "" {
			line += ": " + layout.Truncate(c.Message, 400)
		}
		w.row(label, "%s", line)
	}
}

// admission writes the webhook's decision on the pod now.
func (w rows) admission(a *Admission) {
	switch {
	case a.Runtime:
		w.row("WEBHOOK NOW", "%s: marked for the nodes' NRI plugin", a.Decision)
	case a.Fingerprint != "":
		w.row("WEBHOOK NOW", "%s: layout %s (driver %s)", a.Decision, a.Fingerprint, dash(a.DriverVersion))
	default:
		w.row("WEBHOOK NOW", "%s: %s", a.Decision, a.Reason)
	}
	for _, warning := range a.Warnings {
		w.row("", "warning: %s", warning)
	}
	if a.Note != "" {
		w.row("", "note: %s", a.Note)
	}
}

// renderAttention writes what needs attention, or that nothing does.
func renderAttention(out io.Writer, attention []string) error {
	if len(attention) == 0 {
		_, err := fmt.Fprintln(out, "\nOK: nothing needs attention")
		return err
	}
	fmt.Fprintln(out, "\nNEEDS ATTENTION (docs/troubleshooting.md)")
	for _, a := range attention {
		if _, err := fmt.Fprintf(out, "  -  %s\n", layout.Printable(a)); err != nil {
			return err
		}
	}
	return nil
}
