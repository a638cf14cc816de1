package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-injector/gpu-injector/layout"
)

func unreadPod(ns, name string, age time.Duration, labelled bool, record string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age)),
		Labels: map[string]string{"app": name}, Annotations: map[string]string{}}}
	if labelled {
		p.Labels[layout.LabelImagesUnread] = layout.LabelImagesUnreadValue
	}
	if record != "" {
		p.Annotations[layout.AnnotationImagesUnread] = record
	}
	return p
}

func unreadRecord(image, reason string) string {
	return layout.NewImagesUnread([]layout.ImageUnread{{Image: image, Reason: reason}}).String()
}

// TestImagesUnread: status lists the pods labelled as admitted without an
// image's configuration, newest first, with the registry's answer and when
// they were admitted; a record that does not decode is said, not shown; a
// pod with the record but not the label is not found (the label is the
// index); none of it needs attention.
func TestImagesUnread(t *testing.T) {
	objs := append(healthy(),
		unreadPod("ml", "train-old", 3*time.Hour, true, unreadRecord("registry.example:5000/team/app:v2", "dial tcp 10.0.0.9:5000: connect: connection refused")),
		unreadPod("ml", "train-new", 2*time.Minute, true, layout.NewImagesUnread([]layout.ImageUnread{
			{Image: "registry.example:5000/team/app:v3", Reason: "no answer within the admission's budget; the read goes on for the next pod"},
			{Image: "registry.example:5000/team/logs:v1", Reason: "unexpected status code 401 Unauthorized"}}).String()),
		unreadPod("batch", "forged", time.Hour, true, `{"images":[{"image":"x","reason":"\u001b[2Jgotcha"}]}`),
		unreadPod("ml", "unlabelled", time.Minute, false, unreadRecord("registry.example:5000/team/app:v2", "refused")),
	)
	r := collect(t, &stubDryRun{pod: injectedPod("fp-gpu-a")}, objs...)
	if len(r.Attention) != 0 {
		t.Errorf("attention %v, want none: the pods were admitted, as configured", r.Attention)
	}
	u := r.ImagesUnread
	var names []string
	for _, p := range u.Pods {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if got := strings.Join(names, ","); u.Total != 3 || got != "ml/train-new,batch/forged,ml/train-old" {
		t.Fatalf("total %d, pods %s; want 3, newest first: ml/train-new,batch/forged,ml/train-old", u.Total, got)
	}
	if p := u.Pods[0]; len(p.Images) != 2 || !p.Admitted.Equal(now.Add(-2*time.Minute)) {
		t.Errorf("newest pod %+v", p)
	}
	if p := u.Pods[1]; p.Images != nil || !strings.Contains(p.Note, "not one printable line") {
		t.Errorf("forged record shown: %+v", p)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, want := range []string{"PODS ADMITTED WITHOUT THEIR IMAGES' CONFIGURATION", "POD", "REGISTRY'S ANSWER",
		"ml/train-new  2m ago", "registry.example:5000/team/app:v3   no answer within the admission's budget",
		"registry.example:5000/team/logs:v1  unexpected status code 401 Unauthorized",
		"batch/forged", "record ignored: failed to decode gpu-injector.io/images-unread",
		"ml/train-old  3h0m ago", "connection refused", "a pod's author can too", "OK: nothing needs attention"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "\x1b") || strings.Contains(table, "unlabelled") {
		t.Errorf("table has a control character or the unlabelled pod:\n%s", table)
	}
	js, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(js), `"imagesUnread":{"total":3,"pods":[{"namespace":"ml","name":"train-new"`) {
		t.Errorf("json %s, %v", js, err)
	}
}

// TestImagesUnreadBounded: of many pods, the newest maxUnreadPods are
// named, the rest counted; the list is read a page at a time.
func TestImagesUnreadBounded(t *testing.T) {
	objs := healthy()
	for i := range 45 {
		objs = append(objs, unreadPod("ml", fmt.Sprintf("p-%02d", i), time.Duration(i)*time.Minute, true, unreadRecord("r.example/app:v1", "refused")))
	}
	cs := fake.NewClientset(objs...)
	var limits []int64
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		limits = append(limits, a.(k8stesting.ListActionImpl).ListOptions.Limit)
		return false, nil, nil
	})
	c := &Collector{Client: cs, DryRun: &stubDryRun{pod: injectedPod("fp-gpu-a")}, Now: func() time.Time { return now }}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	u := r.ImagesUnread
	if u.Total != 45 || len(u.Pods) != maxUnreadPods || u.Pods[0].Name != "p-00" || u.Pods[maxUnreadPods-1].Name != fmt.Sprintf("p-%02d", maxUnreadPods-1) {
		t.Fatalf("total %d, %d pods, first %s; want 45, %d, p-00", u.Total, len(u.Pods), u.Pods[0].Name, maxUnreadPods)
	}
	if len(limits) == 0 || limits[0] != unreadPage {
		t.Errorf("list limits %v, want pages of %d", limits, unreadPage)
	}
	var out bytes.Buffer
	if err := Render(&out, r, RenderOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "and 25 older pods (kubectl get pods -A -l gpu-injector.io/images-unread)") {
		t.Errorf("table does not count the rest:\n%s", out.String())
	}
}

// TestImagesUnreadPages: every page of the list is read, each of
// unreadPage pods, following the API server's continue token.
func TestImagesUnreadPages(t *testing.T) {
	const n = 2*unreadPage + 7
	pods := make([]corev1.Pod, n)
	for i := range pods {
		pods[i] = *unreadPod("ml", fmt.Sprintf("p-%04d", i), time.Duration(n-i)*time.Second, true, unreadRecord("r.example/app:v1", "refused"))
	}
	cs := fake.NewClientset(healthy()...)
	var pages []string
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.ListActionImpl).ListOptions
		if o.LabelSelector != layout.LabelImagesUnread {
			return false, nil, nil
		}
		from, _ := strconv.Atoi(o.Continue)
		to := min(from+int(o.Limit), n)
		pages = append(pages, fmt.Sprintf("%d-%d", from, to))
		list := &corev1.PodList{Items: pods[from:to]}
		if to < n {
			list.Continue = strconv.Itoa(to)
		}
		return true, list, nil
	})
	c := &Collector{Client: cs, DryRun: &stubDryRun{pod: injectedPod("fp-gpu-a")}, Now: func() time.Time { return now }}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("0-%d,%d-%d,%d-%d", unreadPage, unreadPage, 2*unreadPage, 2*unreadPage, n)
	if got := strings.Join(pages, ","); got != want {
		t.Errorf("pages read %s, want %s", got, want)
	}
	if u := r.ImagesUnread; u.Total != n || len(u.Pods) != maxUnreadPods || u.Pods[0].Name != fmt.Sprintf("p-%04d", n-1) {
		t.Errorf("total %d, %d pods, newest %+v; want %d, %d, p-%04d", u.Total, len(u.Pods), u.Pods[0], n, maxUnreadPods, n-1)
	}
}

// TestImagesUnreadForbidden: a user who may not list pods gets the report,
// with a note.
func TestImagesUnreadForbidden(t *testing.T) {
	cs := fake.NewClientset(healthy()...)
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", fmt.Errorf("RBAC: access denied"))
	})
	c := &Collector{Client: cs, DryRun: &stubDryRun{pod: injectedPod("fp-gpu-a")}, Now: func() time.Time { return now }}
	r, err := c.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.ImagesUnread.Note, "forbidden") || exitStatus(r) != ExitOK {
		t.Errorf("note %q, exit %d; want forbidden, 0", r.ImagesUnread.Note, exitStatus(r))
	}
}
