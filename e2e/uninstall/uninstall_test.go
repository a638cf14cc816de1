//go:build e2e

// Package uninstall is the end of a release's life, in an environment of its
// own (helm uninstall would leave nothing for a shared suite's later
// tests): the chart rendered for OpenShift accepted by a real API server
// that serves SecurityContextConstraints, helm test passing and failing,
// and helm uninstall leaving the Nodes as they were before gpu-injector.
// docs/e2e.md says what each test proves.
package uninstall

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

var testEnv *env.Env

// Pinning by pool, so that the webhook keeps a pool memory for the uninstall
// to remove; the suite's runtime has no NRI (as the main suite).
func TestMain(m *testing.M) {
	os.Exit(env.RunSuite(m, "uninstall", env.Options{
		ChartValues:   []string{"runtimeInjection.enabled=false", "config.pinning.nodeLabels={" + env.LabelAccelerator + "}"},
		KeepOnFailure: true,
	}, func(e *env.Env) { testEnv = e }))
}

func client() kubernetes.Interface { return testEnv.Clientset }

func poll(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, cond); err != nil {
		t.Fatalf("failed waiting %s for %s: %v", timeout, what, err)
	}
}

// sccCRD serves security.openshift.io/v1 SecurityContextConstraints as
// OpenShift's API defines them (openshift/api, security/v1/types.go: the
// fields, their types, which are nullable and which required), so that a
// field the chart invents or misspells is refused under strict validation.
const sccCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: securitycontextconstraints.security.openshift.io
spec:
  group: security.openshift.io
  scope: Cluster
  names: {kind: SecurityContextConstraints, listKind: SecurityContextConstraintsList, plural: securitycontextconstraints, singular: securitycontextconstraints}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [allowHostDirVolumePlugin, allowHostIPC, allowHostNetwork, allowHostPID, allowHostPorts, allowPrivilegedContainer,
          allowedCapabilities, defaultAddCapabilities, priority, readOnlyRootFilesystem, requiredDropCapabilities, volumes]
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          priority: {type: integer, format: int32, nullable: true}
          allowPrivilegedContainer: {type: boolean}
          defaultAddCapabilities: {type: array, nullable: true, items: {type: string}}
          requiredDropCapabilities: {type: array, nullable: true, items: {type: string}}
          allowedCapabilities: {type: array, nullable: true, items: {type: string}}
          allowHostDirVolumePlugin: {type: boolean}
          volumes: {type: array, nullable: true, items: {type: string}}
          allowedFlexVolumes: {type: array, nullable: true, items: {type: object, required: [driver], properties: {driver: {type: string}}}}
          allowHostNetwork: {type: boolean}
          allowHostPorts: {type: boolean}
          allowHostPID: {type: boolean}
          allowHostIPC: {type: boolean}
          defaultAllowPrivilegeEscalation: {type: boolean, nullable: true}
          allowPrivilegeEscalation: {type: boolean, nullable: true}
          seLinuxContext:
            type: object
            nullable: true
            properties:
              type: {type: string}
              seLinuxOptions: {type: object, properties: {user: {type: string}, role: {type: string}, type: {type: string}, level: {type: string}}}
          runAsUser:
            type: object
            nullable: true
            properties:
              type: {type: string}
              uid: {type: integer, format: int64}
              uidRangeMin: {type: integer, format: int64}
              uidRangeMax: {type: integer, format: int64}
          supplementalGroups: &groups
            type: object
            nullable: true
            properties:
              type: {type: string}
              ranges: {type: array, items: {type: object, properties: {min: {type: integer, format: int64}, max: {type: integer, format: int64}}}}
          fsGroup: *groups
          readOnlyRootFilesystem: {type: boolean}
          users: {type: array, nullable: true, items: {type: string}}
          groups: {type: array, nullable: true, items: {type: string}}
          seccompProfiles: {type: array, nullable: true, items: {type: string}}
          allowedUnsafeSysctls: {type: array, nullable: true, items: {type: string}}
          forbiddenSysctls: {type: array, nullable: true, items: {type: string}}
