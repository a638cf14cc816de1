package nodeagent

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// MemoryLimitEnv names the variable that the chart fills, through the
// downward API (resourceFieldRef limits.memory, divisor 1), with the
// container's memory limit in bytes. A container without a limit gets the
// node's allocatable memory there, which makes a soft limit that only a
// process about to starve the node reaches.
const MemoryLimitEnv = "GPU_INJECTOR_MEMORY_LIMIT"

// runtimeHeadroom is what a container limit keeps beyond the Go runtime's
// soft limit at the least. The runtime's limit covers the memory it manages
// (heap, stacks, its metadata), not the binary's pages mapped from its file,
// which the container's cgroup counts too: about 28 MiB of the binary are
// resident whatever runs (docs/benchmarks.md).
const runtimeHeadroom = 32 << 20

// SoftLimit is the Go runtime's soft memory limit for a container limit of
// limit bytes: 90 % of it, and at least 32 MiB below it (half of a limit
// under 64 MiB). Without a soft limit the collector lets the heap grow to
// twice what is live (GOGC=100) whatever the container allows, so a process
// whose live data fits the limit is killed for the garbage of a burst, as
// the webhook was while it read the first list of a large cluster's Nodes.
func SoftLimit(limit int64) int64 {
	if limit <= 0 {
		return 0
	}
	return limit - max(limit/10, min(runtimeHeadroom, limit/2))
}

// MemoryLimit says what SetMemoryLimit would do with the environment getenv
// reads: the soft limit in bytes, the container limit it comes from (0 when
// none), and where it comes from; soft is 0 when nothing sets one.
func MemoryLimit(getenv func(string) string) (soft, container int64, source string, err error) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		// The runtime read it at start; an operator's explicit choice wins.
		return 0, 0, "GOMEMLIMIT", nil
	}
	v := strings.TrimSpace(getenv(MemoryLimitEnv))
	if v == "" {
		return 0, 0, "", nil
	}
	container, err = strconv.ParseInt(v, 10, 64)
	if err != nil || container <= 0 {
		return 0, 0, MemoryLimitEnv, fmt.Errorf("failed to read %s=%q: want the container's memory limit in bytes", MemoryLimitEnv, v)
	}
	return SoftLimit(container), container, MemoryLimitEnv, nil
}

// SetMemoryLimit gives the Go runtime a soft memory limit below the
// container's, from $GPU_INJECTOR_MEMORY_LIMIT, unless $GOMEMLIMIT sets one,
// and logs the limit in force. It returns that limit in bytes, or 0 when
// there is none. A value it cannot read is logged and leaves the runtime as
// it is: the process runs as it did before the chart set one.
func SetMemoryLimit(log logr.Logger) int64 {
	soft, container, source, err := MemoryLimit(os.Getenv)
	switch {
	case err != nil:
		log.Error(err, "no soft memory limit set")
		return 0
	case source == "GOMEMLIMIT":
		limit := debug.SetMemoryLimit(-1)
		if limit == math.MaxInt64 {
			log.Info("no soft memory limit: GOMEMLIMIT says none", "GOMEMLIMIT", os.Getenv("GOMEMLIMIT"))
			return 0
		}
		log.Info("soft memory limit from GOMEMLIMIT", "memoryLimit", mib(limit), "GOMEMLIMIT", os.Getenv("GOMEMLIMIT"))
		return limit
	case soft == 0:
		log.Info("no soft memory limit: neither " + MemoryLimitEnv + " nor GOMEMLIMIT is set, so the heap may grow to twice what is live")
		return 0
	}
	debug.SetMemoryLimit(soft)
	log.Info("soft memory limit set below the container's", "memoryLimit", mib(soft), "containerLimit", mib(container))
	return soft
}

func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + "MiB" }
