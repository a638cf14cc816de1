package layout

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	kjson "sigs.k8s.io/json"
)

// AnnotationImagesUnread on a Pod is the webhook's record (ImagesUnread,
// JSON) of the images whose configuration it could not read when it
// admitted the pod, with the registry's answer: the pod was admitted
// without their LD_LIBRARY_PATH and CUDA need. LabelImagesUnread
// (LabelImagesUnreadValue) beside it lets `gpu-injector status` find such
// pods with a label selector. The webhook sets both, or removes both, on
// every pod it injects; a pod's author can write them too, so what reads
// them says what the pod says and decides nothing by it.
const (
	AnnotationImagesUnread = Prefix + "images-unread"
	LabelImagesUnread      = Prefix + "images-unread"
	LabelImagesUnreadValue = "true"
)

// Bounds of ImagesUnread: the webhook reads at most 16 images of a pod.
const (
	MaxImagesUnread = 16
	// MaxImageRefBytes cuts an image reference (a registry, a repository
	// of up to 255 bytes, a tag or digest) that is longer still.
	MaxImageRefBytes = 512
	// MaxUnreadReasonBytes cuts the registry's answer: its first words say
	// what went wrong.
	MaxUnreadReasonBytes = 256
	// maxImagesUnreadBytes is the longest record NewImagesUnread writes:
	// JSON escapes a quote or backslash in two bytes, every other printable
	// character as it is. Well under the API server's 256 KiB for all of a
	// pod's annotations.
	maxImagesUnreadBytes = len(`{"images":[]}`) + MaxImagesUnread*(len(`{"image":"","reason":""},`)+2*MaxImageRefBytes+2*MaxUnreadReasonBytes)
)

// ImagesUnread is the value of AnnotationImagesUnread.
type ImagesUnread struct {
	Images []ImageUnread `json:"images"`
}

// ImageUnread is one image the webhook could not read, and why.
type ImageUnread struct {
	// Image is the reference as the pod's container names it.
	Image string `json:"image"`
	// Reason is the registry's answer or the reader's (no answer within
	// the budget), shortened.
	Reason string `json:"reason"`
}

// NewImagesUnread is the record of images, each with its reason shortened
// to one line of printable text within the bounds; images past
// MaxImagesUnread are left out.
func NewImagesUnread(images []ImageUnread) ImagesUnread {
	out := ImagesUnread{Images: make([]ImageUnread, 0, min(len(images), MaxImagesUnread))}
	for _, im := range images[:min(len(images), MaxImagesUnread)] {
		out.Images = append(out.Images, ImageUnread{Image: OneLine(im.Image, MaxImageRefBytes), Reason: OneLine(im.Reason, MaxUnreadReasonBytes)})
	}
	return out
}

// String encodes the record compactly and deterministically.
func (u ImagesUnread) String() string { return compactJSON(u) }

// DecodeImagesUnread reads an AnnotationImagesUnread value, which anyone
// who writes the pod may have written: bounded, no field unknown or twice,
// one to MaxImagesUnread images, each named, every text one printable line
// within its bound.
func DecodeImagesUnread(v string) (ImagesUnread, error) {
	var u ImagesUnread
	if len(v) > maxImagesUnreadBytes {
		return u, fmt.Errorf("failed to decode %s: %d bytes, more than %d", AnnotationImagesUnread, len(v), maxImagesUnreadBytes)
	}
	// Case-sensitive, every field known and once: a record that would read
	// differently elsewhere is no record.
	if err := unmarshalStrict([]byte(v), &u, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields); err != nil {
		return ImagesUnread{}, fmt.Errorf("failed to decode %s: %w", AnnotationImagesUnread, err)
	}
	if len(u.Images) == 0 || len(u.Images) > MaxImagesUnread {
		return ImagesUnread{}, fmt.Errorf("failed to decode %s: %d images, want 1 to %d", AnnotationImagesUnread, len(u.Images), MaxImagesUnread)
	}
	for _, im := range u.Images {
		switch {
		case im.Image == "":
			return ImagesUnread{}, fmt.Errorf("failed to decode %s: an image without a reference", AnnotationImagesUnread)
		case OneLine(im.Image, MaxImageRefBytes) != im.Image:
			return ImagesUnread{}, fmt.Errorf("failed to decode %s: image %q is not one printable line of at most %d bytes", AnnotationImagesUnread, OneLine(im.Image, 64), MaxImageRefBytes)
		case OneLine(im.Reason, MaxUnreadReasonBytes) != im.Reason:
			return ImagesUnread{}, fmt.Errorf("failed to decode %s: the reason for %q is not one printable line of at most %d bytes", AnnotationImagesUnread, OneLine(im.Image, 64), MaxUnreadReasonBytes)
		}
	}
	return u, nil
}

// OneLine makes text that others wrote (a registry's answer, a pod's
// annotation) fit for a terminal and a message: every character that is
// not printable a space, cut between characters to at most n bytes, the
// cut marked with "...".
func OneLine(s string, n int) string {
	clean := len(s) <= n
	for _, r := range s {
		if !clean {
			break
		}
		clean = r != utf8.RuneError && unicode.IsPrint(r)
	}
	if clean {
		return s
	}
	limit := n
	if len(s) > n {
		limit = n - len("...")
	}
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > limit {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
