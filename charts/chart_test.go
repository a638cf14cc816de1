// Package charts_test renders the gpu-injector chart with the real helm binary and
// checks what it would install: security properties of every workload, the webhook
// configuration, RBAC scope, and that the rendered config file is one the binary accepts.
package charts_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

const (
	chartDir    = "gpu-injector"
	releaseName = "gpu-injector"
	namespace   = "gpu-injector"
	fullname    = "gpu-injector"
	probeSA     = "gpu-injector-nodeprobe"
	webhookSA   = "gpu-injector-webhook"
	certSecret  = "gpu-injector-webhook-tls"
	webhookSvc  = "gpu-injector-webhook"
	hookName    = "gpu-injector-validate"
	// testNamespace holds the helm test's objects; cleanupName is the
	// uninstall hook's.
	testNamespace = "gpu-injector-test"
	cleanupName   = "gpu-injector-cleanup"
	// precheckName is the helm test's precheck pod, its account and roles.
	precheckName = "gpu-injector-precheck"
)

// helmBinary finds helm where the repository's tool cache puts it; a missing helm is
// a failure, not a skip, so that a green run always means the chart was rendered.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	cache, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	h := filepath.Join(cache, "helm-"+cluster.HelmVersion, "helm")
	if _, err := os.Stat(h); err != nil {
		t.Fatalf("helm not found at %s (%v): run hack/tools.sh helm, or set HELM", h, err)
	}
	return h
}

// renderOpts carries --api-versions only where a test sets apiVersions: helm template
// without a cluster knows few served kinds, and the chart must render as it does for
// the user who runs it so.
type renderOpts struct {
	kubeVersion string
	// apiVersions are served group/versions as helm install learns them from the cluster.
	apiVersions []string
	set         []string
	// setString are --set-string values: strings, never booleans or numbers.
	setString []string
	// files are values files (-f), applied before set as helm does.
	files []string
}

// rendered is the chart's output, one object per document.
type rendered struct {
	objects []*unstructured.Unstructured
}

func helmTemplate(t *testing.T, o renderOpts) ([]byte, error) {
	t.Helper()
	args := []string{"template", releaseName, chartDir, "--namespace", namespace, "--kube-version", o.kubeVersion}
	args = append(args, o.flags()...)
	return runHelm(t, args)
}

// flags are the helm arguments of o besides the release, chart and kube version.
func (o renderOpts) flags() []string {
	var args []string
	for _, a := range o.apiVersions {
		args = append(args, "--api-versions", a)
	}
	for _, f := range o.files {
		args = append(args, "--values", f)
	}
	for _, s := range o.set {
		args = append(args, "--set", s)
	}
	for _, s := range o.setString {
		args = append(args, "--set-string", s)
	}
	return args
}

func runHelm(t *testing.T, args []string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("failed to run helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// clusterKinds are served kinds as helm install, upgrade and template --validate list
// them from any cluster the chart meets (group/version/Kind): with them, the chart renders
// as it does for an install, which refuses an API server below its floor.
var clusterKinds = []string{"admissionregistration.k8s.io/v1/MutatingWebhookConfiguration"}

// onCluster is o as helm install renders it on a cluster of o's version.
func onCluster(o renderOpts) renderOpts {
	o.apiVersions = append(slices.Clone(o.apiVersions), clusterKinds...)
	return o
}

// checkRefused: the chart refuses to install on a Kubernetes below 1.30, naming the
// floor, the cluster's version and the reason.
func checkRefused(t *testing.T, out []byte, err error, kubeVersion string) {
	t.Helper()
	if err == nil {
		t.Fatalf("helm rendered the chart for an install on Kubernetes %s, below 1.30:\n%.400s", kubeVersion, out)
	}
	want := "gpu-injector needs Kubernetes 1.30 or later, and this cluster runs v" + strings.TrimPrefix(kubeVersion, "v") +
		": the chart's ValidatingAdmissionPolicy needs admissionregistration.k8s.io/v1, GA in 1.30"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("helm refused Kubernetes %s, but not with the chart's floor:\n got %v\nwant %q", kubeVersion, err, want)
	}
}

func render(t *testing.T, o renderOpts) rendered {
	t.Helper()
	out, err := helmTemplate(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return parseRendered(t, out)
}

func parseRendered(t *testing.T, out []byte) rendered {
	t.Helper()
	var r rendered
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("failed to parse helm output: %v\n%s", err, out)
		}
		if len(obj) == 0 {
			continue
		}
		r.objects = append(r.objects, &unstructured.Unstructured{Object: obj})
	}
	if len(r.objects) == 0 {
		t.Fatalf("helm rendered no objects")
	}
	return r
}

func (r rendered) all(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r rendered) get(kind, name string) *unstructured.Unstructured {
	for _, o := range r.all(kind) {
		if o.GetName() == name {
			return o
		}
	}
	return nil
}

// typed converts into the API type, refusing unknown fields: a misspelt field in a
// template would otherwise be dropped silently by the API server.
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	if u == nil {
		t.Fatalf("object not rendered")
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s does not convert to its API type: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func mustGet[T any](t *testing.T, r rendered, kind, name string) *T {
	t.Helper()
	u := r.get(kind, name)
	if u == nil {
		t.Fatalf("%s %s not rendered; have %v", kind, name, r.names())
	}
	return typed[T](t, u)
}

func (r rendered) names() []string {
	var out []string
	for _, o := range r.objects {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

func (r rendered) podSpecs(t *testing.T) map[string]corev1.PodTemplateSpec {
	t.Helper()
	specs := map[string]corev1.PodTemplateSpec{}
	for _, u := range r.all("Deployment") {
		specs["Deployment/"+u.GetName()] = typed[appsv1.Deployment](t, u).Spec.Template
	}
	for _, u := range r.all("DaemonSet") {
		specs["DaemonSet/"+u.GetName()] = typed[appsv1.DaemonSet](t, u).Spec.Template
	}
	return specs
}

func container(t *testing.T, spec corev1.PodTemplateSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("container %s not found", name)
	return corev1.Container{}
}

func mutatingWebhook(t *testing.T, r rendered) admissionregistrationv1.MutatingWebhook {
	t.Helper()
	mwc := mustGet[admissionregistrationv1.MutatingWebhookConfiguration](t, r, "MutatingWebhookConfiguration", fullname)
	if len(mwc.Webhooks) != 1 {
		t.Fatalf("want 1 webhook, got %d", len(mwc.Webhooks))
	}
	return mwc.Webhooks[0]
}

var (
	kube136 = renderOpts{kubeVersion: "1.36.3"}
	// kube133 is the floor: the oldest release the project builds and tests.
	kube133 = renderOpts{kubeVersion: "1.33.13"}
)

func with(o renderOpts, set ...string) renderOpts {
	o.set = append(slices.Clone(o.set), set...)
	return o
}

// checkKnownTypes converts every object of a Kubernetes kind into its API type.
func checkKnownTypes(t *testing.T, r rendered) {
	t.Helper()
	for _, u := range r.objects {
		gvk := schema.FromAPIVersionAndKind(u.GetAPIVersion(), u.GetKind())
		if gvk.Group == "cert-manager.io" {
			continue
		}
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			t.Errorf("%s %s: unknown kind %v: %v", u.GetKind(), u.GetName(), gvk, err)
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
			t.Errorf("%s %s does not convert to its API type: %v", u.GetKind(), u.GetName(), err)
		}
		labels := u.GetLabels()
		for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
			if labels[k] == "" {
				t.Errorf("%s %s lacks label %s", u.GetKind(), u.GetName(), k)
			}
		}
		// The helm test's right to create pods is in a namespace of its own
		// (templates/tests.yaml).
		testRBAC := strings.HasPrefix(u.GetKind(), "Role") && u.GetNamespace() == testNamespace
		if ns := u.GetNamespace(); ns != "" && ns != namespace && !testRBAC {
			t.Errorf("%s %s is in namespace %q, want the release namespace", u.GetKind(), u.GetName(), ns)
		}
	}
}

// checkPodSecurity holds for every workload the chart renders, whatever the values:
// the webhook, the probe and the install hook.
func checkPodSecurity(t *testing.T, r rendered, privilegedProbe bool) {
	t.Helper()
	specs := r.podSpecs(t)
	for _, u := range r.all("Job") {
		specs["Job/"+u.GetName()] = typed[batchv1.Job](t, u).Spec.Template
	}
	for name, spec := range specs {
		ps := spec.Spec
		if ps.HostNetwork || ps.HostPID || ps.HostIPC {
			t.Errorf("%s uses a host namespace", name)
		}
		hostPaths := map[string]bool{}
		for _, v := range ps.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = true
			}
		}
		for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
			where := name + " container " + c.Name
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s has no securityContext", where)
				continue
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("%s does not drop ALL capabilities", where)
			}
			// The one capability any container keeps: the NRI plugin's
			// CAP_SYS_PTRACE, for its stale driver scan, read through the host's
			// /proc (docs/security.md).
			var allowed []corev1.Capability
			if strings.HasPrefix(name, "DaemonSet/") && c.Name == "nri-plugin" && slices.Contains(c.Args, "--proc-root=/host/proc") {
				allowed = []corev1.Capability{"SYS_PTRACE"}
			}
			if sc.Capabilities != nil && !slices.Equal(sc.Capabilities.Add, allowed) {
				t.Errorf("%s adds capabilities %v, want %v", where, sc.Capabilities.Add, allowed)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s has a writable root filesystem", where)
			}
			nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
				(sc.RunAsNonRoot == nil && ps.SecurityContext != nil && ps.SecurityContext.RunAsNonRoot != nil && *ps.SecurityContext.RunAsNonRoot)
			// The NRI plugin runs as uid 0 with nothing else, to connect to the
			// runtime's 0600 socket (hack/chart-test.sh checks the rest of it).
			nriPlugin := strings.HasPrefix(name, "DaemonSet/") && c.Name == "nri-plugin"
			if nriPlugin {
				nonRoot = sc.RunAsUser != nil && *sc.RunAsUser == 0 && sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot
			}
			if !nonRoot {
				t.Errorf("%s may run as root", where)
			}
			if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s has no RuntimeDefault seccomp profile", where)
			}
			privileged := sc.Privileged != nil && *sc.Privileged
			wantPrivileged := privilegedProbe && strings.HasPrefix(name, "DaemonSet/") && !nriPlugin
			if privileged != wantPrivileged {
				t.Errorf("%s privileged=%v, want %v", where, privileged, wantPrivileged)
			}
			if !privileged && (sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation) {
				t.Errorf("%s allows privilege escalation", where)
			}
			for _, m := range c.VolumeMounts {
				if !hostPaths[m.Name] {
					continue
				}
				if !m.ReadOnly {
					t.Errorf("%s mounts hostPath volume %s writable", where, m.Name)
				}
				if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
					t.Errorf("%s mounts hostPath volume %s with Bidirectional propagation", where, m.Name)
				}
			}
		}
	}
}

