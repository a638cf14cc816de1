package inject_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// manyContainers is a pod of n one-GPU containers.
func manyContainers(n int) *corev1.Pod {
	return gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
		c := p.Spec.Containers[0]
		p.Spec.Containers = make([]corev1.Container, n)
		for i := range p.Spec.Containers {
			p.Spec.Containers[i] = *c.DeepCopy()
			p.Spec.Containers[i].Name = fmt.Sprintf("c%d", i)
		}
	})
}

func limitLayouts(cfg *config.Configuration) []*Layout {
	nodes, _ := honestCluster(8, "560.35.03")
	return clustertest.LayoutsOf(cfg, nodes)
}

// TestTooManyGPUContainers: a pod of 5,000 GPU containers is denied within a
// second, left as it came, with a message that says how to split it.
func TestTooManyGPUContainers(t *testing.T) {
	cfg := config.Default()
	layouts := limitLayouts(cfg)
	pod := manyContainers(5000)
	before := pod.DeepCopy()
	start := time.Now()
	res := Mutate(Input{Pod: pod, Layouts: layouts}, cfg)
	took := time.Since(start)
	if took > time.Second {
		t.Errorf("took %s, want under a second", took)
	}
	t.Logf("denied in %s", took)
	if res.Decision != DecisionDenied || !strings.Contains(res.Reason, "split it") || !strings.Contains(res.Reason, "limits.maxGPUContainers") {
		t.Fatalf("decision %s: %s", res.Decision, res.Reason)
	}
	gputest.CheckUnchangedUnlessInjected(t, before, pod, res)
}

// TestTooManyContainersAll: with containers: All, every container of a GPU
// pod counts towards the limit, not only those with a GPU.
func TestTooManyContainersAll(t *testing.T) {
	cfg := config.Default()
	cfg.Containers = config.ContainersAll
	pod := manyContainers(5000)
	for i := 1; i < len(pod.Spec.Containers); i++ {
		pod.Spec.Containers[i].Resources = corev1.ResourceRequirements{}
	}
	res := Mutate(Input{Pod: pod, Layouts: limitLayouts(cfg)}, cfg)
	if res.Decision != DecisionDenied || !strings.Contains(res.Reason, "limits.maxGPUContainers") {
		t.Fatalf("decision %s: %s", res.Decision, res.Reason)
	}
}

// TestPatchLimits: the limits on patch operations and bytes hold: a pod
// whose patch would be one operation or one byte over them is denied, so the
// estimate the decision checks is never below the patch it would build.
func TestPatchLimits(t *testing.T) {
	// The largest record of images not read: it counts too.
	var unread []layout.ImageUnread
	for i := range layout.MaxImagesUnread {
		unread = append(unread, layout.ImageUnread{Image: fmt.Sprintf("r.example/%d/%s", i, strings.Repeat("a", 600)), Reason: strings.Repeat(`"\`, 200)})
	}
	for _, tc := range []struct {
		n      int
		unread []layout.ImageUnread
	}{{1, nil}, {7, nil}, {128, nil}, {1, unread}} {
		n := tc.n
		t.Run(fmt.Sprint(n, " ", len(tc.unread)), func(t *testing.T) {
			cfg := config.Default()
			layouts := limitLayouts(cfg)
			res := Mutate(Input{Pod: manyContainers(n), Layouts: layouts, ImagesUnread: tc.unread}, cfg)
			if res.Decision != DecisionInjected {
				t.Fatalf("decision %s: %s", res.Decision, res.Reason)
			}
			ops, size := len(res.Patch), len(clustertest.PatchBytes(t, res.Patch))
			for name, set := range map[string]func(*config.Configuration){
				"operations": func(c *config.Configuration) { c.Limits.MaxPatchOperations = ops - 1 },
				"bytes":      func(c *config.Configuration) { c.Limits.MaxPatchBytes = size - 1 },
			} {
				c := config.Default()
				set(c)
				pod := manyContainers(n)
				before := pod.DeepCopy()
				res := Mutate(Input{Pod: pod, Layouts: layouts, ImagesUnread: tc.unread}, c)
				if res.Decision != DecisionDenied || !strings.Contains(res.Reason, "split it") {
					t.Errorf("%s one below the patch (%d operations, %d bytes): decision %s: %s", name, ops, size, res.Decision, res.Reason)
				}
				gputest.CheckUnchangedUnlessInjected(t, before, pod, res)
			}
		})
	}
}

// TestCanceledRequest: once the caller has given up, nothing is fitted or
// edited.
func TestCanceledRequest(t *testing.T) {
	cfg := config.Default()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pod := manyContainers(2)
	before := pod.DeepCopy()
	res := MutateContext(ctx, Input{Pod: pod, Layouts: limitLayouts(cfg)}, cfg)
	if res.Decision != DecisionDenied {
		t.Fatalf("decision %s: %s", res.Decision, res.Reason)
	}
	gputest.CheckUnchangedUnlessInjected(t, before, pod, res)
}
