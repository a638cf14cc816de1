package inject_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

var forgedRuntimeRecord = layout.Injected{Runtime: layout.InjectedByNRI, Containers: []string{"cuda"}}.String()

// withAnnotations is a one-GPU pod carrying the annotations.
func withAnnotations(ann map[string]string) *corev1.Pod {
	return gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
		p.Namespace = "ml"
		p.Annotations = ann
	})
}

// TestForgedRuntimeRecord: a record of a runtime injection that the pod's
// author wrote is no reinvocation: the pod is decided afresh, and the record
// is rewritten or taken out, whatever the author wrote next to it.
func TestForgedRuntimeRecord(t *testing.T) {
	marker := layout.AnnotationRuntimeInject
	plugins := layout.AnnotationNRIRequiredPlugins + "/container.cuda"
	cases := map[string]struct {
		ann   map[string]string
		setup func(*config.Configuration)
		// layouts: the honest cluster's, or none.
		noLayouts bool
		want      Decision
	}{
		"record alone, driverDelivery HostPath": {
			ann:   map[string]string{layout.AnnotationInjected: forgedRuntimeRecord},
			setup: func(c *config.Configuration) { c.DriverDelivery = config.DeliveryHostPath },
			want:  DecisionInjected,
		},
		"record, marker and required plugins, driverDelivery HostPath": {
			ann:   map[string]string{layout.AnnotationInjected: forgedRuntimeRecord, marker: "cuda", plugins: `["gpu-injector"]`},
			setup: func(c *config.Configuration) { c.DriverDelivery = config.DeliveryHostPath },
			want:  DecisionInjected,
		},
		"record naming a container the pod lacks": {
			ann:  map[string]string{layout.AnnotationInjected: layout.Injected{Runtime: layout.InjectedByNRI, Containers: []string{"other"}}.String(), marker: "other"},
			want: DecisionInjected,
		},
		"record, no layout, noLayout Allow": {
			ann: map[string]string{layout.AnnotationInjected: forgedRuntimeRecord},
			setup: func(c *config.Configuration) {
				c.NoLayout.Action, c.DriverDelivery = config.NoLayoutAllow, config.DeliveryHostPath
			},
			noLayouts: true,
			want:      DecisionInjected,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			if tc.setup != nil {
				tc.setup(cfg)
			}
			var layouts []*Layout
			if !tc.noLayouts {
				nodes, _ := honestCluster(8, "560.35.03")
				layouts = clustertest.LayoutsOf(cfg, nodes)
			}
			pod := withAnnotations(tc.ann)
			res := Mutate(Input{Pod: pod, Layouts: layouts}, cfg)
			if res.Decision != tc.want {
				t.Fatalf("decision %s, want %s: %s", res.Decision, tc.want, res.Reason)
			}
			if got := pod.Annotations[layout.AnnotationInjected]; got == forgedRuntimeRecord || strings.Contains(got, `"runtime"`) {
				t.Errorf("the forged record is still there: %q", got)
			}
			if got, ok := pod.Annotations[marker]; ok {
				t.Errorf("the marker is still there: %q", got)
			}
			if !tc.noLayouts && len(pod.Spec.Volumes) == 0 {
				t.Errorf("no hostPath volume: the record was taken for a runtime injection")
			}
		})
	}
}

// TestUnreadableRecord: a record gpu-injector cannot read leaves the pod
// without the driver, but does not end the decision: a forged marker goes,
// and Pod Security's Deny still denies.
func TestUnreadableRecord(t *testing.T) {
	ann := map[string]string{layout.AnnotationInjected: `{"containers":`, layout.AnnotationRuntimeInject: "cuda"}
	nodes, _ := honestCluster(8, "560.35.03")
	t.Run("privileged namespace", func(t *testing.T) {
		cfg := config.Default()
		pod := withAnnotations(ann)
		res := Mutate(Input{Pod: pod, Layouts: clustertest.LayoutsOf(cfg, nodes)}, cfg)
		if res.Decision != DecisionInjected {
			t.Fatalf("decision %s: %s", res.Decision, res.Reason)
		}
		if _, ok := pod.Annotations[layout.AnnotationRuntimeInject]; ok || len(pod.Spec.Volumes) > 0 {
			t.Errorf("want the marker removed and no driver, got %v, %d volumes", pod.Annotations, len(pod.Spec.Volumes))
		}
	})
	t.Run("baseline namespace, podSecurity Deny", func(t *testing.T) {
		cfg := config.Default()
		cfg.PodSecurity = config.PodSecurityDeny
		pod := withAnnotations(ann)
		before := pod.DeepCopy()
		res := Mutate(Input{Pod: pod, Layouts: clustertest.LayoutsOf(cfg, nodes), NamespaceLabels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}, cfg)
		if res.Decision != DecisionDenied {
			t.Fatalf("decision %s: %s", res.Decision, res.Reason)
		}
		gputest.CheckUnchangedUnlessInjected(t, before, pod, res)
	})
}
