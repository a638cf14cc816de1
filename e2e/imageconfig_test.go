//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestImageConfigAdmission: with images.mode On, the webhook reads GPU
// pods' images from the cluster's registry. The workload image, pushed
// there with ENV LD_LIBRARY_PATH=/opt/app/lib and a CUDA requirement the
// stand-in driver meets, runs under hostPath delivery with its own folder
// kept first and the driver's appended, pinned by node affinity to the
// drivers that can run it; the same image requiring the next major CUDA is
// denied, the message naming the need, the newest driver and the
// override; an image of a listed registry that is down is admitted as
// before, with the warning naming the image and the connection's refusal.
// The registry-down case runs first: it needs no registry the webhook's pods
// reach, which the rest does.
func TestImageConfigAdmission(t *testing.T) {
	host := testEnv.Cluster.RegistryHost
	if host == "" {
		t.Skip("the cluster runs no registry")
	}
	ctx := testContext(t)
	node, err := client().CoreV1().Nodes().Get(ctx, testEnv.KubeletNode().Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cudaNumber, err := strconv.Atoi(node.Labels[layout.LabelCUDADriverVersionNumber])
	if err != nil {
		t.Fatalf("node %s publishes no %s: %v", node.Name, layout.LabelCUDADriverVersionNumber, err)
	}
	major, minor := cudaNumber/1000, cudaNumber%1000/10
	// The API-only nodes publish other stand-in drivers: the denied image
	// requires a major version above the newest of them all.
	nodes, err := client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newest := cudaNumber
	for _, n := range nodes.Items {
		if v, err := strconv.Atoi(n.Labels[layout.LabelCUDADriverVersionNumber]); err == nil && v > newest {
			newest = v
		}
	}
	beyond := newest/1000 + 1
	base := filepath.Join(testEnv.Cluster.Dir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(env.WorkloadImage)+".tar")
	push := func(repo string, extra ...string) string {
		t.Helper()
		tag, _ := name.NewTag(env.WorkloadImage)
		img, err := tarball.ImageFromPath(base, &tag)
		if err != nil {
			t.Fatalf("failed to read the workload image: %v", err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		cf = cf.DeepCopy()
		cf.Config.Env = append(cf.Config.Env, extra...)
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		ref := host + "/e2e/" + repo
		r, _ := name.ParseReference(ref, name.Insecure)
		if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
			t.Fatalf("failed to push %s: %v", ref, err)
		}
		return ref
	}
	ok := push("app:cuda-ok", "LD_LIBRARY_PATH=/opt/app/lib", fmt.Sprintf("NVIDIA_REQUIRE_CUDA=cuda>=%d.%d brand=tesla,driver>=470", major, minor))
	tooNew := push("app:cuda-too-new", fmt.Sprintf("NVIDIA_REQUIRE_CUDA=cuda>=%d.0", beyond))
	down := "127.0.0.1:1/e2e/app:v1"

	t.Cleanup(func() {
		if err := testEnv.UpgradeChart(testContext(t)); err != nil {
			t.Errorf("failed to restore the release: %v", err)
		}
	})
	if err := testEnv.UpgradeChart(ctx, "config.images.mode=On",
		"config.images.registries={"+host+",127.0.0.1:1}", "config.images.insecureRegistries={"+host+",127.0.0.1:1}"); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, true)
	pod := func(podName, image string) *corev1.Pod {
		onKubelet := map[string]string{env.LabelAccelerator: testEnv.KubeletNode().Accelerator}
		p := gpuPod(podName, podOpts{resource: env.GPUResource, nodeSelector: onKubelet})
		p.Spec.Containers[0].Image = image
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
		return p
	}

	w := &warningRecorder{}
	_, err = warningClient(t, w).CoreV1().Pods(ns).Create(ctx, pod("registry-down", down), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("pod of a registry that is down: %v, want it admitted", err)
	}
	if got := w.all(); !strings.Contains(got, `failed to read the configuration of image "`+down+`"`) || !strings.Contains(got, "connection refused") {
		t.Errorf("warnings = %q, want one naming %s and the connection's refusal", got, down)
	}
	if strings.HasPrefix(host, "127.") {
		// What a real cluster has and this fixture lacks: a registry the
		// webhook's pods reach. The cluster's registry listens on the
		// host's loopback, which containerd reaches and a pod does not (a
		// run here answered every read "connection refused").
		t.Skipf("the cluster's registry %s listens on the host's loopback, out of the webhook pods' reach: serve it on the node's address (e2e/cluster) to read images through it", host)
	}

	_, err = client().CoreV1().Pods(ns).Create(ctx, pod("too-new", tooNew), metav1.CreateOptions{})
	want := fmt.Sprintf("needs a driver supporting CUDA %d.0 or newer", beyond)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), layout.AnnotationCUDARequirement) {
		t.Errorf("pod of an image requiring CUDA %d.0: err = %v, want a denial with %q and the override", beyond, err, want)
	} else {
		t.Logf("denied: %v", err)
	}

	created := createPod(t, ns, pod("runs", ok))
	var ldPath string
	for _, e := range created.Spec.Containers[0].Env {
		if e.Name == "LD_LIBRARY_PATH" {
			ldPath = e.Value
		}
	}
	if ldPath != "/opt/app/lib:/usr/local/nvidia/lib64" {
		t.Errorf("LD_LIBRARY_PATH = %q, want the image's then the driver's", ldPath)
	}
	affinity := fmt.Sprint(created.Spec.Affinity)
	if !strings.Contains(affinity, layout.LabelCUDADriverVersionNumber) || !strings.Contains(affinity, strconv.Itoa(cudaNumber-1)) {
		t.Errorf("affinity = %s, want %s Gt %d", affinity, layout.LabelCUDADriverVersionNumber, cudaNumber-1)
	}
	done := waitPodDone(t, ns, created.Name)
	if done.Status.Phase != corev1.PodSucceeded {
		t.Errorf("pod %s ended %s, want Succeeded: %s", done.Name, done.Status.Phase, podLog(t, ns, done.Name, "cuda"))
	}

}
