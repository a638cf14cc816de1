package precheck

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

// The offline example: a node with gpu-injector's NRI plugin, one whose
// toolkit injects, a hostPath-only node, one that advertises no GPU, one no
// probe has labelled, a CPU node; a namespace opted in at the cluster's
// default level and one enforcing baseline.
const example = "testdata/cluster.yaml"

// fixed is the clock every test gives the node index: no test depends on
// the day it runs.
var fixed = clocktesting.NewFakePassiveClock(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))

func readExample(t *testing.T) ([]corev1.Node, []corev1.Namespace) {
	t.Helper()
	nodes, namespaces, err := readFile(example, nil)
	if err != nil {
		t.Fatal(err)
	}
	return nodes, namespaces
}

func parseConfig(t *testing.T, yaml string) *config.Configuration {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func byName(r *Report) map[string]NodeCheck {
	m := map[string]NodeCheck{}
	for _, n := range r.Nodes {
		m[n.Name] = n
	}
	return m
}

// TestOfflineGolden: the example's report, as a person reads it, is the
// golden file (REFRESH_GOLDEN=true rewrites it); the JSON form says the same.
func TestOfflineGolden(t *testing.T) {
	var out bytes.Buffer
	code, err := Run(context.Background(), Options{File: example, Namespace: "gpu-injector", Output: "table", Clock: fixed}, nil, &out)
	if err != nil || code != status.ExitAttention {
		t.Fatalf("exit %d, %v; want %d", code, err, status.ExitAttention)
	}
	golden := filepath.Join("testdata", "cluster.golden")
	if os.Getenv("REFRESH_GOLDEN") == "true" {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("failed to read the golden file (REFRESH_GOLDEN=true writes it): %v", err)
	}
	if out.String() != string(want) {
		t.Errorf("report differs from %s (REFRESH_GOLDEN=true rewrites it):\n%s", golden, out.String())
	}

	out.Reset()
	if _, err := Run(context.Background(), Options{File: example, Namespace: "gpu-injector", Output: "json", Clock: fixed}, nil, &out); err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	checkExample(t, &r)
}

func checkExample(t *testing.T, r *Report) {
	t.Helper()
	want := map[string]string{
		"gpu-nri": DeliveryNRI, "gpu-toolkit": DeliveryNodeRuntime, "gpu-hostpath": DeliveryHostPath,
		"gpu-noalloc": DeliveryHostPath, "gpu-unprobed": DeliveryNone,
	}
	nodes := byName(r)
	if len(nodes) != len(want) {
		t.Errorf("GPU nodes %v, want %v (no CPU node)", nodes, want)
	}
	for name, d := range want {
		if n := nodes[name]; n.Delivery != d || n.NeedsAttention != (d == DeliveryNone) {
			t.Errorf("node %s: %+v, want delivery %s", name, n, d)
		}
	}
	if n := nodes["gpu-toolkit"]; n.Runtime != layout.RuntimeToolkit {
		t.Errorf("toolkit node's runtime %q", n.Runtime)
	}
	if why := nodes["gpu-unprobed"].Why; !strings.Contains(why, "not probed") || !strings.Contains(why, "-n gpu-injector") || !strings.Contains(why, "spec.nodeName=gpu-unprobed") {
		t.Errorf("unprobed node: %q, want what to check on it", why)
	}
	if !slices.Equal(r.DevicePlugin.Without, []string{"gpu-noalloc"}) || r.DevicePlugin.Advertising != 4 {
		t.Errorf("device plugin %+v, want gpu-noalloc alone without GPUs", r.DevicePlugin)
	}
	if r.Webhook.Outcome != WebhookSkipped || !r.Offline {
		t.Errorf("webhook %+v offline %v, want skipped offline", r.Webhook, r.Offline)
	}
	var research, ml NamespaceCheck
	for _, ns := range r.Namespaces {
		switch ns.Name {
		case "research":
			research = ns
		case "ml":
			ml = ns
		}
	}
	if !slices.Equal(research.Refused, []string{"gpu-hostpath", "gpu-noalloc"}) || !strings.Contains(research.Message, "hostPath") {
		t.Errorf("baseline namespace %+v, want the hostPath nodes refused", research)
	}
	if len(ml.Refused) > 0 || len(r.Namespaces) != 2 {
		t.Errorf("namespaces %+v, want ml and research alone, ml refusing nothing", r.Namespaces)
	}
	if len(r.Attention) != 3 {
		t.Errorf("attention %q, want the unprobed node, the device plugin, the baseline namespace", r.Attention)
	}
}

// TestDeliveryFollowsConfiguration: the deliveries are the webhook's
// decisions under the configuration given.
func TestDeliveryFollowsConfiguration(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg      string
		want     map[string]string
		attn     []string
		refused  []string
		whyParts map[string]string
	}{
		"HostPath": {cfg: "driverDelivery: HostPath",
			want:     map[string]string{"gpu-nri": DeliveryHostPath, "gpu-toolkit": DeliveryNodeRuntime, "gpu-hostpath": DeliveryHostPath},
			refused:  []string{"gpu-hostpath", "gpu-noalloc", "gpu-nri"},
			whyParts: map[string]string{"gpu-nri": "driverDelivery: HostPath", "gpu-toolkit": "pinned to layout"}},
		"HostPath, Pod Security Deny": {cfg: "driverDelivery: HostPath\npodSecurity: Deny",
			want:    map[string]string{"gpu-toolkit": DeliveryNodeRuntime},
			refused: []string{"gpu-hostpath", "gpu-noalloc", "gpu-nri", "gpu-toolkit"}},
		"Runtime": {cfg: "driverDelivery: Runtime",
			want: map[string]string{"gpu-nri": DeliveryNRI, "gpu-toolkit": DeliveryNodeRuntime, "gpu-hostpath": DeliveryNone},
			attn: []string{"gpu-hostpath", "gpu-noalloc"}, whyParts: map[string]string{"gpu-hostpath": "NRI validator"}},
		"runtimeInjection Skip": {cfg: "runtimeInjection: Skip",
			want:     map[string]string{"gpu-toolkit": DeliveryNodeRuntime, "gpu-nri": DeliveryNRI},
			refused:  []string{"gpu-hostpath", "gpu-noalloc"},
			whyParts: map[string]string{"gpu-toolkit": "runtimeInjection: Skip"}},
	} {
		t.Run(name, func(t *testing.T) {
			nodes, namespaces := readExample(t)
			r := Check(Input{Nodes: nodes, Namespaces: namespaces, Config: parseConfig(t, tc.cfg), Clock: fixed})
			got := byName(r)
			for n, d := range tc.want {
				if got[n].Delivery != d {
					t.Errorf("node %s: %s (%s), want %s", n, got[n].Delivery, got[n].Why, d)
				}
			}
			for n, part := range tc.whyParts {
				if !strings.Contains(got[n].Why, part) {
					t.Errorf("node %s: why %q lacks %q", n, got[n].Why, part)
				}
			}
			for _, n := range tc.attn {
				if !got[n].NeedsAttention {
					t.Errorf("node %s needs no attention: %+v", n, got[n])
				}
			}
			for _, ns := range r.Namespaces {
				if ns.Name == "research" && !slices.Equal(ns.Refused, tc.refused) {
					t.Errorf("baseline namespace refuses %v, want %v (%s)", ns.Refused, tc.refused, ns.Message)
				}
			}
		})
	}
}
