//go:build e2e

package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	// nriTestPlugin is the test plugin's name, which required-plugins
	// annotations name.
	nriTestPlugin = "gi-nri-test"
	// nriTestAnnotation marks the pods whose containers the test plugin
	// adjusts.
	nriTestAnnotation = "gpu-injector.io/nri-test"
	// requiredPluginsKey is NRI's default validator's annotation, per
	// container: a container whose plugins are not all connected is refused.
	requiredPluginsKey = "required-plugins.noderesource.dev/container."
)

// envSource prints what the NRI plugin gave the container: the variable it
// adds and the NRI socket a pod mounts from the host, with its inode so the
// test can tell it is this cluster's.
const envSource = `#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
int main(void) {
	struct stat st;
	printf("NRI_TEST_INJECTED=%s\n", getenv("NRI_TEST_INJECTED") ? getenv("NRI_TEST_INJECTED") : "<unset>");
	if (stat("/nri/nri.sock", &st) == 0)
		printf("nri socket: %s inode %lu\n", S_ISSOCK(st.st_mode) ? "socket" : "other", (unsigned long)st.st_ino);
	else
		printf("nri socket: absent\n");
	return 0;
}
`

// adjustingPlugin adds an environment variable to the containers of pods that
// carry nriTestAnnotation, as a runtime injection plugin adds the driver.
type adjustingPlugin struct{}

