package env

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// Release is the Helm release name and Namespace the release namespace the
// environment installs the chart as, like the README's helm install.
const (
	Release   = "gpu-injector"
	Namespace = "gpu-injector"
)

// FieldManager owns what the environment applies.
const FieldManager = "gpu-injector-e2e"

// RenderChart runs `helm template` on charts/gpu-injector for this cluster's
// version, with extra --set values, and returns every rendered object.
func RenderChart(ctx context.Context, repoRoot, helm string, sets ...string) ([]*unstructured.Unstructured, error) {
	return RenderChartFor(ctx, repoRoot, helm, nil, sets...)
}

// RenderChartFor is RenderChart for a cluster that also serves apiVersions
// (group/version), as helm install would learn from it: an OpenShift's
// security.openshift.io/v1.
func RenderChartFor(ctx context.Context, repoRoot, helm string, apiVersions []string, sets ...string) ([]*unstructured.Unstructured, error) {
	args := []string{"template", Release, filepath.Join(repoRoot, "charts", "gpu-injector"),
		"--namespace", Namespace,
		// helm template does not ask a cluster; the chart decides on the version alone.
		"--kube-version", strings.TrimPrefix(cluster.KubernetesVersion, "v"),
	}
	for _, a := range apiVersions {
		args = append(args, "--api-versions", a)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("failed to render the chart (helm %s): %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return decodeObjects(stdout.Bytes())
}

func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode rendered chart: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Applier server-side applies objects of any kind, resolving kinds through
// the API server's discovery.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier builds an Applier for a client configuration.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create a discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create a dynamic client: %w", err)
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// Apply server-side applies obj; with dryRun the API server runs every
// admission step and validation and persists nothing.
func (a *Applier) Apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) error {
	_, err := a.apply(ctx, obj, dryRun, "")
	return err
}

// DryRunStrict server-side applies obj with dry run and strict field
// validation (a field the API's schema lacks is an error, not dropped), and
// returns what the API server would store.
func (a *Applier) DryRunStrict(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return a.apply(ctx, obj, true, metav1.FieldValidationStrict)
}

// DryRunReplaceStrict replaces the cluster's obj by obj with dry run and
// strict field validation, and returns what the API server would store. A
// field the cluster's object has and obj lacks goes, as helm upgrade's patch
// removes a field the old manifest had and the new one lacks; a server-side
// apply under another field manager would keep it.
func (a *Applier) DryRunReplaceStrict(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	ri, err := a.resource(obj)
	if err != nil {
		return nil, err
	}
	cur, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to get %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	obj = obj.DeepCopy()
	obj.SetResourceVersion(cur.GetResourceVersion())
	out, err := ri.Update(ctx, obj, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		return nil, fmt.Errorf("failed to replace %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return out, nil
}

// DryRunCreateStrict creates obj with dry run and strict field validation,
// as helm install creates an object the cluster does not have yet (a
// server-side apply would treat an explicit null as no value), and returns
// what the API server would store.
func (a *Applier) DryRunCreateStrict(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	ri, err := a.resource(obj)
	if err != nil {
		return nil, err
	}
	out, err := ri.Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	if err != nil {
		return nil, fmt.Errorf("failed to create %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return out, nil
}

func (a *Applier) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		if m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return nil, fmt.Errorf("failed to map %s: %w", gvk, err)
		}
	}
	if m.Scope.Name() == "namespace" {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = Namespace
		}
		return a.dyn.Resource(m.Resource).Namespace(ns), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

func (a *Applier) apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool, validation string) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		if m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return nil, fmt.Errorf("failed to map %s: %w", gvk, err)
		}
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("failed to encode %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true), FieldValidation: validation}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = Namespace
		}
		ri = a.dyn.Resource(m.Resource).Namespace(ns)
	}
	out, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	if err != nil {
		return nil, fmt.Errorf("failed to apply %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return out, nil
}

func ptr[T any](v T) *T { return &v }
