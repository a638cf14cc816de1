package inject_test

import (
	"context"
	"fmt"
	"slices"
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

// ldPod is a pod of n one-GPU containers of one image, each with its own
// LD_LIBRARY_PATH of own bytes, none when own is 0.
func ldPod(n, own int) *corev1.Pod {
	pod := manyContainers(n)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		c.Image = "r.example/app:v1"
		if own > 0 {
			c.Env = []corev1.EnvVar{{Name: EnvLDLibraryPath, Value: "/" + strings.Repeat("a", own-1)}}
		}
	}
	return pod
}

// TestPatchLimitsLibraryPath: the patch carries each container's merged
// LD_LIBRARY_PATH, the image's value or the pod's own included, and the
// limit on bytes still holds: a pod is injected with a patch within
// limits.maxPatchBytes, and its estimate is never below that patch, or it is
// denied. An image's value past MaxImageLDLibraryPath is not written at all.
func TestPatchLimitsLibraryPath(t *testing.T) {
	for name, tc := range map[string]struct {
		containers, own, image int
		denied                 bool
	}{
		"128 containers, an image's 256 KiB":  {containers: 128, image: 256 << 10},
		"128 containers, an image's 4 KiB":    {containers: 128, image: MaxImageLDLibraryPath},
		"128 containers, their own 16 KiB":    {containers: 128, own: 16 << 10, denied: true},
		"64 containers, their own 16 KiB":     {containers: 64, own: 16 << 10},
		"8 containers, their own 200 KiB":     {containers: 8, own: 200 << 10, denied: true},
		"1 container, its own 256 KiB":        {containers: 1, own: 256 << 10},
		"128 containers, own 8 KiB, image 4K": {containers: 128, own: 8 << 10, image: MaxImageLDLibraryPath},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			cfg.DriverDelivery = config.DeliveryHostPath
			layouts := limitLayouts(cfg)
			var images map[string]*ImageConfig
			if tc.image > 0 {
				images = map[string]*ImageConfig{"r.example/app:v1": {Env: []string{EnvLDLibraryPath + "=/" + strings.Repeat("i", tc.image-1)}}}
			}
			pod := ldPod(tc.containers, tc.own)
			before := pod.DeepCopy()
			res := Mutate(Input{Pod: pod, Layouts: layouts, Images: images}, cfg)
			gputest.CheckUnchangedUnlessInjected(t, before, pod, res)
			if tc.denied {
				if res.Decision != DecisionDenied || !strings.Contains(res.Reason, "limits.maxPatchBytes") {
					t.Fatalf("decision %s (%d bytes of patch): %s", res.Decision, len(clustertest.PatchBytes(t, res.Patch)), res.Reason)
				}
				return
			}
			if res.Decision != DecisionInjected {
				t.Fatalf("decision %s: %s", res.Decision, res.Reason)
			}
			size := len(clustertest.PatchBytes(t, res.Patch))
			t.Logf("a pod of %d bytes: a patch of %d bytes, %d operations", len(clustertest.MustJSON(t, before)), size, len(res.Patch))
			if size > cfg.Limits.MaxPatchBytes {
				t.Fatalf("patch of %d bytes, over limits.maxPatchBytes %d", size, cfg.Limits.MaxPatchBytes)
			}
			for _, c := range pod.Spec.Containers {
				for _, e := range c.Env {
					if e.Name == EnvLDLibraryPath && tc.own == 0 && len(e.Value) > MaxImageLDLibraryPath+64 {
						t.Fatalf("container %s: an image's LD_LIBRARY_PATH of %d bytes written", c.Name, len(e.Value))
					}
				}
			}
			if tc.image > MaxImageLDLibraryPath && tc.own == 0 && !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "ignored") }) {
				t.Errorf("no warning that the image's value was ignored: %q", res.Warnings)
			}
			tight := config.Default()
			tight.DriverDelivery = config.DeliveryHostPath
			tight.Limits.MaxPatchBytes = size - 1
			res = Mutate(Input{Pod: ldPod(tc.containers, tc.own), Layouts: layouts, Images: images}, tight)
			if res.Decision != DecisionDenied || !strings.Contains(res.Reason, "split it") {
				t.Errorf("limits.maxPatchBytes one below the patch (%d bytes): decision %s: %s", size, res.Decision, res.Reason)
			}
		})
	}
}
