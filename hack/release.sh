#!/usr/bin/env bash
# Builds a release of gpu-injector into _output/release/ (docs/release.md):
#
#   gpu-injector-<v>.tgz                   the chart, version and appVersion <v>, its
#                                          default image <repository>:<v>
#   gpu-injector-image-<v>.oci.tar         the image index (linux/amd64, linux/arm64) as
#                                          a tar of an OCI image layout
#   gpu-injector-image-<v>.digest          the index's digest, for pinning
#   gpu-injector-<v>.sbom.cdx.json         CycloneDX SBOM of the binary's Go modules
#                                          (cyclonedx-gomod app)
#   SHA256SUMS                             sha256sum of the above
#
#   hack/release.sh [--push REGISTRY] [--plain-http] [--out DIR] [--skip-image] [--skip-sbom] VERSION
#   make release VERSION=x.y.z
#
# --push REGISTRY (a host and optional path, e.g. ghcr.io/gpu-injector or
# registry.example.com:5000/mirror) also pushes the image index to
# REGISTRY/gpu-injector:<v> (go-containerregistry, credentials from
# ~/.docker/config.json) and the chart to oci://REGISTRY/charts (helm push, credentials
# from `helm registry login`); the packaged chart's default image repository is then
# REGISTRY/gpu-injector. Without --push it is IMAGE_REPOSITORY
# (default ghcr.io/gpu-injector/gpu-injector). --plain-http speaks HTTP to the
# registry (loopback and private addresses always do for the image).
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH's (default: the last commit's
# time), so the same commit gives the same files and the same image digest.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"
# shellcheck source=versions.sh
source hack/versions.sh

log() { printf '[release] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

CYCLONEDX_GOMOD="github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0"

out="_output/release"
push="" plain_http="" skip_image="" skip_sbom="" version=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --push) push="${2:?--push needs a registry}"; shift 2 ;;
    --plain-http) plain_http=1; shift ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --skip-image) skip_image=1; shift ;;
    --skip-sbom) skip_sbom=1; shift ;;
    -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) die "unknown flag $1 (see --help)" ;;
    *) [[ -z ${version} ]] || die "one VERSION, got ${version} and $1"; version="$1"; shift ;;
  esac
done
version="${version#v}"
# SemVer 2, as helm requires of a chart version; no build metadata (+...), which OCI
# tags cannot carry.
[[ ${version} =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION must be x.y.z or x.y.z-pre (got '${version}'): make release VERSION=0.2.0"
if [[ -n ${push} ]]; then
  push="${push%/}"
  IMAGE_REPOSITORY="${push}/gpu-injector"
fi
IMAGE_REPOSITORY="${IMAGE_REPOSITORY:-ghcr.io/gpu-injector/gpu-injector}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

hack/tools.sh helm
HELM="${GPU_INJECTOR_CACHE_DIR}/helm-${HELM_VERSION}/helm"
# helm's registry logins and cache stay the user's; nothing else is written there.
start=${SECONDS}
rm -rf "${out}"
mkdir -p "${out}"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

# The chart: a copy whose default image repository is the release's, packaged with the
# release's version as both version and appVersion (the image tag's default).
log "chart ${version} (image ${IMAGE_REPOSITORY}:${version})"
cp -r charts/gpu-injector "${work}/gpu-injector"
awk -v repo="${IMAGE_REPOSITORY}" '
  /^image:/ { in_image = 1 }
  in_image && /^  repository:/ { sub(/repository: .*/, "repository: " repo); in_image = 0 }
  { print }
' charts/gpu-injector/values.yaml >"${work}/gpu-injector/values.yaml"
"${HELM}" package "${work}/gpu-injector" --version "${version}" --app-version "${version}" --destination "${out}" >&2
chart="${out}/gpu-injector-${version}.tgz"
[[ -f ${chart} ]] || die "helm package did not write ${chart}"
# helm stamps each entry with the packaging time: the same files again, sorted, stamped
# SOURCE_DATE_EPOCH, without owners or gzip's name and time, so one commit gives one chart.
mkdir "${work}/unpacked"
tar -xzf "${chart}" -C "${work}/unpacked"
tar -C "${work}/unpacked" --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
  --format=ustar -cf - gpu-injector | gzip -n -9 >"${chart}"

# The chart must agree with itself: version, appVersion and every image it renders.
shown="$("${HELM}" show chart "${chart}")"
grep -qx "version: ${version}" <<<"${shown}" || die "${chart}: version is not ${version}"
grep -qx "appVersion: ${version}" <<<"${shown}" || die "${chart}: appVersion is not ${version}"
images="$("${HELM}" template gpu-injector "${chart}" --namespace gpu-injector --kube-version "${KUBERNETES_VERSION#v}" | sed -n 's/^ *image: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' | sort -u)"
[[ ${images} == "${IMAGE_REPOSITORY}:${version}" ]] ||
  die "${chart} renders images '${images//$'\n'/ }', want ${IMAGE_REPOSITORY}:${version}"

if [[ -z ${skip_image} ]]; then
  log "image index ${IMAGE_REPOSITORY}:${version} (linux/amd64, linux/arm64; SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH})"
  image_args=(-o= -oci "${out}/gpu-injector-image-${version}.oci.tar" -digest-file "${out}/gpu-injector-image-${version}.digest"
    -ref "${IMAGE_REPOSITORY}:${version}" -version "v${version}")
  if [[ -n ${push} ]]; then
    image_args+=(-push "${IMAGE_REPOSITORY}:${version}")
    [[ -z ${plain_http} ]] || image_args+=(-insecure)
  fi
  go run ./hack/image "${image_args[@]}"
fi

if [[ -z ${skip_sbom} ]]; then
  log "SBOM of the binary's Go modules (${CYCLONEDX_GOMOD})"
  # The modules linked into the binary of `go build .`, with their licenses; no serial
  # number or timestamp, so the same commit gives the same file.
  GOFLAGS=-mod=mod go run "${CYCLONEDX_GOMOD}" app -json -licenses -noserial -notimestamp \
    -main . -output "${out}/gpu-injector-${version}.sbom.cdx.json" .
fi

if [[ -n ${push} ]]; then
  log "helm push ${chart} oci://${push}/charts"
  "${HELM}" push "${chart}" "oci://${push}/charts" ${plain_http:+--plain-http} >&2
fi

(cd "${out}" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
log "wrote ${out} in $((SECONDS - start))s:"
(cd "${out}" && ls -l --block-size=K | tail -n +2 >&2)
