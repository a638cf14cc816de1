//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// taintE2E keeps the nodes these tests add away from every other test's
// pods, whichever order tests run in and however late a deletion reaches the
// webhook: neither the webhook nor the scheduler offers a node whose taint a
// pod does not tolerate.
var taintE2E = corev1.Taint{Key: "gpu-injector.io/e2e-node", Value: "dra-and-runtime", Effect: corev1.TaintEffectNoSchedule}

var tolerateE2E = corev1.Toleration{Key: taintE2E.Key, Operator: corev1.TolerationOpEqual, Value: taintE2E.Value, Effect: taintE2E.Effect}

// serverVersion is the API server's Kubernetes version.
func serverVersion(t *testing.T) *utilversion.Version {
	t.Helper()
	info, err := client().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("failed to read the API server's version: %v", err)
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil {
		t.Fatalf("failed to parse the API server's version %q: %v", info.GitVersion, err)
	}
	return v
}

// assertWebhookLogged checks that every webhook replica logged a line that
// holds want: what the webhook tells an operator about the cluster.
func assertWebhookLogged(t *testing.T, want string) {
	t.Helper()
	pods, err := testEnv.WebhookPods(testContext(t))
	if err != nil || len(pods) == 0 {
		t.Fatalf("no webhook pods: %v", err)
	}
	for i := range pods {
		if log := testEnv.PodLog(testContext(t), &pods[i], "webhook", false, 0); !strings.Contains(log, want) {
			t.Errorf("webhook pod %s did not log %q", pods[i].Name, want)
		}
	}
}

// looseDriver is a distribution's packaged driver (Ubuntu's
// nvidia-driver-580): libraries file by file in the shared folder, nvidia-smi
// in /usr/bin.
func looseDriver(version string) layout.Plan {
	lib, bin := "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"
	p := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: version, LibraryPaths: []string{lib}}
	for _, f := range []string{"libcuda", "libnvidia-ml"} {
		p.Mounts = append(p.Mounts, layout.Mount{HostPath: "/usr/lib/x86_64-linux-gnu/" + f + ".so." + version, ContainerPath: lib + "/" + f + ".so.1", Kind: layout.KindFile})
	}
	p.Mounts = append(p.Mounts, layout.Mount{HostPath: "/usr/bin/nvidia-smi", ContainerPath: bin + "/nvidia-smi", Kind: layout.KindFile})
	return p
}

// apiGPUNode registers a Ready node no kubelet runs, publishing plan as the
// probe would (annotation, fingerprint label, state), with gpus allocatable
// nvidia.com/gpu (none when 0, as on a node whose GPUs come through DRA), and
// removes it when the test ends. It returns the plan's fingerprint.
func apiGPUNode(t *testing.T, name, accelerator string, plan layout.Plan, gpus int64) string {
	t.Helper()
	ctx := testContext(t)
	ann, err := layout.Encode(plan)
	if err != nil {
		t.Fatal(err)
	}
	fp := plan.Fingerprint()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/hostname":  name,
				"kubernetes.io/os":        "linux",
				env.LabelAccelerator:      accelerator,
				layout.LabelState:         layout.StateReady,
				layout.LabelFingerprint:   fp,
				layout.LabelDriverVersion: plan.DriverVersion,
			},
			Annotations: map[string]string{
				layout.AnnotationLayout: ann,
				"gpu-injector.io/e2e":   "API object only: no kubelet runs this node; its pods are bound, never started",
			},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{taintE2E}},
	}
	if _, err := client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if gpus > 0 {
		res[env.GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	now := metav1.NewTime(time.Now())
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = corev1.NodeStatus{
			Capacity: res, Allocatable: res, Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "StandIn",
				Message: "simulated by the gpu-injector e2e tests", LastHeartbeatTime: now, LastTransitionTime: now}},
			NodeInfo: corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "none (API object)"},
		}
		_, err = client().CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("failed to set the status of node %s: %v", name, err)
	}
	// The API server taints every new Node not-ready; the node lifecycle
	// controller that would lift it is off in this environment.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []corev1.Taint
		for _, tn := range cur.Spec.Taints {
			if tn.Key != corev1.TaintNodeNotReady {
				keep = append(keep, tn)
			}
		}
		cur.Spec.Taints = keep
		_, err = client().CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("failed to untaint node %s: %v", name, err)
	}
	return fp
}

