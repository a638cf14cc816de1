package webhook

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	kjson "sigs.k8s.io/json"

	"github.com/gpu-injector/gpu-injector/internal/testfixtures/workload"
)

// FuzzDecodePod checks decodePod's one-pass decoder against the API
// machinery's: whenever sigs.k8s.io/json decodes a body into a Pod, decodePod
// reads from that body what it reads from the Pod's own encoding. Bodies an
// API server never sends (repeated names, invalid UTF-8, odd numbers, nulls)
// are where the two decoders could part.
func FuzzDecodePod(f *testing.F) {
	for _, s := range workload.Sizes {
		raw, err := json.Marshal(workload.Pod(s.Name, s.Bytes))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"metadata":{"name":"a","name":"b","labels":{"k":"v","k":"w"}},"spec":{"nodeName":"n","NodeName":"m","containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1","nvidia.com/gpu":"2"}}}]}}`))
	f.Add([]byte("{\"metadata\":{\"name\":\"\xff\xfe\",\"annotations\":{\"a\":\"\\ud800\"}},\"spec\":{\"containers\":[{\"name\":\"c\",\"env\":[{\"name\":\"LD_LIBRARY_PATH\",\"value\":null,\"valueFrom\":{}}]}]}}"))
	f.Add([]byte(`{"metadata":{},"spec":{"tolerations":[{"key":"k","tolerationSeconds":1e3}],"volumes":[{"name":"v","hostPath":{"path":"/x","type":null}}],"containers":null}}`))
	f.Add([]byte(`{"metadata":null,"spec":{}}`))

	// A quantity with a long decimal exponent stalls apimachinery v0.36's
	// ParseQuantity (see FuzzNodeLayout); the API server parses a pod's
	// quantities before any webhook sees it. Four exponent digits are kept.
	longExponent := regexp.MustCompile(`[0-9.][eE][+-]?[0-9]{5}`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if longExponent.Match(raw) {
			return
		}
		var full corev1.Pod
		if kjson.UnmarshalCaseSensitivePreserveInts(raw, &full) != nil {
			return
		}
		canonical, err := json.Marshal(&full)
		if err != nil {
			t.Fatal(err)
		}
		want, wantErr := decodePod(canonical)
		if wantErr == nil {
			// A resource.Quantity encodes a cached string that need not
			// round-trip ("1" then "2000000000000000000000" under one name
			// encodes as "2"): compare the API machinery's values themselves.
			for i, c := range full.Spec.Containers {
				if i < len(want.Spec.Containers) {
					want.Spec.Containers[i].Resources.Limits = c.Resources.Limits
					want.Spec.Containers[i].Resources.Requests = c.Resources.Requests
				}
			}
			for i, c := range full.Spec.InitContainers {
				if i < len(want.Spec.InitContainers) {
					want.Spec.InitContainers[i].Resources.Limits = c.Resources.Limits
					want.Spec.InitContainers[i].Resources.Requests = c.Resources.Requests
				}
			}
			for i, c := range full.Spec.EphemeralContainers {
				if i < len(want.Spec.EphemeralContainers) {
					want.Spec.EphemeralContainers[i].Resources.Limits = c.Resources.Limits
					want.Spec.EphemeralContainers[i].Resources.Requests = c.Resources.Requests
				}
			}
		}
		got, err := decodePod(raw)
		switch {
		case errors.Is(err, errNoMetadataOrSpec):
			// Absent or null in the body; the Pod's encoding has them empty.
		case err != nil && wantErr == nil:
			t.Fatalf("decodePod failed (%v) on a body the API machinery decodes: %s", err, raw)
		case err == nil && wantErr == nil && !apiequality.Semantic.DeepEqual(got, want):
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(want)
			t.Fatalf("decodePod reads\n%s\nbut the API machinery decodes\n%s\nfrom %s", a, b, raw)
		}
	})
}
