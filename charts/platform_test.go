package charts_test

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
)

// allPodSpecs: every pod the chart can create, the hooks' and the test's included.
func allPodSpecs(t *testing.T, r rendered) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for name, s := range r.podSpecs(t) {
		out[name] = s.Spec
	}
	for _, u := range r.all("Job") {
		out["Job/"+u.GetName()] = typed[batchv1.Job](t, u).Spec.Template.Spec
	}
	for _, u := range r.all("Pod") {
		out["Pod/"+u.GetName()] = typed[corev1.Pod](t, u).Spec
	}
	return out
}

func TestLinuxNodesByDefault(t *testing.T) {
	specs := allPodSpecs(t, render(t, kube136))
	for _, want := range []string{"Deployment/gpu-injector-webhook", "DaemonSet/" + probeSA, "Job/" + hookName, "Job/" + cleanupName, "Pod/" + testNamespace} {
		if _, ok := specs[want]; !ok {
			t.Errorf("%s not rendered: have %v", want, slices.Sorted(mapsKeys(specs)))
		}
	}
	for name, s := range specs {
		if s.NodeSelector["kubernetes.io/os"] != "linux" {
			t.Errorf("%s nodeSelector %v: want kubernetes.io/os=linux", name, s.NodeSelector)
		}
	}
	// Helm merges maps: null is how a user drops the default.
	r := render(t, with(kube136, `webhook.nodeSelector.kubernetes\.io/os=null`, "webhook.nodeSelector.pool=system"))
	dep := r.podSpecs(t)["Deployment/gpu-injector-webhook"].Spec
	if !reflect.DeepEqual(dep.NodeSelector, map[string]string{"pool": "system"}) {
		t.Errorf("webhook nodeSelector %v: want the default dropped and pool=system", dep.NodeSelector)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestWebhookHostNetwork(t *testing.T) {
	def := render(t, kube136).podSpecs(t)["Deployment/gpu-injector-webhook"].Spec
	if def.HostNetwork || def.DNSPolicy != "" {
		t.Errorf("default: hostNetwork %v, dnsPolicy %q: want the pod network", def.HostNetwork, def.DNSPolicy)
	}
	r := render(t, with(kube136, "webhook.hostNetwork=true", "webhook.port=10260", "webhook.metricsPort=10261", "webhook.healthPort=10262",
		"webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiServerPeers[0].ipBlock.cidr=10.0.0.0/24"))
	spec := r.podSpecs(t)["Deployment/gpu-injector-webhook"]
	if !spec.Spec.HostNetwork || spec.Spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q: want the node's network with the cluster's DNS", spec.Spec.HostNetwork, spec.Spec.DNSPolicy)
	}
	c := container(t, spec, "webhook")
	for _, a := range []string{"--port=10260", "--metrics-bind-address=:10261", "--health-probe-bind-address=:10262"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("webhook args %q lack %s", c.Args, a)
		}
	}
	if findPort(c, "webhook") != 10260 || findPort(c, "metrics") != 10261 || findPort(c, "health") != 10262 {
		t.Errorf("container ports %+v: want webhook 10260, metrics 10261, health 10262", c.Ports)
	}
	// The Service and the probes name the ports, so they follow.
	svc := mustGet[corev1.Service](t, r, "Service", webhookSvc)
	if svc.Spec.Ports[0].TargetPort.String() != "webhook" || c.ReadinessProbe.HTTPGet.Port.String() != "health" {
		t.Errorf("service targetPort %s, readiness port %s: want the named ports", svc.Spec.Ports[0].TargetPort.String(), c.ReadinessProbe.HTTPGet.Port.String())
	}
	np := mustGet[networkingv1.NetworkPolicy](t, r, "NetworkPolicy", fullname+"-webhook")
	var ports []int32
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			ports = append(ports, p.Port.IntVal)
		}
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []int32{10260, 10261, 10262}) {
		t.Errorf("NetworkPolicy ports %v: want the configured ones", ports)
	}
}

