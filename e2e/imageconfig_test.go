//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestImageConfigAdmission: with images.mode On, the webhook reads GPU
// pods' images from the cluster's registry, at the address pods reach
// (Cluster.RegistryPodHost). An image of a listed registry that is down is
// admitted as before, with the warning naming the image and the
// connection's refusal. The app-check image, pushed there with ENV
// LD_LIBRARY_PATH=/opt/app/lib and a CUDA requirement the stand-in driver
// meets, runs under hostPath delivery with its own folder kept first and the
// driver's appended, so the loader finds both its library and libcuda.so.1,
// pinned by node affinity to the drivers that can run it; the same image
// requiring the next major CUDA is denied, the message naming the need, the
// newest driver and the override. A private registry's image, whose
// requirement only its configuration tells, is read with the pod's
// imagePullSecrets: the webhook pins it, which it could not without the
// credentials, and the kubelet pulls it with the same Secret.
func TestImageConfigAdmission(t *testing.T) {
	host := testEnv.Cluster.RegistryPodHost
	if host == "" {
		t.Fatal("the cluster runs no registry that pods reach")
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

	const user, password = "e2e", "private-e2e-password"
	private, err := testEnv.Cluster.StartPrivateRegistry(ctx, user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(private.Stop)
	built, err := workloads.BuildAppCheck(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range built {
		files[f.Dest] = f.Source
	}
	tarPath := filepath.Join(t.TempDir(), "app.tar")
	const appRef = "gpu-injector.local/e2e/app-check:v1"
	push := func(host, repo string, auth authn.Authenticator, env ...string) string {
		t.Helper()
		env = append([]string{"PATH=/usr/local/nvidia/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=" + workloads.AppLibDir}, env...)
		if err := cluster.WriteImage(tarPath, appRef, files, cluster.ImageConfig{Entrypoint: []string{workloads.AppCheck}, Env: env}); err != nil {
			t.Fatalf("failed to build the app-check image: %v", err)
		}
		tag, _ := name.NewTag(appRef)
		img, err := tarball.ImageFromPath(tarPath, &tag)
		if err != nil {
			t.Fatalf("failed to read the app-check image: %v", err)
		}
		ref := host + "/e2e/" + repo
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
			t.Fatalf("failed to push %s: %v", ref, err)
		}
		return ref
	}
	within := fmt.Sprintf("NVIDIA_REQUIRE_CUDA=cuda>=%d.%d brand=tesla,driver>=470", major, minor)
	ok := push(host, "app:cuda-ok", authn.Anonymous, within)
	tooNew := push(host, "app:cuda-too-new", authn.Anonymous, fmt.Sprintf("NVIDIA_REQUIRE_CUDA=cuda>=%d.0", beyond))
	secret := push(private.Host, "app:cuda-ok", &authn.Basic{Username: user, Password: password}, within)
	down := "127.0.0.1:1/e2e/app:v1"

	t.Cleanup(func() {
		if err := testEnv.UpgradeChart(testContext(t)); err != nil {
			t.Errorf("failed to restore the release: %v", err)
		}
	})
	listed := host + "," + private.Host + ",127.0.0.1:1"
	// pullSecrets Read needs a verified caller; the NetworkPolicy open to
	// every address meets the chart's rule without shutting out an API
	// server whose address the test does not know.
	if err := testEnv.UpgradeChart(ctx, "config.images.mode=On", "config.images.pullSecrets=Read",
		"webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiServerPeers[0].ipBlock.cidr=0.0.0.0/0",
		"config.images.registries={"+listed+"}", "config.images.insecureRegistries={"+listed+"}"); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, true)
	pod := func(podName, image string) *corev1.Pod {
		onKubelet := map[string]string{env.LabelAccelerator: testEnv.KubeletNode().Accelerator}
		p := gpuPod(podName, podOpts{resource: env.GPUResource, nodeSelector: onKubelet, command: []string{workloads.AppCheck}})
		p.Spec.Containers[0].Image = image
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
		return p
	}

	t.Run("registry down", func(t *testing.T) {
		w := &warningRecorder{}
		_, err := warningClient(t, w).CoreV1().Pods(ns).Create(ctx, pod("registry-down", down), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("pod of a registry that is down: %v, want it admitted", err)
		}
		if got := w.all(); !strings.Contains(got, `failed to read the configuration of image "`+down+`"`) || !strings.Contains(got, "connection refused") {
			t.Errorf("warnings = %q, want one naming %s and the connection's refusal", got, down)
		}

		// Stored, the pod carries the record, and status lists it as the
		// pod says: the image and the registry's answer, newest first.
		created := createPod(t, ns, pod("registry-down", down))
		rec, err := layout.DecodeImagesUnread(created.Annotations[layout.AnnotationImagesUnread])
		if err != nil || created.Labels[layout.LabelImagesUnread] != layout.LabelImagesUnreadValue {
			t.Fatalf("stored pod: record %v, label %q; want the record of %s, labelled", err, created.Labels[layout.LabelImagesUnread], down)
		}
		if len(rec.Images) != 1 || rec.Images[0].Image != down || !strings.Contains(rec.Images[0].Reason, "connection refused") {
			t.Errorf("record %+v, want %s and the connection's refusal", rec, down)
		}
		r, _ := statusReport(t)
		u := r.ImagesUnread
		if u.Note != "" || u.Total < 1 || len(u.Pods) == 0 || u.Pods[0].Namespace != ns || u.Pods[0].Name != created.Name ||
			len(u.Pods[0].Images) != 1 || u.Pods[0].Images[0].Image != down || !u.Pods[0].Admitted.Equal(created.CreationTimestamp.UTC()) {
			t.Errorf("status -o json imagesUnread = %+v, want %s/%s first, with %s, admitted at its creation", u, ns, created.Name, down)
		}
		out, _, _ := gpuInjectorStatus(t, "--color", "never")
		if !strings.Contains(out, "PODS ADMITTED WITHOUT THEIR IMAGES' CONFIGURATION") || !strings.Contains(out, ns+"/"+created.Name) || !strings.Contains(out, "connection refused") {
			t.Errorf("status table does not list %s/%s:\n%s", ns, created.Name, out)
		} else {
			t.Logf("gpu-injector status:\n%s", out[strings.Index(out, "PODS ADMITTED"):])
		}
	})

	t.Run("too new", func(t *testing.T) {
		_, err := client().CoreV1().Pods(ns).Create(ctx, pod("too-new", tooNew), metav1.CreateOptions{})
		want := fmt.Sprintf("needs a driver supporting CUDA %d.0 or newer", beyond)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), layout.AnnotationCUDARequirement) {
			t.Errorf("pod of an image requiring CUDA %d.0: err = %v, want a denial with %q and the override", beyond, err, want)
		} else {
			t.Logf("denied: %v", err)
		}
	})

	runs := func(t *testing.T, p *corev1.Pod) {
		t.Helper()
		created := createPod(t, ns, p)
		var ldPath string
		for _, e := range created.Spec.Containers[0].Env {
			if e.Name == "LD_LIBRARY_PATH" {
				ldPath = e.Value
			}
		}
		if ldPath != workloads.AppLibDir+":/usr/local/nvidia/lib64" {
			t.Errorf("LD_LIBRARY_PATH = %q, want the image's then the driver's", ldPath)
		}
		affinity := fmt.Sprint(created.Spec.Affinity)
		if !strings.Contains(affinity, layout.LabelCUDADriverVersionNumber) || !strings.Contains(affinity, strconv.Itoa(cudaNumber-1)) {
			t.Errorf("affinity = %s, want %s Gt %d", affinity, layout.LabelCUDADriverVersionNumber, cudaNumber-1)
		}
		done := waitPodDone(t, ns, created.Name)
		log := podLog(t, ns, done.Name, "cuda")
		if done.Status.Phase != corev1.PodSucceeded {
			t.Fatalf("pod %s ended %s, want Succeeded:\n%s", done.Name, done.Status.Phase, log)
		}
		for _, want := range []string{
			"LD_LIBRARY_PATH=" + workloads.AppLibDir + ":/usr/local/nvidia/lib64\n",
			"libapp: 42\n",
			"loaded libcuda.so.1 from /usr/local/nvidia/lib64/libcuda.so.1\n",
		} {
			if !strings.Contains(log, want) {
				t.Errorf("app-check log:\n%s\nwant %q", log, want)
			}
		}
	}

	t.Run("within the driver", func(t *testing.T) { runs(t, pod("runs", ok)) })

	t.Run("private registry", func(t *testing.T) {
		cfg, err := json.Marshal(map[string]any{"auths": map[string]any{private.Host: map[string]string{
			"username": user, "password": password,
			"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password)),
		}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "regcred"},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: cfg},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Without the Secret the registry refuses the webhook, which
		// admits the pod with a warning and no CUDA term.
		w := &warningRecorder{}
		_, err = warningClient(t, w).CoreV1().Pods(ns).Create(ctx, pod("private-anonymous", secret), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("pod of a private image without its Secret: %v, want it admitted", err)
		}
		if got := w.all(); !strings.Contains(got, `failed to read the configuration of image "`+secret+`"`) {
			t.Errorf("warnings = %q, want one naming %s", got, secret)
		}
		p := pod("private", secret)
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
		runs(t, p)
	})

	// First sight through the API server: each image a new digest, never
	// cached, side by side with the same pod naming an image of a registry
	// not listed (never contacted). The figures go to docs/benchmarks.md;
	// what is checked is that every read answered within the budget.
	t.Run("first sight", func(t *testing.T) {
		const n = 40
		var sight, floor []time.Duration
		unlisted := pod("floor", appRef)
		for i := range n {
			ref := push(host, fmt.Sprintf("app:sight-%d", i), authn.Anonymous, within, fmt.Sprintf("E2E_SIGHT=%d", i))
			w := &warningRecorder{}
			c := warningClient(t, w).CoreV1().Pods(ns)
			start := time.Now()
			if _, err := c.Create(ctx, pod("sight", ref), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Fatalf("first sight of %s: %v", ref, err)
			}
			sight = append(sight, time.Since(start))
			// The affinity term comes only from the image's configuration.
			if got := w.all(); strings.Contains(got, "failed to read") || !strings.Contains(got, "required node affinity "+layout.LabelCUDADriverVersionNumber) {
				t.Errorf("first sight of %s: warnings %q, want its configuration read within the budget and the pod pinned", ref, got)
			}
			start = time.Now()
			if _, err := c.Create(ctx, unlisted, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Fatal(err)
			}
			floor = append(floor, time.Since(start))
		}
		q := func(d []time.Duration, p float64) time.Duration {
			d = slices.Clone(d)
			slices.Sort(d)
			return d[int(p*float64(len(d)-1))]
		}
		t.Logf("first sight through the API server, %d images: p50 %v p99 %v max %v; unlisted registry (floor): p50 %v p99 %v max %v",
			n, q(sight, 0.5), q(sight, 0.99), q(sight, 1), q(floor, 0.5), q(floor, 0.99), q(floor, 1))
	})

	// The node's credential provider plugin (a static program in a folder of
	// the node, a CredentialProviderConfig beside it, both mounted by the
	// chart from the node) gives the webhook the private registry's
	// credentials: the pod names no Secret, and is read and pinned.
	t.Run("node credential provider", func(t *testing.T) {
		dir := filepath.Join(testEnv.Cluster.Dir, "credential-providers")
		binDir := filepath.Join(dir, "bin")
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := buildCredPlugin(ctx, filepath.Join(binDir, "e2e-credential-provider")); err != nil {
			t.Fatal(err)
		}
		config := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: e2e-credential-provider
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: [%q]
  defaultCacheDuration: 1m
  env:
  - {name: E2E_REGISTRY_USER, value: %q}
  - {name: E2E_REGISTRY_PASSWORD, value: %q}
`, private.Host, user, password)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := testEnv.UpgradeChart(ctx, "config.images.mode=On",
			"config.images.registries={"+listed+"}", "config.images.insecureRegistries={"+listed+"}",
			"config.images.credentialProviders.config="+config, "config.images.credentialProviders.binDir="+binDir,
			"webhook.nodeCredentialProviders.hostPath=true"); err != nil {
			t.Fatal(err)
		}
		w := &warningRecorder{}
		created, err := warningClient(t, w).CoreV1().Pods(ns).Create(ctx, pod("node-credentials", secret), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("pod of a private image, no Secret, the node's plugin configured: %v", err)
		}
		if got := w.all(); strings.Contains(got, "failed to read") {
			t.Errorf("warnings = %q, want the image read with the plugin's credentials", got)
		}
		if affinity := fmt.Sprint(created.Spec.Affinity); !strings.Contains(affinity, layout.LabelCUDADriverVersionNumber) {
			t.Errorf("affinity = %s, want the CUDA term only the private image's configuration gives", affinity)
		}
	})
}

// buildCredPlugin builds e2e/credplugin, static, to out.
func buildCredPlugin(ctx context.Context, out string) error {
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = filepath.Join(filepath.Dir(file), "credplugin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to build e2e/credplugin: %w: %s", err, strings.TrimSpace(string(b)))
	}
	return nil
}