func TestRender(t *testing.T) {
	tests := map[string]struct {
		opts            renderOpts
		privilegedProbe bool
		check           func(t *testing.T, r rendered)
	}{
		"defaults on 1.36": {
			opts: kube136,
			check: func(t *testing.T, r rendered) {
				wh := mutatingWebhook(t, r)
				if len(wh.MatchConditions) != 2 {
					t.Errorf("want 2 matchConditions on 1.36, got %d", len(wh.MatchConditions))
				}
				if wh.ClientConfig.Service == nil || wh.ClientConfig.Service.Name != webhookSvc ||
					wh.ClientConfig.Service.Namespace != namespace || ptrValue(wh.ClientConfig.Service.Path) != "/mutate-v1-pod" ||
					ptrValue(wh.ClientConfig.Service.Port) != 443 {
					t.Errorf("clientConfig.service = %+v", wh.ClientConfig.Service)
				}
				if wh.ClientConfig.URL != nil || len(wh.ClientConfig.CABundle) != 0 {
					t.Errorf("clientConfig has url %v or a caBundle in service mode", wh.ClientConfig.URL)
				}
				if r.get("ValidatingAdmissionPolicy", probeSA) == nil || r.get("ValidatingAdmissionPolicyBinding", probeSA) == nil {
					t.Errorf("ValidatingAdmissionPolicy and its binding not rendered on 1.36; have %v", r.names())
				}
				binding := mustGet[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, r, "ValidatingAdmissionPolicyBinding", probeSA)
				if binding.Spec.PolicyName != probeSA || !reflect.DeepEqual(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
					t.Errorf("binding spec = %+v", binding.Spec)
				}
				vap := mustGet[admissionregistrationv1.ValidatingAdmissionPolicy](t, r, "ValidatingAdmissionPolicy", probeSA)
				wantUser := "request.userInfo.username == 'system:serviceaccount:" + namespace + ":" + probeSA + "'"
				if len(vap.Spec.MatchConditions) != 1 || vap.Spec.MatchConditions[0].Expression != wantUser {
					t.Errorf("policy matchConditions = %+v, want %s", vap.Spec.MatchConditions, wantUser)
				}
				// Every write the probe's RBAC allows goes through the policy: the
				// Node and its status.
				if rules := vap.Spec.MatchConstraints.ResourceRules; len(rules) != 1 ||
					!reflect.DeepEqual(rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Update}) ||
					!reflect.DeepEqual(rules[0].Resources, []string{"nodes", "nodes/status"}) {
					t.Errorf("policy resourceRules = %+v, want UPDATE of nodes and nodes/status", rules)
				}
				if r.get("Secret", certSecret) == nil {
					t.Errorf("certificate Secret not rendered in self cert mode")
				}
				sec := mustGet[corev1.Secret](t, r, "Secret", certSecret)
				if len(sec.Data) != 0 || len(sec.StringData) != 0 {
					t.Errorf("certificate Secret carries data %v; an upgrade would overwrite the rotated certificate", sec.Data)
				}
				pdb := r.get("PodDisruptionBudget", webhookSA)
				if pdb == nil {
					t.Errorf("no PodDisruptionBudget with 2 replicas")
				}
				dep := mustGet[appsv1.Deployment](t, r, "Deployment", webhookSA)
				if ptrValue(dep.Spec.Replicas) != 2 {
					t.Errorf("replicas = %d, want 2", ptrValue(dep.Spec.Replicas))
				}
				tsc := dep.Spec.Template.Spec.TopologySpreadConstraints
				if len(tsc) != 1 || tsc[0].TopologyKey != "kubernetes.io/hostname" || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
					tsc[0].LabelSelector == nil || tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/component"] != "webhook" {
					t.Errorf("topologySpreadConstraints = %+v", tsc)
				}
				if !reflect.DeepEqual(dep.Spec.Selector.MatchLabels, tsc[0].LabelSelector.MatchLabels) {
					t.Errorf("spread selector %v differs from the Deployment's %v", tsc[0].LabelSelector.MatchLabels, dep.Spec.Selector.MatchLabels)
				}
				c := container(t, dep.Spec.Template, "webhook")
				wantArgs := []string{
					"webhook",
					"--config=/etc/gpu-injector/config.yaml",
					"--port=9443",
					"--cert-dir=/certs",
					"--cert-mode=self",
					"--cert-secret-name=" + certSecret,
					"--service-name=" + webhookSvc,
					"--webhook-configuration-name=" + fullname,
					"--pool-memory-name=" + fullname + "-pools",
					"--policy-binding-name=" + fullname + "-runtime",
					"--metrics-bind-address=:8080",
					"--health-probe-bind-address=:8081",
				}
				if !reflect.DeepEqual(c.Args, wantArgs) {
					t.Errorf("webhook args:\n got %q\nwant %q", c.Args, wantArgs)
				}
				if len(c.Env) != 2 || c.Env[0].Name != "POD_NAMESPACE" || c.Env[0].ValueFrom == nil ||
					c.Env[0].ValueFrom.FieldRef == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
					t.Errorf("webhook env = %+v", c.Env)
				}
				checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", "health", c)
				checkProbe(t, "liveness", c.LivenessProbe, "/healthz", "health", c)
				if p := findPort(c, "health"); p != 8081 {
					t.Errorf("health port = %d, want 8081", p)
				}
				if p := findPort(c, "webhook"); p != 9443 {
					t.Errorf("webhook port = %d, want 9443", p)
				}
				if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
					t.Errorf("webhook resources incomplete: %+v", c.Resources)
				}
				sc := dep.Spec.Template.Spec.SecurityContext
				if sc == nil || ptrValue(sc.RunAsUser) != 65532 || ptrValue(c.SecurityContext.RunAsUser) != 65532 {
					t.Errorf("webhook does not run as 65532: pod %+v", sc)
				}
				// Self mode: the binary writes the pair from the watched Secret into a
				// writable in-memory folder at once, instead of waiting a kubelet sync
				// period for a mounted Secret to catch up.
				for _, v := range dep.Spec.Template.Spec.Volumes {
					if v.Name == "certs" && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory || v.Secret != nil) {
						t.Errorf("certs volume = %+v, want an in-memory emptyDir in self mode", v.VolumeSource)
					}
				}
				for _, m := range c.VolumeMounts {
					if m.Name == "certs" && (m.MountPath != "/certs" || m.ReadOnly) {
						t.Errorf("certs mount = %+v, want writable at /certs", m)
					}
				}
				svc := mustGet[corev1.Service](t, r, "Service", webhookSvc)
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.String() != "webhook" {
					t.Errorf("service ports = %+v", svc.Spec.Ports)
				}
				if !reflect.DeepEqual(svc.Spec.Selector, dep.Spec.Selector.MatchLabels) {
					t.Errorf("service selector %v does not select the webhook pods %v", svc.Spec.Selector, dep.Spec.Selector.MatchLabels)
				}
				checkNodeprobe(t, r)
				checkWebhookRBAC(t, r, true, true)
				checkProbeRBAC(t, r)
			},
		},
		// The floor: everything of 1.36 but the DRA rules (no resource.k8s.io/v1).
		"defaults on 1.33": {
			opts: kube133,
			check: func(t *testing.T, r rendered) {
				if wh := mutatingWebhook(t, r); len(wh.MatchConditions) != 2 {
					t.Errorf("matchConditions = %d, want 2 on 1.33", len(wh.MatchConditions))
				}
				if r.get("ValidatingAdmissionPolicy", probeSA) == nil || r.get("ValidatingAdmissionPolicyBinding", probeSA) == nil {
					t.Errorf("ValidatingAdmissionPolicy and its binding not rendered on 1.33; have %v", r.names())
				}
				checkNodeprobe(t, r)
				checkWebhookRBAC(t, r, true, false)
				checkProbeRBAC(t, r)
			},
		},
		"defaults on 1.34": {
			opts: renderOpts{kubeVersion: "1.34.0"},
			check: func(t *testing.T, r rendered) {
				if wh := mutatingWebhook(t, r); len(wh.MatchConditions) != 2 {
					t.Errorf("matchConditions = %d, want 2 on 1.34", len(wh.MatchConditions))
				}
				checkNodeprobe(t, r)
				checkWebhookRBAC(t, r, true, true)
				checkProbeRBAC(t, r)
			},
		},
		"1.36 with node restriction off": {
			opts: with(kube136, "nodeprobe.nodeRestriction.enabled=false"),
			check: func(t *testing.T, r rendered) {
				if r.get("ValidatingAdmissionPolicy", probeSA) != nil {
					t.Errorf("ValidatingAdmissionPolicy rendered although disabled")
				}
			},
		},
		"cert-manager": {
			opts: with(kube136, "certManager.enabled=true"),
			check: func(t *testing.T, r rendered) {
				if r.get("Secret", certSecret) != nil {
					t.Errorf("chart renders the certificate Secret that cert-manager owns")
				}
				issuer := r.get("Issuer", fullname+"-selfsigned")
				if issuer == nil {
					t.Fatalf("no self-signed Issuer; have %v", r.names())
				}
				if _, ok, _ := unstructured.NestedMap(issuer.Object, "spec", "selfSigned"); !ok {
					t.Errorf("Issuer is not selfSigned: %v", issuer.Object["spec"])
				}
				cert := r.get("Certificate", webhookSA)
				if cert == nil {
					t.Fatalf("no Certificate; have %v", r.names())
				}
				if s, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); s != certSecret {
					t.Errorf("Certificate writes Secret %q, want %q", s, certSecret)
				}
				dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
				if !slices.Contains(dns, webhookSvc+"."+namespace+".svc") {
					t.Errorf("Certificate dnsNames %v lack the Service's name", dns)
				}
				if k, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name"); k != fullname+"-selfsigned" {
					t.Errorf("Certificate issuer = %q", k)
				}
				mwc := mustGet[admissionregistrationv1.MutatingWebhookConfiguration](t, r, "MutatingWebhookConfiguration", fullname)
				if got := mwc.Annotations["cert-manager.io/inject-ca-from"]; got != namespace+"/"+webhookSA {
					t.Errorf("inject-ca-from = %q, want %s/%s", got, namespace, webhookSA)
				}
				dep := mustGet[appsv1.Deployment](t, r, "Deployment", webhookSA)
				c := container(t, dep.Spec.Template, "webhook")
				if !slices.Contains(c.Args, "--cert-mode=external") {
					t.Errorf("webhook args %q lack --cert-mode=external", c.Args)
				}
				// cert-manager fills the Secret; the binary only reads the mounted files.
				checkVolume(t, dep.Spec.Template, c, "certs", "/certs", func(v corev1.Volume) bool {
					return v.Secret != nil && v.Secret.SecretName == certSecret
				})
				checkWebhookRBAC(t, r, false, true)
			},
		},
		"cert-manager with a cluster issuer": {
			opts: with(kube136, "certManager.enabled=true", "certManager.issuerRef.name=corp-ca", "certManager.issuerRef.kind=ClusterIssuer"),
			check: func(t *testing.T, r rendered) {
				if len(r.all("Issuer")) != 0 {
					t.Errorf("Issuer rendered although issuerRef is set")
				}
				cert := r.get("Certificate", webhookSA)
				if cert == nil {
					t.Fatalf("no Certificate")
				}
				ref, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
				if ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" || ref["group"] != "cert-manager.io" {
					t.Errorf("issuerRef = %v", ref)
				}
			},
		},
		"out-of-cluster webhook url": {
			opts: with(kube136, "webhook.url=https://127.0.0.1:9443/", "webhook.caBundle=Zm9vYmFy", "webhook.enabled=false"),
			check: func(t *testing.T, r rendered) {
				wh := mutatingWebhook(t, r)
				if ptrValue(wh.ClientConfig.URL) != "https://127.0.0.1:9443/mutate-v1-pod" || wh.ClientConfig.Service != nil {
					t.Errorf("clientConfig = url %q service %+v", ptrValue(wh.ClientConfig.URL), wh.ClientConfig.Service)
				}
				if string(wh.ClientConfig.CABundle) != "foobar" {
					t.Errorf("caBundle = %q, want foobar", wh.ClientConfig.CABundle)
				}
				for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget"} {
					if len(r.all(kind)) != 0 {
						t.Errorf("%s rendered with webhook.enabled=false", kind)
					}
				}
				// The out-of-cluster process may run with the chart's identity; its
				// certificate and CA come from outside, so no Secret and no rights on it.
				if r.get("ServiceAccount", webhookSA) == nil {
					t.Errorf("webhook ServiceAccount missing; have %v", r.names())
				}
				if r.get("Secret", certSecret) != nil {
					t.Errorf("certificate Secret rendered although the CA comes from webhook.caBundle")
				}
				checkWebhookRBAC(t, r, false, true)
			},
		},
		"url with the webhook still in the cluster": {
			opts: with(kube136, "webhook.url=https://webhook.example.com"),
			check: func(t *testing.T, r rendered) {
				dep := mustGet[appsv1.Deployment](t, r, "Deployment", webhookSA)
				if c := container(t, dep.Spec.Template, "webhook"); !slices.Contains(c.Args, "--cert-mode=external") {
					t.Errorf("webhook args %q lack --cert-mode=external: self mode cannot inject a CA for a URL", c.Args)
				}
				if wh := mutatingWebhook(t, r); len(wh.ClientConfig.CABundle) != 0 {
					t.Errorf("caBundle %q set without webhook.caBundle", wh.ClientConfig.CABundle)
				}
			},
		},
		"privileged probe fallback": {
			opts:            with(kube136, "nodeprobe.privileged=true"),
			privilegedProbe: true,
		},
		"probe with the nvidia runtime class": {
			opts: with(kube136, "nodeprobe.runtimeClassName=nvidia"),
			check: func(t *testing.T, r rendered) {
				ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
				if ptrValue(ds.Spec.Template.Spec.RuntimeClassName) != "nvidia" {
					t.Errorf("runtimeClassName = %q", ptrValue(ds.Spec.Template.Spec.RuntimeClassName))
				}
			},
		},
		"host root with propagation instead of recursive read-only": {
			opts: with(kube136, "nodeprobe.recursiveReadOnly=false"),
			check: func(t *testing.T, r rendered) {
				m := hostRootMount(t, r)
				// The API server refuses recursiveReadOnly with any propagation but None.
				if !m.ReadOnly || m.RecursiveReadOnly != nil || ptrValue(m.MountPropagation) != corev1.MountPropagationHostToContainer {
					t.Errorf("host root mount = %+v, want read-only, HostToContainer, no recursiveReadOnly", m)
				}
				// The whole root propagates: no second mount of /run/nvidia.
				ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
				for _, v := range ds.Spec.Template.Spec.Volumes {
					if v.Name == "host-run-nvidia" {
						t.Errorf("/run/nvidia mounted again with recursiveReadOnly=false")
					}
				}
			},
		},
		"driverRootPropagation: /run/nvidia again, read-only with HostToContainer": {
			opts: with(kube136, "nodeprobe.driverRootPropagation=true"),
			check: func(t *testing.T, r rendered) {
				ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
				c := container(t, ds.Spec.Template, "nodeprobe")
				checkVolume(t, ds.Spec.Template, c, "host-run-nvidia", "/host/run/nvidia", func(v corev1.Volume) bool {
					return v.HostPath != nil && v.HostPath.Path == "/run/nvidia" && ptrValue(v.HostPath.Type) == corev1.HostPathDirectoryOrCreate
				})
				for _, m := range c.VolumeMounts {
					if m.Name == "host-run-nvidia" && (!m.ReadOnly || m.RecursiveReadOnly != nil || ptrValue(m.MountPropagation) != corev1.MountPropagationHostToContainer) {
						t.Errorf("/run/nvidia mount = %+v, want read-only, HostToContainer", m)
					}
				}
			},
		},
		"no propagation by default: the probe starts where the host's root is private": {
			opts: with(kube136),
			check: func(t *testing.T, r rendered) {
				ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
				for _, v := range ds.Spec.Template.Spec.Volumes {
					if v.Name == "host-run-nvidia" {
						t.Errorf("/run/nvidia mounted with driverRootPropagation=false")
					}
				}
				for _, m := range container(t, ds.Spec.Template, "nodeprobe").VolumeMounts {
					if m.MountPropagation != nil {
						t.Errorf("mount %s propagates (%s) with driverRootPropagation=false", m.Name, *m.MountPropagation)
					}
				}
				if m := hostRootMount(t, r); ptrValue(m.RecursiveReadOnly) != corev1.RecursiveReadOnlyIfPossible {
					t.Errorf("host root mount = %+v, want recursively read-only", m)
				}
			},
		},
		"probe disabled": {
			opts: with(kube136, "nodeprobe.enabled=false", "runtimeInjection.enabled=false"),
			check: func(t *testing.T, r rendered) {
				if len(r.all("DaemonSet")) != 0 {
					t.Errorf("DaemonSet rendered with nodeprobe.enabled=false")
				}
				// The webhook's policy on ephemeral containers stays.
				for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
					if r.get(kind, probeSA) != nil {
						t.Errorf("%s rendered with nodeprobe.enabled=false", kind)
					}
				}
				if r.get("ServiceAccount", probeSA) != nil || r.get("ClusterRole", probeSA) != nil {
					t.Errorf("probe identity rendered with nodeprobe.enabled=false")
				}
			},
		},
		"one replica has no disruption budget": {
			opts: with(kube136, "webhook.replicas=1"),
			check: func(t *testing.T, r rendered) {
				if len(r.all("PodDisruptionBudget")) != 0 {
					t.Errorf("PodDisruptionBudget with minAvailable 1 and one replica would block every drain")
				}
			},
		},
		"failure policy Ignore": {
			opts: with(kube136, "webhook.failurePolicy=Ignore"),
			check: func(t *testing.T, r rendered) {
				if wh := mutatingWebhook(t, r); ptrValue(wh.FailurePolicy) != admissionregistrationv1.Ignore {
					t.Errorf("failurePolicy = %v, want Ignore", ptrValue(wh.FailurePolicy))
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := render(t, tc.opts)
			checkKnownTypes(t, r)
			checkPodSecurity(t, r, tc.privilegedProbe)
			checkWebhookConfiguration(t, r)
			checkConfigMap(t, r)
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// checkWebhookConfiguration holds for every rendering.
func checkWebhookConfiguration(t *testing.T, r rendered) {
	t.Helper()
	wh := mutatingWebhook(t, r)
	if wh.Name != "pods.gpu-injector.io" {
		t.Errorf("webhook name = %q", wh.Name)
	}
	if ptrValue(wh.SideEffects) != admissionregistrationv1.SideEffectClassNone {
		t.Errorf("sideEffects = %v, want None", ptrValue(wh.SideEffects))
	}
	if ptrValue(wh.ReinvocationPolicy) != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("reinvocationPolicy = %v, want IfNeeded", ptrValue(wh.ReinvocationPolicy))
	}
	if ptrValue(wh.TimeoutSeconds) != 5 {
		t.Errorf("timeoutSeconds = %d, want 5", ptrValue(wh.TimeoutSeconds))
	}
	if !reflect.DeepEqual(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("admissionReviewVersions = %v", wh.AdmissionReviewVersions)
	}
	wantRules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
			Scope: new(admissionregistrationv1.NamespacedScope),
		},
	}}
	if !reflect.DeepEqual(wh.Rules, wantRules) {
		t.Errorf("rules = %+v, want CREATE pods only", wh.Rules)
	}
	ns := wh.NamespaceSelector
	if ns == nil || ns.MatchLabels["gpu-injector.io/inject"] != "enabled" {
		t.Fatalf("namespaceSelector %+v does not require gpu-injector.io/inject=enabled", ns)
	}
	var excluded []string
	for _, e := range ns.MatchExpressions {
		if e.Key == "kubernetes.io/metadata.name" && e.Operator == "NotIn" {
			excluded = e.Values
		}
	}
	for _, want := range []string{namespace, "kube-system", "kube-public", "kube-node-lease"} {
		if !slices.Contains(excluded, want) {
			t.Errorf("namespaceSelector does not exclude %s: %v", want, excluded)
		}
	}
}

