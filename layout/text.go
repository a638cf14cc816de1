package layout

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxStateReasonBytes bounds the state-reason annotation: a probe's reason
// is one error message, a few hundred bytes.
const MaxStateReasonBytes = 4 << 10

// Printable is text that others wrote (a node, a pod's author) fit for a
// terminal: every character that is not printable (control characters,
// escape sequences' ESC among them, and bytes that are no UTF-8) replaced by
// U+FFFD, so that nothing written reaches a terminal as a command.
func Printable(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		b.WriteRune(r)
	}
	return b.String()
}

func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// DecodeStateReason reads the state-reason annotation, which a node wrote:
// at most MaxStateReasonBytes of printable text, on one line.
func DecodeStateReason(v string) (string, error) {
	switch {
	case len(v) > MaxStateReasonBytes:
		return "", fmt.Errorf("failed to decode %s: %d bytes, more than %d", AnnotationStateReason, len(v), MaxStateReasonBytes)
	case !printable(v):
		return "", fmt.Errorf("failed to decode %s: it holds characters that are not printable: %q", AnnotationStateReason, Truncate(v, 64))
	}
	return v, nil
}
