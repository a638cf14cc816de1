//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// The drills attack the installed chart while a bounded load of GPU pod
// creates runs: loadRate creates a second, for at least drillSeconds
// (E2E_DRILL_SECONDS overrides it), each a server-side dry run: the API
// server runs every admission step, the webhook included, and stores
// nothing, so a minute of load does not leave a thousand pods for the
// scheduler of a two-core machine. Every create must come back mutated.
const loadRate = 20

func drillDuration() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("E2E_DRILL_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 30 * time.Second
}

// loadResult is what one drill's load saw.
type loadResult struct {
	sent int
	// failed are creates the API server answered with an error or without
	// the injection: admissions that failed.
	failed int
	// unreachable are creates that never reached an API server (it was down).
	unreachable int
	// slow are creates that took longer than a second: they saw a retry
	// or a delay.
	slow       int
	maxLatency time.Duration
	errors     map[string]int
	// failedSent are when the failed creates were sent.
	failedSent []time.Time
	// calls are every create, in the order they were answered.
	calls []loadCall
}

// loadCall is one create of the load: when it was sent, how long its answer
// took, and whether it was an admission that failed, with the API server's
// error.
type loadCall struct {
	sent    time.Time
	latency time.Duration
	failed  bool
	err     string
}

func (r loadResult) String() string {
	var errs []string
	for msg, n := range r.errors {
		errs = append(errs, fmt.Sprintf("%dx %s", n, msg))
	}
	sort.Strings(errs)
	return fmt.Sprintf("sent %d, failed %d, API server unreachable %d, slower than 1s %d, max latency %s; errors: %v",
		r.sent, r.failed, r.unreachable, r.slow, r.maxLatency.Round(time.Millisecond), errs)
}

type load struct {
	cs   kubernetes.Interface
	ns   string
	pod  *corev1.Pod
	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	res loadResult
}

// startLoad sends loadRate dry-run creates of a GPU pod a second until
// finish, each in its own goroutine, so a slow answer delays no other.
func startLoad(t *testing.T, ns string) *load {
	t.Helper()
	cfg := testEnv.RESTConfig()
	cfg.QPS, cfg.Burst = 1000, 1000
	cfg.Timeout = 30 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("failed to create a client: %v", err)
	}
	pod := gpuPod("", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: testEnv.Node("ubuntu-k80").Accelerator}})
	pod.GenerateName = "load-"
	l := &load{cs: cs, ns: ns, pod: pod, stop: make(chan struct{}), done: make(chan struct{}), res: loadResult{errors: map[string]int{}}}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(time.Second / loadRate)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				l.wg.Add(1)
				go l.create()
			}
		}
	}()
	return l
}