func TestExtraEnvVolumesTolerations(t *testing.T) {
	r := render(t, with(kube136,
		"webhook.extraEnv[0].name=HTTPS_PROXY", "webhook.extraEnv[0].value=http://proxy:3128",
		"webhook.extraVolumes[0].name=ca", "webhook.extraVolumes[0].configMap.name=corp-ca",
		"webhook.extraVolumeMounts[0].name=ca", "webhook.extraVolumeMounts[0].mountPath=/etc/ssl/corp", "webhook.extraVolumeMounts[0].readOnly=true",
		"webhook.tolerations[0].key=dedicated", "webhook.tolerations[0].operator=Exists",
		"webhook.priorityClassName=system-cluster-critical",
		"nodeprobe.extraEnv[0].name=GODEBUG", "nodeprobe.extraEnv[0].value=madvdontneed=1",
		"nodeprobe.extraVolumes[0].name=extra", "nodeprobe.extraVolumes[0].emptyDir.medium=Memory",
		"nodeprobe.extraVolumeMounts[0].name=extra", "nodeprobe.extraVolumeMounts[0].mountPath=/extra",
		"nodeprobe.priorityClassName=system-node-critical",
		"runtimeInjection.extraEnv[0].name=NRI_DEBUG", "runtimeInjection.extraEnv[0].value=on",
		"runtimeInjection.extraVolumeMounts[0].name=extra", "runtimeInjection.extraVolumeMounts[0].mountPath=/extra",
	))
	dep := r.podSpecs(t)["Deployment/gpu-injector-webhook"]
	ds := r.podSpecs(t)["DaemonSet/"+probeSA]
	hasEnv := func(c corev1.Container, name string) bool {
		return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	}
	hasMount := func(c corev1.Container, name, path string) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name && m.MountPath == path })
	}
	hasVolume := func(s corev1.PodSpec, name string) bool {
		return slices.ContainsFunc(s.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	}
	wc, pc, nc := container(t, dep, "webhook"), container(t, ds, "nodeprobe"), container(t, ds, "nri-plugin")
	checks := map[string]bool{
		"webhook env":              hasEnv(wc, "HTTPS_PROXY") && hasEnv(wc, "GPU_INJECTOR_MEMORY_LIMIT"),
		"webhook volume and mount": hasVolume(dep.Spec, "ca") && hasMount(wc, "ca", "/etc/ssl/corp") && hasMount(wc, "config", "/etc/gpu-injector"),
		"webhook toleration":       len(dep.Spec.Tolerations) == 1 && dep.Spec.Tolerations[0].Key == "dedicated",
		"webhook priority class":   dep.Spec.PriorityClassName == "system-cluster-critical",
		"probe env":                hasEnv(pc, "GODEBUG") && hasEnv(pc, "NODE_NAME") && !hasEnv(nc, "GODEBUG"),
		"probe volume and mount":   hasVolume(ds.Spec, "extra") && hasMount(pc, "extra", "/extra") && hasVolume(ds.Spec, "host-root"),
		"probe priority class":     ds.Spec.PriorityClassName == "system-node-critical",
		"probe tolerations":        len(ds.Spec.Tolerations) == 1 && ds.Spec.Tolerations[0].Key == "nvidia.com/gpu",
		"plugin env":               hasEnv(nc, "NRI_DEBUG") && !hasEnv(pc, "NRI_DEBUG"),
		"plugin mount":             hasMount(nc, "extra", "/extra") && hasMount(nc, "nri-socket", "/var/run/nri"),
	}
	for what, ok := range checks {
		if !ok {
			t.Errorf("%s: not as set", what)
		}
	}
	checkKnownTypes(t, r)
}

const openShiftAPI = "security.openshift.io/v1"

