#!/usr/bin/env bash
# Builds a release of gpu-injector into _output/release/ (docs/release.md):
#
#   gpu-injector-<v>.tgz                   the chart, version and appVersion <v>, its
#                                          default image <repository>:<v>
#   gpu-injector-image-<v>.oci.tar         the image index (linux/amd64, linux/arm64) as
#                                          a tar of an OCI image layout; signed, it also
#                                          holds the index's cosign signature
#   gpu-injector-image-<v>.digest          the index's digest, for pinning
#   gpu-injector-<v>.sbom.cdx.json         CycloneDX SBOM of the binary's Go modules
#                                          (cyclonedx-gomod app)
#   gpu-injector-<v>-<os>-<arch>.tar.gz    the command line (status, mutate, config, ...)
#                                          for linux and darwin, amd64 and arm64, built
#                                          without cgo; also kubectl's plugin
#   gpu-injector.yaml                      krew's plugin manifest for those archives
#   SHA256SUMS                             sha256sum of the above
#   gpu-injector-<v>.tgz.sig, SHA256SUMS.sig
#                                          cosign signatures (with a key)
#
#   hack/release.sh [--push REGISTRY] [--plain-http] [--out DIR] [--key REF]
#                   [--platforms LIST] [--skip-image] [--skip-sbom] VERSION
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
# --key REF (default $COSIGN_KEY) signs the image index, the chart and SHA256SUMS with
# a cosign key: a file or env://NAME, its password in $COSIGN_PASSWORD (hack/sign);
# with --push the image's signature is pushed too. Without a key the release is
# unsigned, and the script says so. --platforms (default
# linux/amd64,linux/arm64,darwin/amd64,darwin/arm64; empty skips them) picks the
# command line's archives; RELEASE_URL (default the GitHub release of v<v>) is where
# the krew manifest says they are downloaded from.
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH's (default: the last commit's
# time), so the same commit gives the same files and the same image digest; only the
# signatures (ECDSA) differ from one signing to the next.
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
key="${COSIGN_KEY:-}"
platforms="linux/amd64,linux/arm64,darwin/amd64,darwin/arm64"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --push) push="${2:?--push needs a registry}"; shift 2 ;;
    --plain-http) plain_http=1; shift ;;
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --skip-image) skip_image=1; shift ;;
    --skip-sbom) skip_sbom=1; shift ;;
    --key) key="${2:?--key needs a key file or env://NAME}"; shift 2 ;;
    --platforms) platforms="${2?--platforms needs a list}"; shift 2 ;;
    -h|--help) sed -n '2,45p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
RELEASE_URL="${RELEASE_URL:-https://github.com/gpu-injector/gpu-injector/releases/download/v${version}}"
RELEASE_URL="${RELEASE_URL%/}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

if [[ -n ${key} ]]; then
  # The key is checked before anything is built: a wrong password fails in seconds.
  sign_dir="$(mktemp -d)"
  trap 'rm -rf "${sign_dir}"' EXIT
  sign="${sign_dir}/sign"
  go build -o "${sign}" ./hack/sign
  pub="$("${sign}" public-key -key "${key}")" || die "cannot read the signing key ${key} (password: \$COSIGN_PASSWORD)"
  # A committed cosign.pub is the key users verify with: a release signed with
  # another would fail for every one of them.
  if [[ -f cosign.pub ]] && [[ ${pub} != "$(cat cosign.pub)" ]]; then
    die "${key} is not the key of cosign.pub"
  fi
else
  log "UNSIGNED: no --key or \$COSIGN_KEY; this release has no signatures and users cannot verify it (docs/release.md)"
fi

hack/tools.sh helm
HELM="${GPU_INJECTOR_CACHE_DIR}/helm-${HELM_VERSION}/helm"
# helm's registry logins and cache stay the user's; nothing else is written there.
start=${SECONDS}
rm -rf "${out}"
mkdir -p "${out}"
work="$(mktemp -d)"
trap 'rm -rf "${work}" ${sign_dir:+"${sign_dir}"}' EXIT

# archives LIST builds the command line for each os/arch of LIST without cgo (NVML,
# which needs it, is for the node agent in the image), tars each binary alone, and
# writes krew's manifest for them.
archives() {
  local list="$1" p goos goarch name bin
  local -a entries=()
  for p in ${list//,/ }; do
    goos="${p%/*}" goarch="${p#*/}"
    [[ ${goos} == linux || ${goos} == darwin ]] && [[ ${goarch} == amd64 || ${goarch} == arm64 ]] ||
      die "--platforms: ${p} is not linux or darwin, amd64 or arm64"
    name="gpu-injector-${version}-${goos}-${goarch}"
    log "command line ${goos}/${goarch}: ${name}.tar.gz"
    bin="${work}/${name}"
    mkdir -p "${bin}"
    CGO_ENABLED=0 GOOS="${goos}" GOARCH="${goarch}" go build -trimpath \
      -ldflags "-s -w -X github.com/gpu-injector/gpu-injector/version.Version=v${version}" -o "${bin}/gpu-injector" .
    tar -C "${bin}" --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
      --format=ustar -cf - gpu-injector | gzip -n -9 >"${out}/${name}.tar.gz"
    entries+=("  - selector:
      matchLabels:
        os: ${goos}
        arch: ${goarch}
    uri: ${RELEASE_URL}/${name}.tar.gz
    sha256: $(sha256sum "${out}/${name}.tar.gz" | cut -d' ' -f1)
    files:
    - from: gpu-injector
      to: .
    bin: gpu-injector")
  done
  # kubectl finds the plugin "gpu-injector" as kubectl-gpu_injector, the link krew
  # makes to bin, and the binary run under that name is `gpu-injector status`.
  {
    cat <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: gpu-injector
spec:
  version: v${version}
  homepage: https://github.com/gpu-injector/gpu-injector
  shortDescription: What gpu-injector does with your GPU pods
  description: |
    gpu-injector injects each node's NVIDIA driver into GPU pods. This plugin is its
    command line: "kubectl gpu-injector status" says what the webhook, the node
    probes and the NRI plugins do in the cluster, and exits 3 when something needs
    attention.
  platforms:
EOF
    printf '%s\n' "${entries[@]}"
  } >"${out}/gpu-injector.yaml"
}

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
  if [[ -n ${key} ]]; then
    sign_args=(image -key "${key}" -repository "${IMAGE_REPOSITORY}")
    [[ -z ${push} ]] || sign_args+=(-push)
    [[ -z ${plain_http} ]] || sign_args+=(-insecure)
    "${sign}" "${sign_args[@]}" "${out}/gpu-injector-image-${version}.oci.tar"
  fi
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

if [[ -n ${platforms} ]]; then
  archives "${platforms}"
fi

if [[ -n ${key} ]]; then
  "${sign}" blob -key "${key}" "${chart}"
fi
(cd "${out}" && find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name SHA256SUMS.sig -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
if [[ -n ${key} ]]; then
  "${sign}" blob -key "${key}" "${out}/SHA256SUMS"
  # What users check, checked here with the public half: every signature of the release.
  printf '%s\n' "${pub}" >"${work}/cosign.pub"
  verify=("${chart}" "${out}/SHA256SUMS")
  [[ -n ${skip_image} ]] || verify+=("${out}/gpu-injector-image-${version}.oci.tar")
  "${sign}" verify -key "${work}/cosign.pub" -repository "${IMAGE_REPOSITORY}" "${verify[@]}"
fi
log "wrote ${out} in $((SECONDS - start))s:"
(cd "${out}" && ls -l --block-size=K | tail -n +2 >&2)
