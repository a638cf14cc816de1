package cmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/status"
)

func TestParseStatusPodFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args           []string
		ns, pod        string
		manifest, file string
		out            string
		usage          bool
	}{
		"target first":            {args: []string{"ml/train-0", "-o", "json"}, ns: "ml", pod: "train-0", out: "json"},
		"flags first":             {args: []string{"--manifest", "p.yaml", "ml/train-0"}, ns: "ml", pod: "train-0", manifest: "p.yaml", out: "table"},
		"offline":                 {args: []string{"-f", "p.yaml", "--nodes", "n.yaml", "ml/train-0"}, ns: "ml", pod: "train-0", file: "p.yaml", out: "table"},
		"offline, one pod":        {args: []string{"-f", "p.yaml", "--pull"}, file: "p.yaml", out: "table"},
		"offline, a cluster flag": {args: []string{"-f", "p.yaml", "--kubeconfig", "k"}, usage: true},
		"nodes without -f":        {args: []string{"ml/a", "--nodes", "n.yaml"}, usage: true},
		"images and pull":         {args: []string{"-f", "p.yaml", "--pull", "--images", "d"}, usage: true},
		"no target":               {args: []string{"-o", "json"}, usage: true},
		"no namespace":            {args: []string{"train-0"}, usage: true},
		"bad name":                {args: []string{"ml/Train_0"}, usage: true},
		"two targets":             {args: []string{"ml/a", "ml/b"}, usage: true},
		"bad output":              {args: []string{"ml/a", "-o", "wide"}, usage: true},
		"slash in the name":       {args: []string{"ml/a/b"}, usage: true},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := parseStatusPodFlags(tc.args, io.Discard)
			if tc.usage {
				if !errors.Is(err, ErrUsage) {
					t.Fatalf("error %v, want a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o := f.opts; o.PodNamespace != tc.ns || o.PodName != tc.pod || o.ManifestFile != tc.manifest || o.File != tc.file || o.Output != tc.out {
				t.Errorf("options %+v", o)
			}
		})
	}
}

// TestStatusPodOfflineReadsNoCluster: with -f, status pod answers from the
// file without a kubeconfig or a cluster to find.
func TestStatusPodOfflineReadsNoCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	file := filepath.Join(t.TempDir(), "pod.yaml")
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: train, namespace: ml}\nspec:\n  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
	if err := os.WriteFile(file, []byte(pod), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := StatusPod(context.Background(), []string{"-f", file, "-o", "json"}, &stdout, &stderr)
	if code == status.ExitError || code == status.ExitUsage || stderr.Len() > 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"pod": "ml/train"`) || !strings.Contains(stdout.String(), `"admission"`) {
		t.Errorf("report:\n%s", stdout.String())
	}
}
