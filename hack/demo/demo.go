package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
)

// image is the one image of the demo's manifests: cuda-check, standin-server,
// glibc and the loader, and no driver file.
const image = "gpu-injector.local/driverless:demo"

// Container paths in image.
const (
	standinServer = "/usr/bin/standin-server"
	// classicPath is the PATH of the classic CUDA images, which names the
	// folder where the driver's binaries are injected.
	classicPath = "PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

type demo struct {
	out, log io.Writer
	start    time.Time
	waitFor  time.Duration
	// exit: tear down after the report instead of waiting for a signal.
	exit bool
	env  *env.Env
	// dir is the demo's folder inside the environment's, removed with it.
	dir       string
	manifests string
	// applied is what `kubectl apply` said, by namespace/file.
	applied map[string]applied
}

type applied struct {
	stdout   string
	warnings []string
	err      error
}

func (d *demo) progress(format string, args ...any) {
	fmt.Fprintf(d.log, "[demo %6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
}

// runWorkloads applies the manifests, waits, prints the report and returns
// the exit code: 1 when something did not turn out as the demo shows it.
func (d *demo) runWorkloads(ctx context.Context) int {
	e := d.env
	d.dir = filepath.Join(e.Dir, "demo")
	d.manifests = filepath.Join(e.RepoRoot, "hack", "demo", "manifests")
	d.applied = map[string]applied{}
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		fmt.Fprintf(d.log, "demo: failed to create %s: %v\n", d.dir, err)
		return 1
	}
	d.progress("building the demo image %s (cuda-check, standin-server, glibc, the loader; no driver file)", image)
	if err := d.buildImage(ctx); err != nil {
		fmt.Fprintf(d.log, "demo: %v\n", err)
		return 1
	}
	if err := d.applyAll(ctx); err != nil {
		fmt.Fprintf(d.log, "demo: %v\n", err)
		return 1
	}
	wls := d.workloads()
	d.progress("waiting up to %s for the pods: the Job to finish, the Deployment to serve, the model-selecting pods to be bound, the unlabelled Job to fail scheduling", d.waitFor)
	waitErr := d.wait(ctx, wls)
	if ctx.Err() != nil {
		return 1
	}
	if waitErr != nil {
		d.progress("%v; reporting what there is", waitErr)
	}
	views, err := d.collect(ctx, wls)
	if err != nil {
		fmt.Fprintf(d.log, "demo: %v\n", err)
		return 1
	}
	failed := d.report(ctx, views)
	d.howTo()
	if failed {
		return 1
	}
	return 0
}

func (d *demo) buildImage(ctx context.Context) error {
	e := d.env
	files, err := workloads.Build(filepath.Join(d.dir, "cuda-check"))
	if err != nil {
		return err
	}
	server := filepath.Join(d.dir, "standin-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", server, "./hack/demo/standin-server")
	cmd.Dir = e.RepoRoot
	// Static: the image has no room for the Go program's own library needs.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to build standin-server: %w\n%s", err, out)
	}
	m := map[string]string{standinServer: server}
	for _, f := range files {
		m[f.Dest] = f.Source
	}
	var dests []string
	for dst := range m {
		dests = append(dests, dst)
	}
	sort.Strings(dests)
	if bad := env.DriverFiles(dests); len(bad) > 0 {
		return fmt.Errorf("the demo image must hold no driver file, but has %v", bad)
	}
	tar, err := e.Cluster.BuildImageWithConfig(image, m, cluster.ImageConfig{Env: []string{classicPath}})
	if err != nil {
		return err
	}
	if err := e.Cluster.ImportImage(ctx, tar); err != nil {
		return err
	}
	d.progress("  image files: %s", strings.Join(dests, " "))
	return nil
}

