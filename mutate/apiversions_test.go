package mutate

import (
	"strings"
	"testing"
)

// TestRemovedAPIVersions: a workload of an API version the API server no
// longer serves is named with the version to use, once, also inside a List;
// a served one is not.
func TestRemovedAPIVersions(t *testing.T) {
	workload := func(apiVersion, kind, name string) string {
		spec := `{template: {spec: {containers: [{name: c, image: cuda, resources: {limits: {nvidia.com/gpu: 1}}}]}}}`
		if kind == "CronJob" {
			spec = `{schedule: "* * * * *", jobTemplate: {spec: ` + spec + `}}`
		}
		return "apiVersion: " + apiVersion + "\nkind: " + kind + "\nmetadata: {name: " + name + "}\nspec: " + spec + "\n"
	}
	in := strings.Join([]string{
		workload("extensions/v1beta1", "Deployment", "old-web"),
		workload("apps/v1beta2", "StatefulSet", "old-db"),
		workload("batch/v1beta1", "CronJob", "old-cron"),
		workload("batch/v2alpha1", "CronJob", "older-cron"),
		workload("apps/v1", "Deployment", "web"),
		"apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.TrimSuffix(workload("apps/v1beta1", "Deployment", "listed"), "\n"), "\n", "\n  ") + "\n",
	}, "---\n")
	_, stderr, err := runMutate(t, in, "-", nodesFile)
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"warning: Deployment/old-web: apiVersion extensions/v1beta1 is no longer served (removed in Kubernetes 1.16); use apps/v1\n",
		"warning: StatefulSet/old-db: apiVersion apps/v1beta2 is no longer served (removed in Kubernetes 1.16); use apps/v1\n",
		"warning: CronJob/old-cron: apiVersion batch/v1beta1 is no longer served (removed in Kubernetes 1.25); use batch/v1\n",
		"warning: CronJob/older-cron: apiVersion batch/v2alpha1 is no longer served (removed in Kubernetes 1.21); use batch/v1\n",
		"warning: Deployment/listed: apiVersion apps/v1beta1 is no longer served (removed in Kubernetes 1.16); use apps/v1\n",
	} {
		if strings.Count(stderr, want) != 1 {
			t.Errorf("stderr does not say once %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "Deployment/web: apiVersion") {
		t.Errorf("a served apiVersion is warned about:\n%s", stderr)
	}
	// The workloads are still mutated: the hint is the one difference the
	// removed version makes.
	if !strings.Contains(stderr, "injected: Deployment/old-web:") {
		t.Errorf("the removed version's workload was not mutated:\n%s", stderr)
	}
}

// TestRemovedAPIHint: every removed version of a workload kind names a
// served one whose kind mutate reads.
func TestRemovedAPIHint(t *testing.T) {
	for k, r := range removedAPIs {
		if _, ok := templatePaths[k[1]]; !ok {
			t.Errorf("%s %s: mutate reads no pod template of the kind", k[0], k[1])
		}
		if removedAPIHint(r.use, k[1]) != "" {
			t.Errorf("%s %s: the replacement %s is removed too", k[0], k[1], r.use)
		}
	}
	if h := removedAPIHint("apps/v1", "Deployment"); h != "" {
		t.Errorf("apps/v1 Deployment: %q", h)
	}
}
