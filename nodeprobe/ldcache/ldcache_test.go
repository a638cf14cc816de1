package ldcache

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// buildRoot makes a root folder holding tiny shared objects with the given
// SONAMEs, built by gcc, so that ldconfig indexes them as it would real ones.
func buildRoot(t *testing.T, libs map[string]string) string {
	t.Helper()
	for _, tool := range []string{"gcc", "ldconfig"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("this test needs %s to build a real ld.so.cache: %v", tool, err)
		}
	}
	root := t.TempDir()
	src := filepath.Join(t.TempDir(), "a.c")
	if err := os.WriteFile(src, []byte("int f(void) { return 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{}
	for file, soname := range libs {
		p := filepath.Join(root, file)
		dirs[filepath.Dir(file)] = true
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,"+soname, "-o", p, src).CombinedOutput()
		if err != nil {
			t.Fatalf("gcc: %v: %s", err, out)
		}
	}
	var conf []string
	for d := range dirs {
		conf = append(conf, d)
	}
	sort.Strings(conf)
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// printCache returns "key => value" lines from ldconfig -p, the reference reader.
func printCache(t *testing.T, file string) []string {
	t.Helper()
	out, err := exec.Command("ldconfig", "-p", "-C", file).CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig -p -C %s: %v: %s", file, err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "\t") {
			continue
		}
		key, rest, _ := strings.Cut(strings.TrimSpace(l), " (")
		_, value, _ := strings.Cut(rest, " => ")
		lines = append(lines, key+" => "+value)
	}
	sort.Strings(lines)
	return lines
}

func entryLines(c *Cache) []string {
	var lines []string
	for _, e := range c.Entries {
		lines = append(lines, e.Key+" => "+e.Value)
	}
	sort.Strings(lines)
	return lines
}

func TestParseRealLdconfig(t *testing.T) {
	root := buildRoot(t, map[string]string{
		"usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04":      "libcuda.so.1",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04": "libnvidia-ml.so.1",
		"usr/local/nvidia/lib64/libcuda.so.580.159.04":        "libcuda.so.1",
		"usr/local/nvidia/lib64/libnvidia-nvvm.so.580.159.04": "libnvidia-nvvm.so.4",
		"usr/lib/nvidia-384/libnvidia-ml.so.384.130":          "libnvidia-ml.so.1",
	})
	for format, want := range map[string]Format{"new": FormatNew, "compat": FormatCompat, "old": FormatOld} {
		t.Run(format, func(t *testing.T) {
			cache := "/etc/ld.so.cache." + format
			out, err := exec.Command("ldconfig", "-X", "-c", format, "-C", cache, "-r", root).CombinedOutput()
			if err != nil {
				t.Fatalf("ldconfig: %v: %s", err, out)
			}
			data, err := os.ReadFile(filepath.Join(root, cache))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if c.Format != want {
				t.Errorf("format = %q, want %q", c.Format, want)
			}
			got := entryLines(c)
			ref := printCache(t, filepath.Join(root, cache))
			if !reflect.DeepEqual(got, ref) {
				t.Errorf("entries differ from ldconfig -p:\n got %q\nwant %q", got, ref)
			}
			if len(c.Lookup("libcuda.so.1")) != 2 {
				t.Errorf("Lookup(libcuda.so.1) = %v, want the two folders' entries", c.Lookup("libcuda.so.1"))
			}
			for _, e := range c.Entries {
				if e.Flags&FlagTypeMask != FlagELFLibc6 {
					t.Errorf("entry %q flags %#x: want an ELF libc6 type", e.Key, e.Flags)
				}
			}
		})
	}
}