// applyAll creates the namespaces and applies every workload with the real
// kubectl, echoing each command and what kubectl printed, warnings included.
func (d *demo) applyAll(ctx context.Context) error {
	if _, err := d.apply(ctx, "", "namespaces.yaml"); err != nil {
		return err
	}
	for _, ns := range []string{nsInject, nsUnlabelled} {
		// The controller-manager creates it; a pod created before it exists is refused.
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := d.env.Clientset.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("failed waiting for the default service account of namespace %s: %w", ns, err)
		}
	}
	for _, a := range []struct{ ns, file string }{
		{nsInject, "nvidia-smi-job.yaml"},
		{nsInject, "tensorflow-style.yaml"},
		{nsInject, "cuda-check-k80.yaml"},
		{nsInject, "cuda-check-p100.yaml"},
		{nsUnlabelled, "nvidia-smi-job.yaml"},
	} {
		if _, err := d.apply(ctx, a.ns, a.file); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) apply(ctx context.Context, ns, file string) (applied, error) {
	args := []string{"apply"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	args = append(args, "-f", filepath.Join(d.manifests, file))
	shown := strings.Join(append(append([]string{}, args[:len(args)-1]...), "hack/demo/manifests/"+file), " ")
	d.progress("$ kubectl %s", shown)
	stdout, stderr, err := d.kubectl(ctx, args...)
	a := applied{stdout: stdout, warnings: kubectlWarnings(stderr), err: err}
	for _, l := range nonEmptyLines(stdout) {
		d.progress("  %s", l)
	}
	for _, w := range a.warnings {
		d.progress("  Warning: %s", w)
	}
	d.applied[ns+"/"+file] = a
	if err != nil {
		return a, fmt.Errorf("kubectl %s failed: %w\n%s", shown, err, stderr)
	}
	return a, nil
}

// kubectl runs the real kubectl as the cluster's admin.
func (d *demo) kubectl(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, d.env.Kubectl, append([]string{"--kubeconfig", d.env.Kubeconfig}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// kubectlWarnings are the admission warnings kubectl printed on stderr.
func kubectlWarnings(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if w, ok := strings.CutPrefix(strings.TrimSpace(l), "Warning: "); ok {
			out = append(out, w)
		}
	}
	return out
}

// offlineWarnings parses `gpu-injector mutate`'s stderr ("warning: Kind/name:
// message") into the warnings of each object.
func offlineWarnings(stderr string) map[string][]string {
	out := map[string][]string{}
	for _, l := range strings.Split(stderr, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), "warning: ")
		if !ok {
			continue
		}
		obj, msg, ok := strings.Cut(rest, ": ")
		if !ok || !strings.Contains(obj, "/") {
			continue
		}
		out[obj] = append(out[obj], msg)
	}
	return out
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimRight(l, " \r"); strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// expectation is what a workload's pod should come to.
type expectation int

const (
	// completes: the kubelet runs it to Succeeded.
	completes expectation = iota
	// serves: the kubelet runs it and it keeps running.
	serves
	// bound: the scheduler binds it to an API-only node, where it never runs.
	bound
	// pendingForever: no node offers what it asks for.
	pendingForever
)

// workload is one thing the demo applies and the pod it leads to.
type workload struct {
	// title says what the classic workload is.
	title string
	ns    string
	file  string
	// kind and name of the applied object; the pod is found by selector.
	kind, name string
	selector   string
	expect     expectation
	// node is where the pod must end up; nil for pendingForever.
	node *env.Node
}

func (d *demo) workloads() []*workload {
	kn := d.env.KubeletNode()
	byModel := func(acc string) *env.Node {
		for _, n := range d.env.Nodes {
			if n.Accelerator == acc {
				return n
			}
		}
		return nil
	}
	job := "batch.kubernetes.io/job-name=nvidia-smi"
	return []*workload{
		{title: "the classic legacy nvidia-smi Job (alpha.kubernetes.io/nvidia-gpu: 1, no driver volumes)",
			ns: nsInject, file: "nvidia-smi-job.yaml", kind: "Job", name: "nvidia-smi", selector: job, expect: completes, node: kn},
		{title: "a TensorFlow-style Deployment + Service (one GPU, port 8888; standin-server runs cuda-check, no TensorFlow)",
			ns: nsInject, file: "tensorflow-style.yaml", kind: "Deployment", name: "tensorflow-style", selector: "app=tensorflow-style", expect: serves, node: kn},
		{title: "a pod selecting a GPU model: nodeSelector accelerator=nvidia-tesla-k80, legacy resource name",
			ns: nsInject, file: "cuda-check-k80.yaml", kind: "Pod", name: "cuda-check-k80", expect: bound, node: byModel("nvidia-tesla-k80")},
		{title: "a pod selecting a GPU model: nodeSelector accelerator=nvidia-tesla-p100",
			ns: nsInject, file: "cuda-check-p100.yaml", kind: "Pod", name: "cuda-check-p100", expect: bound, node: byModel("nvidia-tesla-p100")},
		{title: "the same legacy nvidia-smi Job, in a namespace that did not opt in",
			ns: nsUnlabelled, file: "nvidia-smi-job.yaml", kind: "Job", name: "nvidia-smi", selector: job, expect: pendingForever},
	}
}

// pod returns the workload's newest pod, nil when there is none yet.
func (d *demo) pod(ctx context.Context, w *workload) (*corev1.Pod, error) {
	pods := d.env.Clientset.CoreV1().Pods(w.ns)
	if w.selector == "" {
		p, err := pods.Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: w.selector})
	if err != nil {
		return nil, err
	}
	var newest *corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if newest == nil || newest.CreationTimestamp.Before(&p.CreationTimestamp) {
			newest = p
		}
	}
	return newest, nil
}

