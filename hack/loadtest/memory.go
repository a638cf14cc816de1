package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
)

// memoryRow is the webhook's memory once it has listed a cluster's Nodes.
type memoryRow struct {
	nodes, gpuNodes int
	// limit is the container limit the webhook was told of, in bytes (0:
	// none); soft the Go runtime's soft limit it set (0: none), or source
	// says what else set it.
	limit, soft int64
	source      string
	readyIn     time.Duration
	// notReady: it was still not ready at -ready-timeout, when the row was
	// read (a soft limit below what is live makes the collector run
	// without pause).
	notReady bool
	// cpu is the process's CPU time from its start until idle: what the
	// collector spends to stay under a soft limit shows here.
	cpu time.Duration
	// idle is /proc's figures 5 s after ready; its hwm is the high-water
	// mark since start, the first list's peak.
	idle                          memory
	heapInUse, heapLive, heapGoal float64
}

// measureMemory is -memory-only: for each cluster size, ascending, it adds
// the nodes, then starts the webhook once for each container limit and reads
// its memory when it is ready and idle.
func measureMemory(ctx context.Context, o *options, dir string, cp *controlPlane) (string, error) {
	r := &run{o: o, dir: dir, cp: cp}
	defer r.close()
	r.certDir = filepath.Join(dir, "webhook-certs")
	var err error
	if r.ca, err = cluster.ServingCerts(r.certDir, "127.0.0.1", "localhost"); err != nil {
		return "", err
	}
	if err := r.chart(ctx); err != nil {
		return "", err
	}
	if err := r.namespaces(ctx); err != nil {
		return "", err
	}
	var rows []memoryRow
	have := 0
	for _, n := range o.nodeCounts {
		if err := r.createNodes(ctx, have, n); err != nil {
			return "", err
		}
		have = n
		for _, limit := range o.memoryLimits {
			row, err := r.memoryRow(ctx, n, limit)
			if err != nil {
				return "", err
			}
			progress("%d nodes, limit %s: ready in %s, high-water mark %.1f MiB, idle %.1f MiB, Go heap in use %.1f MiB",
				n, limitName(limit), row.readyIn.Round(time.Millisecond), kib(row.idle.hwm), kib(row.idle.rss), row.heapInUse/(1<<20))
			rows = append(rows, row)
		}
	}
	return memoryTable(rows), nil
}

// memoryRow starts the webhook told of a container limit as the chart tells
// it, waits until it is ready and idle, reads its memory and stops it.
func (r *run) memoryRow(ctx context.Context, nodes int, limit int64) (memoryRow, error) {
	row := memoryRow{nodes: nodes, gpuNodes: gpuNodes(nodes, r.o.gpuFraction), limit: limit}
	environ := webhookEnv(os.Environ(), limit)
	getenv := func(k string) string {
		for _, e := range environ {
			if v, ok := strings.CutPrefix(e, k+"="); ok {
				return v
			}
		}
		return ""
	}
	var err error
	if row.soft, _, row.source, err = nodeagent.MemoryLimit(getenv); err != nil {
		return row, err
	}
	if row.source == "GOMEMLIMIT" {
		row.source = "GOMEMLIMIT=" + getenv("GOMEMLIMIT")
	}
	row.readyIn, err = r.launchWebhook(ctx, fmt.Sprintf("webhook-%d-%s", nodes, limitName(limit)), environ)
	if r.webhookProc != nil {
		defer func() {
			stopProcess(r.webhookProc)
			r.webhookProc = nil
		}()
	}
	switch {
	case errors.Is(err, errNotReady):
		// The row says so, and the next one runs.
		progress("%d nodes, limit %s: %v", nodes, limitName(limit), err)
		row.notReady, row.readyIn = true, r.o.readyTimeout
	case err != nil:
		return row, err
	default:
		// Idle, as the admission run reads it: the webhook returned the
		// first list's peak to the OS when the list ended.
		select {
		case <-ctx.Done():
			return row, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
	pid := r.webhookProc.Process.Pid
	if row.idle, err = procMemory(pid); err != nil {
		return row, fmt.Errorf("failed to read the webhook's memory: %w", err)
	}
	if row.cpu, err = procCPU(pid); err != nil {
		return row, fmt.Errorf("failed to read the webhook's CPU time: %w", err)
	}
	g, err := scrapeURL(ctx, http.DefaultClient, r.webhookMetrics, "")
	if err != nil {
		if row.notReady {
			return row, nil
		}
		return row, err
	}
	row.heapInUse, row.heapLive, row.heapGoal = g[heapInUse][0], g[heapLive][0], g[heapGoal][0]
	return row, nil
}

// webhookEnv is environ with the container limit the chart would give the
// webhook, and no other.
func webhookEnv(environ []string, limit int64) []string {
	env := slices.DeleteFunc(slices.Clone(environ), func(e string) bool {
		return strings.HasPrefix(e, nodeagent.MemoryLimitEnv+"=")
	})
	if limit > 0 {
		env = append(env, nodeagent.MemoryLimitEnv+"="+strconv.FormatInt(limit, 10))
	}
	return env
}

// procCPU is a process's user and system CPU time, from /proc.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces; utime and stime are
	// the 14th and 15th fields, the 12th and 13th after comm.
	_, rest, _ := strings.Cut(string(data), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("failed to read /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	// USER_HZ is 100 on every Linux architecture Go runs on.
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

func limitName(limit int64) string {
	if limit == 0 {
		return "none"
	}
	return resource.NewQuantity(limit, resource.BinarySI).String()
}

func kib(k int64) float64 { return float64(k) / 1024 }

// memoryTable is -memory-only's result as Markdown.
func memoryTable(rows []memoryRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpu-injector webhook listing the GPU nodes (114 labels) of clusters from kube-apiserver %s on loopback, %s\n\n", cluster.KubernetesVersion, machine())
	b.WriteString("| nodes | GPU nodes | container limit | Go soft limit | ready in s | CPU s to idle | high-water mark MiB | within the limit | idle MiB | idle split MiB | Go heap in use / live / goal MiB |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	mib := func(bytes float64) float64 { return bytes / (1 << 20) }
	for _, x := range rows {
		soft := "none"
		switch {
		case strings.HasPrefix(x.source, "GOMEMLIMIT"):
			soft = x.source
		case x.soft > 0:
			soft = fmt.Sprintf("%.0f MiB", mib(float64(x.soft)))
		}
		within := "-"
		if x.limit > 0 {
			within = "no"
			if x.idle.hwm*1024 <= x.limit {
				within = fmt.Sprintf("yes (%.0f %%)", float64(x.idle.hwm*1024)/float64(x.limit)*100)
			}
		}
		ready := fmt.Sprintf("%.1f", x.readyIn.Seconds())
		if x.notReady {
			ready = "not in " + x.readyIn.String()
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %.1f | %.1f | %s | %.1f | %.1f anonymous + %.1f files | %.1f / %.1f / %.1f |\n",
			x.nodes, x.gpuNodes, limitName(x.limit), soft, ready, x.cpu.Seconds(), kib(x.idle.hwm), within,
			kib(x.idle.rss), kib(x.idle.anon), kib(x.idle.file), mib(x.heapInUse), mib(x.heapLive), mib(x.heapGoal))
	}
	b.WriteString("\nThe high-water mark is the first list's peak: the resident set, the binary's mapped pages included, as a container's cgroup counts it. " +
		"The process is not confined: \"within the limit\" says whether the kernel would have let it live; a row not ready in time was read when the time ran out.\n")
	return b.String()
}
