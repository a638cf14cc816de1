package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// Path is where the API server sends Pod admission reviews.
const Path = "/mutate-v1-pod"

// Handler admits Pod CREATE requests through the pure Mutate.
type Handler struct {
	input admitinput.Builder
}

// WithDRA makes the handler recognise GPUs that come through DRA: claims of
// GPU DeviceClasses and the extended resources those classes serve. A nil d
// (an API server that serves no DRA) leaves them unrecognised.
func (h *Handler) WithDRA(d *gpunodes.DRA) *Handler {
	if d != nil {
		h.input.DRA = d
	}
	return h
}

var _ admission.Handler = &Handler{}

// NewHandler returns a handler; namespaces may be nil, then Pod Security
// levels are not checked.
func NewHandler(cfg *config.Configuration, layouts admitinput.LayoutSource, namespaces admitinput.NamespaceLabeler) *Handler {
	return &Handler{input: admitinput.Builder{Config: cfg, Layouts: layouts, Namespaces: namespaces}}
}

var podKind = metav1.GroupVersionKind{Group: "", Version: "v1", Kind: "Pod"}

// Handle implements admission.Handler. A typed CustomDefaulter would hide the
// decision: it can neither deny with our message nor attach warnings to an
// unchanged pod, so the handler calls Mutate itself.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	// Only creation gets the driver: an UPDATE cannot add volumes to a running
	// pod, and a subresource (binding, eviction, status) is never ours to block.
	if req.Operation == "" {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("the AdmissionReview has no request operation"))
	}
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return admission.Allowed("")
	}
	if req.Kind.Group != podKind.Group || req.Kind.Kind != podKind.Kind {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("expected a Pod, got kind %q in group %q: the webhook configuration must select only pods", req.Kind.Kind, req.Kind.Group))
	}
	pod, err := decodePod(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("failed to decode the pod: %w", err))
	}
	return h.admit(ctx, req.Namespace, req.UID, pod)
}

// admit decides on a pod CREATE request's decoded pod.
func (h *Handler) admit(ctx context.Context, namespace string, uid types.UID, pod *corev1.Pod) admission.Response {
	// controller-runtime's request logger already carries namespace, user and requestID.
	log := logf.FromContext(ctx).WithValues("pod", podName(pod))

	// The patch is the mutation's own operations, each at a path it names:
	// no diff of the pod, and a field this build's API types do not know (a
	// newer API server's) is never in a patch, so it is never removed.
	res := h.input.Decide(logf.IntoContext(ctx, log), pod, namespace, uid)

	log = log.WithValues("decision", res.Decision, "reason", res.Reason)
	if res.Layout != nil {
		log = log.WithValues("layout", layoutName(res.Layout))
	}
	switch res.Decision {
	case inject.DecisionDenied:
		podsDenied.Inc()
		log.Info("denied pod")
		return admission.Denied(res.Reason).WithWarnings(res.Warnings...)
	case inject.DecisionInjected:
		podsInjected.Inc()
		log.Info("injected pod")
		// The response's Complete encodes the operations.
		return admission.Patched("", res.Patch...).WithWarnings(res.Warnings...)
	default:
		podsSkipped.WithLabelValues(res.Reason).Inc()
		log.V(1).Info("skipped pod")
		return admission.Allowed("").WithWarnings(res.Warnings...)
	}
}

func podName(p *corev1.Pod) string {
	if p.Name == "" && p.GenerateName != "" {
		return p.GenerateName + "*"
	}
	return p.Name
}

func layoutName(l *inject.Layout) string {
	if l.Runtime {
		return "runtime/nri"
	}
	if l.Static != "" {
		return "static/" + l.Static
	}
	return l.Fingerprint
}

// NamespaceCache keeps the labels of every namespace from a metadata-only
// informer, so a request reads them without a copy or an API call.
type NamespaceCache struct {
	labels sync.Map // name -> map[string]string
	synced func() bool
}

// WatchNamespaces feeds a NamespaceCache from the cache's metadata informer.
func WatchNamespaces(ctx context.Context, c cache.Cache) (*NamespaceCache, error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, fmt.Errorf("failed to get the namespace informer: %w", err)
	}
	nc := &NamespaceCache{}
	set := func(o any) {
		if m, ok := o.(*metav1.PartialObjectMetadata); ok {
			nc.labels.Store(m.Name, m.Labels)
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, o any) { set(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if m, ok := o.(*metav1.PartialObjectMetadata); ok {
				nc.labels.Delete(m.Name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("failed to add the namespace event handler: %w", err)
	}
	nc.synced = reg.HasSynced
	return nc, nil
}

// NamespaceLabels implements NamespaceLabeler.
func (nc *NamespaceCache) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	v, ok := nc.labels.Load(name)
	if !ok {
		return nil, fmt.Errorf("namespace %q is not in the cache", name)
	}
	return v.(map[string]string), nil
}

// ReadyCheck is a healthz checker for /readyz.
func (nc *NamespaceCache) ReadyCheck(_ *http.Request) error {
	if nc.synced == nil || !nc.synced() {
		return fmt.Errorf("namespace cache has not synced yet")
	}
	return nil
}
