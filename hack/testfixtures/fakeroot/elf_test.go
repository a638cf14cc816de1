package fakeroot

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

func TestELFMachines(t *testing.T) {
	for _, m := range []elf.Machine{elf.EM_X86_64, elf.EM_AARCH64, elf.EM_386} {
		p := filepath.Join(t.TempDir(), "libx.so.1.2")
		os.WriteFile(p, SharedObjectFor(m, "libx.so.1"), 0o644)
		f, err := elf.Open(p)
		if err != nil {
			t.Fatal(m, err)
		}
		n, err := f.DynString(elf.DT_SONAME)
		if err != nil || n[0] != "libx.so.1" || f.Machine != m {
			t.Fatal(m, n, err, f.Machine)
		}
	}
}
