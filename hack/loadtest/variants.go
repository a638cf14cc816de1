package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"

	"github.com/gpu-injector/gpu-injector/layout"
)

// The variants, in the order they run: each replaces the one before, and
// the switch is checked by a request that must show the new one's effect.
const (
	variantNone      = "none"
	variantPolicy    = "policy"
	variantNoop      = "noop"
	variantSamePatch = "same-patch"
	variantWhole     = "whole-lists"
	variantOurs      = "gpu-injector"
	// variantChartPolicy is the chart's admission policy with the chart's
	// webhook configuration beside it (-runtime-delivery): the policy admits
	// the modern GPU pods, the webhook is called for the others.
	variantChartPolicy = "chart-policy"
	// variantRefPolicy is chart-policy with the chart of another checkout
	// (-ref-chart), so that two versions of the policy are measured in one run.
	variantRefPolicy = "chart-policy-ref"
)

var allVariants = []string{variantNone, variantPolicy, variantNoop, variantSamePatch, variantWhole, variantOurs, variantChartPolicy, variantRefPolicy}

// defaultVariants are those that need no -runtime-delivery.
var defaultVariants = allVariants[:len(allVariants)-2]

var variantTitles = map[string]string{
	variantNone:        "no mutating admission (baseline)",
	variantPolicy:      "MutatingAdmissionPolicy, the same static patch",
	variantNoop:        "no-op webhook (floor)",
	variantSamePatch:   "same-patch webhook (floor)",
	variantWhole:       "same change, each list replaced whole (floor)",
	variantOurs:        "gpu-injector",
	variantChartPolicy: "chart's MutatingAdmissionPolicy, gpu-injector for the rest",
	variantRefPolicy:   "-ref-chart's MutatingAdmissionPolicy, gpu-injector for the rest",
}

// webhookName is the webhook's name in the API server's metrics.
func webhookName(variant string) string { return variant + ".loadtest.gpu-injector.io" }

// configure removes every variant's admission objects and installs v's.
func (r *run) configure(ctx context.Context, v string) error {
	ar := r.cp.client.AdmissionregistrationV1()
	for _, old := range allVariants {
		if err := ar.MutatingWebhookConfigurations().Delete(ctx, old, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		for _, s := range append([]string{""}, r.o.sizes...) {
			name := old + "-" + s
			if s == "" {
				name = old
			}
			if err := ar.MutatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			if err := ar.MutatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	var url string
	switch v {
	case variantNone:
		return nil
	case variantPolicy:
		return r.policies(ctx)
	case variantChartPolicy, variantRefPolicy:
		pol := r.chartPol
		if v == variantRefPolicy {
			pol = r.refPol
		}
		if err := r.chartPolicy(ctx, v, pol); err != nil {
			return err
		}
		_, err := ar.MutatingWebhookConfigurations().Create(ctx, webhookFor(pol.mwc, v, r.webhookURL, r.ca), metav1.CreateOptions{})
		return err
	case variantNoop:
		url = r.noop.url
	case variantSamePatch:
		url = r.same.url
	case variantWhole:
		url = r.wholeLists.url
	case variantOurs:
		url = r.webhookURL
	}
	_, err := ar.MutatingWebhookConfigurations().Create(ctx, webhookFor(r.mwc, v, url, r.ca), metav1.CreateOptions{})
	return err
}

// policies installs one MutatingAdmissionPolicy per pod size, selected by
// the size label, matching what the chart's webhook matches and applying our
// patch for that size.
func (r *run) policies(ctx context.Context) error {
	ar := r.cp.client.AdmissionregistrationV1()
	wh := r.mwc.Webhooks[0]
	var conds []admissionregistrationv1.MatchCondition
	conds = append(conds, wh.MatchConditions...)
	for _, size := range r.o.sizes {
		if size == sizeCPU {
			continue
		}
		expr, err := celPatch(r.patches[size])
		if err != nil {
			return err
		}
		name := variantPolicy + "-" + size
		p := &admissionregistrationv1.MutatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{
					NamespaceSelector: wh.NamespaceSelector,
					ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{sizeLabelKey: size}},
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
					}}},
					MatchPolicy: wh.MatchPolicy,
				},
				MatchConditions: conds,
				FailurePolicy:   ptr.To(admissionregistrationv1.Fail),
				// A static patch is not idempotent: applied again it would
				// add every volume twice.
				ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
				Mutations: []admissionregistrationv1.Mutation{{
					PatchType: admissionregistrationv1.PatchTypeJSONPatch,
					JSONPatch: &admissionregistrationv1.JSONPatch{Expression: expr},
				}},
			},
		}
		if _, err := ar.MutatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("failed to create the admission policy: %w", err)
		}
		b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name},
		}
		if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("failed to create the admission policy binding: %w", err)
		}
	}
	return nil
}