// TestEncodeReadByLdconfig proves the writer emits the real format: glibc's
// own reader lists what was written.
func TestEncodeReadByLdconfig(t *testing.T) {
	if _, err := exec.LookPath("ldconfig"); err != nil {
		t.Skipf("this test needs ldconfig: %v", err)
	}
	entries := []Entry{
		{Key: "libcuda.so.1", Value: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: FlagELFLibc6 | FlagX8664Lib64},
		{Key: "libnvidia-ml.so.1", Value: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", Flags: FlagELFLibc6 | FlagX8664Lib64},
		{Key: "libc.so.6", Value: "/lib/x86_64-linux-gnu/libc.so.6", Flags: FlagELFLibc6 | FlagX8664Lib64},
	}
	want := entryLines(&Cache{Entries: entries})
	for _, format := range []Format{FormatNew, FormatCompat, FormatOld} {
		t.Run(string(format), func(t *testing.T) {
			data, err := Encode(entries, format)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "ld.so.cache")
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if got := printCache(t, file); !reflect.DeepEqual(got, want) {
				t.Errorf("ldconfig -p read %q, want %q", got, want)
			}
			c, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if c.Format != format || !reflect.DeepEqual(c.Entries, entries) {
				t.Errorf("round trip = %q %+v, want %q %+v", c.Format, c.Entries, format, entries)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	good, err := Encode([]Entry{{Key: "libcuda.so.1", Value: "/usr/lib/libcuda.so.1", Flags: FlagELFLibc6}}, FormatNew)
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"empty":             {nil, "not an ld.so.cache"},
		"elf file":          {[]byte("\x7fELF\x02\x01\x01"), "not an ld.so.cache"},
		"truncated header":  {good[:30], "new header truncated"},
		"old truncated":     {[]byte(magicOld + "\x00\x01"), "old header truncated"},
		"too many entries":  {mutate(func(b []byte) []byte { b[20] = 0xff; b[21] = 0xff; return b }), "exceed the file size"},
		"old too many":      {[]byte(magicOld + "\x00\xff\xff\xff\x0f"), "exceed the file size"},
		"key past the end":  {mutate(func(b []byte) []byte { b[headerNewSize+4] = 0xff; b[headerNewSize+5] = 0xff; return b }), "past the end"},
		"unterminated":      {mutate(func(b []byte) []byte { return b[:len(b)-1] }), "not terminated"},
		"bad version":       {mutate(func(b []byte) []byte { b[len(magicNew)] = '9'; return b }), "unsupported version"},
		"invalid endianess": {mutate(func(b []byte) []byte { b[28] = 1; return b }), "invalid endianness"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseBigEndian(t *testing.T) {
	le, err := Encode([]Entry{{Key: "libcuda.so.1", Value: "/usr/lib64/libcuda.so.1", Flags: FlagELFLibc6, HWCap: 7}}, FormatNew)
	if err != nil {
		t.Fatal(err)
	}
	be := bytes.Clone(le)
	be[28] = endianBig
	swap := func(off, n int) {
		for i, j := off, off+n-1; i < j; i, j = i+1, j-1 {
			be[i], be[j] = be[j], be[i]
		}
	}
	swap(20, 4)
	swap(24, 4)
	for _, off := range []int{0, 4, 8, 12} {
		swap(headerNewSize+off, 4)
	}
	swap(headerNewSize+16, 8)
	c, err := Parse(be)
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{{Key: "libcuda.so.1", Value: "/usr/lib64/libcuda.so.1", Flags: FlagELFLibc6, HWCap: 7}}
	if !reflect.DeepEqual(c.Entries, want) {
		t.Errorf("entries = %+v, want %+v", c.Entries, want)
	}
}

func FuzzParse(f *testing.F) {
	entries := []Entry{
		{Key: "libcuda.so.1", Value: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: FlagELFLibc6 | FlagX8664Lib64},
		{Key: "libnvidia-ml.so.1", Value: "/usr/local/nvidia/lib64/libnvidia-ml.so.1", Flags: FlagELFLibc6},
	}
	for _, format := range []Format{FormatNew, FormatCompat, FormatOld} {
		data, err := Encode(entries, format)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	if data, err := os.ReadFile("/etc/ld.so.cache"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(magicOld))
	f.Add([]byte(magicNew + versionNew))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		// Whatever parsed must survive a round trip through the writer.
		again, err := Encode(c.Entries, FormatNew)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		c2, err := Parse(again)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if len(c.Entries) != len(c2.Entries) || (len(c.Entries) > 0 && !reflect.DeepEqual(c.Entries, c2.Entries)) {
			t.Fatalf("round trip changed entries: %+v vs %+v", c.Entries, c2.Entries)
		}
	})
}

// TestParseAllocatesInProportion: a crafted cache whose entries all name one
// string of almost maxStringLength bytes costs a small multiple of the file,
// as a valid cache of that size does, not a copy of the string per entry
// (a 1 MiB file would cost 343 MiB in the new format, 700 MiB in the old).
func TestParseAllocatesInProportion(t *testing.T) {
	const size = 1 << 20
	long := strings.Repeat("x", maxStringLength-1) + "\x00"
	le := binary.LittleEndian
	crafted := map[Format][]byte{}
	{
		n := (size - headerNewSize - len(long)) / entryNewSize
		stringsAt := uint32(headerNewSize + n*entryNewSize)
		b := append([]byte(magicNew+versionNew), make([]byte, headerNewSize-len(magicNew)-len(versionNew))...)
		le.PutUint32(b[20:], uint32(n))
		b[28] = endianLittle
		for range n {
			b = le.AppendUint32(b, FlagELFLibc6)
			b = le.AppendUint32(b, stringsAt)
			b = le.AppendUint32(b, stringsAt)
			b = le.AppendUint32(b, 0)
			b = le.AppendUint64(b, 0)
		}
		crafted[FormatNew] = append(b, long...)
	}
	{
		n := (size - headerOldSize - len(long)) / entryOldSize
		b := append([]byte(magicOld), make([]byte, headerOldSize-len(magicOld))...)
		le.PutUint32(b[12:], uint32(n))
		for range n {
			b = le.AppendUint32(b, FlagELFLibc6)
			b = le.AppendUint32(b, 0)
			b = le.AppendUint32(b, 0)
		}
		crafted[FormatOld] = append(b, long...)
	}
	for format, data := range crafted {
		t.Run(string(format), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c, err := Parse(data)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if c.Format != format || len(c.Entries) < size/entryNewSize/2 || len(c.Entries[0].Value) != maxStringLength-1 {
				t.Fatalf("the crafted file parsed as %s with %d entries", c.Format, len(c.Entries))
			}
			// One copy of the file and the entries, 48 bytes each for at
			// least 12 bytes of table.
			if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(6*len(data)); got > limit {
				t.Errorf("parsing %d bytes allocated %d MiB, more than %d MiB", len(data), got>>20, limit>>20)
			}
		})
	}
}
