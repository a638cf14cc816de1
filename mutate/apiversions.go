package mutate

import "fmt"

// removedAPI is a workload API version the API server no longer serves: the
// webhook never sees such an object, since the API server refuses it first.
type removedAPI struct {
	// removedIn is the Kubernetes release that stopped serving it.
	removedIn string
	// use is the API version that serves the kind now.
	use string
}

// removedAPIs are the removed versions of the workload kinds mutate reads
// pod templates from, by apiVersion and kind, as the Kubernetes deprecated
// API migration guide lists them.
var removedAPIs = map[[2]string]removedAPI{
	{"extensions/v1beta1", "Deployment"}: {"1.16", "apps/v1"},
	{"extensions/v1beta1", "DaemonSet"}:  {"1.16", "apps/v1"},
	{"extensions/v1beta1", "ReplicaSet"}: {"1.16", "apps/v1"},
	{"apps/v1beta1", "Deployment"}:       {"1.16", "apps/v1"},
	{"apps/v1beta1", "StatefulSet"}:      {"1.16", "apps/v1"},
	{"apps/v1beta2", "Deployment"}:       {"1.16", "apps/v1"},
	{"apps/v1beta2", "DaemonSet"}:        {"1.16", "apps/v1"},
	{"apps/v1beta2", "StatefulSet"}:      {"1.16", "apps/v1"},
	{"apps/v1beta2", "ReplicaSet"}:       {"1.16", "apps/v1"},
	{"batch/v2alpha1", "CronJob"}:        {"1.21", "batch/v1"},
	{"batch/v1beta1", "CronJob"}:         {"1.25", "batch/v1"},
}

// removedAPIHint says what to write instead of a removed apiVersion; "" for
// one that is served.
func removedAPIHint(apiVersion, kind string) string {
	r, ok := removedAPIs[[2]string{apiVersion, kind}]
	if !ok {
		return ""
	}
	return fmt.Sprintf("apiVersion %s is no longer served (removed in Kubernetes %s); use %s", apiVersion, r.removedIn, r.use)
}
