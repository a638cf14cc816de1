package stale

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const liveMaps = `55d4c6a00000-55d4c6a02000 r--p 00000000 08:01 1311                       /usr/bin/python3.12
7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 
7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 5521                       /usr/local/nvidia/lib64/libcuda.so.550.54.15
7f1c2c000000-7f1c2c100000 r-xp 00000000 08:01 5522                       /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
7ffd1e5f3000-7ffd1e614000 rw-p 00000000 00:00 0                          [stack]
`

const staleMaps = `55d4c6a00000-55d4c6a02000 r--p 00000000 08:01 1311                       /usr/bin/python3.12
7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 5521                       /usr/local/nvidia/lib64/libcuda.so.550.54.15 (deleted)
7f1c2b400000-7f1c2b600000 r--p 00400000 08:01 5521                       /usr/local/nvidia/lib64/libcuda.so.550.54.15 (deleted)
7f1c2c000000-7f1c2c100000 r-xp 00000000 08:01 5522                       /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15 (deleted)
7f1c2d000000-7f1c2d100000 r-xp 00000000 08:01 5523                       /tmp/libfoo.so (deleted)
7f1c2e000000-7f1c2e100000 rw-s 00000000 00:05 7                          /dev/shm/libcuda.so (deleted) (deleted)
7f1c2f000000-7f1c2f100000 rw-s 00000000 00:01 8                          /memfd:libnvidia-x (deleted)
7f1c30000000-7f1c30100000 r-xp 00000000 08:01 5524                       /opt/my dir/libnvidia-glcore.so.550.54.15 (deleted)
`