// checkConfigMap proves the rendered file is one the binary accepts.
func checkConfigMap(t *testing.T, r rendered) *config.Configuration {
	t.Helper()
	cm := mustGet[corev1.ConfigMap](t, r, "ConfigMap", fullname+"-config")
	data, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap has no config.yaml: %v", cm.Data)
	}
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the chart's config.yaml is refused by the binary: %v\n%s", err, data)
	}
	for name, spec := range r.podSpecs(t) {
		found := false
		for _, v := range spec.Spec.Volumes {
			if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				found = true
			}
		}
		if !found {
			t.Errorf("%s does not mount the config ConfigMap", name)
		}
	}
	return c
}

func checkNodeprobe(t *testing.T, r rendered) {
	t.Helper()
	ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != probeSA {
		t.Errorf("probe runs as %q", spec.ServiceAccountName)
	}
	// Every node: a node without a GPU publishes no-driver and idles.
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux"}) || spec.Affinity != nil {
		t.Errorf("probe nodeSelector = %v, affinity %v: the default is every Linux node", spec.NodeSelector, spec.Affinity)
	}
	tolerated := false
	for _, tol := range spec.Tolerations {
		if tol.Key == "nvidia.com/gpu" && tol.Effect == corev1.TaintEffectNoSchedule && tol.Operator == corev1.TolerationOpExists {
			tolerated = true
		}
	}
	if !tolerated {
		t.Errorf("probe does not tolerate the nvidia.com/gpu taint: %+v", spec.Tolerations)
	}
	if spec.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q set by default", *spec.RuntimeClassName)
	}
	c := container(t, ds.Spec.Template, "nodeprobe")
	wantArgs := []string{
		"nodeprobe",
		"--host-root=/host",
		"--config=/etc/gpu-injector/config.yaml",
		"--interval=5m",
		"--nvml-timeout=30s",
		"--health-probe-bind-address=:8082",
		"--metrics-bind-address=:8083",
		// The folder it shares with the NRI plugin, which runs by default.
		"--state-dir=/run/gpu-injector",
	}
	if !reflect.DeepEqual(c.Args, wantArgs) {
		t.Errorf("probe args:\n got %q\nwant %q", c.Args, wantArgs)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME = %+v", e)
	}
	if env["NVIDIA_VISIBLE_DEVICES"].Value != "all" || env["NVIDIA_DRIVER_CAPABILITIES"].Value != "utility" {
		t.Errorf("NVIDIA runtime env = %+v", c.Env)
	}
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", "health", c)
	if p := findPort(c, "health"); p != 8082 {
		t.Errorf("probe health port = %d, want 8082", p)
	}
	checkVolume(t, ds.Spec.Template, c, "host-root", "/host", func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == "/"
	})
	// By default the host's submounts (/run, /dev/shm, /tmp) are read-only too, which
	// the API server allows only without propagation.
	if m := hostRootMount(t, r); !m.ReadOnly || ptrValue(m.RecursiveReadOnly) != corev1.RecursiveReadOnlyIfPossible || m.MountPropagation != nil {
		t.Errorf("host root mount = %+v, want read-only, recursiveReadOnly IfPossible, no propagation", m)
	}
	// No mount propagates by default (the runtime refuses a propagated mount where
	// the host's / is private): a later driver mount is found by the probe's
	// comparison of mount tables, and driverRootPropagation opts into the watch.
	for _, m := range c.VolumeMounts {
		if m.MountPropagation != nil || m.Name == "host-run-nvidia" {
			t.Errorf("probe mount %+v by default, want none with propagation", m)
		}
	}
}

