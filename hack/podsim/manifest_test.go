//go:build linux

package main

import (
	"strings"
	"testing"
)

func TestReadCandidates(t *testing.T) {
	for name, tc := range map[string]struct {
		in        string
		want      []string // Kind/Namespace/Name/first container
		wantErr   string
		wantAnnot string
	}{
		"a pod": {
			in:   "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: ml}\nspec: {containers: [{name: c}]}\n",
			want: []string{"Pod/ml/a/c"},
		},
		"a pod as JSON": {
			in:   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c"}]}}`,
			want: []string{"Pod//a/c"},
		},
		"a multi-document stream with other kinds": {
			in: `apiVersion: v1
kind: Service
metadata: {name: svc}
---
# the mutated job
apiVersion: batch/v1
kind: Job
metadata: {name: nvidia-smi, namespace: ml}
spec:
  template:
    metadata:
      annotations: {gpu-injector.io/injected: '{"volumes":["v"]}'}
    spec: {containers: [{name: smi}]}
---
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec: {schedule: "@daily", jobTemplate: {spec: {template: {spec: {containers: [{name: cron}]}}}}}
`,
			want:      []string{"Job/ml/nvidia-smi/smi", "CronJob//nightly/cron"},
			wantAnnot: `{"volumes":["v"]}`,
		},
		"workloads of apps/v1": {
			in: `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec: {template: {spec: {containers: [{name: a}]}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: s}
spec: {template: {spec: {containers: [{name: b}]}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds}
spec: {template: {spec: {containers: [{name: c}]}}}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs}
spec: {template: {spec: {containers: [{name: d}]}}}
`,
			want: []string{"Deployment//d/a", "StatefulSet//s/b", "DaemonSet//ds/c", "ReplicaSet//rs/d"},
		},
		"a List as kubectl prints it": {
			in: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: a}
  spec: {containers: [{name: c}]}
- apiVersion: batch/v1
  kind: Job
  metadata: {name: j}
  spec: {template: {spec: {containers: [{name: d}]}}}
`,
			want: []string{"Pod//a/c", "Job//j/d"},
		},
		"nothing runnable": {
			in: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
		},
		"broken YAML": {
			in:      "apiVersion: v1\nkind: Pod\nmetadata: [\n",
			wantErr: "failed to decode manifest document 0",
		},
		"a pod with a field of the wrong type": {
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: 3}\n",
			wantErr: "failed to decode Pod",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := readCandidates(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, c := range got {
				keys = append(keys, c.Kind+"/"+c.Namespace+"/"+c.Name+"/"+c.Spec.Containers[0].Name)
			}
			if strings.Join(keys, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("got %q, want %q", keys, tc.want)
			}
			if tc.wantAnnot != "" && got[0].Meta.Annotations["gpu-injector.io/injected"] != tc.wantAnnot {
				t.Fatalf("template annotations lost: %v", got[0].Meta.Annotations)
			}
		})
	}
}

func TestReadCandidatesTooLarge(t *testing.T) {
	_, err := readCandidates(strings.NewReader(strings.Repeat("#", maxManifestBytes+1)))
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("got %v, want a size error", err)
	}
}