// assertPinned checks the injection record and the fingerprint selector.
func assertPinned(t *testing.T, p *corev1.Pod, fp, driver string) layout.Injected {
	t.Helper()
	rec, ok := injected(t, p)
	if !ok {
		t.Fatalf("pod %s was not mutated: no %s annotation; annotations %v", p.Name, layout.AnnotationInjected, p.Annotations)
	}
	if rec.Fingerprint != fp || rec.DriverVersion != driver {
		t.Errorf("pod %s: injection record %+v, want fingerprint %s and driver %s", p.Name, rec, fp, driver)
	}
	if got := p.Spec.NodeSelector[layout.LabelFingerprint]; got != fp {
		t.Errorf("pod %s: nodeSelector %s=%q, want %q", p.Name, layout.LabelFingerprint, got, fp)
	}
	return rec
}

// waitBoundTo waits until the scheduler binds the pod and checks the node.
func waitBoundTo(t *testing.T, ns, name, node string) *corev1.Pod {
	t.Helper()
	p := waitBound(t, ns, name)
	if p.Spec.NodeName != node {
		t.Fatalf("pod %s/%s bound to %q, want %s", ns, name, p.Spec.NodeName, node)
	}
	return p
}

// TestDRANode: a node whose GPUs come through DRA, as with NVIDIA's DRA
// driver on Kubernetes 1.34+: a ResourceSlice of driver gpu.nvidia.com, the
// DeviceClass gpu.nvidia.com that declares the nvidia.com/gpu extended
// resource (DRAExtendedResource), and no nvidia.com/gpu in the Node's
// allocatable. The webhook counts its GPUs from the slice, so a plain GPU
// limit with no node constraint gets this node's layout (its 8 GPUs outweigh
// every other layout of the environment); a pod that claims a GPU only
// through a ResourceClaimTemplate is a GPU pod too. Both are bound by the real
// scheduler, which allocates the devices from the slice.
func TestDRANode(t *testing.T) {
	ctx := testContext(t)
	const nodeName, driver = "dra-h100", "580.95.05"
	version := serverVersion(t)

	if version.LessThan(utilversion.MajorMinor(1, 34)) {
		// resource.k8s.io/v1 is served from 1.34: the webhook counts GPUs
		// from Node allocatable only, and says so when it starts.
		if _, err := client().Discovery().ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String()); !apierrors.IsNotFound(err) {
			t.Fatalf("a %s API server answers for %s: %v", version, resourcev1.SchemeGroupVersion, err)
		}
		assertWebhookLogged(t, "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34+)")
		return
	}
	// DRA extended resources (a DeviceClass's extendedResourceName, which the
	// scheduler satisfies a plain nvidia.com/gpu limit from) are beta, on by
	// default, from 1.36; before that the API server drops the field.
	extended := !version.LessThan(utilversion.MajorMinor(1, 36))

	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"},
		Spec: resourcev1.DeviceClassSpec{
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`}}},
			ExtendedResourceName: ptr("nvidia.com/gpu"),
		},
	}
	created, err := client().ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create DeviceClass %s: %v", class.Name, err)
	}
	t.Cleanup(func() {
		_ = client().ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	if kept := created.Spec.ExtendedResourceName != nil; kept != extended {
		t.Fatalf("a %s API server kept spec.extendedResourceName of DeviceClass %s: %v, want %v (DRAExtendedResource is on by default from 1.36)", version, class.Name, kept, extended)
	}
	if !extended {
		assertWebhookLogged(t, "the API server predates DRA extended resources (Kubernetes 1.36)")
	}

	fp := apiGPUNode(t, nodeName, "nvidia-h100", looseDriver(driver), 0)
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-gpu.nvidia.com"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   "gpu.nvidia.com",
			NodeName: ptr(nodeName),
			Pool:     resourcev1.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: 1},
		},
	}
	for i := range 8 {
		slice.Spec.Devices = append(slice.Spec.Devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":        {StringValue: ptr("gpu")},
				"productName": {StringValue: ptr("NVIDIA H100 80GB HBM3")},
			},
		})
	}
	if _, err := client().ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create ResourceSlice: %v", err)
	}
	t.Cleanup(func() {
		_ = client().ResourceV1().ResourceSlices().Delete(context.Background(), slice.Name, metav1.DeleteOptions{})
	})
	if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{nodeName: fp}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, true)

	if extended {
		t.Run("a GPU limit with no node constraint goes to the DRA node", func(t *testing.T) {
			p := gpuPod("cuda-check", podOpts{resource: gpu})
			p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
			// The slice may reach the webhook's cache a moment after the node:
			// until it does, the DRA node weighs nothing and another layout wins.
			var got *corev1.Pod
			waitFor(t, apiTimeout, "the webhook to weigh the DRA node by its ResourceSlice", func(ctx context.Context) (bool, error) {
				if got != nil {
					_ = client().CoreV1().Pods(ns).Delete(ctx, got.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
					waitGone(t, ns, got.Name)
				}
				got = createPod(t, ns, p.DeepCopy())
				return got.Spec.NodeSelector[layout.LabelFingerprint] == fp, nil
			})
			rec := assertPinned(t, got, fp, driver)
			if len(rec.Volumes) != 3 || len(hostPaths(got)) != 3 {
				t.Errorf("pod %s: injected volumes %v (hostPaths %v), want the layout's 3", got.Name, rec.Volumes, hostPaths(got))
			}
			if v, _ := envValue(got.Spec.Containers[0], "LD_LIBRARY_PATH"); v != "/usr/local/nvidia/lib64" {
				t.Errorf("LD_LIBRARY_PATH=%q, want /usr/local/nvidia/lib64", v)
			}
			bound := waitBoundTo(t, ns, got.Name, nodeName)
			// The scheduler satisfied nvidia.com/gpu from the DeviceClass: it
			// made a claim for the pod and allocated a device of the slice.
			waitFor(t, apiTimeout, "the scheduler's extended-resource claim of "+got.Name, func(ctx context.Context) (bool, error) {
				p, err := client().CoreV1().Pods(ns).Get(ctx, got.Name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				bound = p
				return p.Status.ExtendedResourceClaimStatus != nil, nil
			})
			claim, err := client().ResourceV1().ResourceClaims(ns).Get(testContext(t), bound.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("failed to get the scheduler's claim: %v", err)
			}
			if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 || claim.Status.Allocation.Devices.Results[0].Pool != nodeName {
				t.Errorf("claim %s allocation %+v, want one device of pool %s", claim.Name, claim.Status.Allocation, nodeName)
			}
		})
	}

	t.Run("a pod that claims a GPU only through a ResourceClaimTemplate is a GPU pod", func(t *testing.T) {
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "single-gpu"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}},
			}}},
		}
		if _, err := client().ResourceV1().ResourceClaimTemplates(ns).Create(testContext(t), tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create ResourceClaimTemplate: %v", err)
		}
		// Created right after its template, as one kubectl apply does: the
		// webhook may not have the template in its cache yet.
		p := gpuPod("claim-only", podOpts{})
		p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr(tmpl.Name)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "logger", Image: env.WorkloadImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"true"}, SecurityContext: restrictedContext()})
		got := createPod(t, ns, p)
		rec := assertPinned(t, got, fp, driver)
		if strings.Join(rec.Containers, ",") != "cuda" {
			t.Errorf("injected containers %v, want only the one that uses the claim", rec.Containers)
		}
		if len(got.Spec.Containers[1].VolumeMounts) != 0 {
			t.Errorf("the container without the claim got mounts %v", got.Spec.Containers[1].VolumeMounts)
		}
		waitBoundTo(t, ns, got.Name, nodeName)
	})

	if !extended {
		// After the claim above: the webhook has the slice by now.
		t.Run("a GPU limit does not go to the DRA node, whose GPUs no DeviceClass offers as nvidia.com/gpu", func(t *testing.T) {
			p := gpuPod("cuda-check", podOpts{resource: gpu})
			p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
			got := createPod(t, ns, p)
			if fpGot := got.Spec.NodeSelector[layout.LabelFingerprint]; fpGot == fp {
				t.Errorf("pod %s pinned to the DRA node's layout %s, where the scheduler cannot give it nvidia.com/gpu", got.Name, fp)
			}
		})
	}

	t.Run("a claim of a device that is no GPU is left alone", func(t *testing.T) {
		nic := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-nic.example.com"},
			Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "dra.net"`}}}}}
		if _, err := client().ResourceV1().DeviceClasses().Create(testContext(t), nic, metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create DeviceClass: %v", err)
		}
		t.Cleanup(func() {
			_ = client().ResourceV1().DeviceClasses().Delete(context.Background(), nic.Name, metav1.DeleteOptions{})
		})
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one-nic"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: nic.Name}}}}}}
		if _, err := client().ResourceV1().ResourceClaims(ns).Create(testContext(t), claim, metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create ResourceClaim: %v", err)
		}
		p := gpuPod("nic-only", podOpts{})
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr(claim.Name)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "nic"}}
		want := p.DeepCopy()
		assertUntouched(t, createPod(t, ns, p), want)
	})
}

