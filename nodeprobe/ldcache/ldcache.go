// Package ldcache reads and writes glibc's /etc/ld.so.cache. The probe reads
// the host's cache to find the driver libraries the host's own loader would
// use; the file comes from the node, so the parser treats it as untrusted and
// never panics or reads out of bounds on any input.
package ldcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The magic strings and sizes are those of glibc's sysdeps/generic/dl-cache.h.
const (
	magicOld        = "ld.so-1.7.0"
	magicNew        = "glibc-ld.so.cache"
	versionNew      = "1.1"
	headerOldSize   = 16 // magic[11], pad to 4, nlibs uint32
	entryOldSize    = 12 // flags int32, key uint32, value uint32
	headerNewSize   = 48
	entryNewSize    = 24 // old entry, osversion uint32, hwcap uint64
	endianMask      = 3
	endianUnset     = 0
	endianLittle    = 2
	endianBig       = 3
	extensionMagic  = 0xeaa42174
	maxStringLength = 4096
)

// Entry flags, from dl-cache.h. Only the ones a caller may want to match.
const (
	FlagTypeMask     = 0x00ff
	FlagELFLibc6     = 0x0003
	FlagRequiredMask = 0xff00
	FlagX8664Lib64   = 0x0300
	FlagAArch64Lib64 = 0x0a00
)

// Format says which layout a cache file used.
type Format string

const (
	// FormatNew is "glibc-ld.so.cache1.1" alone, the default since glibc 2.32.
	FormatNew Format = "new"
	// FormatCompat is the old "ld.so-1.7.0" table followed by the new one;
	// only the new table is read, as glibc does.
	FormatCompat Format = "compat"
	// FormatOld is the old table alone (glibc before 2.2 era, or ldconfig -c old).
	FormatOld Format = "old"
)

// Entry maps a library name (usually a SONAME) to the path of the file the
// loader would open for it.
type Entry struct {
	Key   string
	Value string
	Flags int32
	HWCap uint64
}

// Cache is a parsed cache file.
type Cache struct {
	Format  Format
	Entries []Entry
}

// ErrNotCache means the data does not start with a known magic string.
var ErrNotCache = errors.New("not an ld.so.cache file")

// Parse decodes a cache file. String offsets are checked against the file
// size and strings are NUL-terminated within maxStringLength bytes. It
// allocates in proportion to the file whatever the file says: the table can
// hold no more entries than fit in the file, and every key and value is a
// piece of one copy of it, so entries that all name one long string (a
// crafted file's way to make a reader copy the same 4 KiB for each of them)
// cost no more than entries that name their own.
func Parse(data []byte) (*Cache, error) {
	switch {
	case bytes.HasPrefix(data, []byte(magicNew)):
		entries, err := parseNew(data, 0)
		if err != nil {
			return nil, err
		}
		return &Cache{Format: FormatNew, Entries: entries}, nil
	case bytes.HasPrefix(data, []byte(magicOld)):
		if len(data) < headerOldSize {
			return nil, fmt.Errorf("failed to parse ld.so.cache: old header truncated at %d bytes", len(data))
		}
		n := uint64(binary.LittleEndian.Uint32(data[12:16]))
		end := uint64(headerOldSize) + n*entryOldSize
		if end > uint64(len(data)) {
			return nil, fmt.Errorf("failed to parse ld.so.cache: %d old entries exceed the file size %d", n, len(data))
		}
		// glibc aligns the new header after the old table to its own alignment (8).
		newStart := (end + 7) &^ 7
		if newStart < uint64(len(data)) && bytes.HasPrefix(data[newStart:], []byte(magicNew)) {
			entries, err := parseNew(data, int(newStart))
			if err != nil {
				return nil, err
			}
			return &Cache{Format: FormatCompat, Entries: entries}, nil
		}
		entries, err := parseOld(data, int(n), int(end))
		if err != nil {
			return nil, err
		}
		return &Cache{Format: FormatOld, Entries: entries}, nil
	}
	return nil, ErrNotCache
}

