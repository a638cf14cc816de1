//go:build e2e

package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

// poolMemoryName is the chart's <fullname>-pools for the environment's release.
const poolMemoryName = env.Release + "-pools"

// TestPoolScaledToZero: with config.pinning.nodeLabels set to the label the
// kubelet node registers with (accelerator, from its --node-labels, as a
// cloud's node pool label comes from the node group), the elected webhook
// remembers the pool's layout in its ConfigMap. The pool's only Node is
// deleted: the pool is at zero. A GPU pod for that pool is then admitted,
// injected with the remembered layout and pinned only by the pool's label
// (no fingerprint selector), and stays Pending. A new node of the pool
// appears (the kubelet starts again and registers its Node anew, with its
// labels and no layout yet), and the pod is scheduled there and runs against
// the injected driver. Then the probe publishes on the new node and the
// pool is live again; a pod pinned by the pool to another layout than the
// node's gets the LayoutMismatch Event from the elected webhook.
func TestPoolScaledToZero(t *testing.T) {
	kn := testEnv.KubeletNode()
	pool := env.LabelAccelerator + "=" + kn.Accelerator
	fp := currentFingerprint(t, kn.Name)
	cfg := enablePoolPinning(t, "config.pinning.nodeLabels={"+env.LabelAccelerator+"}")

	var mem pools.Memory
	waitFor(t, 2*time.Minute, "the elected webhook to remember pool "+pool, func(ctx context.Context) (bool, error) {
		cm, err := client().CoreV1().ConfigMaps(env.Namespace).Get(ctx, poolMemoryName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		entries, errs := pools.DecodeMemory(cm.Data, cfg.Pinning.NodeLabels, cfg.Rules(), time.Now())
		if len(errs) > 0 {
			return false, errs[0]
		}
		for _, m := range entries {
			if m.Pool == pool && m.Plan.Fingerprint() == fp {
				mem = m
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("remembered pool %s: layout %s (driver %s), node labels %v, taints %v", pool, fp, mem.Plan.DriverVersion, mem.NodeLabels, mem.Taints)
	if _, ok := mem.NodeLabels[layout.LabelFingerprint]; ok {
		t.Errorf("remembered node labels carry %s, which a new node does not have: %v", layout.LabelFingerprint, mem.NodeLabels)
	}

	// The pool scales to zero: its only node leaves, and with it the chart's
	// webhook replicas (this cluster runs pods on that node only; a real one
	// runs the webhook elsewhere). One more replica, a local process behind
	// the same Service, stands in for those.
	stopLocal, err := testEnv.StartLocalWebhook(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stopLocal(); err != nil {
			t.Errorf("failed to stop the local webhook: %v", err)
		}
	})
	if err := client().CoreV1().Nodes().Delete(testContext(t), kn.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("failed to delete node %s: %v", kn.Name, err)
	}
	// The node's pods go with it, at once, as the pod garbage collector
	// would delete them within a minute: otherwise it deletes the chart's
	// pods after the node is back, and the webhook is gone for a while.
	if err := client().CoreV1().Pods(env.Namespace).DeleteCollection(testContext(t), metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))},
		metav1.ListOptions{FieldSelector: "spec.nodeName=" + kn.Name}); err != nil {
		t.Fatalf("failed to delete the pods of node %s: %v", kn.Name, err)
	}
	var rejoined bool
	t.Cleanup(func() {
		// Leave the suite's kubelet node as it was: registered, untainted,
		// its layout published and seen by the webhook.
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		if !rejoined {
			if err := testEnv.Cluster.RestartKubelet(ctx); err != nil {
				t.Errorf("failed to bring node %s back: %v", kn.Name, err)
				return
			}
			if err := untaintNotReady(ctx, client(), kn.Name); err != nil {
				t.Error(err)
			}
		}
		if err := testEnv.WaitWebhookReady(ctx); err != nil {
			t.Errorf("the chart's webhook did not come back on node %s: %v", kn.Name, err)
		}
		if _, err := testEnv.WaitProbePod(ctx); err != nil {
			t.Errorf("the chart's probe did not come back on node %s: %v", kn.Name, err)
		}
		if _, err := testEnv.UpgradeDriver(ctx, kn.Name, kn.DriverVersion); err != nil {
			t.Errorf("failed to have node %s's layout published again: %v", kn.Name, err)
		}
	})
	waitPoolState(t, pool, "remembered")

	ns := newNamespace(t, true)
	warnings := &warningRecorder{}
	warned := warningClient(t, warnings)
	pod := gpuPod("at-zero", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: kn.Accelerator}})
	created, err := warned.CoreV1().Pods(ns).Create(testContext(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a GPU pod for a pool at zero was refused: %v", err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().Pods(ns).Delete(context.Background(), created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	})

	rec, ok := injected(t, created)
	if !ok {
		t.Fatalf("pod was not injected; warnings %q", warnings.all())
	}
	if !rec.Remembered || rec.Pool != pool || rec.Fingerprint != fp || rec.DriverVersion != kn.DriverVersion {
		t.Errorf("injection record %+v, want layout %s (driver %s) remembered for pool %s", rec, fp, kn.DriverVersion, pool)
	}
	for k := range created.Spec.NodeSelector {
		if strings.HasPrefix(k, layout.Prefix) {
			t.Errorf("pod pinned by %s, a label no autoscaler knows; nodeSelector %v", k, created.Spec.NodeSelector)
		}
	}
	if got := created.Spec.NodeSelector[env.LabelAccelerator]; got != kn.Accelerator || len(created.Spec.NodeSelector) != 1 {
		t.Errorf("nodeSelector %v, want only the pool label %s", created.Spec.NodeSelector, pool)
	}
	if got := created.Labels[layout.LabelPinnedLayout]; got != fp {
		t.Errorf("label %s=%q, want %s", layout.LabelPinnedLayout, got, fp)
	}
	wantPaths := map[string]bool{}
	for _, m := range mem.Plan.Mounts {
		wantPaths[m.HostPath] = true
	}
	for name, p := range hostPaths(created) {
		if !wantPaths[p] {
			t.Errorf("volume %s mounts %s, not in the remembered layout %v", name, p, mem.Plan.Mounts)
		}
		delete(wantPaths, p)
	}
	if len(wantPaths) > 0 {
		t.Errorf("remembered host paths not injected: %v", wantPaths)
	}
	t.Logf("admitted with warnings: %s", warnings.all())
	if w := warnings.all(); !strings.Contains(w, "pool "+pool+" has no ready node") {
		t.Errorf("warnings %q do not say the layout came from the pool's memory", w)
	}

	// Nothing can run it yet: the scheduler finds no node.
	waitUnschedulable(t, ns, created.Name)

	// A new node of the pool joins, with the pool's label and no layout yet.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testEnv.Cluster.RestartKubelet(ctx); err != nil {
		t.Fatalf("failed to start the kubelet again: %v", err)
	}
	rejoined = true
	if err := untaintNotReady(ctx, client(), kn.Name); err != nil {
		t.Fatal(err)
	}
	node, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[env.LabelAccelerator] != kn.Accelerator {
		t.Fatalf("the new node has labels %v, want %s", node.Labels, pool)
	}
	t.Logf("node %s registered again: %s=%q, fingerprint label %q", kn.Name, env.LabelAccelerator, node.Labels[env.LabelAccelerator], node.Labels[layout.LabelFingerprint])

	bound := waitBound(t, ns, created.Name)
	if bound.Spec.NodeName != kn.Name {
		t.Fatalf("pod bound to %s, want the pool's new node %s", bound.Spec.NodeName, kn.Name)
	}
	done := waitPodDone(t, ns, created.Name)
	log := podLog(t, ns, created.Name, "cuda")
	if done.Status.Phase != corev1.PodSucceeded || !strings.Contains(log, "driver="+kn.DriverVersion) {
		t.Fatalf("pod on the new node: phase %s, log:\n%s\nwant Succeeded with driver=%s", done.Status.Phase, log, kn.DriverVersion)
	}

	// The probe publishes on the new node (it re-probes on SIGHUP, as a new
	// node's probe pod does when it starts): the pool is live again.
	if _, err := testEnv.UpgradeDriver(testContext(t), kn.Name, kn.DriverVersion); err != nil {
		t.Fatal(err)
	}
	waitPoolState(t, pool, "live")

	// A pod pinned by the pool to a layout the node does not publish (what a
	// wrong memory makes) gets an Event that names both layouts and says what
	// to do. Made by hand in a namespace the webhook leaves alone.
	plain := newNamespace(t, false)
	const wrong = "00000000000000000000"
	stray := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "wrong-layout",
			Labels: map[string]string{layout.LabelPinnedLayout: wrong},
			Annotations: map[string]string{layout.AnnotationInjected: layout.Injected{
				Fingerprint: wrong, DriverVersion: "470.82.01", Pool: pool, Remembered: true, Containers: []string{"pause"},
			}.String()},
		},
		Spec: corev1.PodSpec{
			NodeSelector:                 map[string]string{env.LabelAccelerator: kn.Accelerator},
			AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{
				Name: "pause", Image: cluster.PauseImage, ImagePullPolicy: corev1.PullNever, SecurityContext: restrictedContext(),
			}},
		},
	}
	createPod(t, plain, stray)
	msg := waitEvent(t, plain, stray.Name, pools.ReasonLayoutMismatch, "publishes layout "+fp)
	t.Logf("event on %s/%s: %s", plain, stray.Name, msg)
	for _, want := range []string{wrong, "driver 470.82.01", "pool's memory", "node " + kn.Name + " of pool " + pool, "Delete the pod"} {
		if !strings.Contains(msg, want) {
			t.Errorf("LayoutMismatch event %q lacks %q", msg, want)
		}
	}
}