func (adjustingPlugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	v, ok := pod.GetAnnotations()[nriTestAnnotation]
	if !ok {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("NRI_TEST_INJECTED", v+"/"+ctr.GetName())
	return adj, nil, nil
}

// TestNRIRuntime proves NRI end to end on each runtime with NRI (containerd
// 2.x, CRI-O): the node runs the built runtime; a plugin connected from this
// process to NRISocket adjusts the containers of annotated pods and leaves
// the others alone; a pod mounting /var/run/nri/nri.sock as a hostPath sees
// this cluster's socket; and NRI's default validator refuses a container
// whose required plugin is not connected, while one whose required plugin is
// runs.
func TestNRIRuntime(t *testing.T) {
	for _, tc := range []struct {
		runtime Runtime
		version string // the Node's containerRuntimeVersion
	}{
		{RuntimeNRI, "containerd://" + strings.TrimPrefix(ContainerdVersion, "v")},
		{RuntimeCRIO, "cri-o://" + strings.TrimPrefix(CRIOVersion, "v")},
	} {
		t.Run(RuntimeProcess(tc.runtime), func(t *testing.T) { testNRIRuntime(t, tc.runtime, tc.version) })
	}
}

func testNRIRuntime(t *testing.T, runtime Runtime, version string) {
	start := time.Now()
	ctx := t.Context()
	c, err := Start(ctx, Options{
		NodeName:      "nri-node-1",
		Runtime:       runtime,
		KeepOnFailure: os.Getenv("KEEP_CLUSTER") != "",
		Logger:        testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("cluster ready in %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			c.MarkFailed()
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	if c.Runtime != runtime || c.NRISocket == "" {
		t.Fatalf("Runtime = %q, NRISocket = %q; want %q and a path", c.Runtime, c.NRISocket, runtime)
	}
	runtimeLog := func() string { return tailFile(c.LogPath(RuntimeProcess(runtime)), 30) }

	node, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if got, want := node.Status.NodeInfo.ContainerRuntimeVersion, version; got != want {
		t.Errorf("container runtime version = %q, want %q", got, want)
	}

	// The runtime made the socket when it started (the node is Ready, so it
	// has); a plugin connects and registers at once.
	sock, err := os.Stat(c.NRISocket)
	if err != nil {
		t.Fatalf("NRI socket: %v", err)
	}
	if sock.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s is not a socket: %v", c.NRISocket, sock.Mode())
	}
	p, err := stub.New(adjustingPlugin{}, stub.WithSocketPath(c.NRISocket), stub.WithPluginName(nriTestPlugin), stub.WithPluginIdx("50"))
	if err != nil {
		t.Fatalf("create NRI plugin: %v", err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatalf("connect NRI plugin to %s: %v\n%s log:\n%s", c.NRISocket, err, runtime, runtimeLog())
	}
	// Registered before the cluster's cleanup runs (cleanups run last first).
	t.Cleanup(p.Stop)

	dir := t.TempDir()
	src := filepath.Join(dir, "env.c")
	bin := filepath.Join(dir, "env")
	if err := os.WriteFile(src, []byte(envSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	const ref = "gpu-injector.local/e2e/nri-env:v1"
	tarPath, err := c.BuildImage(ref, map[string]string{"/env": bin})
	if err != nil {
		t.Fatalf("build image: %v", err)
	}
	if err := c.ImportImage(ctx, tarPath); err != nil {
		t.Fatalf("import image: %v", err)
	}
	inode := sock.Sys().(*syscall.Stat_t).Ino

	socketType := corev1.HostPathSocket
	pod := func(name string, annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: annotations},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name:            "app",
					Image:           ref,
					ImagePullPolicy: corev1.PullNever,
					Command:         []string{"/env"},
					VolumeMounts:    []corev1.VolumeMount{{Name: "nri", MountPath: "/nri/nri.sock"}},
				}},
				// What the project's chart mounts for its NRI plugin.
				Volumes: []corev1.Volume{{Name: "nri", VolumeSource: corev1.VolumeSource{
					HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/nri/nri.sock", Type: &socketType},
				}}},
			},
		}
	}

	for name, tc := range map[string]struct {
		annotations map[string]string
		want        []string
	}{
		"adjusted": {
			// Requires the plugin that is connected: the validator lets it run.
			annotations: map[string]string{nriTestAnnotation: "yes", requiredPluginsKey + "app": `["` + nriTestPlugin + `"]`},
			want: []string{
				"NRI_TEST_INJECTED=yes/app",
				fmt.Sprintf("nri socket: socket inode %d", inode),
			},
		},
		"untouched": {
			want: []string{"NRI_TEST_INJECTED=<unset>"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := pod("nri-"+name, tc.annotations)
			if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod: %v", err)
			}
			last, err := waitPod(ctx, c, p.Name, 2*time.Minute, func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
			})
			if err != nil {
				t.Fatalf("pod did not finish: %v; status: %+v\n%s log:\n%s", err, last.Status, runtime, runtimeLog())
			}
			if last.Status.Phase != corev1.PodSucceeded {
				t.Fatalf("pod phase = %s, want Succeeded: %+v", last.Status.Phase, last.Status)
			}
			logs, err := c.Clientset.CoreV1().Pods("default").GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				t.Fatalf("pod logs: %v", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(string(logs), want) {
					t.Errorf("pod log lacks %q:\n%s", want, logs)
				}
			}
			t.Logf("pod %s log:\n%s", p.Name, logs)
		})
	}

	t.Run("required plugin absent", func(t *testing.T) {
		const absent = "some-plugin-that-is-absent"
		p := pod("nri-required-absent", map[string]string{requiredPluginsKey + "app": `["` + absent + `"]`})
		if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod: %v", err)
		}
		// The kubelet retries the creation and reports each refusal; the
		// container must never start.
		last, err := waitPod(ctx, c, p.Name, 2*time.Minute, func(p *corev1.Pod) bool {
			for _, s := range p.Status.ContainerStatuses {
				if w := s.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
					return true
				}
			}
			return p.Status.Phase != corev1.PodPending
		})
		if err != nil {
			t.Fatalf("container was not refused: %v; status: %+v", err, last.Status)
		}
		if last.Status.Phase != corev1.PodPending || len(last.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod phase = %s, want Pending with one refused container: %+v", last.Status.Phase, last.Status)
		}
		w := last.Status.ContainerStatuses[0].State.Waiting
		if !strings.Contains(w.Message, absent) {
			t.Errorf("refusal does not name the absent plugin: %s: %s", w.Reason, w.Message)
		}
		t.Logf("refused: %s: %s", w.Reason, w.Message)
	})
}

// waitPod polls a pod until done says so or the timeout ends, and returns the
// last pod seen.
func waitPod(ctx context.Context, c *Cluster, name string, timeout time.Duration, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	last := &corev1.Pod{}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return done(p), nil
	})
	return last, err
}