func TestOpenShiftDetection(t *testing.T) {
	scc := probeSA
	for name, tc := range map[string]struct {
		o    renderOpts
		want bool
	}{
		"auto, plain Kubernetes":        {o: kube136},
		"auto, OpenShift":               {o: renderOpts{kubeVersion: "1.33.6", apiVersions: []string{openShiftAPI}}, want: true},
		"forced on without the API":     {o: with(kube136, "openshift.enabled=true"), want: true},
		"forced off on OpenShift":       {o: renderOpts{kubeVersion: "1.33.6", apiVersions: []string{openShiftAPI}, set: []string{"openshift.enabled=false"}}},
		"OpenShift without the probe":   {o: renderOpts{kubeVersion: "1.33.6", apiVersions: []string{openShiftAPI}, set: []string{"nodeprobe.enabled=false", "runtimeInjection.enabled=false"}}},
		"OpenShift with cert-manager":   {o: renderOpts{kubeVersion: "1.36.3", apiVersions: []string{openShiftAPI}, set: []string{"certManager.enabled=true"}}, want: true},
		"OpenShift, a privileged probe": {o: renderOpts{kubeVersion: "1.36.3", apiVersions: []string{openShiftAPI}, set: []string{"nodeprobe.privileged=true"}}, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			r := render(t, tc.o)
			probe := r.podSpecs(t)["DaemonSet/"+probeSA]
			gotSCC := r.get("SecurityContextConstraints", scc) != nil
			if probe.Spec.Containers == nil {
				if gotSCC {
					t.Error("an SCC without the probe")
				}
				return
			}
			if gotSCC != tc.want || (probe.Annotations["openshift.io/required-scc"] == scc) != tc.want {
				t.Fatalf("SCC rendered %v, probe's required-scc %q: want OpenShift %v", gotSCC, probe.Annotations["openshift.io/required-scc"], tc.want)
			}
			for name, s := range allPodSpecs(t, r) {
				if strings.HasPrefix(name, "DaemonSet/") {
					continue
				}
				fixed := s.SecurityContext != nil && (s.SecurityContext.RunAsUser != nil || s.SecurityContext.FSGroup != nil || s.SecurityContext.RunAsGroup != nil)
				for _, c := range s.Containers {
					fixed = fixed || c.SecurityContext != nil && (c.SecurityContext.RunAsUser != nil || c.SecurityContext.RunAsGroup != nil)
				}
				if fixed == tc.want {
					t.Errorf("%s: a fixed uid or fsGroup %v, want %v (restricted-v2 assigns the namespace's)", name, fixed, !tc.want)
				}
			}
			if tc.want {
				checkSCC(t, r)
			}
		})
	}
}

// checkSCC: the probe's SCC allows what the probe's pod asks for and nothing
// more, and only the probe's ServiceAccount may use it.
func checkSCC(t *testing.T, r rendered) {
	t.Helper()
	scc := r.get("SecurityContextConstraints", probeSA).Object
	ds := mustGet[appsv1.DaemonSet](t, r, "DaemonSet", probeSA)
	spec := ds.Spec.Template.Spec
	need := map[string]any{
		"allowHostDirVolumePlugin": false, "allowHostIPC": spec.HostIPC, "allowHostNetwork": spec.HostNetwork,
		"allowHostPID": spec.HostPID, "allowHostPorts": false, "allowPrivilegedContainer": false, "allowPrivilegeEscalation": false,
		"defaultAllowPrivilegeEscalation": false, "allowedCapabilities": nil, "defaultAddCapabilities": nil,
		"requiredDropCapabilities": []any{"ALL"}, "readOnlyRootFilesystem": true, "seccompProfiles": []any{"runtime/default"},
		"users": []any{}, "groups": []any{}, "priority": nil,
		"seLinuxContext": map[string]any{"type": "MustRunAs"}, "fsGroup": map[string]any{"type": "MustRunAs"},
		"supplementalGroups": map[string]any{"type": "RunAsAny"},
	}
	var volumes []any
	for _, v := range spec.Volumes {
		var kind string
		switch {
		case v.HostPath != nil:
			kind = "hostPath"
			need["allowHostDirVolumePlugin"] = true
		case v.ConfigMap != nil:
			kind = "configMap"
		case v.EmptyDir != nil:
			kind = "emptyDir"
		case v.Projected != nil:
			kind = "projected"
		default:
			t.Fatalf("volume %s of a kind this check does not know", v.Name)
		}
		if !slices.Contains(volumes, any(kind)) {
			volumes = append(volumes, kind)
		}
	}
	sort.Slice(volumes, func(i, j int) bool { return volumes[i].(string) < volumes[j].(string) })
	need["volumes"] = volumes
	uids := map[int64]bool{}
	var added []any
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc.Privileged != nil && *sc.Privileged {
			need["allowPrivilegedContainer"], need["allowPrivilegeEscalation"] = true, true
		}
		if sc.Capabilities != nil {
			for _, c := range sc.Capabilities.Add {
				added = append(added, string(c))
			}
		}
		if sc.RunAsUser == nil {
			t.Fatalf("container %s has no uid: the SCC's user rule cannot be checked", c.Name)
		}
		uids[*sc.RunAsUser] = true
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				need["allowHostPorts"] = true
			}
		}
	}
	if len(added) > 0 {
		need["allowedCapabilities"] = added
	}
	if len(uids) == 1 {
		for uid := range uids {
			need["runAsUser"] = map[string]any{"type": "MustRunAs", "uid": uid}
		}
	} else {
		// No SCC user rule but RunAsAny admits two uids; the pod fixes each.
		need["runAsUser"] = map[string]any{"type": "RunAsAny"}
	}
	for k, v := range scc {
		if k == "apiVersion" || k == "kind" || k == "metadata" {
			continue
		}
		w, ok := need[k]
		if !ok {
			t.Errorf("SCC field %s=%v: nothing the probe's pod needs", k, v)
			continue
		}
		if !reflect.DeepEqual(normalize(v), normalize(w)) {
			t.Errorf("SCC %s = %v, the pod needs %v", k, v, w)
		}
	}
	for k := range need {
		if _, ok := scc[k]; !ok {
			t.Errorf("SCC lacks %s: its default may grant more than needed", k)
		}
	}
	role := mustGet[rbacv1.Role](t, r, "Role", probeSA+"-scc")
	want := []rbacv1.PolicyRule{{APIGroups: []string{"security.openshift.io"}, Resources: []string{"securitycontextconstraints"}, ResourceNames: []string{probeSA}, Verbs: []string{"use"}}}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("SCC Role rules %+v, want use of the probe's SCC alone", role.Rules)
	}
	rb := mustGet[rbacv1.RoleBinding](t, r, "RoleBinding", probeSA+"-scc")
	if rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != probeSA || rb.Subjects[0].Namespace != namespace {
		t.Errorf("SCC RoleBinding %+v: want the probe's ServiceAccount alone", rb)
	}
}