// parseOld reads the old table; its string offsets count from the end of the table.
func parseOld(data []byte, n, stringsStart int) ([]Entry, error) {
	text := string(data)
	entries := make([]Entry, 0, n)
	for i := range n {
		off := headerOldSize + i*entryOldSize
		e, err := readEntry(data, text, binary.LittleEndian, off, stringsStart)
		if err != nil {
			return nil, fmt.Errorf("failed to parse ld.so.cache entry %d: %w", i, err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// parseNew reads the new table at start; its string offsets count from start.
func parseNew(data []byte, start int) ([]Entry, error) {
	h := data[start:]
	if len(h) < headerNewSize {
		return nil, fmt.Errorf("failed to parse ld.so.cache: new header truncated at %d bytes", len(h))
	}
	if string(h[len(magicNew):len(magicNew)+len(versionNew)]) != versionNew {
		return nil, fmt.Errorf("failed to parse ld.so.cache: unsupported version %q", h[len(magicNew):len(magicNew)+len(versionNew)])
	}
	var order binary.ByteOrder = binary.LittleEndian
	switch h[28] & endianMask {
	case endianUnset, endianLittle:
	case endianBig:
		order = binary.BigEndian
	default:
		return nil, fmt.Errorf("failed to parse ld.so.cache: invalid endianness flag %#x", h[28])
	}
	n := uint64(order.Uint32(h[20:24]))
	if uint64(headerNewSize)+n*entryNewSize > uint64(len(h)) {
		return nil, fmt.Errorf("failed to parse ld.so.cache: %d entries exceed the file size %d", n, len(data))
	}
	text := string(data)
	entries := make([]Entry, 0, n)
	for i := range int(n) {
		off := start + headerNewSize + i*entryNewSize
		e, err := readEntry(data, text, order, off, start)
		if err != nil {
			return nil, fmt.Errorf("failed to parse ld.so.cache entry %d: %w", i, err)
		}
		e.HWCap = order.Uint64(data[off+16 : off+24])
		entries = append(entries, e)
	}
	return entries, nil
}

// readEntry reads the entry at off of data; its strings are pieces of text,
// data's one copy.
func readEntry(data []byte, text string, order binary.ByteOrder, off, stringsStart int) (Entry, error) {
	key, err := cString(text, stringsStart, order.Uint32(data[off+4:off+8]))
	if err != nil {
		return Entry{}, fmt.Errorf("failed to read key: %w", err)
	}
	value, err := cString(text, stringsStart, order.Uint32(data[off+8:off+12]))
	if err != nil {
		return Entry{}, fmt.Errorf("failed to read value: %w", err)
	}
	return Entry{Key: key, Value: value, Flags: int32(order.Uint32(data[off : off+4]))}, nil
}

func cString(text string, base int, off uint32) (string, error) {
	start := uint64(base) + uint64(off)
	if start >= uint64(len(text)) {
		return "", fmt.Errorf("string offset %d is past the end of the file (%d bytes)", start, len(text))
	}
	rest := text[start:]
	if len(rest) > maxStringLength {
		rest = rest[:maxStringLength]
	}
	i := strings.IndexByte(rest, 0)
	if i < 0 {
		return "", fmt.Errorf("string at offset %d is not terminated within %d bytes", start, len(rest))
	}
	return rest[:i], nil
}

// Lookup returns the entries whose key is name, in cache order (glibc puts
// the preferred one first).
func (c *Cache) Lookup(name string) []Entry {
	var out []Entry
	for _, e := range c.Entries {
		if e.Key == name {
			out = append(out, e)
		}
	}
	return out
}

// Encode writes entries in the given format, as glibc's ldconfig would lay
// them out (little endian). Tests and fake host roots use it; the probe only
// reads.
func Encode(entries []Entry, format Format) ([]byte, error) {
	var strs bytes.Buffer
	offsets := make(map[string]uint32)
	intern := func(s string) uint32 {
		if o, ok := offsets[s]; ok {
			return o
		}
		o := uint32(strs.Len())
		strs.WriteString(s)
		strs.WriteByte(0)
		offsets[s] = o
		return o
	}
	type rel struct{ key, value uint32 }
	rels := make([]rel, len(entries))
	for i, e := range entries {
		rels[i] = rel{intern(e.Key), intern(e.Value)}
	}
	le := binary.LittleEndian
	var out []byte
	oldTable := func(stringsFromTableEnd uint32) {
		out = append(out, magicOld...)
		out = append(out, 0)
		out = le.AppendUint32(out, uint32(len(entries)))
		for i, e := range entries {
			out = le.AppendUint32(out, uint32(e.Flags))
			out = le.AppendUint32(out, rels[i].key+stringsFromTableEnd)
			out = le.AppendUint32(out, rels[i].value+stringsFromTableEnd)
		}
	}
	newTable := func() {
		stringsAt := uint32(headerNewSize + len(entries)*entryNewSize)
		out = append(out, magicNew+versionNew...)
		out = le.AppendUint32(out, uint32(len(entries)))
		out = le.AppendUint32(out, uint32(strs.Len()))
		out = append(out, endianLittle, 0, 0, 0)
		out = le.AppendUint32(out, 0) // no extension section
		out = append(out, make([]byte, 12)...)
		for i, e := range entries {
			out = le.AppendUint32(out, uint32(e.Flags))
			out = le.AppendUint32(out, rels[i].key+stringsAt)
			out = le.AppendUint32(out, rels[i].value+stringsAt)
			out = le.AppendUint32(out, 0)
			out = le.AppendUint64(out, e.HWCap)
		}
	}
	switch format {
	case FormatNew:
		newTable()
	case FormatCompat:
		oldEnd := headerOldSize + len(entries)*entryOldSize
		newStart := (oldEnd + 7) &^ 7
		// Old offsets count from the old table's end; the strings sit after the new table.
		oldTable(uint32(newStart - oldEnd + headerNewSize + len(entries)*entryNewSize))
		out = append(out, make([]byte, newStart-oldEnd)...)
		newTable()
	case FormatOld:
		oldTable(0)
	default:
		return nil, fmt.Errorf("failed to encode ld.so.cache: unknown format %q", format)
	}
	out = append(out, strs.Bytes()...)
	return out, nil
}
