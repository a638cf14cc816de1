//go:build e2e

package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// helloSource prints what a pod's container sees, so the test can tell it ran
// in the image it built and on the node it started.
const helloSource = `#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
	char host[256] = {0};
	gethostname(host, sizeof host - 1);
	printf("hello from %s, node %s\n", host, getenv("NODE_NAME") ? getenv("NODE_NAME") : "?");
	printf("root holds /hello: %s\n", access("/hello", X_OK) == 0 ? "yes" : "no");
	printf("root holds /bin/sh: %s\n", access("/bin/sh", F_OK) == 0 ? "yes" : "no");
	return 0;
}
`

func TestClusterRunsPod(t *testing.T) {
	start := time.Now()
	ctx := t.Context()
	c, err := Start(ctx, Options{
		NodeName:      "gpu-node-1",
		NodeLabels:    map[string]string{"gpu-injector.io/test": "cluster"},
		KeepOnFailure: os.Getenv("KEEP_CLUSTER") != "",
		Logger:        testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("cluster ready in %s", time.Since(start).Round(time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if stopped {
			return
		}
		if t.Failed() {
			c.MarkFailed()
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	node, err := c.Clientset.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node: %v", err)
	}
	if got := node.Labels["gpu-injector.io/test"]; got != "cluster" {
		t.Errorf("node label gpu-injector.io/test = %q, want cluster", got)
	}
	if got := node.Status.NodeInfo.KubeletVersion; got != KubernetesVersion {
		t.Errorf("kubelet version = %q, want %s", got, KubernetesVersion)
	}
	if _, err := os.Stat(filepath.Join(c.DevicePluginDir, "kubelet.sock")); err != nil {
		t.Errorf("kubelet device plugin socket not in DevicePluginDir: %v", err)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "hello.c")
	bin := filepath.Join(dir, "hello")
	if err := os.WriteFile(src, []byte(helloSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	const ref = "gpu-injector.local/e2e/hello:v1"
	tarPath, err := c.BuildImage(ref, map[string]string{"/hello": bin})
	if err != nil {
		t.Fatalf("build image: %v", err)
	}
	if err := c.ImportImage(ctx, tarPath); err != nil {
		t.Fatalf("import image: %v", err)
	}

	for name, hostNetwork := range map[string]bool{"pod-network": false, "host-network": true} {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "hello-" + name, Namespace: "default"},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					HostNetwork:   hostNetwork,
					Containers: []corev1.Container{{
						Name:            "hello",
						Image:           ref,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{"/hello"},
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"},
						}}},
					}},
				},
			}
			if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create pod: %v", err)
			}
			var last *corev1.Pod
			err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
				p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				last = p
				return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
			})
			if err != nil {
				t.Fatalf("pod did not finish: %v; status: %+v\nkubelet log:\n%s", err, last.Status, tailFile(c.LogPath("kubelet"), 40))
			}
			if last.Status.Phase != corev1.PodSucceeded {
				t.Fatalf("pod phase = %s, want Succeeded: %+v", last.Status.Phase, last.Status)
			}
			if last.Spec.NodeName != "gpu-node-1" {
				t.Errorf("pod bound to %q, want gpu-node-1", last.Spec.NodeName)
			}
			if !hostNetwork && last.Status.PodIP == c.NodeIP {
				t.Errorf("pod-network pod got the node IP %s", last.Status.PodIP)
			}
			logs, err := c.Clientset.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				t.Fatalf("pod logs through the API server: %v", err)
			}
			for _, want := range []string{"node gpu-node-1", "root holds /hello: yes", "root holds /bin/sh: no"} {
				if !strings.Contains(string(logs), want) {
					t.Errorf("pod log lacks %q:\n%s", want, logs)
				}
			}
			t.Logf("pod %s (ip %s) log:\n%s", pod.Name, last.Status.PodIP, logs)
		})
	}

	// Stop must leave nothing behind: no process of the cluster's namespace,
	// no folder. The test pins the namespace too, or a cluster started
	// beside it could take its number once Stop lets it go.
	pin, ns, err := pinNamespace(c.proc("namespace").pid())
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	var pids []int
	for _, name := range c.order {
		pids = append(pids, c.proc(name).pid())
	}
	stopStart := time.Now()
	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("cluster stopped in %s", time.Since(stopStart).Round(time.Millisecond))
	left, err := namespaceProcesses(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("processes left in the cluster's mount namespace: %v", left)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("component pid %d still alive", pid)
		}
	}
	for _, d := range []string{c.Dir, c.runDir} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cluster folder %s still exists (err %v)", d, err)
		}
	}
}

// A component that cannot start fails Start fast, with its log in the error,
// and leaves no process behind.
func TestStartFailureStopsEverything(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"apiserver rejects a flag": {
			opts: Options{APIServerFlags: []string{"--no-such-flag=1"}},
			want: "unknown flag: --no-such-flag",
		},
		"apiserver rejects a flag, folder kept": {
			opts: Options{APIServerFlags: []string{"--no-such-flag=1"}, KeepOnFailure: true},
			want: "kept ",
		},
		"kubelet rejects a flag": {
			opts: Options{KubeletFlags: []string{"--no-such-flag=1"}},
			want: "unknown flag: --no-such-flag",
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.opts.ParentDir = t.TempDir()
			before := clusterProcesses(t, tc.opts.ParentDir)
			// Generous: the failure is seen early anyway, and on two busy
			// cores (the e2e suite's cluster starts beside this one) a short
			// deadline would fail with a timeout instead of the cause.
			tc.opts.Timeout = 3 * time.Minute
			c, err := Start(t.Context(), tc.opts)
			if err == nil {
				c.Stop()
				t.Fatal("Start succeeded, want error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error lacks %q:\n%v", tc.want, err)
			}
			if after := clusterProcesses(t, tc.opts.ParentDir); len(after) > len(before) {
				t.Errorf("processes left behind: before %v, after %v", before, after)
			}
			entries, err := os.ReadDir(tc.opts.ParentDir)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.opts.KeepOnFailure && len(entries) != 1:
				t.Errorf("KeepOnFailure: folders in parent = %v, want the cluster's", entries)
			case tc.opts.KeepOnFailure:
				log := filepath.Join(tc.opts.ParentDir, entries[0].Name(), "logs", "kube-apiserver.log")
				if _, err := os.Stat(log); err != nil {
					t.Errorf("KeepOnFailure: apiserver log not kept: %v", err)
				}
			case len(entries) != 0:
				t.Errorf("cluster folder left behind: %v", entries)
			}
		})
	}
}

// clusterProcesses lists processes whose command line points into a cluster
// folder under parent: only this test's, since other packages' suites (the e2e
// environment) may run clusters of their own at the same time.
func clusterProcesses(t *testing.T, parent string) []string {
	t.Helper()
	procs, err := listProcesses()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "cmdline"))
		if err == nil && strings.Contains(string(cmd), "gpu-injector-cluster-") && strings.Contains(string(cmd), parent) {
			out = append(out, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}