// normalize makes YAML's numbers and typed values comparable.
func normalize(v any) any {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case int:
		return float64(x)
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}

func TestHelmTest(t *testing.T) {
	r := render(t, kube136)
	var hooks []string
	for _, o := range r.objects {
		if h := o.GetAnnotations()["helm.sh/hook"]; h == "test" {
			hooks = append(hooks, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
		}
	}
	// helm test --logs reads the logs of every test hook as a pod of the release
	// namespace, of one container: the pods must be the only hooks, and be there.
	slices.Sort(hooks)
	if want := []string{"Pod/" + namespace + "/" + precheckName, "Pod/" + namespace + "/" + testNamespace}; !slices.Equal(hooks, want) {
		t.Errorf("test hooks %v, want %v", hooks, want)
	}
	ns := mustGet[corev1.Namespace](t, r, "Namespace", testNamespace)
	if ns.Labels["gpu-injector.io/inject"] != "enabled" || ns.Annotations["helm.sh/hook"] != "" {
		t.Errorf("test namespace labels %v, annotations %v: want it opted in, part of the release", ns.Labels, ns.Annotations)
	}
	wh := mutatingWebhook(t, r)
	for _, e := range wh.NamespaceSelector.MatchExpressions {
		if slices.Contains(e.Values, testNamespace) {
			t.Errorf("the webhook never sees the test's namespace: %+v", e)
		}
	}
	role := mustGet[rbacv1.Role](t, r, "Role", testNamespace)
	if want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}}}; !reflect.DeepEqual(role.Rules, want) || role.Namespace != testNamespace {
		t.Errorf("test Role in %s: %+v, want pods create alone, in the test's namespace", role.Namespace, role.Rules)
	}
	rb := mustGet[rbacv1.RoleBinding](t, r, "RoleBinding", testNamespace)
	if len(rb.Subjects) != 2 || rb.Subjects[0].Name != testNamespace || rb.Subjects[1].Name != precheckName ||
		rb.Subjects[0].Namespace != namespace || rb.Subjects[1].Namespace != namespace {
		t.Errorf("test RoleBinding subjects %+v, want the two tests' accounts", rb.Subjects)
	}
	pod := mustGet[corev1.Pod](t, r, "Pod", testNamespace)
	if pod.Namespace != namespace || pod.Spec.ServiceAccountName != testNamespace ||
		!slices.Equal(pod.Spec.Containers[0].Args, []string{"status", "--dry-run-only", "--dry-run-namespace=" + testNamespace}) {
		t.Errorf("test pod in %s, account %q, args %q", pod.Namespace, pod.Spec.ServiceAccountName, pod.Spec.Containers[0].Args)
	}
	if p := pod.Annotations["helm.sh/hook-delete-policy"]; p != "before-hook-creation" {
		t.Errorf("test pod delete policy %q: kept for its logs until the next test", p)
	}
	if reasons := restricted(t, corev1.PodTemplateSpec{Spec: pod.Spec}); len(reasons) > 0 {
		t.Errorf("Pod Security restricted refuses the test pod: %v", reasons)
	}
	checkPrecheckTest(t, r)
	checkTestPolicy(t, r)
	off := render(t, with(kube136, "tests.enabled=false"))
	for _, o := range off.objects {
		if o.GetName() == testNamespace || o.GetName() == precheckName {
			t.Errorf("tests.enabled=false renders %s %s", o.GetKind(), o.GetName())
		}
	}
	if cr := mustGet[rbacv1.Role](t, off, "Role", cleanupName); slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "pods") }) {
		t.Error("with no test, the cleanup may still delete a pod")
	}
}

