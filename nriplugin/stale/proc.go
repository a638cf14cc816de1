package stale

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultMaxProcesses bounds the processes read of one container per scan.
const DefaultMaxProcesses = 1024

// maxSmallFile bounds /proc/<pid>/stat and .../children: a stat line is a few
// hundred bytes; a children list of thousands of pids fits in 64 KiB.
const maxSmallFile = 64 << 10

// ErrGone means a container's first process is gone, or its pid now names
// another process (the start time differs): the container stopped.
var ErrGone = errors.New("the container's process is gone")

// Proc reads a /proc tree of the host's PID namespace: the host's /proc
// mounted into the plugin, or a fake tree in tests.
type Proc struct {
	// Root is the folder that holds <pid>/maps, <pid>/stat.
	Root string
	// MaxProcesses bounds the processes read of one container; zero means
	// DefaultMaxProcesses.
	MaxProcesses int
}

// Finding is what one scan found of one container.
type Finding struct {
	// Processes is how many of its processes had their maps read.
	Processes int
	// Deleted are the deleted driver libraries they map, each once, at most
	// MaxPathsPerProcess.
	Deleted []string
	// Unreadable is the first maps file that could not be read: without
	// ptrace-read access to a process (CAP_SYS_PTRACE, or the same uid and
	// no more capabilities), the kernel refuses its maps.
	Unreadable error
}

// Stale reports whether the container maps a deleted driver library.
func (f Finding) Stale() bool { return len(f.Deleted) > 0 }

// StartTime is a process's start time in clock ticks after boot (field 22
// of /proc/<pid>/stat): with the pid, it names one process for good.
func (p Proc) StartTime(pid uint32) (uint64, error) {
	data, err := p.readSmall(pid, "stat")
	if err != nil {
		return 0, err
	}
	return parseStartTime(data)
}

// parseStartTime reads field 22 of a stat line. The command name (field 2)
// is in parentheses and may hold anything, parentheses and spaces included,
// so the fields are counted after its last ')'. Parsed here, not by procfs's
// Proc.Stat: it reads up to 1 MiB, needs all 52 fields and panics on a line
// that ends at the ')'.
func parseStartTime(data []byte) (uint64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("failed to read a process's stat: no command name")
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return 0, fmt.Errorf("failed to read a process's stat: %d fields after the command name", len(fields))
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("failed to read a process's start time: %w", err)
	}
	return v, nil
}

// Scan reads the maps of a container's first process, pid, started at
// start, and of its descendants. ErrGone when pid is no longer that
// process.
func (p Proc) Scan(pid uint32, start uint64) (Finding, error) {
	if st, err := p.StartTime(pid); err != nil || st != start {
		return Finding{}, ErrGone
	}
	limit := p.MaxProcesses
	if limit <= 0 {
		limit = DefaultMaxProcesses
	}
	var f Finding
	seen := map[uint32]bool{pid: true}
	queue := []uint32{pid}
	for len(queue) > 0 && f.Processes < limit {
		cur := queue[0]
		queue = queue[1:]
		deleted, err := p.maps(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Exited between the listing and now.
			continue
		case err != nil:
			if f.Unreadable == nil {
				f.Unreadable = err
			}
		default:
			f.Processes++
			for _, d := range deleted {
				if len(f.Deleted) < MaxPathsPerProcess && !slices.Contains(f.Deleted, d) {
					f.Deleted = append(f.Deleted, d)
				}
			}
		}
		for _, c := range p.children(cur) {
			if !seen[c] && len(seen) < limit {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	// The first process gone during the scan: its findings are no more.
	if st, err := p.StartTime(pid); err != nil || st != start {
		return Finding{}, ErrGone
	}
	return f, nil
}

func (p Proc) maps(pid uint32) ([]string, error) {
	name := filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "maps")
	fh, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", name, err)
	}
	defer fh.Close()
	deleted, err := deletedDriverLibraries(fh, p.liveFile(pid))
	if err != nil {
		return deleted, fmt.Errorf("failed to read %s: %w", name, err)
	}
	return deleted, nil
}

// liveFile reports whether the process's mapping named name, which ends in
// " (deleted)", is a live file of that very name: the name in the process's
// view of its filesystem (<pid>/root, which the same ptrace-read access
// opens) holds the mapping's inode. A deleted file's inode cannot be another
// live file's while the mapping holds it. The kernel writes the name
// resolved, so it is looked up with no link followed and never above that
// root; where it cannot be (openat2(2) needs Linux 5.6), the mapping counts
// as deleted.
func (p Proc) liveFile(pid uint32) func(name string, inode uint64) bool {
	root := filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "root")
	return func(name string, inode uint64) bool {
		dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		defer unix.Close(dir)
		fd, err := unix.Openat2(dir, strings.TrimLeft(name, "/"), &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return false
		}
		return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Ino == inode
	}
}

// children lists the children of every thread of pid, from
// /proc/<pid>/task/<tid>/children (Linux 3.5 with CONFIG_PROC_CHILDREN, which
// the kernels of common distributions have). Without it, only the first
// process is read.
func (p Proc) children(pid uint32) []uint32 {
	tasks, err := os.ReadDir(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "task"))
	if err != nil {
		return nil
	}
	var out []uint32
	for _, t := range tasks {
		if _, err := strconv.ParseUint(t.Name(), 10, 32); err != nil {
			continue
		}
		data, err := readBounded(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "task", t.Name(), "children"))
		if err != nil {
			continue
		}
		out = append(out, parsePids(data)...)
	}
	return out
}

// parsePids reads a space-separated list of pids; anything else is skipped.
func parsePids(data []byte) []uint32 {
	var out []uint32
	for _, f := range strings.Fields(string(data)) {
		if v, err := strconv.ParseUint(f, 10, 32); err == nil && v > 0 {
			out = append(out, uint32(v))
		}
	}
	return out
}

func (p Proc) readSmall(pid uint32, file string) ([]byte, error) {
	return readBounded(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), file))
}

func readBounded(name string) ([]byte, error) {
	fh, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxSmallFile))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", name, err)
	}
	return data, nil
}