// hostRootMount is the probe's mount of the host root.
func hostRootMount(t *testing.T, r rendered) corev1.VolumeMount {
	t.Helper()
	ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
	for _, m := range container(t, ds.Spec.Template, "nodeprobe").VolumeMounts {
		if m.Name == "host-root" {
			return m
		}
	}
	t.Fatalf("probe has no host-root mount")
	return corev1.VolumeMount{}
}

// checkWebhookRBAC: nodes and namespaces read-only, and in self cert mode only the
// one Secret and the one webhook configuration writable.
// checkWebhookRBAC: dra is a cluster that serves resource.k8s.io/v1 (1.34+).
func checkWebhookRBAC(t *testing.T, r rendered, selfCerts, dra bool) {
	t.Helper()
	cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", webhookSA)
	crb := mustGet[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", webhookSA)
	if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Name != webhookSA || crb.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding = %+v", crb)
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
	}
	if dra {
		want = append(want,
			rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices", "deviceclasses"}, Verbs: []string{"list", "watch"}},
			rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"}, Verbs: []string{"get", "list", "watch"}},
		)
	}
	if selfCerts {
		want = append(want,
			rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{fullname}, Verbs: []string{"get", "update"}},
			rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, Verbs: []string{"list", "watch"}},
		)
	}
	// A switched policy (PreferRuntime): its binding, by name (checkSwitch).
	if b := r.get("MutatingAdmissionPolicyBinding", fullname+"-runtime"); b != nil {
		if _, switched, _ := unstructured.NestedMap(b.Object, "spec", "matchResources"); switched {
			want = append(want, rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingadmissionpolicybindings"},
				ResourceNames: []string{fullname + "-runtime"}, Verbs: []string{"get", "patch"}})
		}
	}
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("webhook ClusterRole rules:\n got %+v\nwant %+v", cr.Rules, want)
	}
	role := r.get("Role", webhookSA)
	if !selfCerts {
		if role != nil {
			t.Errorf("Secret Role rendered although cert-manager writes the Secret")
		}
		return
	}
	rl := mustGet[rbacv1.Role](t, r, "Role", webhookSA)
	wantRole := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{certSecret}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}},
	}
	if !reflect.DeepEqual(rl.Rules, wantRole) || rl.Namespace != namespace {
		t.Errorf("webhook Role in %q:\n got %+v\nwant %+v", rl.Namespace, rl.Rules, wantRole)
	}
	rb := mustGet[rbacv1.RoleBinding](t, r, "RoleBinding", webhookSA)
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != rl.Name || rb.Subjects[0].Name != webhookSA {
		t.Errorf("RoleBinding = %+v", rb)
	}
}