// TestDeclaredPoolAtZero: a pool that never had a node, declared in the
// chart's values (config.pinning.pools, from a values file as a user writes
// it) with the layout its node image publishes, serves its first GPU pod:
// admitted through the webhook, injected with the declared layout, pinned by
// the pool's label only, warned, and Unschedulable. Then a node of the pool
// appears (the kubelet node takes the pool's label, as a node the
// autoscaler adds for the pod would carry it from its template), and the
// pod runs there against the injected driver.
func TestDeclaredPoolAtZero(t *testing.T) {
	kn := testEnv.KubeletNode()
	const declared = "nvidia-declared-a100"
	pool := env.LabelAccelerator + "=" + declared
	fp := currentFingerprint(t, kn.Name)
	text := nodeAnnotation(t, kn.Name, layout.AnnotationLayout)
	values := filepath.Join(t.TempDir(), "pools-values.yaml")
	if err := os.WriteFile(values, []byte("config:\n  pinning:\n    nodeLabels: ["+env.LabelAccelerator+"]\n    pools:\n"+
		"    - pool: {"+env.LabelAccelerator+": "+declared+"}\n      layout: '"+text+"'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := testEnv.UpgradeChart(ctx); err != nil {
			t.Errorf("failed to upgrade back to the installed values: %v", err)
		}
	})
	if err := testEnv.UpgradeChartWithValues(ctx, values); err != nil {
		t.Fatalf("failed to upgrade with a declared pool: %v", err)
	}
	waitPoolState(t, pool, "declared")

	ns := newNamespace(t, true)
	warnings := &warningRecorder{}
	pod := gpuPod("declared", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: declared}})
	created, err := warningClient(t, warnings).CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the first GPU pod of a declared pool at zero was refused: %v", err)
	}
	rec, ok := injected(t, created)
	if !ok || !rec.Remembered || rec.Pool != pool || rec.Fingerprint != fp {
		t.Fatalf("injection record %+v (injected %v), want layout %s from pool %s's declaration; warnings %q", rec, ok, fp, pool, warnings.all())
	}
	if got := created.Spec.NodeSelector; len(got) != 1 || got[env.LabelAccelerator] != declared {
		t.Errorf("nodeSelector %v, want only the pool label %s", got, pool)
	}
	if w := warnings.all(); !strings.Contains(w, "pool "+pool+" has no ready node; injected the layout pinning.pools declares for it") {
		t.Errorf("warnings %q do not say the layout came from the pool's declaration", w)
	}
	waitUnschedulable(t, ns, created.Name)

	// The pool's node appears: the kubelet node now carries the pool's label.
	setAccelerator := func(ctx context.Context, value string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Labels[env.LabelAccelerator] = value
			_, err = client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = client().CoreV1().Pods(ns).Delete(ctx, created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if err := setAccelerator(ctx, kn.Accelerator); err != nil {
			t.Errorf("failed to give node %s its label back: %v", kn.Name, err)
		}
	})
	if err := setAccelerator(ctx, declared); err != nil {
		t.Fatalf("failed to label node %s into pool %s: %v", kn.Name, pool, err)
	}
	bound := waitBound(t, ns, created.Name)
	if bound.Spec.NodeName != kn.Name {
		t.Fatalf("pod bound to %s, want the pool's node %s", bound.Spec.NodeName, kn.Name)
	}
	done := waitPodDone(t, ns, created.Name)
	log := podLog(t, ns, created.Name, "cuda")
	if done.Status.Phase != corev1.PodSucceeded || !strings.Contains(log, "driver="+kn.DriverVersion) {
		t.Fatalf("pod on the pool's node: phase %s, log:\n%s\nwant Succeeded with driver=%s", done.Status.Phase, log, kn.DriverVersion)
	}
	waitPoolState(t, pool, "live")
}