func (l *load) create() {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	p, err := l.cs.CoreV1().Pods(l.ns).Create(ctx, l.pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	lat := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res.sent++
	if lat > l.res.maxLatency {
		l.res.maxLatency = lat
	}
	if lat > time.Second {
		l.res.slow++
	}
	var status apierrors.APIStatus
	failed := false
	switch {
	case err != nil && !errors.As(err, &status):
		// No answer from an API server at all: connection refused while it
		// restarts. Not an admission.
		l.res.unreachable++
		l.res.errors[shortError(err)]++
	case err != nil:
		failed = true
		l.res.errors[shortError(err)]++
	case p.Annotations[layout.AnnotationInjected] == "":
		failed = true
		l.res.errors["admitted without the injection"]++
	}
	call := loadCall{sent: start, latency: lat, failed: failed}
	if failed {
		l.res.failed++
		l.res.failedSent = append(l.res.failedSent, start)
		if err != nil {
			call.err = err.Error()
		}
	}
	l.res.calls = append(l.res.calls, call)
}

// shortError keeps an error's start (what failed) and its end (why: EOF,
// reset, refused, deadline), which groups alike failures.
func shortError(err error) string {
	s := err.Error()
	if len(s) > 240 {
		s = s[:150] + " ... " + s[len(s)-80:]
	}
	return s
}

func (l *load) finish() loadResult {
	close(l.stop)
	<-l.done
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.res
}

// drill runs action under load for at least drillDuration and returns what
// the load saw; the figures go to the test log as a docs/e2e.md row.
func drill(t *testing.T, name string, action func(t *testing.T)) loadResult {
	t.Helper()
	if err := testEnv.WaitWebhookReady(testContext(t)); err != nil {
		t.Fatalf("the webhook is not ready before the drill: %v", err)
	}
	ns := newNamespace(t, true)
	l := startLoad(t, ns)
	stopped := false
	defer func() {
		if !stopped {
			l.finish()
		}
	}()
	// A steady state first, so the action hits a warm connection.
	time.Sleep(2 * time.Second)
	begin := time.Now()
	action(t)
	// And a tail of load after the action, so that what follows it (a
	// restarted API server's first answers) is measured too.
	rest := drillDuration() - time.Since(begin)
	if rest < 10*time.Second {
		rest = 10 * time.Second
	}
	time.Sleep(rest)
	res := l.finish()
	stopped = true
	t.Logf("load: %s", res)
	t.Logf("FIGURES | %s | %d | %d | %s | %d |", name, res.sent, res.failed, res.maxLatency.Round(time.Millisecond), res.slow)
	return res
}

func requireNoFailedAdmission(t *testing.T, res loadResult) {
	t.Helper()
	if res.failed > 0 || res.unreachable > 0 {
		t.Errorf("%d admissions failed and %d creates found no API server during the drill, want 0: %s", res.failed, res.unreachable, res)
	}
	if res.sent < int(drillDuration().Seconds())*loadRate/2 {
		t.Errorf("only %d creates were sent; the load did not run", res.sent)
	}
}

// readyWebhookPods returns the ready webhook pods.
func readyWebhookPods(t *testing.T) []corev1.Pod {
	t.Helper()
	pods, err := testEnv.WebhookPods(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for i := range pods {
		if env.PodReady(&pods[i]) {
			out = append(out, pods[i])
		}
	}
	return out
}

func waitWebhookReady(t *testing.T) {
	t.Helper()
	if err := testEnv.WaitWebhookReady(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

// TestDrillWebhookPodForceDeleted: each replica in turn (so the one the API
// server's connection sticks to is hit) is deleted with --grace-period=0
// --force: the API object is gone at once, the endpoint with it.
func TestDrillWebhookPodForceDeleted(t *testing.T) {
	var outages []outage
	res := drill(t, "webhook pod force-deleted (each replica in turn)", func(t *testing.T) {
		done := map[string]bool{}
		for range 2 {
			var victim string
			for _, p := range readyWebhookPods(t) {
				if !done[p.Name] {
					victim = p.Name
					break
				}
			}
			if victim == "" {
				t.Fatal("no ready webhook pod left to delete")
			}
			done[victim] = true
			o := outage{what: "pod " + victim + " force-deleted", from: time.Now()}
			if _, stderr, err := kubectl(t, "", "-n", env.Namespace, "delete", "pod", victim, "--grace-period=0", "--force"); err != nil {
				t.Fatalf("kubectl delete: %v: %s", err, stderr)
			}
			// Every replica ready again: the replacement is serving.
			waitWebhookReady(t)
			o.to = time.Now()
			outages = append(outages, o)
		}
	})
	// Whether the kubelet then gives the process its termination grace period
	// or only a moment before SIGKILL has changed between kubelet versions
	// (kubernetes/kubernetes#115819); a process killed inside its shutdown
	// delay cannot drain, as in the SIGKILL drill. A 1.36.3 run failed 1 of
	// 640, so this drill confines the failures as that one does.
	requireFailuresOnlyDuring(t, res, outages)
}

// TestDrillWebhookProcessKilled: SIGKILL of each replica's process in turn,
// through containerd: no graceful anything, the kubelet restarts the
// container in the same pod.
func TestDrillWebhookProcessKilled(t *testing.T) {
	var outages []outage
	res := drill(t, "webhook process SIGKILLed (each replica in turn)", func(t *testing.T) {
		for _, p := range readyWebhookPods(t) {
			restarts := p.Status.ContainerStatuses[0].RestartCount
			o := outage{what: "pod " + p.Name + "'s process killed", from: time.Now()}
			if err := testEnv.SignalContainer(testContext(t), &p, "webhook", "SIGKILL"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Minute, "webhook pod "+p.Name+" restarted and ready", func(ctx context.Context) (bool, error) {
				now, err := client().CoreV1().Pods(env.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				return now.Status.ContainerStatuses[0].RestartCount > restarts && env.PodReady(now), nil
			})
			o.to = time.Now()
			outages = append(outages, o)
		}
	})
	// SIGKILL leaves the process no chance to drain: a call in flight on the
	// killed replica's connection, or one dialled to its closed port before
	// the kubelet notices the death and the endpoint goes, fails
	// (failurePolicy Fail, and the API server does not retry a POST). How
	// many is the request rate times that delay (the kubelet's relist, a
	// second or more on a loaded machine), so this drill does not count
	// them: it requires that every one was sent while a killed replica was
	// not back yet; docs/e2e.md has the figures.
	requireFailuresOnlyDuring(t, res, outages)
}

// outage is the time from just before a replica was killed or deleted until
// the webhook was whole again.
type outage struct {
	what     string
	from, to time.Time
}

// inFlight is how long before an outage a failed call may have been sent:
// one in flight on the killed replica's connection fails too.
const inFlight = time.Second

// requireFailuresOnlyDuring allows creates to fail only by a failed call of
// the webhook (no other error, no create without the injection) sent during
// one of the outages, and none to miss the API server: after each outage
// the webhook answers every call again.
func requireFailuresOnlyDuring(t *testing.T, res loadResult, outages []outage) {
	t.Helper()
	if res.unreachable > 0 {
		t.Errorf("%d creates found no API server: %s", res.unreachable, res)
	}
	for _, sent := range res.failedSent {
		during := false
		for _, o := range outages {
			if !sent.Before(o.from.Add(-inFlight)) && !sent.After(o.to) {
				during = true
			}
		}
		if !during {
			t.Errorf("a create sent at %s failed outside every outage %v: %s", sent.Format(time.StampMilli), outages, res)
		}
	}
	for _, o := range outages {
		t.Logf("outage: %s, %s to %s (%s)", o.what, o.from.Format(time.StampMilli), o.to.Format(time.StampMilli), o.to.Sub(o.from).Round(time.Millisecond))
	}
	for msg := range res.errors {
		if !strings.Contains(msg, `failed calling webhook "pods.gpu-injector.io"`) {
			t.Errorf("a create failed otherwise than by a failed webhook call: %s", msg)
		}
	}
	if res.sent < int(drillDuration().Seconds())*loadRate/2 {
		t.Errorf("only %d creates were sent; the load did not run", res.sent)
	}
}

// TestDrillDrain: kubectl drain of the node that holds both replicas, with
// the chart's PodDisruptionBudget (minAvailable 1): the first eviction
// passes, the second is refused while the first one's replacement cannot
// schedule on the cordoned node, and one replica serves throughout.
func TestDrillDrain(t *testing.T) {
	node := testEnv.KubeletNode().Name
	t.Cleanup(func() {
		if _, stderr, err := kubectl(t, "", "uncordon", node); err != nil {
			t.Errorf("kubectl uncordon: %v: %s", err, stderr)
		}
	})
	var drainErr string
	res := drill(t, "kubectl drain of the webhook's node, PDB minAvailable 1", func(t *testing.T) {
		_, stderr, err := kubectl(t, "", "drain", node, "--pod-selector="+env.WebhookSelector, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=25s")
		if err == nil {
			t.Errorf("kubectl drain evicted both replicas of one node; the PodDisruptionBudget should have refused the second")
		}
		drainErr = stderr
		if n := len(readyWebhookPods(t)); n != 1 {
			t.Errorf("%d webhook pods ready while drained, want 1", n)
		}
		if _, stderr, err := kubectl(t, "", "uncordon", node); err != nil {
			t.Fatalf("kubectl uncordon: %v: %s", err, stderr)
		}
		waitWebhookReady(t)
	})
	if !strings.Contains(drainErr, "disruption budget") {
		t.Errorf("kubectl drain said:\n%s\nwant it to name the disruption budget", drainErr)
	}
	requireNoFailedAdmission(t, res)
}

// servedCert is the leaf certificate a webhook pod serves now.
func servedCert(ctx context.Context, pod *corev1.Pod) ([]byte, error) {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // we compare the served bytes, nothing is trusted
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(pod.Status.PodIP, "9443"))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0].Raw, nil
}

func pemDER(t *testing.T, data []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("no PEM block in %q", data)
	}
	return b.Bytes
}

// TestDrillCertRotation: the self-mode CA and serving certificate are
// rotated early (the CA is removed from the Secret, which makes
// cert-controller issue a new CA and pair at once, as at the end of the CA's
// life). The caBundle must change to the new CA and both replicas must serve
// the new pair, with no admission failing across the switch.
func TestDrillCertRotation(t *testing.T) {
	secretName := env.Release + "-webhook-tls"
	secrets := client().CoreV1().Secrets(env.Namespace)
	old, err := secrets.Get(testContext(t), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldCA, oldCrt := old.Data["ca.crt"], old.Data["tls.crt"]
	if len(oldCA) == 0 || len(oldCrt) == 0 {
		t.Fatalf("secret %s holds no certificate: keys %v", secretName, keys(old.Data))
	}
	var newSecret *corev1.Secret
	var rotated, served time.Time
	res := drill(t, "certificate rotation, self mode, CA and pair", func(t *testing.T) {
		rotated = time.Now()
		patch := `[{"op":"remove","path":"/data/ca.crt"},{"op":"remove","path":"/data/ca.key"}]`
		if _, err := secrets.Patch(testContext(t), secretName, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("failed to remove the CA from the Secret: %v", err)
		}
		waitFor(t, time.Minute, "a new CA and pair in the Secret", func(ctx context.Context) (bool, error) {
			s, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			newSecret = s
			return len(s.Data["ca.crt"]) > 0 && string(s.Data["ca.crt"]) != string(oldCA) && len(s.Data["tls.crt"]) > 0 && string(s.Data["tls.crt"]) != string(oldCrt), nil
		})
		waitFor(t, time.Minute, "the caBundle to be the new CA", func(ctx context.Context) (bool, error) {
			mwc, err := client().AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, env.Release, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			s, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			newSecret = s
			return string(mwc.Webhooks[0].ClientConfig.CABundle) == string(s.Data["ca.crt"]), nil
		})
		waitFor(t, 2*time.Minute, "both replicas to serve the new pair", func(ctx context.Context) (bool, error) {
			s, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			want := pemDER(t, s.Data["tls.crt"])
			pods := readyWebhookPods(t)
			if len(pods) != 2 {
				return false, nil
			}
			for i := range pods {
				got, err := servedCert(ctx, &pods[i])
				if err != nil || string(got) != string(want) {
					return false, nil
				}
			}
			served = time.Now()
			return true, nil
		})
	})
	t.Logf("CA rotated: %d -> %d bytes of PEM", len(oldCA), len(newSecret.Data["ca.crt"]))
	// The API server trusts one CA at a time (cert-controller writes only the
	// new one into the caBundle), and each replica loads the new pair a
	// moment before or after the API server switches: a connection opened to
	// a replica in between fails its handshake (docs/webhook.md,
	// Certificates). That is one admission per replica at most, inside the
	// rotation and with that very error; a replica slow to load the pair
	// fails every connection until it does, and fails the drill.
	switchover := 0
	for _, c := range res.calls {
		if c.failed && !c.sent.Before(rotated) && c.sent.Before(served) &&
			strings.Contains(c.err, `x509: certificate signed by unknown authority`) &&
			strings.Contains(c.err, `while trying to verify candidate authority certificate "gpu-injector-ca"`) {
			switchover++
		}
	}
	if switchover > 0 && switchover <= len(readyWebhookPods(t)) {
		t.Logf("%d admissions failed the TLS handshake while the API server and the replicas switched CA", switchover)
		res.failed -= switchover
	}
	requireNoFailedAdmission(t, res)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDrillHelmUpgrade: helm upgrade with a configuration change (one more
// excluded namespace) rolls both workloads through the checksum annotation;
// then a second upgrade rolls them back to the installed values.
func TestDrillHelmUpgrade(t *testing.T) {
	upgrade := func(t *testing.T, extra ...string) {
		if err := testEnv.UpgradeChart(testContext(t), extra...); err != nil {
			t.Fatal(err)
		}
	}
	checksum := func(t *testing.T) string {
		d, err := client().AppsV1().Deployments(env.Namespace).Get(testContext(t), env.WebhookDeployment, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations["checksum/config"]
	}
	before := checksum(t)
	var changed string
	t.Cleanup(func() {
		if checksum(t) != before {
			upgrade(t)
		}
	})
	res := drill(t, "helm upgrade changing the configuration, and back", func(t *testing.T) {
		upgrade(t, "config.excludedNamespaces={kube-system,kube-public,kube-node-lease,e2e-drill-excluded}")
		changed = checksum(t)
		upgrade(t)
	})
	if changed == before || checksum(t) != before {
		t.Errorf("checksum/config %s -> %s -> %s: want a change and the original back", before, changed, checksum(t))
	}
	requireNoFailedAdmission(t, res)
}

// gpuInjectorKeys are the Node's gpu-injector.io labels and annotations.
func gpuInjectorKeys(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		if strings.HasPrefix(k, layout.Prefix) {
			out["label "+k] = v
		}
	}
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, layout.Prefix) {
			out["annotation "+k] = v
		}
	}
	return out
}

// TestDrillProbeRestart: the probe pod on the kubelet node is deleted (the
// DaemonSet makes a new one), then its new process is killed (the kubelet
// restarts it). The Node's layout must stay as it is all along, and a probe
// that finds what the Node already says must not write to it.
func TestDrillProbeRestart(t *testing.T) {
	kn := testEnv.KubeletNode()
	nodeWrites := func() int {
		ws, err := testEnv.NodeWrites(testEnv.ProbeUser())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, w := range ws {
			if w.Node == kn.Name {
				n++
			}
		}
		return n
	}
	node, err := client().CoreV1().Nodes().Get(testContext(t), kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := gpuInjectorKeys(node)
	writesBefore := nodeWrites()

	// Watch the Node's layout keys for the whole drill.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	var changes []string
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watchCtx.Err() == nil {
			n, err := client().CoreV1().Nodes().Get(watchCtx, kn.Name, metav1.GetOptions{})
			if err == nil {
				if got := gpuInjectorKeys(n); fmt.Sprint(got) != fmt.Sprint(want) {
					changes = append(changes, fmt.Sprint(got))
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	res := drill(t, "probe pod deleted, then its process killed", func(t *testing.T) {
		p, err := testEnv.WaitProbePod(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := kubectl(t, "", "-n", env.Namespace, "delete", "pod", p.Name); err != nil {
			t.Fatalf("kubectl delete: %v: %s", err, stderr)
		}
		var fresh *corev1.Pod
		waitFor(t, 2*time.Minute, "a new probe pod, ready", func(ctx context.Context) (bool, error) {
			np, err := testEnv.ProbePod(ctx)
			if err != nil || np.Name == p.Name {
				return false, nil
			}
			fresh = np
			return env.PodReady(np), nil
		})
		restarts := fresh.Status.ContainerStatuses[0].RestartCount
		if err := testEnv.SignalContainer(testContext(t), fresh, "nodeprobe", "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the probe container restarted and ready", func(ctx context.Context) (bool, error) {
			np, err := client().CoreV1().Pods(env.Namespace).Get(ctx, fresh.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			return np.Status.ContainerStatuses[0].RestartCount > restarts && env.PodReady(np), nil
		})
	})
	stopWatch()
	<-watched
	writes := nodeWrites() - writesBefore
	t.Logf("probe writes to %s during the drill: %d", kn.Name, writes)
	if len(changes) > 0 {
		t.Errorf("the Node's gpu-injector.io keys changed during the drill (want %v); seen: %v", want, changes)
	}
	if writes != 0 {
		t.Errorf("the restarted probes wrote %d times to %s, whose layout did not change; want 0", writes, kn.Name)
	}
	requireNoFailedAdmission(t, res)
}

// TestDrillAPIServerRestart: kube-apiserver is stopped (SIGTERM, as a
// control-plane upgrade does) and started again under the running webhook.
// Creates sent while it is down find no API server (counted apart). Once it
// is back, what a user sees is measured, not only the outage: every create
// it answers must be mutated and none may wait past the webhook's timeout,
// and the API server must reach every replica again (bursts of creates until
// each replica's injected count has grown; how long that took is logged).
// The webhook's /readyz is sampled throughout. The webhook must reconnect: a
// Node added afterwards reaches every replica's cache.
func TestDrillAPIServerRestart(t *testing.T) {
	pods := readyWebhookPods(t)
	type sample struct {
		at    time.Time
		ready []bool
	}
	var samples []sample
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	hc := &http.Client{Timeout: time.Second}
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			s := sample{at: time.Now()}
			for _, p := range pods {
				resp, err := hc.Get("http://" + net.JoinHostPort(p.Status.PodIP, "8081") + "/readyz")
				ok := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					resp.Body.Close()
				}
				s.ready = append(s.ready, ok)
			}
			samples = append(samples, s)
			time.Sleep(200 * time.Millisecond)
		}
	}()
	burstNS := newNamespace(t, true)
	var down, up time.Time
	var everyReplica time.Duration
	var bursts int
	res := drill(t, "kube-apiserver restarted (5 s down) under the webhook", func(t *testing.T) {
		down = time.Now()
		if err := testEnv.Cluster.RestartAPIServer(testContext(t), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		up = time.Now()
		everyReplica, bursts = burstUntilEveryReplica(t, burstNS, pods, hc)
	})
	stopSampling()
	<-sampled
	notReady := 0
	for _, s := range samples {
		for _, r := range s.ready {
			if !r {
				notReady++
			}
		}
	}
	t.Logf("API server down %s..%s (%s); webhook /readyz samples: %d, not ready: %d", down.Format("15:04:05.000"), up.Format("15:04:05.000"),
		up.Sub(down).Round(time.Millisecond), len(samples)*len(pods), notReady)
	if res.failed > 0 {
		t.Errorf("%d admissions failed, want 0 (creates that found no API server: %d): %s", res.failed, res.unreachable, res)
	}

	// After the restart: every answer in time, every replica answering.
	after, slowest := 0, time.Duration(0)
	for _, c := range res.calls {
		if c.sent.Before(up) {
			continue
		}
		after++
		slowest = max(slowest, c.latency)
		if c.latency >= webhookTimeout {
			t.Errorf("a create sent %s after the API server was back took %s, the webhook's timeout or more: the API server's call to the webhook hung",
				c.sent.Sub(up).Round(time.Millisecond), c.latency.Round(time.Millisecond))
		}
	}
	t.Logf("after the restart: %d creates, slowest %s", after, slowest.Round(time.Millisecond))
	if after == 0 {
		t.Errorf("no create was sent after the API server was back")
	}
	t.Logf("every replica answered the API server's admissions %s after its return (%d bursts)", everyReplica.Round(time.Millisecond), bursts)

	// Reconnected and resynced: a new Node with the k80's layout reaches every replica.
	src, err := client().CoreV1().Nodes().Get(testContext(t), "ubuntu-k80", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fresh := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "drill-resync", Labels: src.Labels, Annotations: src.Annotations}}
	fresh.Labels = map[string]string{}
	for k, v := range src.Labels {
		fresh.Labels[k] = v
	}
	fresh.Labels[env.LabelAccelerator] = "drill-resync"
	fresh.Labels["kubernetes.io/hostname"] = "drill-resync"
	if _, err := client().CoreV1().Nodes().Create(testContext(t), fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().Nodes().Delete(context.Background(), "drill-resync", metav1.DeleteOptions{})
	})
	// Ready and untainted, as the API-only nodes: the webhook counts only those.
	waitFor(t, apiTimeout, "drill-resync ready and untainted", func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, "drill-resync", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if len(n.Spec.Taints) > 0 {
			n.Spec.Taints = nil
			_, err := client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return false, ignoreConflict(err)
		}
		if len(n.Status.Conditions) == 0 {
			n.Status = *src.Status.DeepCopy()
			_, err := client().CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return false, ignoreConflict(err)
		}
		return true, nil
	})
	fp := src.Labels[layout.LabelFingerprint]
	waitFor(t, time.Minute, "every webhook replica to count 2 nodes of the k80 layout", func(ctx context.Context) (bool, error) {
		urls, err := testEnv.WebhookMetricsURLs(ctx)
		if err != nil || len(urls) < 2 {
			return false, nil
		}
		for _, u := range urls {
			resp, err := hc.Get(u)
			if err != nil {
				return false, nil
			}
			body := new(strings.Builder)
			_, _ = fmt.Fprint(body, readAll(resp))
			if !strings.Contains(body.String(), `gpu_injector_layout_nodes{fingerprint="`+fp+`"} 2`) {
				return false, nil
			}
		}
		return true, nil
	})

	// The controller manager came back too: its informers reconnect on
	// their own backoff, which after an outage this long can leave a new
	// namespace without its default service account for a minute, and the
	// tests after this one install into new namespaces.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "drill-controllers-"}}
	created, err := client().CoreV1().Namespaces().Create(testContext(t), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().Namespaces().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	start := time.Now()
	waitDefaultServiceAccount(t, created.Name, 2*time.Minute)
	t.Logf("the controller manager gave a new namespace its default service account %s after it was created, %s after the API server's return",
		time.Since(start).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
}

// burstUntilEveryReplica sends bursts of concurrent GPU pod creates (dry
// runs) until every webhook replica's injected count has grown, and returns
// how long that took and how many bursts it needed. A steady load does not
// show that every replica is reached: the API server reuses an idle
// keep-alive connection, so one replica may take every call. Concurrent calls
// make it dial more, and each dial goes to a random ready endpoint. Every
// create must be mutated, within the webhook's timeout.
func burstUntilEveryReplica(t *testing.T, ns string, pods []corev1.Pod, hc *http.Client) (time.Duration, int) {
	t.Helper()
	start := time.Now()
	base := make([]float64, len(pods))
	for i, p := range pods {
		if base[i] = injectedCount(hc, p); base[i] < 0 {
			t.Fatalf("failed to read replica %s's metrics", p.Name)
		}
	}
	pod := gpuPod("", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: testEnv.Node("ubuntu-k80").Accelerator}})
	pod.GenerateName = "burst-"
	const width = 16
	for burst := 1; ; burst++ {
		var wg sync.WaitGroup
		errs := make(chan error, width)
		for range width {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent := time.Now()
				p, err := client().CoreV1().Pods(ns).Create(context.Background(), pod.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				took := time.Since(sent)
				switch {
				case took >= webhookTimeout:
					errs <- fmt.Errorf("a create sent %s after the API server was back took %s (%v)", sent.Sub(start).Round(time.Millisecond), took.Round(time.Millisecond), err)
				case err != nil:
					errs <- fmt.Errorf("a create sent %s after the API server was back failed: %w", sent.Sub(start).Round(time.Millisecond), err)
				case p.Annotations[layout.AnnotationInjected] == "":
					errs <- fmt.Errorf("a create sent %s after the API server was back was admitted without the injection", sent.Sub(start).Round(time.Millisecond))
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		waiting := 0
		for i, p := range pods {
			if injectedCount(hc, p) <= base[i] {
				waiting++
			}
		}
		if waiting == 0 {
			return time.Since(start), burst
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("after %d bursts of %d creates in %s, %d of %d replicas had injected no pod since the API server was back", burst, width, time.Since(start).Round(time.Millisecond), waiting, len(pods))
		}
	}
}

// webhookTimeout is the chart's webhook.timeoutSeconds: an API server call
// to the webhook that takes this long has hung.
const webhookTimeout = 5 * time.Second

// webhookMetric is the value of a webhook pod's metric of no labels, or -1
// when its metrics cannot be read.
func webhookMetric(hc *http.Client, p corev1.Pod, name string) float64 {
	resp, err := hc.Get("http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/metrics")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(readAll(resp), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// injectedCount is a webhook pod's gpu_injector_pods_injected_total.
func injectedCount(hc *http.Client, p corev1.Pod) float64 {
	return webhookMetric(hc, p, "gpu_injector_pods_injected_total")
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
