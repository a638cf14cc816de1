package podstatus

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// source is where Collect reads the pod and its cluster: an API server, or
// files that stand in for one.
type source interface {
	// release is the release's configuration, a note when defaults stand
	// in, and where the pool memory is.
	release(ctx context.Context) (status.Release, error)
	// pod is the pod, nil when there is none.
	pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// node is the node, nil when there is none; missing says so.
	node(ctx context.Context, name string) (*corev1.Node, error)
	missing(node string) string
	// cluster is what the decision reads of the cluster for pod.
	cluster(ctx context.Context, rel status.Release, pod *corev1.Pod) (*offline.Cluster, []string, error)
}

// builder is the decision's input for pod over src's cluster, and what of
// the cluster the user should know.
func builder(ctx context.Context, src source, rel status.Release, pod *corev1.Pod, images admitinput.ImageReader, clk clock.PassiveClock) (*admitinput.Builder, []string, error) {
	cl, notes, err := src.cluster(ctx, rel, pod)
	if err != nil {
		return nil, nil, err
	}
	b, more := cl.Builder(rel.Config, clk, logr.Discard())
	b.Images = images
	return b, append(notes, more...), nil
}

// apiSource reads an API server.
type apiSource struct {
	client kubernetes.Interface
	// namespace is where gpu-injector runs; empty finds it.
	namespace string
}

func (s apiSource) release(ctx context.Context) (status.Release, error) {
	return (&status.Collector{Client: s.client, Namespace: s.namespace}).Config(ctx)
}

func (s apiSource) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	pod, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("failed to get pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

func (s apiSource) node(ctx context.Context, name string) (*corev1.Node, error) {
	node, err := s.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("failed to get node %s: %w", name, err)
	}
	return node, nil
}

func (apiSource) missing(node string) string { return "its node " + node + " no longer exists" }

// cluster reads what the webhook's caches hold: every Node, the pod's
// Namespace, the pool memory, the DeviceClasses and ResourceSlices, and
// the claims and claim templates the pod names. What RBAC or the API
// server's version keeps from it is left out, with a note.
func (s apiSource) cluster(ctx context.Context, rel status.Release, pod *corev1.Pod) (*offline.Cluster, []string, error) {
	cl := &offline.Cluster{}
	nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("failed to list nodes: %w", err)
	}
	cl.Nodes = nodes.Items
	if ns, err := s.client.CoreV1().Namespaces().Get(ctx, pod.Namespace, metav1.GetOptions{}); err == nil {
		cl.Namespaces = offline.Namespaces{ns.Name: ns.Labels}
	} else if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return nil, nil, fmt.Errorf("failed to get namespace %s: %w", pod.Namespace, err)
	}
	var notes []string
	if rel.Config.Pinning.ByPool() && rel.Namespace != "" && rel.PoolMemory != "" {
		cm, err := s.client.CoreV1().ConfigMaps(rel.Namespace).Get(ctx, rel.PoolMemory, metav1.GetOptions{})
		switch {
		case err == nil:
			cl.Memory, cl.MemoryName = cm.Data, rel.Namespace+"/"+rel.PoolMemory
		case !apierrors.IsNotFound(err):
			notes = append(notes, fmt.Sprintf("the pool memory %s/%s is not read: %v", rel.Namespace, rel.PoolMemory, err))
		}
	}
	if note := s.readDRA(ctx, cl, pod); note != "" {
		notes = append(notes, note)
	}
	return cl, notes, nil
}

// readDRA adds the cluster's DeviceClasses and ResourceSlices, and the
// claims and claim templates the pod names, to cl; the note says what
// could not be read. An API server that serves no resource.k8s.io/v1 has
// none of them, as the webhook then reads none.
func (s apiSource) readDRA(ctx context.Context, cl *offline.Cluster, pod *corev1.Pod) string {
	api := s.client.ResourceV1()
	classes, err := api.DeviceClasses().List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("DRA objects are not read: %v", err)
	}
	slices, err := api.ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("ResourceSlices are not read: %v", err)
	}
	for i := range classes.Items {
		cl.DRA = append(cl.DRA, &classes.Items[i])
	}
	for i := range slices.Items {
		cl.DRA = append(cl.DRA, &slices.Items[i])
	}
	for _, pc := range pod.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimTemplateName != nil:
			var t *resourcev1.ResourceClaimTemplate
			if t, err = api.ResourceClaimTemplates(pod.Namespace).Get(ctx, *pc.ResourceClaimTemplateName, metav1.GetOptions{}); err == nil {
				cl.DRA = append(cl.DRA, t)
			}
		case pc.ResourceClaimName != nil:
			var c *resourcev1.ResourceClaim
			if c, err = api.ResourceClaims(pod.Namespace).Get(ctx, *pc.ResourceClaimName, metav1.GetOptions{}); err == nil {
				cl.DRA = append(cl.DRA, c)
			}
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the pod's claim %s is not read: %v", pc.Name, err)
		}
	}
	return ""
}

// fileSource reads files, and contacts no API server.
type fileSource struct {
	files *Files
}

func (s fileSource) release(context.Context) (status.Release, error) {
	cfg := s.files.Config
	if cfg == nil {
		return status.Release{Config: config.Default(), Note: "no --config given: the default configuration"}, nil
	}
	return status.Release{Config: cfg}, nil
}

func (s fileSource) pod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	for _, p := range s.files.Pods {
		if p.Name == name && podNamespace(p) == namespace {
			pod := p.DeepCopy()
			pod.Namespace = namespace
			return pod, nil
		}
	}
	return nil, nil
}

func (s fileSource) node(_ context.Context, name string) (*corev1.Node, error) {
	for i := range s.files.Cluster.Nodes {
		if n := &s.files.Cluster.Nodes[i]; n.Name == name {
			return n.DeepCopy(), nil
		}
	}
	return nil, nil
}

func (fileSource) missing(node string) string {
	return "its node " + node + " is in none of the files given"
}

func (s fileSource) cluster(context.Context, status.Release, *corev1.Pod) (*offline.Cluster, []string, error) {
	return &s.files.Cluster, nil, nil
}
