#!/usr/bin/env bash
# Tests the chart's monitoring objects (templates/servicemonitor.yaml, podmonitor.yaml,
# prometheusrule.yaml, dashboard-configmap.yaml):
#
#   hack/monitoring-test.sh
#
# - with the monitoring values on but no prometheus-operator API, the chart renders no
#   monitoring.coreos.com object (a cluster without the operator is never broken);
# - with the API, it renders the ServiceMonitor, its metrics Service, the PodMonitor
#   and the PrometheusRule, and helm lint --strict passes;
# - the PrometheusRule's groups pass `promtool check rules`, and `promtool test rules`
#   runs monitoring/rules-test.yaml on them: each alert fires on its failing series
#   and stays silent on a healthy one;
# - the dashboard's queries parse as PromQL (promtool, through go test), and the
#   dashboard and the rules name only metrics the code defines or the API server exports
#   (go test ./monitoring/, which `go test ./...` runs too, without promtool).
#
# helm and promtool come from ${HELM} and ${PROMTOOL}, or hack/tools.sh's cache, built
# there when missing (promtool takes a few minutes the first time).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.sh
source "${REPO_ROOT}/hack/versions.sh"
CACHE="${GPU_INJECTOR_CACHE_DIR}"
CHART="${REPO_ROOT}/charts/gpu-injector"

log() { printf '[monitoring-test] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

if [[ -z "${HELM:-}" ]]; then
  HELM="${CACHE}/helm-${HELM_VERSION}/helm"
  [[ -x "${HELM}" ]] || "${REPO_ROOT}/hack/tools.sh" helm
fi
if [[ -z "${PROMTOOL:-}" ]]; then
  # tools.sh names the binary in its last line, built or cached; the version is its
  # business alone.
  out="$("${REPO_ROOT}/hack/tools.sh" promtool 2>&1)" || { printf '%s\n' "${out}" >&2; die "failed to build promtool"; }
  printf '%s\n' "${out}" >&2
  PROMTOOL="$(printf '%s\n' "${out}" | sed -n 's/^\[tools\] promtool .*: cached (\(.*\))$/\1/p; s/^\[tools\] promtool .*: built in .* -> \(.*\)$/\1/p' | tail -n 1)"
  [[ -x "${PROMTOOL}" ]] || die "hack/tools.sh promtool named no promtool binary"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

on=(--set monitoring.serviceMonitor.enabled=true --set monitoring.podMonitor.enabled=true
  --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true)
apis=(--api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PodMonitor
  --api-versions monitoring.coreos.com/v1/PrometheusRule)
render() { "${HELM}" template gpu-injector "${CHART}" --namespace gpu-injector --kube-version 1.36.3 "$@"; }

log "monitoring on, no prometheus-operator API: no monitoring.coreos.com object"
render "${on[@]}" >"${tmp}/without.yaml"
if grep -q 'monitoring.coreos.com' "${tmp}/without.yaml"; then
  die "the chart renders prometheus-operator objects on a cluster that does not serve their API"
fi
grep -q 'grafana_dashboard: "1"' "${tmp}/without.yaml" || die "monitoring.dashboard.enabled renders no dashboard ConfigMap"

log "monitoring off (the defaults), with the API: nothing"
render "${apis[@]}" >"${tmp}/off.yaml"
if grep -q 'monitoring.coreos.com\|grafana_dashboard' "${tmp}/off.yaml"; then
  die "the defaults render monitoring objects"
fi

log "monitoring on, with the API: every object, and helm lint --strict"
render "${on[@]}" "${apis[@]}" >"${tmp}/with.yaml"
for kind in ServiceMonitor PodMonitor PrometheusRule; do
  grep -q "^kind: ${kind}$" "${tmp}/with.yaml" || die "no ${kind} rendered"
done
grep -q '^  name: gpu-injector-webhook-metrics$' "${tmp}/with.yaml" || die "no webhook metrics Service rendered"
"${HELM}" lint --strict "${CHART}" --kube-version 1.36.3 "${on[@]}" >/dev/null

log "promtool check rules and test rules (${PROMTOOL})"
render "${on[@]}" "${apis[@]}" --show-only templates/prometheusrule.yaml >"${tmp}/prometheusrule.yaml"
# The rule file is the PrometheusRule's spec: every line after "spec:", dedented.
sed -n '/^spec:$/,$p' "${tmp}/prometheusrule.yaml" | tail -n +2 | sed 's/^  //' >"${tmp}/rules.yaml"
"${PROMTOOL}" check rules "${tmp}/rules.yaml"
cp "${REPO_ROOT}/monitoring/rules-test.yaml" "${tmp}/rules-test.yaml"
"${PROMTOOL}" test rules "${tmp}/rules-test.yaml"

log "the dashboard's queries as PromQL, its lint, the metric names (go test ./monitoring/)"
(cd "${REPO_ROOT}" && PROMTOOL="${PROMTOOL}" go test -count=1 ./monitoring/)

log "PASS"
