package inject

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// One pod's containers each get a patch operation per mount of the plan, so
// a pod of thousands of GPU containers would have the webhook build a
// response of tens of megabytes. The limits of config.Limits bound that
// work: the container count is checked before any layout is fitted, the
// patch the decision would make before it is built.

// MutateContext is Mutate for a request whose caller may give up: once ctx
// is done, the decision stops fitting layouts and denies the pod (no one
// reads the answer), and nothing is edited.
func MutateContext(ctx context.Context, in Input, cfg *config.Configuration) Result {
	r := newRequest(in, cfg)
	r.ctx = ctx
	res := r.apply(r.bound(r.decide()))
	if w := annotationWarnings(in.Pod); len(w) > 0 {
		res.Warnings = append(w, res.Warnings...)
	}
	return res
}

// canceled reports whether the caller has given up on the request.
func (r *request) canceled() bool {
	return r.ctx != nil && r.ctx.Err() != nil
}

// tooManyGPUContainers counts the containers that would get the driver, before the resource fixes copy a pod of thousands of them.
func (r *request) tooManyGPUContainers() bool {
	refs := containerRefs(r.pod)
	n := 0
	for _, ref := range refs {
		if r.wantsGPU(ref.get(r.pod)) {
			n++
		}
	}
	if n > 0 && r.cfg.Containers == config.ContainersAll {
		// Every container of a GPU pod gets the driver.
		n = len(refs)
	}
	return n > r.cfg.Limits.MaxGPUContainers
}

// bound denies a pod whose injection would exceed the patch limits, and
// one whose caller has gone.
func (r *request) bound(d decision) decision {
	if r.canceled() {
		return decision{outcome: outcomeDeny, reason: reasonCanceled}
	}
	if d.outcome != outcomeInject {
		return d
	}
	ops, size := r.patchEstimate(d)
	if ops > r.cfg.Limits.MaxPatchOperations || size > r.cfg.Limits.MaxPatchBytes {
		d.outcome, d.reason = outcomeDeny, reasonPatchTooLarge
		d.patchOps, d.patchBytes = ops, size
	}
	return d
}

// opOverhead is the JSON of one operation around its path and value:
// {"op":"add","path":"","value":}, and a comma.
const opOverhead = 32

// patchEstimate is at least the operations and bytes the injection adds:
// per target container a mount per plan mount and LD_LIBRARY_PATH (or, at
// the runtime, the required-plugins annotation), plus the volumes, the pin,
// the marker and the record. What the injection removes (an earlier
// injection, hand-written mounts) is bounded by the pod as it came, which
// the API server's request limit bounds.
func (r *request) patchEstimate(d decision) (ops, size int) {
	ops = len(r.fixPatch)
	for _, op := range r.fixPatch {
		size += opOverhead + len(op.Path) + 64
	}
	ops, size = r.unreadEstimate(ops, size)
	names := 0
	for _, ref := range r.targets {
		names += len(ref.get(r.view).Name) + 3
	}
	const pathLen = len("/spec/initContainers/1234/volumeMounts/-")
	if d.delivery == deliveryNRI {
		perContainer := 2*(opOverhead+pathLen) + len(layout.AnnotationNRIRequiredPlugins) + 64 + 256
		ops += 2*len(r.targets) + 3
		size += len(r.targets)*perContainer + 3*names + 512
		return ops, size
	}
	mounts := r.cfg.Limits.MaxPatchBytes
	if d.layout != nil {
		mounts = 0
		for _, pm := range d.layout.preparedMounts() {
			mounts += opOverhead + pathLen + len(pm.mount.ContainerPath) + len(pm.use.Name) + 96
			size += opOverhead + len(pm.mount.HostPath) + len(pm.volume.Name) + 96
		}
		ops += len(r.targets)*(len(d.layout.Plan.Mounts)+1) + len(d.layout.Plan.Mounts) + 4
		size += r.libraryPathEstimate(d.layout.Plan.LibraryPaths)
	}
	size += len(r.targets)*(mounts+opOverhead+pathLen+256) + names + 512
	return ops, size
}

