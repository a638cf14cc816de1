package status

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

// Bounds of the pods admitted without their images' configuration: the
// report names the newest; the list is read a page at a time, so that a
// registry down for a day does not fill status's memory with pods.
const (
	maxUnreadPods = 20
	unreadPage    = 500
)

// ImagesUnreadStatus is the pods the webhook admitted without the
// configuration of some of their images, as each pod's
// gpu-injector.io/images-unread annotation says: a pod's author can write
// it too, so it is shown, never acted on.
type ImagesUnreadStatus struct {
	// Total is how many pods carry the label; Pods are the newest
	// maxUnreadPods of them, newest first.
	Total int         `json:"total"`
	Pods  []UnreadPod `json:"pods,omitempty"`
	// Note says why the pods could not be listed, when they could not.
	Note string `json:"note,omitempty"`
}

// UnreadPod is one pod admitted without an image's configuration.
type UnreadPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Admitted is the pod's creation, which the API server stamps after
	// the webhook answered (it sees only CREATE): when the record was
	// written, and what its author cannot set.
	Admitted time.Time `json:"admitted"`
	// Images are the images and the registry's answers the record holds;
	// Note says why the record was not believed instead.
	Images []layout.ImageUnread `json:"images,omitempty"`
	Note   string               `json:"note,omitempty"`
}

// readImagesUnread lists the pods labelled as admitted without an image's
// configuration, in every namespace, keeping the newest. A user who may not
// list pods still gets the rest of the report, with a note.
func (c *Collector) readImagesUnread(ctx context.Context, out *ImagesUnreadStatus) {
	opts := metav1.ListOptions{LabelSelector: layout.LabelImagesUnread, Limit: unreadPage}
	for {
		list, err := c.Client.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			out.Note = layout.OneLine(fmt.Sprintf("failed to list the pods labelled %s: %v", layout.LabelImagesUnread, err), 300)
			return
		}
		for i := range list.Items {
			p := &list.Items[i]
			out.Total++
			u := UnreadPod{Namespace: p.Namespace, Name: p.Name, Admitted: p.CreationTimestamp.UTC()}
			rec, err := layout.DecodeImagesUnread(p.Annotations[layout.AnnotationImagesUnread])
			if err != nil {
				u.Note = layout.OneLine(err.Error(), 200)
			} else {
				u.Images = rec.Images
			}
			out.Pods = newestUnread(out.Pods, u)
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return
		}
	}
}

// newestUnread adds p to pods, newest first, keeping maxUnreadPods.
func newestUnread(pods []UnreadPod, p UnreadPod) []UnreadPod {
	i, _ := slices.BinarySearchFunc(pods, p, func(a, b UnreadPod) int {
		if c := b.Admitted.Compare(a.Admitted); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	if i >= maxUnreadPods {
		return pods
	}
	pods = slices.Insert(pods, i, p)
	if len(pods) > maxUnreadPods {
		pods = pods[:maxUnreadPods]
	}
	return pods
}

// imagesUnreadLines are the report's section on pods admitted without an
// image's configuration: one row per image, then what the rows are.
func imagesUnreadLines(w *errWriter, s ImagesUnreadStatus, o RenderOptions) {
	switch {
	case s.Note != "":
		w.printf("  %s\n", s.Note)
		return
	case s.Total == 0:
		w.printf("  none\n")
		return
	}
	t := &table{header: []string{"POD", "ADMITTED", "IMAGE", "REGISTRY'S ANSWER"}}
	for _, p := range s.Pods {
		pod := p.Namespace + "/" + p.Name
		when := age(o.Now.Sub(p.Admitted)) + " ago"
		if p.Note != "" {
			t.add(txt(pod), txt(when), txt("-"), toned(warn, "record ignored: "+p.Note))
			continue
		}
		for i, im := range p.Images {
			if i > 0 {
				pod, when = "", ""
			}
			t.add(txt(pod), txt(when), txt(im.Image), toned(warn, dash(im.Reason)))
		}
	}
	t.write(w, o, "  ")
	if more := s.Total - len(s.Pods); more > 0 {
		w.printf("  and %d older pods (kubectl get pods -A -l %s)\n", more, layout.LabelImagesUnread)
	}
	w.printf("  As each pod's %s annotation says (the webhook writes it at admission; a pod's author can too):\n"+
		"  these run without their images' LD_LIBRARY_PATH and CUDA need. A pod created now is read again;\n"+
		"  recreate these once the registry answers.\n", layout.AnnotationImagesUnread)
}
