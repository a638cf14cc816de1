package admitinput

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

type noLayouts struct{}

func (noLayouts) Layouts() []*inject.Layout    { return nil }
func (noLayouts) Wedged() []*inject.WedgedNode { return nil }

type namespaces struct {
	labels map[string]string
	err    error
}

func (n namespaces) NamespaceLabels(context.Context, string) (map[string]string, error) {
	return n.labels, n.err
}

type dra struct{ warnings []string }

func (dra) GPUResources() []string { return []string{"example.com/gpu"} }
func (d dra) GPUClaims(context.Context, *corev1.Pod, string) ([]string, []string) {
	return []string{"gpu"}, d.warnings
}

// registry answers for app and fails for down; other images are of a
// registry not listed.
type registry struct{}

func (registry) Read(_ context.Context, image string, _ imageconfig.Credentials) (*imageconfig.Facts, error) {
	switch image {
	case "app":
		return &imageconfig.Facts{Env: []string{"LD_LIBRARY_PATH=/opt/app/lib"}}, nil
	case "down":
		return nil, &imageconfig.Error{Image: image, Registry: "registry.example", Err: errors.New("connection refused")}
	}
	return nil, &imageconfig.Error{Image: image, Registry: "elsewhere.example", Err: imageconfig.ErrNotListed}
}

func pod() *corev1.Pod {
	gpu := corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu"}},
		Containers:     []corev1.Container{{Name: "a", Image: "app", Resources: gpu}, {Name: "b", Image: "down"}, {Name: "c", Image: "unlisted"}, {Name: "d", Image: "app"}},
	}}
}

// TestBuild: every source lands in the input; what could not be read is a
// warning after the decision's own, prefixed as the webhook's are, and is
// logged; an image of a registry not listed is neither.
func TestBuild(t *testing.T) {
	cfg := config.Default()
	cfg.Images.Mode = config.ImagesOn
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	b := Builder{Config: cfg, Layouts: noLayouts{}, Namespaces: namespaces{labels: map[string]string{"a": "b"}},
		DRA: dra{warnings: []string{"failed to read ResourceClaim x: forbidden"}}, Images: registry{}}
	p := pod()
	in, warnings := b.Build(logr.NewContext(context.Background(), log), p, "ml", "uid-1")
	if p.Namespace != "ml" || in.Pod != p || in.Seed != inject.Seed("uid-1") || in.NamespaceLabels["a"] != "b" {
		t.Errorf("input %+v", in)
	}
	if !slices.Equal(in.GPUResources, []string{"example.com/gpu"}) || !slices.Equal(in.GPUClaims, []string{"gpu"}) {
		t.Errorf("DRA: resources %v, claims %v", in.GPUResources, in.GPUClaims)
	}
	if len(in.Images) != 1 || in.Images["app"] == nil || !slices.Equal(in.ImagesUnread, []layout.ImageUnread{{Image: "down", Reason: "connection refused"}}) {
		t.Errorf("images %v, unread %v", in.Images, in.ImagesUnread)
	}
	want := []string{
		inject.WarnPrefix + "failed to read ResourceClaim x: forbidden; the claim was not counted as a GPU claim",
		inject.WarnPrefix + `failed to read the configuration of image "down" from registry.example: connection refused; admitted without the image's configuration (its own LD_LIBRARY_PATH is not kept)`,
	}
	if !slices.Equal(warnings, want) {
		t.Errorf("warnings\n%q\nwant\n%q", warnings, want)
	}
	if len(logged) != 2 || !strings.Contains(logged[0], "failed to read a claim of the pod") || !strings.Contains(logged[1], "admitting without an image's configuration") {
		t.Errorf("logged %q", logged)
	}

	res := b.Decide(context.Background(), pod(), "ml", "uid-1")
	if n := len(res.Warnings); n < 2 || !slices.Equal(res.Warnings[n-2:], want) {
		t.Errorf("the decision's warnings %q do not end with the builder's", res.Warnings)
	}
}

// TestBuildImagesRead: the webhook reads the images of the namespaces
// images.mode and images.namespaces say; the offline commands read those
// given for every pod, and record none unread on the pod.
func TestBuildImagesRead(t *testing.T) {
	off := config.Default()
	listed := config.Default()
	listed.Images.Mode, listed.Images.Namespaces = config.ImagesOn, []string{"other"}
	for name, tc := range map[string]struct {
		cfg     *config.Configuration
		offline bool
		read    bool
	}{
		"images.mode Off":                 {cfg: off},
		"a namespace not listed":          {cfg: listed},
		"offline, whatever the mode says": {cfg: off, offline: true, read: true},
	} {
		t.Run(name, func(t *testing.T) {
			b := Builder{Config: tc.cfg, Layouts: noLayouts{}, Images: registry{}, Offline: tc.offline}
			in, warnings := b.Build(context.Background(), pod(), "ml", "")
			if (in.Images["app"] != nil) != tc.read || (len(warnings) == 1) != tc.read {
				t.Errorf("images %v, warnings %q; want them read: %v", in.Images, warnings, tc.read)
			}
			if len(in.ImagesUnread) > 0 {
				t.Errorf("recorded unread: %v", in.ImagesUnread)
			}
		})
	}
}

// TestBuildNamespaceUnread: a namespace whose labels cannot be read leaves
// the Pod Security level unchecked, and is logged.
func TestBuildNamespaceUnread(t *testing.T) {
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	b := Builder{Config: config.Default(), Layouts: noLayouts{}, Namespaces: namespaces{err: errors.New("namespace \"ml\" is not in the cache")}}
	in, warnings := b.Build(logr.NewContext(context.Background(), log), pod(), "ml", "")
	if in.NamespaceLabels != nil || len(warnings) != 0 || len(logged) != 1 || !strings.Contains(logged[0], "the Pod Security check is skipped") {
		t.Errorf("labels %v, warnings %q, logged %q", in.NamespaceLabels, warnings, logged)
	}
}
