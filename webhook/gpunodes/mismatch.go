package gpunodes

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// Mismatches tells pods pinned by a pool's labels that they landed on a node
// whose driver layout is not the one injected: the memory was wrong, or the
// pool changed its node image. Such a pod's hostPath type check fails (or it
// runs against other driver paths), and only deleting it helps: its
// controller recreates it and the webhook injects what the node publishes.
//
// The webhook, not the probe, does this: it already knows every node's
// layout, and only its elected replica needs to read pods (those it labelled,
// by a label selector) and write Events, where the probe would need both on
// every node.
type Mismatches struct {
	idx      *Index
	recorder record.EventRecorder
	log      logr.Logger
	// Interval re-checks pods whose node had not published a layout yet.
	Interval time.Duration

	mu   sync.Mutex
	told map[types.UID]bool
}

// NewMismatches returns the checker; recorder writes the Events.
func NewMismatches(idx *Index, recorder record.EventRecorder, log logr.Logger) *Mismatches {
	return &Mismatches{idx: idx, recorder: recorder, log: log, Interval: 15 * time.Second, told: map[types.UID]bool{}}
}

// PodCacheByObject limits the pod informer to the pods the webhook pinned by
// pool, and to what the check reads of them.
func PodCacheByObject() cache.ByObject {
	req, err := labels.NewRequirement(layout.LabelPinnedLayout, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return cache.ByObject{
		Label: labels.NewSelector().Add(*req),
		Transform: func(obj any) (any, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				p.ManagedFields = nil
				p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName}
				p.Status = corev1.PodStatus{Phase: p.Status.Phase}
				if v, ok := p.Annotations[layout.AnnotationInjected]; ok {
					p.Annotations = map[string]string{layout.AnnotationInjected: v}
				} else {
					p.Annotations = nil
				}
			}
			return obj, nil
		},
	}
}

// Run watches the labelled pods until ctx ends; the informer starts here, so
// only the elected replica caches pods.
func (m *Mismatches) Run(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("failed to get the pod informer: %w", err)
	}
	check := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			m.Check(p)
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, obj any) { check(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				m.mu.Lock()
				delete(m.told, p.UID)
				m.mu.Unlock()
			}
		},
	})
	if err != nil {
		return fmt.Errorf("failed to add the pod event handler: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	t := time.NewTicker(m.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			// A pod whose node had not published yet when it was bound.
			pods := &corev1.PodList{}
			if err := c.List(ctx, pods); err != nil {
				m.log.Error(err, "failed to list the pods pinned by pool")
				continue
			}
			for i := range pods.Items {
				m.Check(&pods.Items[i])
			}
		}
	}
}

// Check raises the Event once per pod when its node publishes a layout other
// than the one injected.
func (m *Mismatches) Check(p *corev1.Pod) {
	want := p.Labels[layout.LabelPinnedLayout]
	if want == "" || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return
	}
	have, driver, ok := m.idx.NodeLayout(p.Spec.NodeName)
	if !ok || have == want {
		return
	}
	m.mu.Lock()
	if m.told[p.UID] {
		m.mu.Unlock()
		return
	}
	m.told[p.UID] = true
	m.mu.Unlock()
	inj, _ := inject.PreviousInjection(p)
	from := "the pool's live nodes"
	if inj != nil && inj.Remembered {
		from = "the pool's memory (the pool had no node)"
	}
	injected := want
	if inj != nil && inj.DriverVersion != "" {
		injected += " (driver " + inj.DriverVersion + ")"
	}
	pool := ""
	if inj != nil && inj.Pool != "" {
		pool = " of pool " + strings.Join(pools.Split(inj.Pool), " or ")
	}
	mismatches.Inc()
	m.log.Info("pod landed on a node of another layout", "pod", p.Namespace+"/"+p.Name, "node", p.Spec.NodeName, "injected", want, "nodeLayout", have)
	m.recorder.Eventf(p, corev1.EventTypeWarning, pools.ReasonLayoutMismatch,
		"gpu-injector injected driver layout %s from %s, but node %s%s publishes layout %s (driver %s): the injected host paths may be missing there (hostPath type check failed). Delete the pod; its controller recreates it and the webhook injects the node's layout",
		injected, from, p.Spec.NodeName, pool, have, driver)
}

// NodeLayout returns the fingerprint and driver version a node publishes,
// valid or not, and whether it publishes one.
func (idx *Index) NodeLayout(name string) (string, string, bool) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	st, ok := idx.nodes[name]
	if !ok || st.source.label == "" {
		return "", "", false
	}
	driver := "unknown"
	if ls, ok := idx.layouts[st.fingerprint]; ok && st.fingerprint != "" {
		driver = ls.plan.DriverVersion
	} else if st.info != nil {
		if v := st.info.Labels.Get(layout.LabelDriverVersion); v != "" {
			driver = layout.Truncate(v, 64)
		}
	}
	return layout.Truncate(st.source.label, 64), driver, true
}
