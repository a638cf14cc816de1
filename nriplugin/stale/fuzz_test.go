package stale

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzDeletedDriverLibraries reads fuzzed maps files: any process on the node
// names its mapped files. Whatever the input, the answer is bounded, each
// path absolute, a driver library, listed once and present in the input
// followed by " (deleted)".
func FuzzDeletedDriverLibraries(f *testing.F) {
	f.Add([]byte(liveMaps))
	f.Add([]byte(staleMaps))
	f.Add([]byte("1-2 r-xp 0 0:0 1\n"))
	f.Add([]byte("1-2 r-xp 0 0:0 1 /usr/lib/libcuda.so.1 (deleted) (deleted)\n1-2 r-xp 0 0:0 1 /x/libnvidia-ml.so\\012 (deleted)\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DeletedDriverLibraries(bytes.NewReader(data))
		if len(got) > MaxPathsPerProcess {
			t.Fatalf("%d paths, more than %d", len(got), MaxPathsPerProcess)
		}
		seen := map[string]bool{}
		for _, p := range got {
			if !strings.HasPrefix(p, "/") || !DriverLibrary(p) || seen[p] {
				t.Fatalf("path %q: not absolute, not a driver library, or listed twice (error %v)", p, err)
			}
			if !bytes.Contains(data, []byte(p+deletedSuffix)) {
				t.Fatalf("path %q is not in the input as deleted", p)
			}
			seen[p] = true
		}
	})
}

// FuzzParseStartTime reads fuzzed stat lines, whose command name is any
// process's to choose.
func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("4242 (python (a) b) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 3 0 987654 1000000 300"))
	f.Add([]byte("1 () S"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseStartTime(data)
		_ = parsePids(data)
	})
}
