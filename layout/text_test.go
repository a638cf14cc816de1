package layout

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"driver wedged: NVML timed out": "driver wedged: NVML timed out",
		"\x1b[2J\x1b]0;owned\x07":       "\uFFFD[2J\uFFFD]0;owned\uFFFD",
		"a\nb\rc\td":                    "a\uFFFDb\uFFFDc\uFFFDd",
		"\xff\xfe":                      "\uFFFD\uFFFD",
		"\u009b31m":                     "\uFFFD31m",
		"ünïcode — fine…":               "ünïcode — fine…",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDecodeStateReason(t *testing.T) {
	if got, err := DecodeStateReason("error: no libnvidia-ml.so.1 under /usr/lib"); err != nil || got != "error: no libnvidia-ml.so.1 under /usr/lib" {
		t.Errorf("a reason: %q, %v", got, err)
	}
	for name, v := range map[string]string{
		"an escape":       "error: \x1b[31mred",
		"a newline":       "error\nfake line",
		"a C1 control":    "error \u009b2J",
		"invalid UTF-8":   "error \xff",
		"over the bound":  strings.Repeat("a", MaxStateReasonBytes+1),
		"a bell, a title": "\x1b]0;title\x07",
	} {
		if got, err := DecodeStateReason(v); err == nil {
			t.Errorf("%s: %q decoded to %q", name, v, got)
		}
	}
}

// FuzzDecodeStateReason: what decodes is bounded printable text, and
// Printable makes any text printable, of as many characters.
func FuzzDecodeStateReason(f *testing.F) {
	f.Add("error: no driver")
	f.Add("\x1b[2J")
	f.Add("\xff\u2028")
	f.Fuzz(func(t *testing.T, v string) {
		if got, err := DecodeStateReason(v); err == nil {
			if got != v || len(got) > MaxStateReasonBytes || Printable(got) != got {
				t.Fatalf("%q decoded to %q", v, got)
			}
		}
		p := Printable(v)
		for _, r := range p {
			if r != utf8.RuneError && !unicode.IsPrint(r) {
				t.Fatalf("Printable(%q) = %q holds %U", v, p, r)
			}
		}
		if utf8.RuneCountInString(p) != utf8.RuneCountInString(v) {
			t.Fatalf("Printable(%q) = %q changed the count of characters", v, p)
		}
	})
}
