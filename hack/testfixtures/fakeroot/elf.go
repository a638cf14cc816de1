package fakeroot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// SharedObject returns the bytes of a minimal ELF64 x86-64 shared object whose
// only content is a dynamic section naming its SONAME. It is a real ELF file:
// glibc's ldconfig indexes it and debug/elf reads its SONAME, so fake roots
// behave like real ones without a compiler.
func SharedObject(soname string) []byte {
	return SharedObjectFor(elf.EM_X86_64, soname)
}

// SharedObjectFor is SharedObject for another machine: elf.EM_AARCH64 (a
// 64-bit Arm server), or elf.EM_386, which gives a 32-bit ELFCLASS32 file as
// the 32-bit compatibility libraries of a driver are.
func SharedObjectFor(machine elf.Machine, soname string) []byte {
	is64 := machine != elf.EM_386
	word := 4
	ehSize, phSize, shSize, dynEntry := 52, 32, 40, 8
	if is64 {
		word = 8
		ehSize, phSize, shSize, dynEntry = 64, 56, 64, 16
	}
	const phNum = 2
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
	class := byte(1)
	if is64 {
		class = 2
	}
	// ELF header.
	b.Write([]byte{0x7f, 'E', 'L', 'F', class, 1 /* LE */, 1 /* version */, 0 /* SysV */})
	b.Write(make([]byte, 8))
	w16 := func(v uint16) { _ = binary.Write(&b, le, v) }
	w32 := func(v uint32) { _ = binary.Write(&b, le, v) }
	wword := func(v uint64) {
		if is64 {
			_ = binary.Write(&b, le, v)
		} else {
			_ = binary.Write(&b, le, uint32(v))
		}
	}
	w16(3) // ET_DYN
	w16(uint16(machine))
	w32(1)
	wword(0)              // entry
	wword(uint64(ehSize)) // phoff
	wword(uint64(shOff))  // shoff
	w32(0)
	w16(uint16(ehSize))
	w16(uint16(phSize))
	w16(phNum)
	w16(uint16(shSize))
	w16(4) // shnum
	w16(3) // shstrndx
	// PT_LOAD of the whole file, then PT_DYNAMIC.
	for _, ph := range []struct {
		typ, flags       uint32
		off, size, align uint64
	}{
		{1, 4, 0, uint64(total), 0x1000},
		{2, 4, uint64(dynOff), uint64(dynSize), uint64(word)},
	} {
		w32(ph.typ)
		if is64 {
			w32(ph.flags)
		}
		wword(ph.off)
		wword(ph.off) // vaddr
		wword(ph.off) // paddr
		wword(ph.size)
		wword(ph.size)
		if !is64 {
			w32(ph.flags)
		}
		wword(ph.align)
	}
	b.Write(dynstr)
	b.Write(make([]byte, dynOff-b.Len()))
	for _, d := range dyn {
		wword(d[0])
		wword(d[1])
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
		{9, 6, 3, uint64(dynOff), uint64(dynOff), uint64(dynSize), 1, uint64(word), uint64(dynEntry)},
		{18, 3, 0, 0, uint64(shstrOff), uint64(len(shstr)), 0, 1, 0},
	} {
		w32(sh.name)
		w32(sh.typ)
		wword(sh.flags)
		wword(sh.addr)
		wword(sh.off)
		wword(sh.size)
		w32(sh.link)
		w32(0) // info
		wword(sh.align)
		wword(sh.entsize)
	}
	return b.Bytes()
}

func align8(n int) int { return (n + 7) &^ 7 }
