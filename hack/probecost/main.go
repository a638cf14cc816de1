// Command probecost measures what the node probe costs on a node without a
// GPU, where the chart's default placement (every node) runs it: resident
// memory, CPU while idle between probes, and CPU per probe, against an API
// server stand-in that answers the probe's GET and PATCH of its Node and
// counts them. The numbers go to docs/helm.md.
//
//	go run ./hack/probecost -duration 60s
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "probecost: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	duration := flag.Duration("duration", 60*time.Second, "how long each of the two runs lasts")
	layoutName := flag.String("layout", "no-driver", "fake root the probe reads")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "probecost-")
	if err != nil {
		return fmt.Errorf("failed to create a temp folder: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "gpu-injector")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("failed to build gpu-injector: %w", err)
	}
	root := filepath.Join(tmp, "root")
	if _, err := fakeroot.Build(root, *layoutName); err != nil {
		return err
	}
	api := newAPI("cpu-1")
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL)), 0o600); err != nil {
		return fmt.Errorf("failed to write kubeconfig: %w", err)
	}

	fmt.Printf("layout %s, %s per run, %s\n", *layoutName, *duration, time.Now().UTC().Format(time.RFC3339))
	// Idle: one probe at start, then nothing but the HTTP servers and the runtime.
	idle, err := measure(bin, root, kubeconfig, "1h", *duration, api)
	if err != nil {
		return err
	}
	// Busy: a probe every second, to price one probe cycle (probe + GET, and
	// the PATCH of the first cycle).
	busy, err := measure(bin, root, kubeconfig, "1s", *duration, api)
	if err != nil {
		return err
	}
	perProbe := (busy.cpu - idle.cpu) / time.Duration(max(busy.gets-idle.gets, 1))
	fmt.Printf("idle (interval 1h): RSS %.1f MiB (max %.1f), CPU %v in %s (%.3f%% of a core), %d GET %d PATCH\n",
		idle.rssMiB, idle.maxRSSMiB, idle.cpu, *duration, 100*idle.cpu.Seconds()/duration.Seconds(), idle.gets, idle.patches)
	fmt.Printf("busy (interval 1s): RSS %.1f MiB (max %.1f), CPU %v for %d probes, %d PATCH\n",
		busy.rssMiB, busy.maxRSSMiB, busy.cpu, busy.gets, busy.patches)
	perHour := time.Duration(float64(idle.cpu)*time.Hour.Seconds()/duration.Seconds()) + 12*perProbe
	fmt.Printf("per probe: ~%v CPU; at the default 5m interval: ~%v CPU per hour, 12 GET per hour, no write on a steady node\n", perProbe, perHour.Round(time.Millisecond))
	return nil
}

type sample struct {
	rssMiB, maxRSSMiB float64
	cpu               time.Duration
	gets, patches     int64
}

func measure(bin, root, kubeconfig, interval string, d time.Duration, api *fakeAPI) (sample, error) {
	api.gets.Store(0)
	api.patches.Store(0)
	api.reset()
	cmd := exec.Command(bin, "nodeprobe", "--host-root", root, "--kubeconfig", kubeconfig, "--node-name", "cpu-1",
		"--interval", interval, "--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return sample{}, fmt.Errorf("failed to start the probe: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// The first seconds are start-up (one probe, one PATCH): measured from
	// when the first probe has published.
	deadline := time.Now().Add(30 * time.Second)
	for api.patches.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if api.patches.Load() == 0 {
		return sample{}, fmt.Errorf("the probe never published")
	}
	time.Sleep(time.Second)
	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	gets0, patches0 := api.gets.Load(), api.patches.Load()
	var s sample
	var n int
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Second) {
		rss, err := rssMiB(cmd.Process.Pid)
		if err != nil {
			return sample{}, err
		}
		s.rssMiB += rss
		s.maxRSSMiB = max(s.maxRSSMiB, rss)
		n++
	}
	cpu1, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	s.rssMiB /= float64(max(n, 1))
	s.cpu = cpu1 - cpu0
	s.gets, s.patches = api.gets.Load()-gets0, api.patches.Load()-patches0
	return s, nil
}

func rssMiB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("failed to read the probe's status: %w", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// cpuTime is user plus system time from /proc/<pid>/stat, in clock ticks of
// 10 ms (USER_HZ is 100 on Linux).
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("failed to read the probe's stat: %w", err)
	}
	// Fields after the command name in parentheses; utime and stime are the
	// 14th and 15th fields of the line.
	rest := string(data)[strings.LastIndexByte(string(data), ')')+2:]
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return time.Duration(u+s) * 10 * time.Millisecond, nil
}

// fakeAPI answers GET and merge-PATCH of one Node, as the API server does
// for the probe's two calls.
type fakeAPI struct {
	name          string
	mu            sync.Mutex
	node          corev1.Node
	gets, patches atomic.Int64
}

func newAPI(name string) *fakeAPI {
	a := &fakeAPI{name: name}
	a.reset()
	return a
}

func (a *fakeAPI) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node = corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: a.name}}
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/nodes/"+a.name {
		http.NotFound(w, r)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		a.gets.Add(1)
	case http.MethodPatch:
		a.patches.Add(1)
		patch, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		cur, _ := json.Marshal(a.node)
		merged, err := jsonpatch.MergePatch(cur, patch)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var n corev1.Node
		if err := json.Unmarshal(merged, &n); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.node = n
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a.node)
}
