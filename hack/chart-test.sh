#!/usr/bin/env bash
# Lints the Helm chart in every mode it supports and runs the chart's Go tests, which
# render it with helm and evaluate its CEL with the API server's own CEL code.
#
#   hack/chart-test.sh
#
# helm comes from ${HELM}, or hack/tools.sh's cache (helm-<version>/helm, the version
# e2e/cluster/versions.env sets), built by hack/tools.sh helm when missing.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.sh
source "${REPO_ROOT}/hack/versions.sh"
CACHE="${GPU_INJECTOR_CACHE_DIR}"
CHART="${REPO_ROOT}/charts/gpu-injector"

log() { printf '[chart-test] %s\n' "$*" >&2; }

if [[ -z "${HELM:-}" ]]; then
  HELM="${CACHE}/helm-${HELM_VERSION}/helm"
  if [[ ! -x "${HELM}" ]]; then
    if [[ -x "${REPO_ROOT}/hack/tools.sh" ]]; then
      "${REPO_ROOT}/hack/tools.sh" helm
    else
      log "building helm ${HELM_VERSION} into ${CACHE}/helm-${HELM_VERSION}"
      mkdir -p "${CACHE}/helm-${HELM_VERSION}"
      GOBIN="${CACHE}/helm-${HELM_VERSION}" CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
    fi
  fi
fi
export HELM

# Each mode: a name, then helm arguments. The chart refuses to install on a Kubernetes
# below its floor (1.30) but renders any version without a cluster, so no mode names one;
# the Go tests check that refusal, the policy and its CEL.
modes=(
  "defaults (1.36)|--kube-version 1.36.3"
  "defaults (1.33, the oldest tested: no DRA rules)|--kube-version 1.33.13"
  "defaults (1.30, the floor: untested)|--kube-version 1.30.0"
  "cert-manager|--kube-version 1.36.3 --set certManager.enabled=true"
  "cert-manager with a ClusterIssuer|--kube-version 1.36.3 --set certManager.enabled=true --set certManager.issuerRef.name=ca --set certManager.issuerRef.kind=ClusterIssuer"
  "out-of-cluster webhook url|--kube-version 1.36.3 --set webhook.url=https://127.0.0.1:9443 --set webhook.caBundle=Zm9v --set webhook.enabled=false"
  "privileged probe, one replica|--kube-version 1.36.3 --set nodeprobe.privileged=true --set webhook.replicas=1"
  "probe disabled|--kube-version 1.36.3 --set nodeprobe.enabled=false --set runtimeInjection.enabled=false"
  "an added allowlist entry|--kube-version 1.36.3 --set config.hostPaths.extraAllowlist[0].path=/srv/gpu"
  "runtime injection off (no NRI plugin)|--kube-version 1.36.3 --set runtimeInjection.enabled=false"
  "runtime injection only, socket elsewhere|--kube-version 1.36.3 --set runtimeInjection.nriSocket=/run/containerd/nri/nri.sock --set config.driverDelivery=Runtime"
  "webhook on the host network, ports moved|--kube-version 1.36.3 --set webhook.hostNetwork=true --set webhook.port=10260 --set webhook.metricsPort=10261 --set webhook.healthPort=10262"
  "OpenShift on its floor (4.20: Kubernetes 1.33)|--kube-version 1.33.13 --set openshift.enabled=true"
  "OpenShift, privileged probe, no NRI plugin|--kube-version 1.36.3 --set openshift.enabled=true --set nodeprobe.privileged=true --set runtimeInjection.enabled=false"
  "no helm test, no uninstall cleanup|--kube-version 1.36.3 --set tests.enabled=false --set cleanup.enabled=false"
  "the node's credential provider plugins mounted|--kube-version 1.36.3 --set config.images.mode=On --set config.images.registries[0]=us-docker.pkg.dev --set webhook.nodeCredentialProviders.hostPath=true --set config.images.credentialProviders.config=/etc/srv/kubernetes/cri_auth_config.yaml --set config.images.credentialProviders.binDir=/home/kubernetes/bin"
)
for mode in "${modes[@]}"; do
  name="${mode%%|*}"
  read -r -a args <<<"${mode#*|}"
  log "helm lint --strict: ${name}"
  "${HELM}" lint --strict --namespace gpu-injector "${args[@]}" "${CHART}" >/dev/null || {
    "${HELM}" lint --strict --namespace gpu-injector "${args[@]}" "${CHART}"
    exit 1
  }
done

# The configuration is the binary's to check: the install hook runs `gpu-injector config
# validate` on the file the chart renders, before anything is installed or upgraded. This
# does offline what the hook does in a cluster: helm template, then the binary's check of
# the rendered ConfigMaps (the release's and the hook's, one file).
log "building gpu-injector (config validate)"
bin="${REPO_ROOT}/_output/chart-test/gpu-injector"
(cd "${REPO_ROOT}" && go build -o "${bin}" .)
validate() {
  "${HELM}" template t "${CHART}" --namespace gpu-injector "$@" | "${bin}" config validate -f -
}
# Every mode above installs: the hook passes.
for mode in "${modes[@]}"; do
  name="${mode%%|*}"
  read -r -a args <<<"${mode#*|}"
  validate "${args[@]}" >/dev/null || { log "the hook refuses mode ${name}"; exit 1; }
