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

# Each mode: a name, then helm arguments. The chart refuses a Kubernetes below its
# floor (kubeVersion >=1.33.0-0) in helm template and install, though not in helm lint,
# so no mode names one; the Go tests check that refusal, the policy and its CEL.
modes=(
  "defaults (1.36)|--kube-version 1.36.3"
  "defaults (1.33, the floor: no DRA rules)|--kube-version 1.33.13"
  "cert-manager|--kube-version 1.36.3 --set certManager.enabled=true"
  "cert-manager with a ClusterIssuer|--kube-version 1.36.3 --set certManager.enabled=true --set certManager.issuerRef.name=ca --set certManager.issuerRef.kind=ClusterIssuer"
  "out-of-cluster webhook url|--kube-version 1.36.3 --set webhook.url=https://127.0.0.1:9443 --set webhook.caBundle=Zm9v --set webhook.enabled=false"
  "privileged probe, one replica|--kube-version 1.36.3 --set nodeprobe.privileged=true --set webhook.replicas=1"
  "probe disabled|--kube-version 1.36.3 --set nodeprobe.enabled=false"
  "an added allowlist entry|--kube-version 1.36.3 --set config.hostPaths.extraAllowlist[0].path=/srv/gpu"
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

log "go test ./charts/..."
cd "${REPO_ROOT}"
go test -count=1 ./charts/...
log "ok"