`

// TestOpenShiftChartAccepted: with the SCC API served, the chart rendered for
// OpenShift (as helm install renders it there) is accepted object by object
// by the API server, dry run with strict field validation, and the SCC it
// would store is the one rendered: nothing pruned, nothing defaulted wider.
func TestOpenShiftChartAccepted(t *testing.T) {
	ctx := context.Background()
	var crd map[string]any
	if err := yaml.Unmarshal([]byte(sccCRD), &crd); err != nil {
		t.Fatal(err)
	}
	if err := testEnv.Applier.Apply(ctx, &unstructured.Unstructured{Object: crd}, false); err != nil {
		t.Fatalf("failed to serve SecurityContextConstraints: %v", err)
	}
	objs, err := env.RenderChartFor(ctx, testEnv.RepoRoot, testEnv.Helm, []string{"security.openshift.io/v1"}, testEnv.HelmValues()...)
	if err != nil {
		t.Fatal(err)
	}
	var scc *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "SecurityContextConstraints" {
			scc = o
		}
	}
	if scc == nil {
		t.Fatal("the chart rendered for OpenShift has no SecurityContextConstraints")
	}
	// The CRD is served once the API server has established it.
	var stored *unstructured.Unstructured
	poll(t, 30*time.Second, "the SCC API", func(ctx context.Context) (bool, error) {
		stored, err = testEnv.Applier.DryRunCreateStrict(ctx, scc)
		return err == nil, nil
	})
	for k, v := range scc.Object {
		if k != "metadata" && !reflect.DeepEqual(normalize(stored.Object[k]), normalize(v)) {
			t.Errorf("SCC %s: rendered %v, the API server would store %v", k, v, stored.Object[k])
		}
	}
	checked := 0
	for _, o := range objs {
		// The release's objects exist: applied over them, as helm upgrade would
		// change them; the workloads replaced, so that a field the OpenShift
		// rendering leaves out (the probe's recursiveReadOnly host root) goes
		// as helm's patch removes it; the SCC and its Role are new: created, as
		// helm install would.
		dryRun := testEnv.Applier.DryRunStrict
		switch o.GetKind() {
		case "SecurityContextConstraints":
			dryRun = testEnv.Applier.DryRunCreateStrict
		case "DaemonSet", "Deployment":
			dryRun = testEnv.Applier.DryRunReplaceStrict
		}
		if _, err := dryRun(ctx, o); err != nil {
			t.Errorf("the API server refuses %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		checked++
	}
	t.Logf("%d objects of the OpenShift rendering accepted (dry run, strict)", checked)
	// The same API server refuses an SCC field that does not exist: the
	// check above can fail.
	bad := scc.DeepCopy()
	bad.Object["allowHostPaths"] = []any{"/"}
	if _, err := testEnv.Applier.DryRunCreateStrict(ctx, bad); err == nil || !strings.Contains(err.Error(), "allowHostPaths") {
		t.Errorf("an SCC with an unknown field was accepted (%v)", err)
	}
}

func normalize(v any) any {
	b, _ := yaml.Marshal(v)
	var out any
	_ = yaml.Unmarshal(b, &out)
	return out
}

var succeeded = regexp.MustCompile(`Phase:\s+Succeeded`)

// TestHelmTest: helm test passes against the running release, twice in a row
// (the kept pods of the first are replaced), prints the webhook's answer and
// precheck's report with --logs, and fails while no webhook replica answers.
func TestHelmTest(t *testing.T) {
	ctx := context.Background()
	for i := range 2 {
		out, err := testEnv.HelmCommand(ctx, "test", env.Release, "--namespace", env.Namespace, "--timeout", "3m", "--logs")
		if err != nil {
			t.Fatalf("helm test, run %d: %v", i+1, err)
		}
		if !succeeded.MatchString(out) || !strings.Contains(out, "outcome: injected") {
			t.Fatalf("helm test, run %d, did not report the injected pod:\n%s", i+1, out)
		}
		if !strings.Contains(out, "GPU NODES") || !strings.Contains(out, "WEBHOOK        ok: ") {
			t.Fatalf("helm test, run %d, did not print precheck's report:\n%s", i+1, out)
		}
		if i == 0 {
			t.Logf("helm test:\n%s", out)
		}
	}
	if err := testEnv.ScaleWebhook(ctx, 0); err != nil {
		t.Fatal(err)
	}
	poll(t, 2*time.Minute, "the webhook's pods to go", func(ctx context.Context) (bool, error) {
		pods, err := testEnv.WebhookPods(ctx)
		return err == nil && len(pods) == 0, nil
	})
	out, err := testEnv.HelmCommand(ctx, "test", env.Release, "--namespace", env.Namespace, "--timeout", "3m", "--logs")
	// helm runs the test pods one by one and stops at the first that fails: the
	// dry-run pod or precheck, whichever helm starts first, names the webhook.
	if err == nil || !(strings.Contains(out, "outcome: unreachable") || strings.Contains(out, "WEBHOOK        failed: the API server CANNOT REACH the webhook")) {
		t.Errorf("helm test with no webhook: %v\n%s\nwant a failure naming the unreachable webhook", err, out)
	}
	if err := testEnv.ScaleWebhook(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := testEnv.WaitWebhookReady(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUninstall: helm uninstall removes every gpu-injector.io/ label and
// annotation and the GPUDriverWedged condition from every Node, the pool
// memory, the helm test's kept pod and namespace, and every object of the
// release.
func TestUninstall(t *testing.T) {
	ctx := context.Background()
	nodes, err := client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	published := 0
	for _, n := range nodes.Items {
		if len(ours(n)) > 0 {
			published++
		}
	}
	if published < 2 {
		t.Fatalf("%d nodes carry gpu-injector's keys before the uninstall: the test would prove nothing", published)
	}
	// A wedged node's condition, as the probe writes it.
	wedged := testEnv.Nodes[len(testEnv.Nodes)-1].Name
	cond := `{"status":{"conditions":[{"type":"GPUDriverWedged","status":"True","reason":"NVMLTimeout","message":"nvmlInit did not return"}]}}`
	if _, err := client().CoreV1().Nodes().Patch(ctx, wedged, types.StrategicMergePatchType, []byte(cond), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("failed to mark %s wedged: %v", wedged, err)
	}
	pools := env.Release + "-pools"
	poll(t, time.Minute, "the webhook's pool memory", func(ctx context.Context) (bool, error) {
		_, cmErr := client().CoreV1().ConfigMaps(env.Namespace).Get(ctx, pools, metav1.GetOptions{})
		_, leaseErr := client().CoordinationV1().Leases(env.Namespace).Get(ctx, pools, metav1.GetOptions{})
		return cmErr == nil && leaseErr == nil, nil
	})
	// The API-only nodes' probes are local processes here, pods of the
	// DaemonSet in a real cluster: the hook cannot stop them.
	if err := testEnv.StopLocalProbes(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := testEnv.HelmCommand(ctx, "uninstall", env.Release, "--namespace", env.Namespace, "--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	t.Logf("helm uninstall took %s:\n%s", time.Since(start).Round(time.Second), out)

	nodes, err = client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if keys := ours(n); len(keys) > 0 {
			t.Errorf("node %s keeps %v", n.Name, keys)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "GPUDriverWedged" {
				t.Errorf("node %s keeps condition %s", n.Name, c.Type)
			}
		}
	}
	if _, err := client().CoreV1().ConfigMaps(env.Namespace).Get(ctx, pools, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s: %v, want it deleted", pools, err)
	}
	if _, err := client().CoordinationV1().Leases(env.Namespace).Get(ctx, pools, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Lease %s: %v, want it deleted", pools, err)
	}
	// The helm test's pods are hooks, which helm keeps: the cleanup deletes them.
	for _, pod := range []string{env.Release + "-test", env.Release + "-precheck"} {
		if _, err := client().CoreV1().Pods(env.Namespace).Get(ctx, pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the helm test's pod %s: %v, want it deleted", pod, err)
		}
	}
	poll(t, 2*time.Minute, "the helm test's namespace to go", func(ctx context.Context) (bool, error) {
		_, err := client().CoreV1().Namespaces().Get(ctx, env.Release+"-test", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	checkNothingLeft(t)
}

// ours are the node's labels and annotations under gpu-injector.io/.
func ours(n corev1.Node) []string {
	var keys []string
	for k := range n.Labels {
		if strings.HasPrefix(k, layout.Prefix) {
			keys = append(keys, "label "+k)
		}
	}
	for k := range n.Annotations {
		if strings.HasPrefix(k, layout.Prefix) {
			keys = append(keys, "annotation "+k)
		}
	}
	return keys
}

// checkNothingLeft: no object of the release's, hooks included, remains.
func checkNothingLeft(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + env.Release}
	c := client()
	var left []string
	add := func(kind string, n int, err error) {
		if err != nil {
			t.Errorf("failed to list %s: %v", kind, err)
		}
		if n > 0 {
			left = append(left, fmt.Sprintf("%d %s", n, kind))
		}
	}
	cr, err := c.RbacV1().ClusterRoles().List(ctx, sel)
	add("ClusterRoles", len(cr.Items), err)
	crb, err := c.RbacV1().ClusterRoleBindings().List(ctx, sel)
	add("ClusterRoleBindings", len(crb.Items), err)
	mwc, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, sel)
	add("MutatingWebhookConfigurations", len(mwc.Items), err)
	vap, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, sel)
	add("ValidatingAdmissionPolicies", len(vap.Items), err)
	sa, err := c.CoreV1().ServiceAccounts(env.Namespace).List(ctx, sel)
	add("ServiceAccounts", len(sa.Items), err)
	roles, err := c.RbacV1().Roles(env.Namespace).List(ctx, sel)
	add("Roles", len(roles.Items), err)
	jobs, err := c.BatchV1().Jobs(env.Namespace).List(ctx, sel)
	add("Jobs", len(jobs.Items), err)
	cms, err := c.CoreV1().ConfigMaps(env.Namespace).List(ctx, sel)
	add("ConfigMaps", len(cms.Items), err)
	secrets, err := c.CoreV1().Secrets(env.Namespace).List(ctx, sel)
	add("Secrets", len(secrets.Items), err)
	ds, err := c.AppsV1().DaemonSets(env.Namespace).List(ctx, sel)
	add("DaemonSets", len(ds.Items), err)
	deps, err := c.AppsV1().Deployments(env.Namespace).List(ctx, sel)
	add("Deployments", len(deps.Items), err)
	if len(left) > 0 {
		t.Errorf("helm uninstall left %v", left)
	}
}