// checkPrecheckTest: the precheck pod runs gpu-injector precheck with the
// release's configuration as a file, and its account may list Nodes and
// Namespaces and nothing else of the cluster: no read of ConfigMaps,
// Secrets or workloads.
func checkPrecheckTest(t *testing.T, r rendered) {
	t.Helper()
	pod := mustGet[corev1.Pod](t, r, "Pod", precheckName)
	c := pod.Spec.Containers[0]
	wantArgs := []string{"precheck", "--namespace=" + namespace, "--config=/etc/gpu-injector/config.yaml", "--dry-run-namespace=" + testNamespace}
	if pod.Namespace != namespace || pod.Spec.ServiceAccountName != precheckName || !slices.Equal(c.Args, wantArgs) {
		t.Errorf("precheck pod in %s, account %q, args %q; want args %q", pod.Namespace, pod.Spec.ServiceAccountName, c.Args, wantArgs)
	}
	if p := pod.Annotations["helm.sh/hook-delete-policy"]; p != "before-hook-creation" {
		t.Errorf("precheck pod delete policy %q: kept for its logs until the next test", p)
	}
	if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].ConfigMap == nil || pod.Spec.Volumes[0].ConfigMap.Name != fullname+"-config" ||
		len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/gpu-injector" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("precheck volumes %+v, mounts %+v: want the release's ConfigMap read-only at /etc/gpu-injector", pod.Spec.Volumes, c.VolumeMounts)
	}
	if lim := c.Resources.Limits.Memory(); lim.String() != "256Mi" {
		t.Errorf("precheck memory limit %s, want tests.precheck.resources' 256Mi", lim)
	}
	if reasons := restricted(t, corev1.PodTemplateSpec{Spec: pod.Spec}); len(reasons) > 0 {
		t.Errorf("Pod Security restricted refuses the precheck pod: %v", reasons)
	}
	cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", precheckName)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}},
	}
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("precheck ClusterRole %+v\nwant %+v", cr.Rules, want)
	}
	crb := mustGet[rbacv1.ClusterRoleBinding](t, r, "ClusterRoleBinding", precheckName)
	if crb.RoleRef.Name != precheckName || len(crb.Subjects) != 1 || crb.Subjects[0].Name != precheckName || crb.Subjects[0].Namespace != namespace {
		t.Errorf("precheck ClusterRoleBinding %+v", crb)
	}
	// No other binding gives the precheck account anything.
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, u := range r.all(kind) {
			b := typed[rbacv1.ClusterRoleBinding](t, u)
			for _, s := range b.Subjects {
				if s.Name == precheckName && b.Name != precheckName && !(kind == "RoleBinding" && b.Namespace == testNamespace) {
					t.Errorf("%s %s/%s also grants the precheck account rights", kind, b.Namespace, b.Name)
				}
			}
		}
	}
}