done
# As the docs type it: no --kube-version, where helm assumes v1.20.0 unless its build is
# stamped with another version; the chart renders, and its configuration passes.
for kube in "--kube-version 1.20.0" ""; do
  read -r -a args <<<"${kube}"
  log "helm template | config validate, ${kube:-the default version}"
  "${HELM}" template gpu-injector "${CHART}" "${args[@]}" | "${bin}" config validate -f - >/dev/null
done
# Bad values render, and the hook refuses them with the binary's message (stderr, exit 1).
bad_values=(
  "--set config.noLayout.action=Static|noLayout.staticLayout: Required value: the name of a staticLayouts entry, with action Static"
  "--set config.hostPaths.extraAllowlist[0].path=/usr/lib|hostPaths.extraAllowlist[0].path: Forbidden: it would allow the system folder /usr/lib whole; allow it only with filesOnly: true, or name the driver's own folder"
  "--set config.hostPaths.extraAllowlist[0].path=/etc|hostPaths.extraAllowlist[0].path: Forbidden: it would allow the system folder /etc whole"
  "--set config.excludedNamespaces={Kube-System}|excludedNamespaces[0]: Invalid value: \"Kube-System\": a lowercase RFC 1123 label must consist of"
  "--set config.pinning.nodeLabels={gpu-injector.io/layout-fingerprint}|pinning.nodeLabels[0]: Forbidden: gpu-injector.io/ labels are set by the probe"
  "--set config.images.credentialProviders.binDir=/home/kubernetes/bin|images.credentialProviders.config: Required value"
  "--set config.pinning.rememberFor=3days|failed to parse configuration: error unmarshaling JSON: while decoding JSON: time: unknown unit \"days\" in duration \"3days\""
)
for case in "${bad_values[@]}"; do
  read -r -a args <<<"${case%%|*}"
  want="${case#*|}"
  log "the hook refuses ${args[*]}"
  rc=0
  out=$(validate --kube-version 1.36.3 "${args[@]}" 2>&1 >/dev/null) || rc=$?
  # The binary names each field's line of the rendered file, which the chart's
  # defaults move: the message is compared without it.
  plain=$(sed -E 's/(in [^;,]*, )?on line [0-9]+(; |: |$)//g' <<<"${out}")
  if [[ ${rc} -ne 1 || "${plain}" != *"${want}"* ]]; then
    log "exit ${rc}, want 1 and the message: ${want}"
    printf '%s\n' "${out}" >&2
    exit 1
  fi
done