// waitUnschedulable waits until the scheduler has found no node for pod
// ns/name.
func waitUnschedulable(t *testing.T, ns, name string) {
	t.Helper()
	waitFor(t, apiTimeout, "the scheduler to find no node for the pod", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName != "" {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
}

// enablePoolPinning runs helm upgrade of the release with the given values
// (a configuration change rolls the webhook pods); the test's cleanup
// upgrades back to the installed values. It returns the configuration the
// webhook now runs with, from the release's ConfigMap.
func enablePoolPinning(t *testing.T, sets ...string) *config.Configuration {
	t.Helper()
	ctx := testContext(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := testEnv.UpgradeChart(ctx); err != nil {
			t.Errorf("failed to upgrade back to the installed values: %v", err)
		}
	})
	if err := testEnv.UpgradeChart(ctx, sets...); err != nil {
		t.Fatalf("failed to upgrade with pinning by pool: %v", err)
	}
	data, err := os.ReadFile(testEnv.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data)
	if err != nil {
		t.Fatalf("the chart rendered a bad configuration: %v", err)
	}
	return cfg
}

// waitPoolState waits until a webhook replica's gpu_injector_pools metric
// shows the pool in that state.
func waitPoolState(t *testing.T, pool, state string) {
	t.Helper()
	want := `gpu_injector_pools{pool="` + pool + `",state="` + state + `"} 1`
	waitFor(t, 2*time.Minute, "the webhook to see pool "+pool+" "+state, func(ctx context.Context) (bool, error) {
		urls, err := testEnv.WebhookMetricsURLs(ctx)
		if err != nil {
			return false, nil
		}
		for _, u := range urls {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return false, err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && strings.Contains(string(body), want) {
				return true, nil
			}
		}
		return false, nil
	})
}

// untaintNotReady lifts the not-ready taint every new Node gets, which the
// node lifecycle controller (off in this environment) lifts on a real cluster
// once the node is Ready.
func untaintNotReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []corev1.Taint
		for _, tn := range n.Spec.Taints {
			if tn.Key != corev1.TaintNodeNotReady {
				keep = append(keep, tn)
			}
		}
		if len(keep) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = keep
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// warningRecorder keeps the API server's warnings, which carry the webhook's.
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.msgs, "\n")
}

func warningClient(t *testing.T, w *warningRecorder) kubernetes.Interface {
	t.Helper()
	cfg := testEnv.RESTConfig()
	cfg.WarningHandler = w
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