// checkTestPolicy: the tests' accounts may create pods only with dry run.
func checkTestPolicy(t *testing.T, r rendered) {
	t.Helper()
	vap := mustGet[admissionregistrationv1.ValidatingAdmissionPolicy](t, r, "ValidatingAdmissionPolicy", testNamespace)
	validator := compilePolicy(t, vap)
	podGVK := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	podGVR := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	pod := object(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: "+testNamespace+"}\nspec: {containers: [{name: c, image: i}]}")
	for _, tc := range []struct {
		user   string
		dryRun bool
		denied bool
		match  bool
	}{
		{user: "system:serviceaccount:" + namespace + ":" + testNamespace, dryRun: true, match: true},
		{user: "system:serviceaccount:" + namespace + ":" + testNamespace, dryRun: false, match: true, denied: true},
		{user: "system:serviceaccount:" + namespace + ":" + precheckName, dryRun: true, match: true},
		{user: "system:serviceaccount:" + namespace + ":" + precheckName, dryRun: false, match: true, denied: true},
		{user: "system:serviceaccount:other:" + testNamespace, dryRun: false},
	} {
		va := attributes(pod, nil, podGVK, podGVR, "", admission.Create, &user.DefaultInfo{Name: tc.user})
		va.Attributes = admission.NewAttributesRecord(pod, nil, podGVK, testNamespace, "p", podGVR, "", admission.Create, nil, tc.dryRun, &user.DefaultInfo{Name: tc.user})
		res := validator.Validate(context.Background(), podGVR, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
		if (len(res.Decisions) > 0) != tc.match {
			t.Errorf("%s dry run %v: policy applied %v, want %v", tc.user, tc.dryRun, len(res.Decisions) > 0, tc.match)
			continue
		}
		denied := slices.ContainsFunc(res.Decisions, func(d validating.PolicyDecision) bool { return d.Action == validating.ActionDeny })
		if denied != tc.denied {
			t.Errorf("%s dry run %v: denied %v, want %v (%+v)", tc.user, tc.dryRun, denied, tc.denied, res.Decisions)
		}
	}
}

func TestCleanupHook(t *testing.T) {
	r := render(t, kube136)
	job := mustGet[batchv1.Job](t, r, "Job", cleanupName)
	wantArgs := []string{"cleanup", "--namespace=" + namespace, "--webhook-configuration-name=" + fullname, "--webhook-deployment=" + fullname + "-webhook",
		"--probe-daemonset=" + probeSA, "--pool-memory-name=" + fullname + "-pools", "--delete-pods=" + testNamespace + "," + precheckName, "--timeout=2m"}
	if got := job.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, wantArgs) {
		t.Errorf("cleanup args %q, want %q", got, wantArgs)
	}
	if job.Spec.Template.Spec.ServiceAccountName != cleanupName {
		t.Errorf("cleanup runs as %q", job.Spec.Template.Spec.ServiceAccountName)
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job"} {
		o := r.get(kind, cleanupName)
		if o == nil || o.GetAnnotations()["helm.sh/hook"] != "pre-delete" || !strings.Contains(o.GetAnnotations()["helm.sh/hook-delete-policy"], "hook-succeeded") {
			t.Errorf("%s %s: want a pre-delete hook, deleted when it succeeds", kind, cleanupName)
		}
	}
	// The policy is in force before the hook runs: part of the release.
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if o := r.get(kind, cleanupName); o == nil || o.GetAnnotations()["helm.sh/hook"] != "" {
			t.Errorf("%s %s: want it installed with the release", kind, cleanupName)
		}
	}
	cr := mustGet[rbacv1.ClusterRole](t, r, "ClusterRole", cleanupName)
	wantCluster := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{fullname}, Verbs: []string{"delete"}},
	}
	if !reflect.DeepEqual(cr.Rules, wantCluster) {
		t.Errorf("cleanup ClusterRole %+v\nwant %+v", cr.Rules, wantCluster)
	}
	role := mustGet[rbacv1.Role](t, r, "Role", cleanupName)
	wantRole := []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{fullname + "-webhook"}, Verbs: []string{"get", "delete"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{probeSA}, Verbs: []string{"get", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{fullname + "-pools"}, Verbs: []string{"delete"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{fullname + "-pools"}, Verbs: []string{"delete"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{testNamespace, precheckName}, Verbs: []string{"delete"}},
	}
	if !reflect.DeepEqual(role.Rules, wantRole) {
		t.Errorf("cleanup Role %+v\nwant %+v", role.Rules, wantRole)
	}
	if reasons := restricted(t, job.Spec.Template); len(reasons) > 0 {
		t.Errorf("Pod Security restricted refuses the cleanup pod: %v", reasons)
	}
	off := render(t, with(kube136, "cleanup.enabled=false"))
	for _, o := range off.objects {
		if strings.HasSuffix(o.GetName(), "-cleanup") {
			t.Errorf("cleanup.enabled=false renders %s %s", o.GetKind(), o.GetName())
		}
	}
}

const cleanupUser = "system:serviceaccount:" + namespace + ":" + cleanupName

func TestCleanupPolicy(t *testing.T) {
	vap := mustGet[admissionregistrationv1.ValidatingAdmissionPolicy](t, render(t, kube136), "ValidatingAdmissionPolicy", cleanupName)
	validator := compilePolicy(t, vap)
	const (
		keys   = "gpu-injector's cleanup may only remove labels and annotations under gpu-injector.io/"
		spec   = "gpu-injector's cleanup may not change a Node's spec, owners or finalizers"
		status = "gpu-injector's cleanup may only remove the GPUDriverWedged condition from a Node's status"
	)
	withoutWedged := `{"status":{"conditions":[
		{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-26T10:00:00Z"},
		{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-11-26T10:00:00Z"}]}}`
	tests := map[string]struct {
		old, new    string
		subresource string
		user        string
		denied      []string
		notMatch    bool
	}{
		"our keys removed": {new: `{"metadata":{"labels":{"gpu-injector.io/layout-fingerprint":null},"annotations":{"gpu-injector.io/layout":null}}}`},
		// The Node itself written while its status still has the condition.
		"our keys removed from a wedged node":      {old: wedgedNode, new: `{"metadata":{"labels":{"gpu-injector.io/layout-fingerprint":null}}}`},
		"status: nothing changed on a wedged node": {subresource: "status", old: wedgedNode, new: `{}`},
		"nothing changed":                          {new: `{}`},
		"our label added":                          {new: `{"metadata":{"labels":{"gpu-injector.io/state":"ready"}}}`, denied: []string{keys}},
		"our label changed":                        {new: `{"metadata":{"labels":{"gpu-injector.io/layout-fingerprint":"bbbb"}}}`, denied: []string{keys}},
		"our annotation changed":                   {new: `{"metadata":{"annotations":{"gpu-injector.io/layout":"{}"}}}`, denied: []string{keys}},
		"a foreign label removed":                  {new: `{"metadata":{"labels":{"nvidia.com/gpu.present":null}}}`, denied: []string{keys}},
		"a foreign annotation added":               {new: `{"metadata":{"annotations":{"example.com/x":"y"}}}`, denied: []string{keys}},
		"cordoned":                                 {new: `{"spec":{"unschedulable":true}}`, denied: []string{spec}},
		"status: wedged removed":                   {subresource: "status", old: wedgedNode, new: withoutWedged},
		"status: wedged added":                     {subresource: "status", new: strings.Replace(withoutWedged, `]}}`, `,{"type":"GPUDriverWedged","status":"True","reason":"x","message":"m"}]}}`, 1), denied: []string{status}},
		"status: wedged changed": {subresource: "status", old: wedgedNode,
			new: strings.Replace(withoutWedged, `]}}`, `,{"type":"GPUDriverWedged","status":"False","reason":"x","message":"m"}]}}`, 1), denied: []string{status}},
		"status: Ready removed":   {subresource: "status", new: `{"status":{"conditions":[{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":"2026-11-26T10:00:00Z"}]}}`, denied: []string{status}},
		"status: capacity":        {subresource: "status", new: `{"status":{"capacity":{"nvidia.com/gpu":"64"}}}`, denied: []string{status}},
		"the probe, not the hook": {user: probeUser, new: `{"spec":{"unschedulable":true}}`, notMatch: true},
	}
	nodeGVK := schema.GroupVersionKind{Version: "v1", Kind: "Node"}
	nodeGVR := schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			oldDoc := tc.old
			if oldDoc == "" {
				oldDoc = baseNode
			}
			old := object(t, oldDoc)
			u := tc.user
			if u == "" {
				u = cleanupUser
			}
			va := attributes(mergePatch(t, old, tc.new), old, nodeGVK, nodeGVR, tc.subresource, admission.Update, &user.DefaultInfo{Name: u})
			res := validator.Validate(context.Background(), nodeGVR, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
			checkDecisions(t, res, tc.notMatch, tc.denied, u)
		})
	}
}

