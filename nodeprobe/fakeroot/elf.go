package fakeroot

import (
	"bytes"
	"encoding/binary"
)

// SharedObject returns the bytes of a minimal ELF64 x86-64 shared object whose
// only content is a dynamic section naming its SONAME. It is a real ELF file:
// glibc's ldconfig indexes it and debug/elf reads its SONAME, so fake roots
// behave like real ones without a compiler.
func SharedObject(soname string) []byte {
	const (
		ehSize   = 64
		phSize   = 56
		shSize   = 64
		phNum    = 2
		dynEntry = 16
	)
	le := binary.LittleEndian
	dynstr := append(append([]byte{0}, soname...), 0)
	shstr := []byte("\x00.dynstr\x00.dynamic\x00.shstrtab\x00")
	dynstrOff := ehSize + phSize*phNum
	dynOff := align8(dynstrOff + len(dynstr))
	dyn := [][2]uint64{
		{14, 1},                   // DT_SONAME: offset in .dynstr
		{5, uint64(dynstrOff)},    // DT_STRTAB: vaddr equals file offset
		{10, uint64(len(dynstr))}, // DT_STRSZ
		{0, 0},                    // DT_NULL
	}
	dynSize := len(dyn) * dynEntry
	shstrOff := dynOff + dynSize
	shOff := align8(shstrOff + len(shstr))
	total := shOff + 4*shSize

	var b bytes.Buffer
	// ELF header.
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* LE */, 1 /* version */, 0 /* SysV */})
	b.Write(make([]byte, 8))
	w16 := func(v uint16) { _ = binary.Write(&b, le, v) }
	w32 := func(v uint32) { _ = binary.Write(&b, le, v) }
	w64 := func(v uint64) { _ = binary.Write(&b, le, v) }
	w16(3)  // ET_DYN
	w16(62) // EM_X86_64
	w32(1)
	w64(0)             // entry
	w64(ehSize)        // phoff
	w64(uint64(shOff)) // shoff
	w32(0)
	w16(ehSize)
	w16(phSize)
	w16(phNum)
	w16(shSize)
	w16(4) // shnum
	w16(3) // shstrndx
	// PT_LOAD of the whole file, then PT_DYNAMIC.
	for _, ph := range []struct {
		typ, flags       uint32
		off, size, align uint64
	}{
		{1, 4, 0, uint64(total), 0x1000},
		{2, 4, uint64(dynOff), uint64(dynSize), 8},
	} {
		w32(ph.typ)
		w32(ph.flags)
		w64(ph.off)
		w64(ph.off) // vaddr
		w64(ph.off) // paddr
		w64(ph.size)
		w64(ph.size)
		w64(ph.align)
	}
	b.Write(dynstr)
	b.Write(make([]byte, dynOff-b.Len()))
	for _, d := range dyn {
		w64(d[0])
		w64(d[1])
	}
	b.Write(shstr)
	b.Write(make([]byte, shOff-b.Len()))
	// Section headers: null, .dynstr, .dynamic (linked to .dynstr), .shstrtab.
	for _, sh := range []struct {
		name, typ        uint32
		flags, addr, off uint64
		size             uint64
		link             uint32
		align, entsize   uint64
	}{
		{},
		{1, 3, 2, uint64(dynstrOff), uint64(dynstrOff), uint64(len(dynstr)), 0, 1, 0},
		{9, 6, 3, uint64(dynOff), uint64(dynOff), uint64(dynSize), 1, 8, dynEntry},
		{18, 3, 0, 0, uint64(shstrOff), uint64(len(shstr)), 0, 1, 0},
	} {
		w32(sh.name)
		w32(sh.typ)
		w64(sh.flags)
		w64(sh.addr)
		w64(sh.off)
		w64(sh.size)
		w32(sh.link)
		w32(0) // info
		w64(sh.align)
		w64(sh.entsize)
	}
	return b.Bytes()
}

func align8(n int) int { return (n + 7) &^ 7 }