// settled says whether a pod has come as far as it will for the report.
func (d *demo) settled(ctx context.Context, w *workload, p *corev1.Pod) bool {
	switch w.expect {
	case completes:
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	case serves:
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 || cs.State.Terminated != nil {
				return true
			}
		}
		log, _ := d.logs(ctx, p, p.Spec.Containers[0].Name)
		return strings.Contains(log, "serving this on")
	case bound:
		return p.Spec.NodeName != ""
	default:
		msg, _ := d.schedulingFailure(ctx, p)
		return msg != ""
	}
}

func (d *demo) wait(ctx context.Context, wls []*workload) error {
	waiting := map[*workload]bool{}
	for _, w := range wls {
		waiting[w] = true
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, d.waitFor, true, func(ctx context.Context) (bool, error) {
		for w := range waiting {
			p, err := d.pod(ctx, w)
			if err != nil || p == nil || !d.settled(ctx, w, p) {
				continue
			}
			delete(waiting, w)
			d.progress("  %s/%s: %s", p.Namespace, p.Name, podState(p))
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		var names []string
		for w := range waiting {
			names = append(names, w.ns+"/"+w.kind+"/"+w.name)
		}
		sort.Strings(names)
		return fmt.Errorf("still waiting after %s for %s", d.waitFor, strings.Join(names, ", "))
	}
	return nil
}

func podState(p *corev1.Pod) string {
	if p.Spec.NodeName == "" {
		return "Pending, not scheduled"
	}
	return fmt.Sprintf("%s on %s", p.Status.Phase, p.Spec.NodeName)
}

// logs is a container's log through the API server, from the kubelet.
func (d *demo) logs(ctx context.Context, p *corev1.Pod, container string) (string, error) {
	b, err := d.env.Clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	return string(b), err
}

// schedulingFailure is the scheduler's latest FailedScheduling message for a pod.
func (d *demo) schedulingFailure(ctx context.Context, p *corev1.Pod) (string, error) {
	sel := fields.Set{"involvedObject.name": p.Name, "reason": "FailedScheduling"}.AsSelector().String()
	evs, err := d.env.Clientset.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return "", err
	}
	var msg string
	var last time.Time
	for _, ev := range evs.Items {
		t := ev.LastTimestamp.Time
		if t.IsZero() {
			t = ev.EventTime.Time
		}
		if msg == "" || t.After(last) {
			msg, last = ev.Message, t
		}
	}
	return msg, nil
}

// mutateOffline runs the real binary's `gpu-injector mutate` on a manifest
// against the cluster's nodes and the chart's config: what the webhook says
// to a controller, which keeps it to itself, shown to the user.
func (d *demo) mutateOffline(ctx context.Context, ns, file string) (map[string][]string, error) {
	nodes := filepath.Join(d.dir, "nodes.yaml")
	if _, err := os.Stat(nodes); errors.Is(err, os.ErrNotExist) {
		out, stderr, err := d.kubectl(ctx, "get", "nodes", "-o", "yaml")
		if err != nil {
			return nil, fmt.Errorf("failed to get nodes: %w\n%s", err, stderr)
		}
		if err := os.WriteFile(nodes, []byte(out), 0o644); err != nil {
			return nil, fmt.Errorf("failed to write %s: %w", nodes, err)
		}
	}
	cmd := exec.CommandContext(ctx, d.env.Binary, "mutate", "-f", filepath.Join(d.manifests, file),
		"--nodes", nodes, "--config", d.env.ConfigFile, "--namespace", ns)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gpu-injector mutate -f %s failed: %w\n%s", file, err, stderr.String())
	}
	return offlineWarnings(stderr.String()), nil
}