func checkProbeRBAC(t *testing.T, r rendered) {
	t.Helper()
	cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", probeSA)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
	}
	// Status only where the policy narrows it (TestNodeRestriction).
	if r.get("ValidatingAdmissionPolicy", probeSA) != nil {
		want = append(want, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}})
	}
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("probe ClusterRole rules = %+v, want %+v", cr.Rules, want)
	}
	crb := mustGet[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", probeSA)
	if crb.RoleRef.Name != probeSA || len(crb.Subjects) != 1 || crb.Subjects[0].Name != probeSA {
		t.Errorf("probe ClusterRoleBinding = %+v", crb)
	}
	// No other role of the chart may reach the probe's identity.
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, u := range r.all(kind) {
			b := typed[rbacv1.ClusterRoleBinding](t, u)
			for _, s := range b.Subjects {
				if s.Name == probeSA && b.Name != probeSA {
					t.Errorf("%s %s also grants the probe rights", kind, b.Name)
				}
			}
		}
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path, port string, c corev1.Container) {
	t.Helper()
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != port {
		t.Errorf("%s %s probe = %+v, want GET %s on port %s", c.Name, what, p, path, port)
	}
}

func checkVolume(t *testing.T, spec corev1.PodTemplateSpec, c corev1.Container, name, mountPath string, ok func(corev1.Volume) bool) {
	t.Helper()
	found := false
	for _, v := range spec.Spec.Volumes {
		if v.Name == name {
			found = ok(v)
		}
	}
	if !found {
		t.Errorf("volume %s missing or of the wrong source", name)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			if m.MountPath != mountPath || !m.ReadOnly {
				t.Errorf("mount %s = %+v, want read-only at %s", name, m, mountPath)
			}
			return
		}
	}
	t.Errorf("container %s does not mount %s", c.Name, name)
}

func findPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func ptrValue[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// TestConfigDefaults: values.yaml writes out the binary's defaults, so what a reader
// sees there is what runs.
func TestConfigDefaults(t *testing.T) {
	c := checkConfigMap(t, render(t, kube136))
	// Semantic: an empty list in values.yaml equals the binary's nil default.
	if want := config.Default(); !apiequality.Semantic.DeepEqual(c, want) {
		t.Errorf("values.yaml config differs from config.Default():\n got %+v\nwant %+v", c, want)
	}
}

// TestConfigValues: config values reach the file, and the file still parses.
func TestConfigValues(t *testing.T) {
	tests := map[string]struct {
		set   []string
		check func(t *testing.T, c *config.Configuration)
	}{
		"layout policy": {
			set:   []string{"config.layoutPolicy=NewestDriver"},
			check: func(t *testing.T, c *config.Configuration) { eq(t, c.LayoutPolicy, config.LayoutPolicyNewestDriver) },
		},
		"mig resources": {
			set: []string{"config.resources.names={nvidia.com/gpu,nvidia.com/mig-*}"},
			check: func(t *testing.T, c *config.Configuration) {
				if !reflect.DeepEqual(c.Resources.Names, []string{"nvidia.com/gpu", "nvidia.com/mig-*"}) {
					t.Errorf("names = %v", c.Resources.Names)
				}
			},
		},
		"no toleration for renamed pods": {
			set: []string{"config.resources.renameToleration=None"},
			check: func(t *testing.T, c *config.Configuration) {
				eq(t, c.Resources.RenameToleration, config.RenameTolerationNone)
			},
		},
		"pinning by pool": {
			set: []string{"config.pinning.nodeLabels={karpenter.sh/nodepool,node.kubernetes.io/instance-type}", "config.pinning.rememberFor=72h"},
			check: func(t *testing.T, c *config.Configuration) {
				if !reflect.DeepEqual(c.Pinning.NodeLabels, []string{"karpenter.sh/nodepool", "node.kubernetes.io/instance-type"}) || c.Pinning.Remember() != 72*time.Hour {
					t.Errorf("pinning = %+v", c.Pinning)
				}
			},
		},
		"no layout allows": {
			set:   []string{"config.noLayout.action=Allow", "config.ldLibraryPath=Prepend", "config.containers=All", "config.podSecurity=Deny"},
			check: func(t *testing.T, c *config.Configuration) { eq(t, c.NoLayout.Action, config.NoLayoutAllow) },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.check(t, checkConfigMap(t, render(t, with(kube136, tc.set...))))
		})
	}
}

func eq[T comparable](t *testing.T, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

func checksums(t *testing.T, r rendered) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, spec := range r.podSpecs(t) {
		sum := spec.Annotations["checksum/config"]
		if len(sum) != 64 {
			t.Errorf("%s has no sha256 checksum/config annotation: %q", name, sum)
		}
		out[name] = sum
	}
	return out
}

// TestConfigChecksum: a config change rolls both workloads; anything else does not.
func TestConfigChecksum(t *testing.T) {
	base := checksums(t, render(t, kube136))
	if len(base) != 2 {
		t.Fatalf("want checksums on the Deployment and the DaemonSet, got %v", base)
	}
	tests := map[string]struct {
		set     []string
		changed bool
	}{
		"same values":              {changed: false},
		"replicas are not config":  {set: []string{"webhook.replicas=3"}, changed: false},
		"image is not config":      {set: []string{"image.tag=v9"}, changed: false},
		"layout policy":            {set: []string{"config.layoutPolicy=NewestDriver"}, changed: true},
		"an allowlist entry":       {set: []string{"config.hostPaths.allowlist[0].path=/opt/driver"}, changed: true},
		"excluded namespaces":      {set: []string{"config.excludedNamespaces={kube-system,batch}"}, changed: true},
		"container library folder": {set: []string{"config.containerPaths.libraryDir=/usr/lib/nvidia-host"}, changed: true},
		"probe interval is a flag": {set: []string{"nodeprobe.interval=1m"}, changed: false},
		"NVML limit is a flag":     {set: []string{"nodeprobe.nvmlTimeout=1m"}, changed: false},
		"no-layout action":         {set: []string{"config.noLayout.action=Allow"}, changed: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := checksums(t, render(t, with(kube136, tc.set...)))
			for wl, sum := range base {
				if (got[wl] != sum) != tc.changed {
					t.Errorf("%s checksum changed=%v, want %v", wl, got[wl] != sum, tc.changed)
				}
			}
		})
	}
}

// TestKubeVersions: every supported minor renders with matchConditions and the probe's
// policy, decided with no --api-versions as helm template renders for a user; the DRA
// rules where resource.k8s.io/v1 is served (by version, or by the API versions helm
// install learns from the cluster). Below 1.30 an install is refused, while helm template
// without a cluster renders whatever version it assumes.
func TestKubeVersions(t *testing.T) {
	tests := map[string]struct {
		opts    renderOpts
		wantDRA bool
		refused bool
	}{
		"1.33":                      {opts: kube133},
		"1.33 with a vendor suffix": {opts: renderOpts{kubeVersion: "1.33.5-eks-1"}},
		// A 1.33 cluster serves resource.k8s.io only as v1beta1 and v1beta2, which the
		// webhook does not read.
		"1.33 serving DRA in beta": {opts: renderOpts{kubeVersion: "1.33.13", apiVersions: []string{"resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"}}},
		// helm install learns the served API versions from the cluster.
		"1.33 serving resource.k8s.io/v1": {opts: renderOpts{kubeVersion: "1.33.13", apiVersions: []string{"resource.k8s.io/v1"}}, wantDRA: true},
		"1.34":                            {opts: renderOpts{kubeVersion: "1.34.0"}, wantDRA: true},
		"1.35":                            {opts: renderOpts{kubeVersion: "1.35.4"}, wantDRA: true},
		"1.36":                            {opts: kube136, wantDRA: true},
		"1.37":                            {opts: renderOpts{kubeVersion: "1.37.2"}, wantDRA: true},
		"1.34 with a vendor suffix":       {opts: renderOpts{kubeVersion: "1.34.1-gke.1"}, wantDRA: true},
		"1.30 (the floor)":                {opts: renderOpts{kubeVersion: "1.30.0"}},
		"1.30 install":                    {opts: onCluster(renderOpts{kubeVersion: "1.30.0"})},
		"1.32":                            {opts: renderOpts{kubeVersion: "1.32.9"}},
		"1.32 install, vendor suffix":     {opts: onCluster(renderOpts{kubeVersion: "1.32.13-eks-1"})},
		"1.37 install":                    {opts: onCluster(renderOpts{kubeVersion: "1.37.2"}), wantDRA: true},
		"1.29 install":                    {opts: onCluster(renderOpts{kubeVersion: "1.29.0"}), refused: true},
		"1.29 install, vendor suffix":     {opts: onCluster(renderOpts{kubeVersion: "1.29.5-eks-1"}), refused: true},
		"1.20 install":                    {opts: onCluster(renderOpts{kubeVersion: "1.20.0"}), refused: true},
		// What helm template assumes when given no --kube-version, without a cluster.
		"1.20, helm's default, no cluster": {opts: renderOpts{kubeVersion: "1.20.0"}},
		"1.29, no cluster":                 {opts: renderOpts{kubeVersion: "1.29.0"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.opts)
			if tc.refused {
				checkRefused(t, out, err, tc.opts.kubeVersion)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := parseRendered(t, out)
			checkKnownTypes(t, r)
			checkWebhookConfiguration(t, r)
			wh := mutatingWebhook(t, r)
			var conditions []string
			for _, c := range wh.MatchConditions {
				conditions = append(conditions, c.Name)
			}
			if !reflect.DeepEqual(conditions, []string{"not-opted-out", "requests-a-gpu"}) {
				t.Errorf("matchConditions = %v, want not-opted-out and requests-a-gpu", conditions)
			}
			if r.get("ValidatingAdmissionPolicy", probeSA) == nil || r.get("ValidatingAdmissionPolicyBinding", probeSA) == nil {
				t.Errorf("ValidatingAdmissionPolicy and its binding not rendered; have %v", r.names())
			}
			checkWebhookRBAC(t, r, true, tc.wantDRA)
			checkProbeRBAC(t, r)
		})
	}
}

// TestNodeRestriction: the policy follows the values alone, so helm template, which
// knows no served kinds, renders it as helm install does.
func TestNodeRestriction(t *testing.T) {
	tests := map[string]struct {
		opts       renderOpts
		wantPolicy bool
	}{
		"1.33":                 {opts: kube133, wantPolicy: true},
		"1.36":                 {opts: kube136, wantPolicy: true},
		"1.33 restriction off": {opts: with(kube133, "nodeprobe.nodeRestriction.enabled=false")},
		"1.36 restriction off": {opts: with(kube136, "nodeprobe.nodeRestriction.enabled=false")},
		"1.36 probe disabled":  {opts: with(kube136, "nodeprobe.enabled=false", "runtimeInjection.enabled=false")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := render(t, tc.opts)
			gotPolicy := r.get("ValidatingAdmissionPolicy", probeSA) != nil
			gotBinding := r.get("ValidatingAdmissionPolicyBinding", probeSA) != nil
			if gotPolicy != tc.wantPolicy || gotBinding != tc.wantPolicy {
				t.Errorf("policy rendered = %v, binding = %v, want %v; have %v", gotPolicy, gotBinding, tc.wantPolicy, r.names())
			}
			// The right to patch Node status is only given where the policy
			// narrows it to the probe's own Node and one condition.
			if u := r.get("ClusterRole", probeSA); u != nil {
				status := false
				for _, rule := range typed[rbacv1.ClusterRole](t, u).Rules {
					status = status || slices.Contains(rule.Resources, "nodes/status")
				}
				if status != tc.wantPolicy {
					t.Errorf("probe may patch nodes/status = %v, want %v (with the policy only)", status, tc.wantPolicy)
				}
			}
		})
	}
}