func TestNotesHelmTestAndOpenShift(t *testing.T) {
	for name, tc := range map[string]struct {
		o               renderOpts
		test, openShift bool
	}{
		"defaults":           {o: kube136, test: true},
		"no test":            {o: with(kube136, "tests.enabled=false")},
		"OpenShift detected": {o: renderOpts{kubeVersion: "1.33.6", apiVersions: []string{openShiftAPI}}, test: true, openShift: true},
	} {
		t.Run(name, func(t *testing.T) {
			notes, err := renderNotes(t, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(notes, "helm test "+releaseName+" -n "+namespace+" --logs"); got != tc.test {
				t.Errorf("notes name helm test: %v, want %v\n%s", got, tc.test, notes)
			}
			if got := strings.Contains(notes, "refused by OpenShift's SCC admission"); got != tc.openShift {
				t.Errorf("notes warn of SCC refusals: %v, want %v", got, tc.openShift)
			}
		})
	}
}

// TestOpenShiftHostRoot: on OpenShift (CRI-O), nodeprobe.recursiveReadOnly=auto
// mounts the host root read-only with HostToContainer propagation. CRI-O turns
// a hostPath volume holding its storage root into HostToContainer and then
// refuses it recursively read-only: the probe would never start. Asked for
// explicitly, recursiveReadOnly stays as set.
func TestOpenShiftHostRoot(t *testing.T) {
	openShift := renderOpts{kubeVersion: "1.33.6", apiVersions: []string{openShiftAPI}}
	m := hostRootMount(t, render(t, openShift))
	if !m.ReadOnly || m.RecursiveReadOnly != nil || ptrValue(m.MountPropagation) != corev1.MountPropagationHostToContainer {
		t.Errorf("host root mount on OpenShift = %+v, want read-only, HostToContainer, no recursiveReadOnly", m)
	}
	openShift.set = []string{"nodeprobe.recursiveReadOnly=true"}
	if m := hostRootMount(t, render(t, openShift)); m.RecursiveReadOnly == nil || m.MountPropagation != nil {
		t.Errorf("host root mount with recursiveReadOnly=true = %+v, want recursively read-only, no propagation", m)
	}
	if m := hostRootMount(t, render(t, kube136)); m.RecursiveReadOnly == nil {
		t.Errorf("host root mount by default off OpenShift = %+v, want recursively read-only", m)
	}
}

// TestNodeCredentialProviders: the node's credential provider plugins are
// mounted only when asked, read-only, at the paths the configuration names,
// as a file and a folder (one folder where the file is in it, as on EKS);
// without both paths, or on OpenShift, the chart refuses.
func TestNodeCredentialProviders(t *testing.T) {
	webhookVolumes := func(r rendered) ([]corev1.Volume, []corev1.VolumeMount) {
		spec := r.podSpecs(t)["Deployment/gpu-injector-webhook"]
		var vols []corev1.Volume
		for _, v := range spec.Spec.Volumes {
			if v.HostPath != nil {
				vols = append(vols, v)
			}
		}
		var mounts []corev1.VolumeMount
		for _, m := range container(t, spec, "webhook").VolumeMounts {
			if strings.HasPrefix(m.Name, "credential-provider") {
				mounts = append(mounts, m)
			}
		}
		return vols, mounts
	}
	if vols, mounts := webhookVolumes(render(t, kube136)); len(vols)+len(mounts) > 0 {
		t.Errorf("default: hostPath volumes %+v, mounts %+v", vols, mounts)
	}
	for name, tc := range map[string]struct {
		config, binDir string
		want           map[string]corev1.HostPathType
	}{
		"GKE": {"/etc/srv/kubernetes/cri_auth_config.yaml", "/home/kubernetes/bin", map[string]corev1.HostPathType{
			"/etc/srv/kubernetes/cri_auth_config.yaml": corev1.HostPathFile, "/home/kubernetes/bin": corev1.HostPathDirectory}},
		"EKS": {"/etc/eks/image-credential-provider/config.json", "/etc/eks/image-credential-provider", map[string]corev1.HostPathType{
			"/etc/eks/image-credential-provider": corev1.HostPathDirectory}},
		"paths YAML would misread": {"/etc/a: b/c.json", "/opt/x #y", map[string]corev1.HostPathType{
			"/etc/a: b/c.json": corev1.HostPathFile, "/opt/x #y": corev1.HostPathDirectory}},
	} {
		t.Run(name, func(t *testing.T) {
			vols, mounts := webhookVolumes(render(t, with(kube136, "webhook.nodeCredentialProviders.hostPath=true",
				"config.images.credentialProviders.config="+tc.config, "config.images.credentialProviders.binDir="+tc.binDir)))
			got := map[string]corev1.HostPathType{}
			for _, v := range vols {
				got[v.HostPath.Path] = *v.HostPath.Type
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("hostPath volumes %v, want %v", got, tc.want)
			}
			for _, m := range mounts {
				if _, ok := tc.want[m.MountPath]; !ok || !m.ReadOnly {
					t.Errorf("mount %+v: want read-only at one of %v", m, tc.want)
				}
			}
			if len(mounts) != len(tc.want) {
				t.Errorf("%d mounts, want %d", len(mounts), len(tc.want))
			}
		})
	}
	for name, set := range map[string][]string{
		"no paths":  {"webhook.nodeCredentialProviders.hostPath=true"},
		"OpenShift": {"webhook.nodeCredentialProviders.hostPath=true", "openshift.enabled=true", "config.images.credentialProviders.config=/c.yaml", "config.images.credentialProviders.binDir=/bin"},
	} {
		if out, err := helmTemplate(t, with(kube136, set...)); err == nil || !strings.Contains(err.Error(), "webhook.nodeCredentialProviders.hostPath") {
			t.Errorf("%s: rendered (%d bytes) or refused for another reason: %v", name, len(out), err)
		}
	}
}
