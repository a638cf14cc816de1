package charts_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
)

const ephemeralPolicy = "gpu-injector-ephemeral-containers"

// TestEphemeralContainersPolicy: an ephemeral container may mount an injected
// driver volume only recursively read-only, as the webhook mounts it; other volumes and other pods are not its
// business.
func TestEphemeralContainersPolicy(t *testing.T) {
	vap := mustGet[admissionregistrationv1.ValidatingAdmissionPolicy](t, render(t, kube136), "ValidatingAdmissionPolicy", ephemeralPolicy)
	mustGet[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, render(t, kube136), "ValidatingAdmissionPolicyBinding", ephemeralPolicy)
	validator := compilePolicy(t, vap)

	const pod = `apiVersion: v1
kind: Pod
metadata: {name: train, namespace: ml}
spec:
  volumes:
  - {name: gpu-injector-0b56974fbfa82afc3217fbd5, hostPath: {path: /usr/lib/nvidia, type: Directory}}
  - {name: gpu-injector-scratch, emptyDir: {}}
  containers:
  - name: cuda
    image: cuda
    volumeMounts:
    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /usr/local/nvidia/lib64, readOnly: true}
  ephemeralContainers:
  - name: debug
    image: busybox
    volumeMounts:
`
	tests := map[string]struct {
		mount  string
		denied bool
	}{
		"driver volume read-write":                 {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver}\n", denied: true},
		"driver volume read-only, not recursively": {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver, readOnly: true}\n", denied: true},
		"driver volume recursiveReadOnly Disabled": {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver, readOnly: true, recursiveReadOnly: Disabled}\n", denied: true},
		"driver volume recursiveReadOnly alone":    {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver, recursiveReadOnly: Enabled}\n", denied: true},
		"driver volume recursively read-only":      {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver, readOnly: true, recursiveReadOnly: IfPossible}\n"},
		"driver volume read-only, Enabled":         {mount: "    - {name: gpu-injector-0b56974fbfa82afc3217fbd5, mountPath: /host-driver, readOnly: true, recursiveReadOnly: Enabled}\n"},
		"a user's volume read-write":               {mount: "    - {name: gpu-injector-scratch, mountPath: /scratch}\n"},
	}
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obj := object(t, pod+tc.mount)
			va := attributes(obj, obj, gvk, gvr, "ephemeralcontainers", admission.Update, &user.DefaultInfo{Name: "dev"})
			res := validator.Validate(context.Background(), gvr, va, nil, nil, celconfig.RuntimeCELCostBudget, nil)
			denied := false
			for _, d := range res.Decisions {
				if d.Evaluation == validating.EvalError {
					t.Errorf("evaluation error: %s", d.Message)
				}
				denied = denied || d.Action == validating.ActionDeny
			}
			if denied != tc.denied {
				t.Errorf("denied = %v, want %v (%+v)", denied, tc.denied, res.Decisions)
			}
		})
	}
}

// TestNetworkPolicy: off by default; on, the webhook port admits only the
// API server's peers, and without them the render is refused.
func TestNetworkPolicy(t *testing.T) {
	if n := len(render(t, kube136).all("NetworkPolicy")); n != 0 {
		t.Errorf("%d NetworkPolicies by default, want none", n)
	}
	r := render(t, with(kube136, "webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiServerPeers[0].ipBlock.cidr=10.0.0.0/24"))
	np := mustGet[networkingv1.NetworkPolicy](t, r, "NetworkPolicy", "gpu-injector-webhook")
	var webhookRule *networkingv1.NetworkPolicyIngressRule
	for i, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.IntValue() == 9443 {
				webhookRule = &np.Spec.Ingress[i]
			}
		}
	}
	if webhookRule == nil || len(webhookRule.From) != 1 || webhookRule.From[0].IPBlock == nil || webhookRule.From[0].IPBlock.CIDR != "10.0.0.0/24" {
		t.Errorf("webhook port rule = %+v, want only from 10.0.0.0/24", webhookRule)
	}
	if _, err := helmTemplate(t, with(kube136, "webhook.networkPolicy.enabled=true")); err == nil {
		t.Error("rendered a NetworkPolicy without apiServerPeers, which would shut the API server out")
	}
}

// TestClientCA: the webhook verifies client certificates with the CA of the
// named ConfigMap, mounted where the server reads it.
func TestClientCA(t *testing.T) {
	r := render(t, with(kube136, "webhook.clientCA.enabled=true", "webhook.clientCA.configMap=apiserver-client-ca"))
	for name, spec := range r.podSpecs(t) {
		if !strings.HasSuffix(name, "webhook") {
			continue
		}
		c := container(t, spec, "webhook")
		if !slices.Contains(c.Args, "--client-ca-name=client-ca/ca.crt") {
			t.Errorf("args %q lack --client-ca-name=client-ca/ca.crt", c.Args)
		}
		ok := slices.ContainsFunc(spec.Spec.Volumes, func(v corev1.Volume) bool {
			return v.Name == "client-ca" && v.ConfigMap != nil && v.ConfigMap.Name == "apiserver-client-ca"
		})
		if !ok || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/certs/client-ca" }) {
			t.Errorf("no client-ca ConfigMap mounted at /certs/client-ca: %+v, %+v", spec.Spec.Volumes, c.VolumeMounts)
		}
	}
	if _, err := helmTemplate(t, with(kube136, "webhook.clientCA.enabled=true")); err == nil {
		t.Error("rendered clientCA without its ConfigMap")
	}
}

// TestPullSecretsNeedVerifiedCaller: the chart refuses to read pods' pull
// secrets unless the webhook verifies its caller (its NetworkPolicy or
// client certificates), and says what to set.
func TestPullSecretsNeedVerifiedCaller(t *testing.T) {
	read := with(kube136, "config.images.mode=On", "config.images.pullSecrets=Read")
	out, err := helmTemplate(t, read)
	if err == nil || !strings.Contains(err.Error(), "needs the webhook to verify its caller") || !strings.Contains(err.Error(), "webhook.networkPolicy.enabled=true") {
		t.Errorf("pullSecrets Read unverified: err = %v, output %.300s; want a refusal naming what to set", err, out)
	}
	for name, o := range map[string]renderOpts{
		"network policy": with(read, "webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiServerPeers[0].ipBlock.cidr=10.0.0.0/24"),
		"client CA":      with(read, "webhook.clientCA.enabled=true", "webhook.clientCA.configMap=apiserver-client-ca"),
		"mode off":       with(kube136, "config.images.pullSecrets=Read"),
	} {
		if _, err := helmTemplate(t, o); err != nil {
			t.Errorf("%s: %v, want rendered", name, err)
		}
	}
}