func TestDeletedDriverLibraries(t *testing.T) {
	for name, tc := range map[string]struct {
		maps    string
		want    []string
		wantErr bool
	}{
		"live driver":                 {maps: liveMaps},
		"empty":                       {maps: ""},
		"stale driver":                {maps: staleMaps, want: []string{"/usr/local/nvidia/lib64/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", "/opt/my dir/libnvidia-glcore.so.550.54.15"}},
		"anonymous last field absent": {maps: "7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0\n"},
		"too few fields":              {maps: "7f1c2a000000-7f1c2a021000 rw-p 00000000\n", wantErr: true},
		"empty field":                 {maps: "7f1c2a000000-7f1c2a021000  rw-p\n", wantErr: true},
		"line too long":               {maps: strings.Repeat("a", maxLineBytes+1) + "\n", wantErr: true},
		"no path prefix":              {maps: "1-2 r-xp 0 0:0 1 libcuda.so.1 (deleted)\n"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DeletedDriverLibraries(strings.NewReader(tc.maps))
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDeletedDriverLibrariesBounded(t *testing.T) {
	var b strings.Builder
	for i := range 3 * MaxPathsPerProcess {
		b.WriteString("1-2 r-xp 0 0:0 1 /usr/lib/libnvidia-x" + strconv.Itoa(i) + ".so.1 (deleted)\n")
	}
	got, err := DeletedDriverLibraries(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxPathsPerProcess {
		t.Errorf("%d paths kept, want %d", len(got), MaxPathsPerProcess)
	}
}

func TestDriverLibrary(t *testing.T) {
	for p, want := range map[string]bool{
		"/usr/local/nvidia/lib64/libcuda.so.1":                   true,
		"/usr/lib64/libnvidia-ml.so.550.54.15":                   true,
		"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0":           true,
		"/usr/lib/libcudart.so.12":                               false,
		"/usr/lib/libc.so.6":                                     false,
		"/usr/bin/nvidia-smi":                                    false,
		"/usr/local/cuda/lib64/libnvidia-not-a-library-but-text": false,
	} {
		if got := DriverLibrary(p); got != want {
			t.Errorf("DriverLibrary(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestParseStartTime(t *testing.T) {
	line := "4242 (python (a) b) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 3 0 987654 1000000 300 18446744073709551615"
	got, err := parseStartTime([]byte(line))
	if err != nil || got != 987654 {
		t.Fatalf("parseStartTime = %d, %v; want 987654", got, err)
	}
	for _, bad := range []string{"", "4242 python S 1", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 3 0 -5"} {
		if _, err := parseStartTime([]byte(bad)); err == nil {
			t.Errorf("parseStartTime(%q) gave no error", bad)
		}
	}
}

// fakeProc writes a /proc tree: each process a stat line with its start
// time, its maps, and the children of its one thread.
type fakeProcess struct {
	start    uint64
	maps     string
	children []uint32
	// noMaps makes maps unreadable, as the kernel does without ptrace access.
	noMaps bool
}

func writeProc(t *testing.T, procs map[uint32]fakeProcess) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(int(pid)))
		task := filepath.Join(dir, "task", strconv.Itoa(int(pid)))
		if err := os.MkdirAll(task, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := strconv.Itoa(int(pid)) + " (sh) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 " + strconv.FormatUint(p.start, 10) + " 0 0\n"
		var kids []string
		for _, c := range p.children {
			kids = append(kids, strconv.Itoa(int(c)))
		}
		files := map[string]string{filepath.Join(dir, "stat"): stat, filepath.Join(task, "children"): strings.Join(kids, " ")}
		if p.noMaps {
			// A folder where the file should be: open works, read fails as
			// EACCES would: an error that is not ErrNotExist.
			if err := os.MkdirAll(filepath.Join(dir, "maps"), 0o755); err != nil {
				t.Fatal(err)
			}
		} else {
			files[filepath.Join(dir, "maps")] = p.maps
		}
		for name, content := range files {
			if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestScan(t *testing.T) {
	for name, tc := range map[string]struct {
		procs          map[uint32]fakeProcess
		pid            uint32
		start          uint64
		wantErr        error
		wantStale      bool
		wantProcesses  int
		wantUnreadable bool
	}{
		"live": {procs: map[uint32]fakeProcess{10: {start: 5, maps: liveMaps}}, pid: 10, start: 5, wantProcesses: 1},
		"stale first process": {procs: map[uint32]fakeProcess{10: {start: 5, maps: staleMaps}}, pid: 10, start: 5,
			wantStale: true, wantProcesses: 1},
		"stale grandchild": {procs: map[uint32]fakeProcess{
			10: {start: 5, maps: liveMaps, children: []uint32{11}},
			11: {start: 6, maps: liveMaps, children: []uint32{12, 10}},
			12: {start: 7, maps: staleMaps},
		}, pid: 10, start: 5, wantStale: true, wantProcesses: 3},
		"gone":           {procs: map[uint32]fakeProcess{}, pid: 10, start: 5, wantErr: ErrGone},
		"pid reused":     {procs: map[uint32]fakeProcess{10: {start: 9, maps: staleMaps}}, pid: 10, start: 5, wantErr: ErrGone},
		"child exited":   {procs: map[uint32]fakeProcess{10: {start: 5, maps: liveMaps, children: []uint32{99}}}, pid: 10, start: 5, wantProcesses: 1},
		"no ptrace read": {procs: map[uint32]fakeProcess{10: {start: 5, noMaps: true}}, pid: 10, start: 5, wantUnreadable: true},
	} {
		t.Run(name, func(t *testing.T) {
			p := Proc{Root: writeProc(t, tc.procs)}
			f, err := p.Scan(tc.pid, tc.start)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if f.Stale() != tc.wantStale || f.Processes != tc.wantProcesses || (f.Unreadable != nil) != tc.wantUnreadable {
				t.Errorf("got stale %v (%q), %d processes, unreadable %v; want %v, %d, %v",
					f.Stale(), f.Deleted, f.Processes, f.Unreadable, tc.wantStale, tc.wantProcesses, tc.wantUnreadable)
			}
		})
	}
}

func TestScanBoundsProcesses(t *testing.T) {
	procs := map[uint32]fakeProcess{}
	for pid := uint32(10); pid < 40; pid++ {
		procs[pid] = fakeProcess{start: 1, maps: liveMaps, children: []uint32{pid + 1}}
	}
	p := Proc{Root: writeProc(t, procs), MaxProcesses: 5}
	f, err := p.Scan(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if f.Processes != 5 {
		t.Errorf("read %d processes, want the bound 5", f.Processes)
	}
}

// TestScanLiveFileNamedDeleted: a process that maps a live file it named
// "libcuda.so.<version> (deleted)" is not stale, so a pod cannot list itself
// among its node's stale pods and push the real ones out of that bounded
// list; a deleted library is stale still, and so is one whose name now holds
// another file, or a link to the mapped one.
func TestScanLiveFileNamedDeleted(t *testing.T) {
	const lib = "/usr/lib/libcuda.so.550.54.15 (deleted)"
	for name, tc := range map[string]struct {
		file      string // at lib under the process's root: "file", "other", "link" or none
		wantStale bool
	}{
		"a live file of that name":              {file: "file"},
		"deleted":                               {wantStale: true},
		"the name holds another file":           {file: "other", wantStale: true},
		"the name is a link to the mapped file": {file: "link", wantStale: true},
	} {
		t.Run(name, func(t *testing.T) {
			procRoot := t.TempDir()
			root := filepath.Join(procRoot, "10", "root")
			if err := os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755); err != nil {
				t.Fatal(err)
			}
			mapped := filepath.Join(root, "usr/lib/mapped")
			if err := os.WriteFile(mapped, []byte("ELF"), 0o644); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(mapped)
			if err != nil {
				t.Fatal(err)
			}
			inode := fi.Sys().(*syscall.Stat_t).Ino
			switch tc.file {
			case "file":
				err = os.Rename(mapped, filepath.Join(root, lib))
			case "other":
				err = os.WriteFile(filepath.Join(root, lib), []byte("ELF"), 0o644)
			case "link":
				err = os.Symlink("mapped", filepath.Join(root, lib))
			}
			if err != nil {
				t.Fatal(err)
			}
			maps := "7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 " + strconv.FormatUint(inode, 10) + "    " + lib + "\n"
			dir := filepath.Join(procRoot, "10")
			stat := "10 (sh) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n"
			for file, content := range map[string]string{"stat": stat, "maps": maps} {
				if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f, err := Proc{Root: procRoot}.Scan(10, 5)
			if err != nil {
				t.Fatal(err)
			}
			if f.Stale() != tc.wantStale || f.Processes != 1 {
				t.Errorf("stale %v (%q), %d processes; want stale %v", f.Stale(), f.Deleted, f.Processes, tc.wantStale)
			}
		})
	}
}