// libraryPathEstimate is at least the bytes of the LD_LIBRARY_PATH values
// the patch carries, beyond the fixed share of each container's operation:
// per target container the merged value, which holds the container's own
// value or its image's whole; and, on a reinjection, every container's own
// value once more, rewritten without the earlier injection's folders.
func (r *request) libraryPathEstimate(libs []string) int {
	size := 0
	if r.prev != nil {
		refs := containerRefs(r.view)
		for i := range r.view.Spec.EphemeralContainers {
			refs = append(refs, containerRef{ephemeralContainers, i})
		}
		for _, ref := range refs {
			if e := envOf(ref.get(r.view), envLDLibraryPath); e != nil {
				size += jsonStringBytes(e.Value)
			}
		}
	}
	if r.cfg.LDLibraryPath == config.LDLibraryPathOff || len(libs) == 0 {
		return size
	}
	add := jsonStringBytes(strings.Join(libs, ":"))
	for _, ref := range r.targets {
		c := ref.get(r.view)
		own := ""
		switch e := envOf(c, envLDLibraryPath); {
		case e != nil:
			own = e.Value
		case len(c.EnvFrom) > 0:
			own = "$(" + envLDLibraryPath + ")"
		default:
			own, _ = r.imageLDLibraryPath(c)
		}
		size += add + 1 + jsonStringBytes(own)
	}
	return size
}

// envOf is the container's last variable of that name, the one the kubelet
// uses, or nil.
func envOf(c *corev1.Container, name string) *corev1.EnvVar {
	var found *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == name {
			found = &c.Env[i]
		}
	}
	return found
}

// jsonStringBytes is at least the length of s as a JSON string, quotes
// included, as encoding/json writes it: HTML characters, control characters,
// U+2028, U+2029 and invalid bytes escaped as \uXXXX.
func jsonStringBytes(s string) int {
	n := 2
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			switch {
			case b == '"' || b == '\\':
				n += 2
			case b < 0x20 || b == '<' || b == '>' || b == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 || c == '\u2028' || c == '\u2029' {
			n += 6
		} else {
			n += size
		}
		i += size
	}
	return n
}

// unreadEstimate adds to an estimate the record of the images not read, or
// its removal: its label and annotation, the record's JSON escaped once
// more as a string of the patch.
func (r *request) unreadEstimate(ops, size int) (int, int) {
	const keys = 2 * (opOverhead + len("/metadata/annotations/") + len(layout.AnnotationImagesUnread) + 16)
	switch {
	case len(r.unread) > 0:
		return ops + 2, size + keys + 2*len(layout.NewImagesUnread(r.unread).String())
	case r.view.Annotations[layout.AnnotationImagesUnread] != "" || r.view.Labels[layout.LabelImagesUnread] != "":
		return ops + 2, size + keys
	}
	return ops, size
}

// limitWhy is the denial of a pod past the limits: why, and how to split it.
func (r *request) limitWhy(d decision) string {
	switch d.reason {
	case reasonTooManyContainers:
		return fmt.Sprintf("the pod has more than %d containers that would get the NVIDIA driver (limits.maxGPUContainers); split it into several pods (a Job or a Deployment of smaller pods), or opt it out with annotation %s: \"false\"",
			r.cfg.Limits.MaxGPUContainers, layout.AnnotationInject)
	case reasonPatchTooLarge:
		return fmt.Sprintf("injecting the NVIDIA driver into the pod's %d containers would take about %d patch operations and %d bytes, more than the webhook's limits (limits.maxPatchOperations %d, limits.maxPatchBytes %d); split it into several pods with fewer GPU containers, or opt it out with annotation %s: \"false\"",
			len(r.targets), d.patchOps, d.patchBytes, r.cfg.Limits.MaxPatchOperations, r.cfg.Limits.MaxPatchBytes, layout.AnnotationInject)
	}
	return "the API server stopped waiting for the answer"
}