// chartPolicy installs the chart's MutatingAdmissionPolicy and its binding,
// as helm template rendered them.
func (r *run) chartPolicy(ctx context.Context, v string, pol chartPolicy) error {
	if pol.policy == nil {
		return fmt.Errorf("the %s variant needs -runtime-delivery or -default-values (and -ref-chart for %s), where the chart renders its admission policy", v, variantRefPolicy)
	}
	ar := r.cp.client.AdmissionregistrationV1()
	p := pol.policy.DeepCopy()
	p.ObjectMeta = metav1.ObjectMeta{Name: v}
	if _, err := ar.MutatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create the chart's admission policy: %w", err)
	}
	b := pol.binding.DeepCopy()
	b.ObjectMeta = metav1.ObjectMeta{Name: v}
	b.Spec.PolicyName = v
	if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create the chart's admission policy binding: %w", err)
	}
	return nil
}

// celPatch writes a JSON Patch as the CEL list of JSONPatch values an
// admission policy returns. CEL wants objects built as their schema type
// (Object.spec.volumes{...}); maps of strings stay map literals.
func celPatch(patch []byte) (string, error) {
	var ops []map[string]any
	if err := json.Unmarshal(patch, &ops); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("[")
	for i, op := range ops {
		if i > 0 {
			b.WriteString(",\n")
		}
		path := op["path"].(string)
		fmt.Fprintf(&b, "JSONPatch{op: %s, path: %s", strconv.Quote(op["op"].(string)), strconv.Quote(path))
		if v, ok := op["value"]; ok {
			b.WriteString(", value: ")
			celLiteral(&b, schemaType(path), v)
		}
		b.WriteString("}")
	}
	b.WriteString("]")
	return b.String(), nil
}

// schemaType names the type at a JSON Patch path: /spec/containers/0/env/-
// is Object.spec.containers.env.
func schemaType(path string) string {
	t := "Object"
	for _, seg := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		if _, err := strconv.Atoi(seg); err == nil || seg == "-" {
			continue
		}
		t += "." + seg
	}
	return t
}

// stringMaps are the fields of our patches that are maps, not objects.
var stringMaps = map[string]bool{"nodeSelector": true, "annotations": true, "labels": true, "limits": true, "requests": true}

func celLiteral(b *strings.Builder, typ string, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		isMap := stringMaps[typ[strings.LastIndexByte(typ, '.')+1:]]
		if isMap {
			b.WriteString("{")
		} else {
			b.WriteString(typ + "{")
		}
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			if isMap {
				b.WriteString(strconv.Quote(k) + ": ")
			} else {
				b.WriteString(k + ": ")
			}
			celLiteral(b, typ+"."+k, x[k])
		}
		b.WriteString("}")
	case []any:
		b.WriteString("[")
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			celLiteral(b, typ, e)
		}
		b.WriteString("]")
	case string:
		b.WriteString(strconv.Quote(x))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case float64:
		b.WriteString(strconv.FormatFloat(x, 'f', -1, 64))
	case nil:
		b.WriteString("null")
	}
}

// awaitSwitch sends dry-run creates until the new variant shows: the
// response carries our injection exactly when v injects, and when v is a
// webhook, the API server's count of calls to it moved.
func (r *run) awaitSwitch(ctx context.Context, l *loader, v string) error {
	deadline := time.Now().Add(60 * time.Second)
	size := r.o.sizes[0]
	for _, s := range r.o.sizes {
		if s != sizeCPU {
			size = s
			break
		}
	}
	for {
		before, err := r.cp.scrape(ctx)
		if err != nil {
			return err
		}
		body, err := l.create(ctx, size)
		if err != nil {
			return err
		}
		after, err := r.cp.scrape(ctx)
		if err != nil {
			return err
		}
		injected := bytes.Contains(body, []byte(layout.LabelFingerprint)) || bytes.Contains(body, []byte(layout.AnnotationRuntimeInject))
		wantInjected := v != variantNone && v != variantNoop
		called := true
		switch v {
		case variantNone, variantPolicy:
		case variantChartPolicy, variantRefPolicy:
			// The policy, not the webhook, admits the modern GPU pod.
			called = after.webhookCount(webhookName(v)) == before.webhookCount(webhookName(v))
		default:
			called = after.webhookCount(webhookName(v)) > before.webhookCount(webhookName(v))
		}
		if injected == wantInjected && called {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("variant %s did not take effect within 60s (injected %v, called %v): %.400s", v, injected, called, body)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func decodeYAMLObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("failed to decode the chart's objects: %w", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}
