package layout

import (
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestImagesUnreadRoundTrip(t *testing.T) {
	long := "registry.example:5000/" + strings.Repeat("a", 600) + ":v1"
	rec := NewImagesUnread([]ImageUnread{
		{Image: "registry.example:5000/team/app:v2", Reason: `Get "https://registry.example:5000/v2/": dial tcp 10.0.0.9:5000: connect: connection refused`},
		{Image: long, Reason: "line one\nline two\x1b[31m " + strings.Repeat("é", 300)},
	})
	if got := rec.Images[1]; len(got.Image) > MaxImageRefBytes || !strings.HasSuffix(got.Image, "...") {
		t.Errorf("long image kept as %d bytes %q", len(got.Image), got.Image)
	}
	if got := rec.Images[1].Reason; len(got) > MaxUnreadReasonBytes || strings.ContainsAny(got, "\n\x1b") || !utf8.ValidString(got) {
		t.Errorf("reason not one printable line within the bound: %q", got)
	}
	out, err := DecodeImagesUnread(rec.String())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, rec) {
		t.Errorf("round trip gave %+v, want %+v", out, rec)
	}
	many := make([]ImageUnread, 40)
	for i := range many {
		many[i] = ImageUnread{Image: "r.example/app:" + strings.Repeat("x", i+1), Reason: "no answer"}
	}
	if n := len(NewImagesUnread(many).Images); n != MaxImagesUnread {
		t.Errorf("%d images recorded of 40, want %d", n, MaxImagesUnread)
	}
}

// TestImagesUnreadLongest: the longest record the webhook can write, every
// image and reason at its bound and made of what JSON escapes, decodes.
func TestImagesUnreadLongest(t *testing.T) {
	images := make([]ImageUnread, MaxImagesUnread)
	for i := range images {
		images[i] = ImageUnread{Image: strings.Repeat(`"`, MaxImageRefBytes), Reason: strings.Repeat(`\`, MaxUnreadReasonBytes)}
	}
	v := NewImagesUnread(images).String()
	if len(v) != maxImagesUnreadBytes-1 {
		t.Errorf("the longest record takes %d bytes, want %d (the bound less the last comma)", len(v), maxImagesUnreadBytes-1)
	}
	if _, err := DecodeImagesUnread(v); err != nil {
		t.Errorf("the longest record the webhook writes does not decode: %v", err)
	}
	if len(v) > 64<<10 {
		t.Errorf("the record takes %d bytes of the pod's 256 KiB of annotations", len(v))
	}
}

func TestDecodeImagesUnreadRefuses(t *testing.T) {
	for name, v := range map[string]string{
		"not json":       "{",
		"unknown field":  `{"images":[{"image":"a","reason":"b"}],"recordedAt":"2026-11-27T00:00:00Z"}`,
		"key twice":      `{"images":[{"image":"a","reason":"b","image":"c"}]}`,
		"other case":     `{"Images":[{"image":"a","reason":"b"}]}`,
		"no images":      `{"images":[]}`,
		"no image":       `{"images":[{"reason":"b"}]}`,
		"control char":   `{"images":[{"image":"a","reason":"b\u001b[2J"}]}`,
		"newline":        `{"images":[{"image":"a\nb","reason":"b"}]}`,
		"long reason":    `{"images":[{"image":"a","reason":"` + strings.Repeat("b", MaxUnreadReasonBytes+1) + `"}]}`,
		"trailing value": `{"images":[{"image":"a","reason":"b"}]} {}`,
		"too large":      `{"images":[{"image":"` + strings.Repeat("a", maxImagesUnreadBytes) + `","reason":""}]}`,
		"too many":       `{"images":[` + strings.Repeat(`{"image":"a","reason":"b"},`, MaxImagesUnread) + `{"image":"a","reason":"b"}]}`,
	} {
		if _, err := DecodeImagesUnread(v); err == nil {
			t.Errorf("%s: %s decoded", name, v)
		}
	}
}

// FuzzDecodeImagesUnread: the annotation is what a pod's author may have
// written. What decodes keeps the bounds, is printable, and encodes back to
// a value that decodes to itself; OneLine's output is printable, bounded,
// and its own OneLine.
func FuzzDecodeImagesUnread(f *testing.F) {
	f.Add(`{"images":[{"image":"registry.example:5000/team/app:v2","reason":"dial tcp 10.0.0.9:5000: connect: connection refused"}]}`)
	f.Add(`{"images":[{"image":"a","reason":""},{"image":"b","reason":"no answer within the admission's budget"}]}`)
	f.Add(`{"images":[{"image":"a\u2028","reason":"\ufffd"}]}`)
	f.Add(`{"images":null}`)
	f.Fuzz(func(t *testing.T, v string) {
		for _, n := range []int{8, MaxUnreadReasonBytes} {
			s := OneLine(v, n)
			if len(s) > n || !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 || OneLine(s, n) != s {
				t.Fatalf("OneLine(%q, %d) = %q", v, n, s)
			}
		}
		u, err := DecodeImagesUnread(v)
		if err != nil {
			return
		}
		if len(u.Images) == 0 || len(u.Images) > MaxImagesUnread {
			t.Fatalf("decoded %d images", len(u.Images))
		}
		for _, im := range u.Images {
			if im.Image == "" || len(im.Image) > MaxImageRefBytes || len(im.Reason) > MaxUnreadReasonBytes {
				t.Fatalf("decoded %+v past the bounds", im)
			}
		}
		again, err := DecodeImagesUnread(NewImagesUnread(u.Images).String())
		if err != nil || !reflect.DeepEqual(again, u) {
			t.Fatalf("re-decoding gave %+v, %v; want %+v", again, err, u)
		}
	})
}