// renderNotes renders templates/NOTES.txt, which helm template does not print: a copy
// of the chart carries the notes as a named template inside a ConfigMap. The error is
// helm's, for a rendering it refuses.
func renderNotes(t *testing.T, o renderOpts) (string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), chartDir)
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatalf("failed to copy the chart: %v", err)
	}
	notesPath := filepath.Join(dir, "templates", "NOTES.txt")
	notes, err := os.ReadFile(notesPath)
	if err != nil {
		t.Fatalf("failed to read NOTES.txt: %v", err)
	}
	if err := os.Remove(notesPath); err != nil {
		t.Fatalf("failed to remove NOTES.txt: %v", err)
	}
	wrapped := `{{- define "test.notes" }}` + string(notes) + "{{- end }}\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: test-notes\ndata:\n  notes: {{ include \"test.notes\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "test-notes.yaml"), []byte(wrapped), 0o644); err != nil {
		t.Fatalf("failed to write the notes template: %v", err)
	}
	args := []string{"template", releaseName, dir, "--namespace", namespace, "--kube-version", o.kubeVersion, "--show-only", "templates/test-notes.yaml"}
	out, err := runHelm(t, append(args, o.flags()...))
	if err != nil {
		return "", err
	}
	var cm corev1.ConfigMap
	if err := utilyaml.Unmarshal(out, &cm); err != nil {
		t.Fatalf("failed to parse the notes: %v\n%s", err, out)
	}
	if cm.Data["notes"] == "" {
		t.Fatalf("notes rendered empty:\n%s", out)
	}
	return cm.Data["notes"], nil
}

func TestNotes(t *testing.T) {
	// What a cluster lacks, as NOTES.txt says it (compared with its line breaks as
	// spaces).
	const (
		noDRA = "does not serve resource.k8s.io/v1 (DRA, served from 1.34): GPUs that come through DRA are not counted, " +
			"and pods that claim a GPU DeviceClass are not recognised as GPU pods"
		noExtended = "does not serve a DeviceClass's extendedResourceName (DRA extended resources: alpha in 1.34 and 1.35 " +
			"behind the DRAExtendedResource feature gate, beta in 1.36, GA in 1.37): a pod that asks for a DeviceClass's extended resource name " +
			"is not recognised through that class; it is a GPU pod only if the name is one of config.resources.names"
		untested = "is older than 1.33, the oldest Kubernetes release this project tests end to end. " +
			"1.30 to 1.32 install, but they are not tested here; below 1.30 the chart does not install."
		// The warnings of the clusters below 1.30 the chart no longer installs on.
		noRestriction = "NO NODE RESTRICTION"
		noConditions  = "no matchConditions"
	)
	tests := map[string]struct {
		opts    renderOpts
		refused bool
		want    []string
		notWant []string
	}{
		"1.37 says how to see the policy's switch": {
			opts: renderOpts{kubeVersion: "1.37.2"},
			want: []string{"Admission policy: modern GPU pods are admitted by the API server itself", "kubectl get mutatingadmissionpolicybinding " + fullname + "-runtime -o jsonpath='{.spec.matchResources.namespaceSelector}"},
		},
		"1.37 with runtime delivery: the policy, no switch": {
			opts:    renderOpts{kubeVersion: "1.37.2", set: []string{"config.driverDelivery=Runtime"}},
			want:    []string{"Admission policy: modern GPU pods are admitted by the API server itself, with no webhook call."},
			notWant: []string{"kubectl get mutatingadmissionpolicybinding"},
		},
		"1.29 install is refused": {
			opts:    onCluster(renderOpts{kubeVersion: "1.29.0"}),
			refused: true,
		},
		"1.30 install warns it is not tested": {
			opts: onCluster(renderOpts{kubeVersion: "1.30.0"}),
			want: []string{"WARNING: this cluster (v1.30.0) " + untested, "This cluster (v1.30.0) " + noDRA},
		},
		"1.32 warns it is not tested": {
			opts: renderOpts{kubeVersion: "1.32.9-eks-1"},
			want: []string{"WARNING: this cluster (v1.32.9-eks-1) " + untested},
		},
		"1.33 lacks DRA and DRA extended resources": {
			opts:    kube133,
			want:    []string{"This cluster (v1.33.13) " + noDRA, "This cluster (v1.33.13) is older than 1.36 and " + noExtended},
			notWant: []string{noRestriction, noConditions, untested},
		},
		"1.33 serving resource.k8s.io/v1 lacks DRA extended resources only": {
			opts:    renderOpts{kubeVersion: "1.33.13", apiVersions: []string{"resource.k8s.io/v1"}},
			want:    []string{noExtended},
			notWant: []string{noDRA},
		},
		"1.34 lacks DRA extended resources": {
			opts:    renderOpts{kubeVersion: "1.34.0"},
			want:    []string{"This cluster (v1.34.0) is older than 1.36 and " + noExtended},
			notWant: []string{noDRA},
		},
		"1.35 with a vendor suffix lacks DRA extended resources": {
			opts:    renderOpts{kubeVersion: "1.35.4-eks-1"},
			want:    []string{"This cluster (v1.35.4-eks-1) is older than 1.36 and " + noExtended},
			notWant: []string{noDRA},
		},
		"1.36 lacks nothing": {
			opts:    kube136,
			notWant: []string{noDRA, noExtended, noRestriction, noConditions, untested},
		},
		"1.37 lacks nothing": {
			opts:    renderOpts{kubeVersion: "1.37.2"},
			notWant: []string{noDRA, noExtended},
		},
		"unprivileged probe points at the node's state": {
			opts:    kube136,
			want:    []string{`{.metadata.labels.gpu-injector\.io/state}`, `{.metadata.annotations.gpu-injector\.io/state-reason}`, "nodeprobe.runtimeClassName=nvidia"},
			notWant: []string{noRestriction, "stay unready"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			notes, err := renderNotes(t, tc.opts)
			if tc.refused {
				checkRefused(t, []byte(notes), err, tc.opts.kubeVersion)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			flat := strings.Join(strings.Fields(notes), " ")
			for _, w := range tc.want {
				if !strings.Contains(flat, w) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(flat, w) {
					t.Errorf("notes contain %q:\n%s", w, notes)
				}
			}
		})
	}
}

// TestPoolRBAC: pinning by pool adds only the memory's one ConfigMap and Lease (by
// name, create aside) and the read of pods and write of Events the mismatch check needs;
// the admission policy's switch needs only the same Lease (its binding's rule is in
// checkSwitch), and a release with neither gets no Role in its namespace.
func TestPoolRBAC(t *testing.T) {
	memory := fullname + "-pools"
	lease := []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{memory}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	}
	if rl := mustGet[rbacv1.Role](t, render(t, kube136), "Role", webhookSA+"-pools"); !reflect.DeepEqual(rl.Rules, lease) {
		t.Errorf("the switch's Role without pinning by pool:\n got %+v\nwant %+v", rl.Rules, lease)
	}
	if rl := render(t, with(kube136, "admission.policy=off")).get("Role", webhookSA+"-pools"); rl != nil {
		t.Errorf("a Role for a release that elects no replica: %v", rl.Object["rules"])
	}
	r := render(t, with(kube136, "config.pinning.nodeLabels={karpenter.sh/nodepool}"))
	rl := mustGet[rbacv1.Role](t, r, "Role", webhookSA+"-pools")
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{memory}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{memory}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	}
	if !reflect.DeepEqual(rl.Rules, want) || rl.Namespace != namespace {
		t.Errorf("pool Role in %q:\n got %+v\nwant %+v", rl.Namespace, rl.Rules, want)
	}
	rb := mustGet[rbacv1.RoleBinding](t, r, "RoleBinding", webhookSA+"-pools")
	if rb.RoleRef.Name != rl.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != webhookSA {
		t.Errorf("RoleBinding = %+v", rb)
	}
	// Before the switch's rule on its binding (checkSwitch).
	cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", webhookSA)
	tail := cr.Rules[len(cr.Rules)-3 : len(cr.Rules)-1]
	wantTail := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if !reflect.DeepEqual(tail, wantTail) {
		t.Errorf("webhook ClusterRole with pools ends with %+v, want %+v", tail, wantTail)
	}
	spec := r.podSpecs(t)
	for _, s := range spec {
		for _, c := range s.Spec.Containers {
			if c.Name == "webhook" && !slices.Contains(c.Args, "--pool-memory-name="+memory) {
				t.Errorf("webhook args %v lack --pool-memory-name=%s", c.Args, memory)
			}
		}
	}
}