# The NRI plugin's container, rendered: present by default and gone with
# runtimeInjection.enabled=false, uid 0
# with nothing else, the socket's folder read-only, the state folder shared with the probe,
# and no service-account token: the pod mounts none by itself, the probe's container its own.
# A Go program reads the DaemonSet as the API server's types; it is written under
# _output/ (ignored), where go run finds this module.
log "runtime injection: the rendered DaemonSet"
check_dir="${REPO_ROOT}/_output/chart-test-nri"
mkdir -p "${check_dir}"
cat >"${check_dir}/main.go" <<'GO'
// Reads helm template output on stdin and checks the probe DaemonSet's NRI plugin.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	want, socketDir := os.Args[1] == "enabled", os.Args[2]
	data, _ := io.ReadAll(bufio.NewReader(os.Stdin))
	var ds *appsv1.DaemonSet
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		if bytes.Contains(doc, []byte("kind: DaemonSet")) {
			ds = &appsv1.DaemonSet{}
			if err := yaml.Unmarshal(doc, ds); err != nil {
				fail("failed to decode the DaemonSet: %v", err)
			}
		}
	}
	if ds == nil {
		fail("no DaemonSet rendered")
	}
	spec := ds.Spec.Template.Spec
	var probe, plugin *corev1.Container
	for i := range spec.Containers {
		switch spec.Containers[i].Name {
		case "nodeprobe":
			probe = &spec.Containers[i]
		case "nri-plugin":
			plugin = &spec.Containers[i]
		}
	}
	if probe == nil {
		fail("no nodeprobe container")
	}
	checkToken(spec, probe)
	if !want {
		if plugin != nil || len(spec.Containers) != 1 || slices.ContainsFunc(probe.Args, func(a string) bool { return strings.HasPrefix(a, "--state-dir") }) {
			fail("runtime injection off, yet the pod has %d containers or the probe a state folder", len(spec.Containers))
		}
		for _, v := range spec.Volumes {
			if v.Name == "nri-socket" || v.Name == "state" {
				fail("runtime injection off, yet volume %s", v.Name)
			}
		}
		return
	}
	if plugin == nil {
		fail("runtime injection on, and no nri-plugin container")
	}
	sc := plugin.SecurityContext
	// The stale driver scan (--proc-root) is the one reason to keep a capability:
	// CAP_SYS_PTRACE, for ptrace-read access to other processes' maps.
	scan := slices.Contains(plugin.Args, "--proc-root=/host/proc")
	var wantAdd []corev1.Capability
	if scan {
		wantAdd = []corev1.Capability{"SYS_PTRACE"}
	}
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, wantAdd) || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("nri-plugin securityContext %+v: want uid 0, every capability dropped but %v, no escalation, read-only root, RuntimeDefault seccomp", sc, wantAdd)
	}
	if spec.HostPID {
		fail("the probe's pod shares the host's PID namespace")
	}
	if plugin.ReadinessProbe != nil {
		fail("nri-plugin has a readiness probe: a node without NRI would hold every rollout")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range plugin.VolumeMounts {
		mounts[m.Name] = m
	}
	if m, ok := mounts["nri-socket"]; !ok || !m.ReadOnly || m.MountPath != socketDir {
		fail("nri-plugin socket mount %+v: want %s read-only", m, socketDir)
	}
	wantMounts := 3
	if scan {
		wantMounts = 4
		if m, ok := mounts["host-proc"]; !ok || !m.ReadOnly || m.MountPath != "/host/proc" {
			fail("nri-plugin host /proc mount %+v: want /host/proc read-only", m)
		}
	}
	if m, ok := mounts["state"]; !ok || m.MountPath != "/run/gpu-injector" || len(mounts) != wantMounts {
		fail("nri-plugin mounts %v: want config, state, the socket's folder and, scanning, the host's /proc only", mounts)
	}
	if !slices.Contains(probe.Args, "--state-dir=/run/gpu-injector") {
		fail("the probe writes no state folder: %v", probe.Args)
	}
	for _, v := range spec.Volumes {
		switch v.Name {
		case "nri-socket":
			if v.HostPath == nil || v.HostPath.Path != socketDir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				fail("nri-socket volume %+v", v)
			}
		case "host-proc":
			if !scan || v.HostPath == nil || v.HostPath.Path != "/proc" {
				fail("host-proc volume %+v without the scan, or not the host's /proc", v)
			}
		case "state":
			if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
				fail("state volume %+v: want an emptyDir in memory", v)
			}
		}
	}
	// The plugin's hostPaths are the socket's folder and, scanning, /proc.
	for _, m := range plugin.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.Name != "nri-socket" && (v.Name != "host-proc" || !scan) {
				fail("nri-plugin mounts hostPath %s", v.HostPath.Path)
			}
		}
	}
}

// checkToken: the pod mounts no token into every container; the probe's
// container, the one that calls the API server, mounts one at the place
// client-go reads it from, and no other container mounts it.
func checkToken(spec corev1.PodSpec, probe *corev1.Container) {
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		fail("the probe's pod mounts the service-account token into every container")
	}
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount"
	token := ""
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil && s.ServiceAccountToken.Path == "token" {
				token = v.Name
			}
		}
	}
	if token == "" {
		fail("no projected service-account token volume")
	}
	for _, c := range spec.Containers {
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == token && m.MountPath == dir && m.ReadOnly
		})
		if mounted != (c.Name == probe.Name) || slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == token && m.MountPath != dir || strings.HasPrefix(m.MountPath, "/var/run/secrets") && m.Name != token
		}) {
			fail("container %s mounts %v: want the token at %s read-only in the probe's container alone", c.Name, c.VolumeMounts, dir)
		}
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "chart-test: "+format+"\n", args...)
	os.Exit(1)
}
GO
nri_check() {
  local want=$1 socket_dir=$2
  shift 2
  "${HELM}" template t "${CHART}" --namespace gpu-injector --kube-version 1.36.3 "$@" |
    (cd "${REPO_ROOT}" && go run ./_output/chart-test-nri "${want}" "${socket_dir}")
}
nri_check enabled /var/run/nri
nri_check disabled /var/run/nri --set runtimeInjection.enabled=false
nri_check enabled /var/run/nri --set runtimeInjection.staleDriver.enabled=false
nri_check enabled /run/containerd/nri --set runtimeInjection.nriSocket=/run/containerd/nri/nri.sock
# Refused at render: the plugin without the probe, Runtime delivery without the plugin.
for refused in "--set nodeprobe.enabled=false" "--set runtimeInjection.enabled=false --set config.driverDelivery=Runtime" \
  "--set runtimeInjection.nriSocket=nri.sock" "--set config.driverDelivery=Sometimes"; do
  read -r -a args <<<"${refused}"
  if "${HELM}" template t "${CHART}" --namespace gpu-injector --kube-version 1.36.3 "${args[@]}" >/dev/null 2>&1; then
    log "rendered, want refused: ${refused}"
    exit 1
  fi
done

log "go test ./charts/..."
cd "${REPO_ROOT}"
go test -count=1 ./charts/...
log "ok"