// TestRuntimeInjectedNode: a node whose container runtime injects the driver
// (the NVIDIA container toolkit as the default runtime) publishes a layout
// without mounts. A GPU pod sent there gets the runtime's marker and no pin
// on that layout (such nodes are one pool, whatever their image or driver),
// no hostPath volume and no LD_LIBRARY_PATH, which would collide with what
// the runtime mounts; a classic manifest's hand-written driver mounts are
// dropped.
func TestRuntimeInjectedNode(t *testing.T) {
	ctx := testContext(t)
	const nodeName, driver = "toolkit-a10g", "560.35.03"
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: driver, RuntimeInjection: layout.RuntimeToolkit}
	fp := apiGPUNode(t, nodeName, "nvidia-a10g", plan, 4)
	if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{nodeName: fp}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, true)
	onNode := map[string]string{env.LabelAccelerator: "nvidia-a10g"}

	t.Run("one pool, without mounts", func(t *testing.T) {
		p := gpuPod("cuda-check", podOpts{resource: gpu, nodeSelector: onNode})
		p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		got := createPod(t, ns, p)
		assertOnePool(t, got, fp)
		if len(hostPaths(got)) != 0 || len(got.Spec.Containers[0].VolumeMounts) != 0 {
			t.Errorf("pod %s got volumes %v and mounts %v, want none", got.Name, hostPaths(got), got.Spec.Containers[0].VolumeMounts)
		}
		if v, ok := envValue(got.Spec.Containers[0], "LD_LIBRARY_PATH"); ok {
			t.Errorf("pod %s got LD_LIBRARY_PATH=%q", got.Name, v)
		}
		waitBoundTo(t, ns, got.Name, nodeName)
	})

	t.Run("two node images, one pool: a Deployment with anti-affinity spreads over both", func(t *testing.T) {
		// Another node image of the same pool: another driver, so another layout.
		const other, otherDriver = "toolkit-a10g-b", "570.172.08"
		otherPlan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: otherDriver, RuntimeInjection: layout.RuntimeToolkit}
		otherFP := apiGPUNode(t, other, "nvidia-a10g", otherPlan, 4)
		if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{nodeName: fp, other: otherFP}); err != nil {
			t.Fatal(err)
		}
		app := map[string]string{"app": "two-images"}
		tmpl := gpuPod("", podOpts{resource: gpu, nodeSelector: onNode})
		tmpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
		tmpl.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		tmpl.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: app}, TopologyKey: "kubernetes.io/hostname"}}}}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "two-images"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: app},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: app}, Spec: tmpl.Spec}}}
		if _, err := client().AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create deployment %s: %v", d.Name, err)
		}
		t.Cleanup(func() {
			_ = client().AppsV1().Deployments(ns).Delete(context.Background(), d.Name, metav1.DeleteOptions{})
			_ = client().CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))},
				metav1.ListOptions{LabelSelector: "app=two-images"})
		})
		var bound map[string]bool
		waitFor(t, apiTimeout, "both replicas of "+d.Name+" to be bound", func(ctx context.Context) (bool, error) {
			pods, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=two-images"})
			if err != nil {
				return false, err
			}
			bound = map[string]bool{}
			for i := range pods.Items {
				p := &pods.Items[i]
				assertOnePool(t, p, fp)
				if p.Spec.NodeName != "" {
					bound[p.Spec.NodeName] = true
				}
			}
			return len(bound) == 2, nil
		})
		if !bound[nodeName] || !bound[other] {
			t.Errorf("replicas bound to %v, want one on each of %s and %s", bound, nodeName, other)
		}
	})

	t.Run("a classic manifest's hand-written driver mounts are dropped", func(t *testing.T) {
		p := gpuPod("nvidia-smi", podOpts{resource: legacyGPU, nodeSelector: onNode, command: []string{"/usr/local/nvidia/bin/nvidia-smi"}})
		p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		p.Spec.Volumes = []corev1.Volume{{Name: "nvidia-driver-384-bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/lib/nvidia-384/bin"}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "nvidia-driver-384-bin", MountPath: "/usr/local/nvidia/bin", ReadOnly: true}}
		got := createPod(t, ns, p)
		assertOnePool(t, got, fp)
		if len(got.Spec.Volumes) != 0 || len(got.Spec.Containers[0].VolumeMounts) != 0 {
			t.Errorf("pod %s kept volumes %v and mounts %v, want the stale driver mount gone", got.Name, got.Spec.Volumes, got.Spec.Containers[0].VolumeMounts)
		}
		if q, ok := got.Spec.Containers[0].Resources.Limits[gpu]; !ok || q.Value() != 1 {
			t.Errorf("limits %v, want %s=1", got.Spec.Containers[0].Resources.Limits, gpu)
		}
		waitBoundTo(t, ns, got.Name, nodeName)
	})
}

// waitGone waits until a pod is deleted.
func waitGone(t *testing.T, ns, name string) {
	t.Helper()
	waitFor(t, apiTimeout, "pod "+ns+"/"+name+" to be deleted", func(ctx context.Context) (bool, error) {
		_, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// assertOnePool checks that a pod for nodes whose runtime injects the driver
// carries the runtime's marker and no pin on the layout fp, which would split
// a fleet of node images.
func assertOnePool(t *testing.T, p *corev1.Pod, fp string) {
	t.Helper()
	if p.Annotations[layout.AnnotationRuntimeInject] == "" {
		t.Errorf("pod %s has no %s marker: annotations %v", p.Name, layout.AnnotationRuntimeInject, p.Annotations)
	}
	if got, ok := p.Spec.NodeSelector[layout.LabelFingerprint]; ok {
		t.Errorf("pod %s pinned to layout %s (the node's is %s), want no pin", p.Name, got, fp)
	}
}