// TestSchemaRejects: values.schema.json stops bad values before anything renders.
func TestSchemaRejects(t *testing.T) {
	tests := map[string]string{
		"failure policy":   "webhook.failurePolicy=Maybe",
		"timeout too long": "webhook.timeoutSeconds=31",
		"plain http url":   "webhook.url=http://127.0.0.1:9443",
		"layout policy":    "config.layoutPolicy=Random",
		"no-layout action": "config.noLayout.action=Panic",
		"ld library path":  "config.ldLibraryPath=Replace",
		"misspelt key":     "webhook.replica=3",
		"misspelt config":  "config.layoutPolicies=MostGPUs",
		"pull policy":      "image.pullPolicy=Sometimes",
		"issuer kind":      "certManager.issuerRef.kind=Vault",
		"a config list":    "config.excludedNamespaces=kube-system",
		"a mount kind":     "config.staticLayouts[0].mounts[0].kind=Socket",
		"no nvml timeout":  "nodeprobe.nvmlTimeout=0s",
	}
	for name, set := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := helmTemplate(t, with(kube136, set))
			if err == nil {
				t.Fatalf("helm accepted --set %s:\n%.400s", set, out)
			}
			if !strings.Contains(err.Error(), "schema") {
				t.Errorf("helm refused --set %s, but not by the schema: %v", set, err)
			}
		})
	}
}

// TestSchemaBooleanInStringField: a boolean where the configuration takes a string,
// which an unquoted yes or off of a values file and --set's true or false are, is
// refused with the fix: quote it (a choice's values offered), or use --set-string.
func TestSchemaBooleanInStringField(t *testing.T) {
	const yaml11 = "(YAML 1.1 reads yes, no, on, off, true and false unquoted as booleans; with --set, use --set-string)"
	valuesFile := func(content string) []string {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{f}
	}
	tests := map[string]struct {
		o    renderOpts
		want string
	}{
		"a choice, unquoted off": {
			o:    renderOpts{kubeVersion: kube136.kubeVersion, files: valuesFile("config:\n  images:\n    mode: off\n")},
			want: `config.images.mode must be one of the following: "quoted: 'Off' or 'On' ` + yaml11 + `"`,
		},
		"a choice, --set true": {
			o:    with(kube136, "config.podSecurity=true"),
			want: `config.podSecurity must be one of the following: "quoted: 'Warn' or 'Deny' ` + yaml11 + `"`,
		},
		"a choice in a list": {
			o:    with(kube136, "config.staticLayouts[0].name=s", "config.staticLayouts[0].mounts[0].kind=false"),
			want: `config.staticLayouts.0.mounts.0.kind must be one of the following: "quoted: 'Directory' or 'File' ` + yaml11 + `"`,
		},
		"a path, unquoted no": {
			o:    renderOpts{kubeVersion: kube136.kubeVersion, files: valuesFile("config:\n  containerPaths:\n    libraryDir: no\n")},
			want: `config.containerPaths.libraryDir must be one of the following: "a quoted string ` + yaml11 + `"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.o)
			if err == nil {
				t.Fatalf("helm accepted a boolean in a string field:\n%.400s", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm's error does not say how to quote the value:\n got %v\nwant %q", err, tc.want)
			}
		})
	}
	// Quoted, or --set-string, the same values are strings.
	quoted := renderOpts{kubeVersion: kube136.kubeVersion, files: valuesFile("config:\n  images:\n    mode: \"Off\"\n"), setString: []string{"config.podSecurity=Deny"}}
	c := checkConfigMap(t, render(t, quoted))
	if c.Images.Mode != config.ImagesOff || c.PodSecurity != config.PodSecurityDeny {
		t.Errorf("images.mode %q, podSecurity %q; want Off and Deny", c.Images.Mode, c.PodSecurity)
	}
}

// TestMemoryLimitEnv: each Go container learns its memory limit in bytes from the
// downward API, from which the binary sets the Go runtime's soft limit
// (internal/nodeagent.SetMemoryLimit); the chart sets no GOMEMLIMIT, which would win.
func TestMemoryLimitEnv(t *testing.T) {
	r := render(t, kube136)
	specs := r.podSpecs(t)
	for _, want := range []struct{ workload, container string }{
		{"webhook", "webhook"}, {"nodeprobe", "nodeprobe"}, {"nodeprobe", "nri-plugin"},
	} {
		var spec corev1.PodTemplateSpec
		found := false
		for name, s := range specs {
			if strings.HasSuffix(name, want.workload) {
				spec, found = s, true
			}
		}
		if !found {
			t.Fatalf("no %s workload rendered; have %v", want.workload, r.names())
		}
		c := container(t, spec, want.container)
		if c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: no memory limit, so the downward API would give the node's memory", c.Name)
		}
		var env *corev1.EnvVar
		for i := range c.Env {
			switch c.Env[i].Name {
			case "GPU_INJECTOR_MEMORY_LIMIT":
				env = &c.Env[i]
			case "GOMEMLIMIT":
				t.Errorf("%s: GOMEMLIMIT set (%+v): it would override the limit derived from the container's", c.Name, c.Env[i])
			}
		}
		if env == nil || env.ValueFrom == nil || env.ValueFrom.ResourceFieldRef == nil {
			t.Errorf("%s: GPU_INJECTOR_MEMORY_LIMIT = %+v, want the downward API's limits.memory", c.Name, env)
			continue
		}
		ref := env.ValueFrom.ResourceFieldRef
		if ref.Resource != "limits.memory" || ref.ContainerName != c.Name || ref.Divisor.String() != "1" {
			t.Errorf("%s: GPU_INJECTOR_MEMORY_LIMIT from %+v, want limits.memory of this container in bytes (divisor 1)", c.Name, ref)
		}
	}
}

// TestImagesRBAC: the webhook may get Secrets (never list or watch them)
// only with config.images.mode On and pullSecrets Read; the rendered
// configuration keeps the mode a string.
func TestImagesRBAC(t *testing.T) {
	secrets := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}
	for name, tc := range map[string]struct {
		set  []string
		want bool
	}{
		"default":           {nil, false},
		"on, anonymous":     {[]string{"config.images.mode=On"}, false},
		"off, pull secrets": {[]string{"config.images.pullSecrets=Read"}, false},
		"on, pull secrets":  {[]string{"config.images.mode=On", "config.images.pullSecrets=Read", "webhook.clientCA.enabled=true", "webhook.clientCA.configMap=ca"}, true},
	} {
		t.Run(name, func(t *testing.T) {
			o := kube136
			for _, s := range tc.set {
				o = with(o, s)
			}
			r := render(t, o)
			cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", webhookSA)
			got := false
			for _, rule := range cr.Rules {
				if slices.Contains(rule.Resources, "secrets") {
					if !reflect.DeepEqual(rule, secrets) {
						t.Errorf("secrets rule %+v, want %+v", rule, secrets)
					}
					got = true
				}
			}
			if got != tc.want {
				t.Errorf("secrets rule rendered: %v, want %v", got, tc.want)
			}
		})
	}
}
