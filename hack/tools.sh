#!/usr/bin/env bash
# Builds and caches, by version, the binaries the local cluster needs: etcd, the
# Kubernetes components, helm, NVIDIA's device plugin and container toolkit runtime, the NRI runtime
# (containerd 2.x with its runc shim and ctr, and runc) and CRI-O with its pinns.
# Nothing is downloaded but
# Go modules (and, for the runtime's cgo builds, Debian's headers when missing):
# no Docker, no release tarballs, so the same script works wherever Go and its
# module proxy do.
#
#   hack/tools.sh [etcd|kubernetes|helm|nvidia-device-plugin|nvidia-container-toolkit|containerd|runc|crio|promtool|registry|all]...  (default: all)
#
# Several tools build two at a time (TOOLS_JOBS=1 builds one after the other).
#
# Versions come from e2e/cluster/versions.env (hack/versions.sh); KUBERNETES_VERSION=v1.X.Y
# (and the others) in the environment win. Each tool is built into
# ${GPU_INJECTOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/gpu-injector}/<tool>-<version>-<go version>/,
# outside the clone, so a fresh clone on a machine that built it once reuses it, as Go's
# own build cache does; <tool>-<version> is a link to the folder of the Go in use, which
# is where the e2e suite and the demo look. A folder with a .complete stamp is "cached"
# and returns at once. Another Go builds a folder of its own and moves the link: no
# binary another clone may be running is ever replaced.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.sh
source "${REPO_ROOT}/hack/versions.sh"
KUBERNETES_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

CACHE="${GPU_INJECTOR_CACHE_DIR}"
mkdir -p "${CACHE}"
CACHE="$(cd "${CACHE}" && pwd)"

# Static binaries: nothing here needs cgo (upstream release builds are static too),
# and a static kubelet does not depend on the host's glibc.
export CGO_ENABLED=0

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null || die "go is not on PATH"

# with_lock DIR CMD...: a second run of this script (another terminal, a parallel
# test) waits for the first instead of racing it on the same folder.
with_lock() {
  local dir="$1"; shift
  mkdir -p "${CACHE}/.locks"
  (
    flock 9
    "$@"
  ) 9>"${CACHE}/.locks/$(basename "${dir}").lock"
}

# The Go that builds: asked outside any module, where the builds run, so that no
# go.mod's toolchain line picks another one.
GO_VERSION="$(cd "${CACHE}" && go env GOVERSION)"

# tool_dir NAME VERSION: the folder this Go builds NAME at VERSION into.
tool_dir() { echo "${CACHE}/$1-$2-${GO_VERSION}"; }

is_cached() {
  local dir="$1"; shift
  [[ -f "${dir}/.complete" ]] || return 1
  local b
  for b in "$@"; do [[ -x "${dir}/${b}" ]] || return 1; done
}

# mark_built DIR: stamps DIR done and points its <tool>-<version> link at it,
# atomically (a link renamed over the old one).
mark_built() {
  local dir="$1" link="${1%-"${GO_VERSION}"}"
  touch "${dir}/.complete"
  if [[ -d ${link} && ! -L ${link} ]]; then
    # A folder of this script's earlier layout: kept aside, never deleted under a user.
    mv "${link}" "${link}.unversioned.$$"
  fi
  ln -sfn "$(basename "${dir}")" "${link}.link.$$"
  mv -T "${link}.link.$$" "${link}"
}

# elapsed SECONDS_START: human duration since then.
elapsed() { local s=$(( SECONDS - $1 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

build_etcd() {
  local dir; dir="$(tool_dir etcd "${ETCD_VERSION}")"
  if is_cached "${dir}" etcd; then mark_built "${dir}"; log "etcd ${ETCD_VERSION}: cached (${dir}/etcd)"; return; fi
  with_lock "${dir}" build_etcd_locked "${dir}"
}

build_etcd_locked() {
  local dir="$1"
  if is_cached "${dir}" etcd; then mark_built "${dir}"; log "etcd ${ETCD_VERSION}: cached (${dir}/etcd)"; return; fi
  local work start=${SECONDS}
  work="$(mktemp -d)"
  trap 'rm -rf "${work}"' RETURN
  log "etcd ${ETCD_VERSION}: building (first time, ~2 min)..."
  (
    cd "${work}"
    go mod init gpu-injector.local/etcd-tools >/dev/null 2>&1
    cat > tools.go <<GO
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    go mod tidy >/dev/null 2>&1 || go mod tidy
    mkdir -p "${dir}"
    go build -trimpath -o "${dir}/.etcd.tmp" go.etcd.io/etcd/server/v3
  )
  mv -f "${dir}/.etcd.tmp" "${dir}/etcd"
  # Whole output: `| head -1` would SIGPIPE etcd and fail the script under pipefail.
  "${dir}/etcd" --version >&2
  mark_built "${dir}"
  log "etcd ${ETCD_VERSION}: built in $(elapsed "${start}") -> ${dir}/etcd"
}

# staging_modules prints the k8s.io modules that k8s.io/kubernetes' own go.mod
# replaces with ./staging/...: exactly those must be pinned to their published
# v0.X.Y twins, or the wrapper module cannot resolve them. Read from the module
# itself rather than a list here that goes stale with each minor release.
staging_modules() {
  local modfile="$1"
  awk '/=> \.\/staging\/src\// { print $1 }' "${modfile}" | sort -u
}

build_kubernetes() {
  local dir; dir="$(tool_dir kubernetes "${KUBERNETES_VERSION}")"
  if is_cached "${dir}" kube "${KUBERNETES_BINARIES[@]}"; then
    mark_built "${dir}"; log "kubernetes ${KUBERNETES_VERSION}: cached (${dir})"; return
  fi
  with_lock "${dir}" build_kubernetes_locked "${dir}"
}

build_kubernetes_locked() {
  local dir="$1"
  if is_cached "${dir}" kube "${KUBERNETES_BINARIES[@]}"; then
    mark_built "${dir}"; log "kubernetes ${KUBERNETES_VERSION}: cached (${dir})"; return
  fi
  local work start=${SECONDS}
  work="$(mktemp -d)"
  trap 'rm -rf "${work}"' RETURN
  local staging_version="v0.${KUBERNETES_VERSION#v1.}"
  local minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  log "kubernetes ${KUBERNETES_VERSION}: resolving k8s.io/kubernetes and its staging modules..."
  (
    cd "${work}"
    go mod init gpu-injector.local/kubernetes-tools >/dev/null 2>&1
    go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" > kubernetes.json
    local gomod
    gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' kubernetes.json)"
    [[ -f "${gomod}" ]] || die "cannot find go.mod of k8s.io/kubernetes@${KUBERNETES_VERSION}"
    local mods
    mods="$(staging_modules "${gomod}")"
    [[ -n "${mods}" ]] || die "no staging replaces found in ${gomod}"
    log "kubernetes ${KUBERNETES_VERSION}: pinning $(wc -l <<<"${mods}") staging modules to ${staging_version}"
    {
      echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
      echo "replace ("
      local m
      for m in ${mods}; do echo "	${m} => ${m} ${staging_version}"; done
      echo ")"
    } >> go.mod
    # One multicall binary (hack/gpu/kube-multicall.go) linked under each
    # component's name: the five share most of their code, so one link of
    # 137 MB replaces five of 417 MB in all, and the cold build is one compile.
    sed '/^\/\/go:build ignore/d' "${REPO_ROOT}/hack/gpu/kube-multicall.go" > main.go
    go mod tidy >tidy.log 2>&1 || { cat tidy.log >&2; die "go mod tidy failed"; }
    mkdir -p "${dir}"
    local ldflags="-s -w"
    ldflags+=" -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION}"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
    ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
    ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
    ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
    log "building kube (${KUBERNETES_BINARIES[*]} in one binary; first time, ~6 min on 2 cores)..."
    go build -trimpath -ldflags "${ldflags}" -o "${dir}/.kube.tmp" .
    mv -f "${dir}/.kube.tmp" "${dir}/kube"
    local b
    for b in "${KUBERNETES_BINARIES[@]}"; do ln -sfn kube "${dir}/${b}"; done
  )
  "${dir}/kube-apiserver" --version >&2
  mark_built "${dir}"
  log "kubernetes ${KUBERNETES_VERSION}: built in $(elapsed "${start}") -> ${dir}"
}

build_helm() {
  local dir; dir="$(tool_dir helm "${HELM_VERSION}")"
  if is_cached "${dir}" helm; then mark_built "${dir}"; log "helm ${HELM_VERSION}: cached (${dir}/helm)"; return; fi
  with_lock "${dir}" build_helm_locked "${dir}"
}

build_helm_locked() {
  local dir="$1"
  if is_cached "${dir}" helm; then mark_built "${dir}"; log "helm ${HELM_VERSION}: cached (${dir}/helm)"; return; fi
  local tmp start=${SECONDS}
  tmp="$(mktemp -d "${CACHE}/.helm.XXXXXX")"
  trap 'rm -rf "${tmp}"' RETURN
  log "helm ${HELM_VERSION}: building (first time, ~2 min)..."
  # helm's own version stamp: without it `helm version` reports v3.x-dev-ish output
  # and chart kubeVersion checks misbehave. The Kubernetes version helm assumes
  # without a cluster (helm template/lint) is stamped too, as helm's release
  # builds do (1.31 for helm 3.16); unstamped it is 1.20, below the chart's floor.
  local k8s="helm.sh/helm/v3/pkg/chartutil" lint="helm.sh/helm/v3/pkg/lint/rules"
  GOBIN="${tmp}" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} -X ${k8s}.k8sVersionMajor=1 -X ${k8s}.k8sVersionMinor=31 -X ${lint}.k8sVersionMajor=1 -X ${lint}.k8sVersionMinor=31" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  mkdir -p "${dir}"
  mv -f "${tmp}/helm" "${dir}/helm"
  "${dir}/helm" version --short >&2
  mark_built "${dir}"
  log "helm ${HELM_VERSION}: built in $(elapsed "${start}") -> ${dir}/helm"
}

# NVIDIA's k8s-device-plugin, as its release image carries it: the e2e suite and
# the GPU machine's cluster run it as a DaemonSet pod, as users do. `go install
# module@version` asks the proxy for the module's version list (for deprecation
# notices), which it refuses for this module, hence build_module_command. Its
# vendor folder is used (GOFLAGS empty). cgo: go-nvml loads libnvidia-ml with dlopen.
build_nvidia_device_plugin() {
  build_module_command nvidia-device-plugin "${NVIDIA_DEVICE_PLUGIN_VERSION}" github.com/NVIDIA/k8s-device-plugin \
    cmd/nvidia-device-plugin "-X github.com/NVIDIA/k8s-device-plugin/internal/info.version=${NVIDIA_DEVICE_PLUGIN_VERSION}" \
    "~1 min" GOFLAGS= CGO_ENABLED=1
}

# NVIDIA's container toolkit's runtime, nvidia-container-runtime: the OCI runtime
# that wraps runc and, in its cdi mode, applies the CDI specs of the devices a
# container asks for (NVIDIA_VISIBLE_DEVICES) itself, without libnvidia-container.
# The NRI suite's toolkit node runs it as containerd's default runtime, as
# `nvidia-ctk runtime configure` sets it on EKS's GPU AMIs. cgo: go-nvml loads
# libnvidia-ml with dlopen; its deprecated NVML calls warn at every build.
build_nvidia_container_toolkit() {
  local pkg=github.com/NVIDIA/nvidia-container-toolkit
  build_module_command nvidia-container-runtime "${NVIDIA_CONTAINER_TOOLKIT_VERSION}" "${pkg}" \
    cmd/nvidia-container-runtime "-X ${pkg}/internal/info.version=${NVIDIA_CONTAINER_TOOLKIT_VERSION#v}" \
    "~1 min" CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
}

# build_module_command TOOL VERSION MODULE CMD LDFLAGS DURATION [VAR=VALUE...]: the
# command CMD of MODULE@VERSION, built in the module's own folder of the module
# cache (its go.mod, its replace directives or vendor folder, none of ours) and
# cached like the other tools as TOOL. The VARs are the build's environment, after
# GOWORK=off (a go.work above the cache must not take it over) and GOFLAGS=-mod=mod.
build_module_command() {
  local tool=$1 version=$2
  local dir; dir="$(tool_dir "${tool}" "${version}")"
  if is_cached "${dir}" "${tool}"; then mark_built "${dir}"; log "${tool} ${version}: cached (${dir}/${tool})"; return; fi
  with_lock "${dir}" build_module_command_locked "${dir}" "$@"
}

build_module_command_locked() {
  local dir=$1 tool=$2 version=$3 module=$4 cmd=$5 ldflags=$6 duration=$7
  shift 7
  if is_cached "${dir}" "${tool}"; then mark_built "${dir}"; log "${tool} ${version}: cached (${dir}/${tool})"; return; fi
  local tmp src start=${SECONDS}
  tmp="$(mktemp -d "${CACHE}/.${tool}.XXXXXX")"
  trap 'rm -rf "${tmp}"' RETURN
  log "${tool} ${version}: building from ${module} (first time, ${duration})..."
  src="$(cd "${tmp}" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "${module}@${version}" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d ${src} ]] || die "failed to download ${module}@${version}"
  (cd "${src}" && env GOWORK=off GOFLAGS=-mod=mod "$@" go build -trimpath -ldflags "-s -w ${ldflags}" -o "${tmp}/${tool}" "./${cmd}")
  mkdir -p "${dir}"
  mv -f "${tmp}/${tool}" "${dir}/${tool}"
  mark_built "${dir}"
  log "${tool} ${version}: built in $(elapsed "${start}") -> ${dir}/${tool}"
}

# need_packages PKG...: installs the Debian packages the cgo builds below need
# (headers, libseccomp's static library, pkg-config) when dpkg lacks them, as
# hack/install-runtime.sh installs the runtime: only what is missing, apt-get
# update only when the package lists cannot name them.
need_packages() {
  local missing=() p
  # Not Debian: the build says what it lacks itself.
  command -v dpkg-query >/dev/null || return 0
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${p}")
  done
  [[ ${#missing[@]} -eq 0 ]] && return
  if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null; then
    die "missing Debian packages ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}"
  fi
  # Builds run side by side, and dpkg takes one install at a time.
  with_lock "${CACHE}/apt" install_packages "${missing[@]}"
}

install_packages() {
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache show "$@" >/dev/null 2>&1; then
    log "refreshing package lists (apt-get update)..."
    apt-get update -qq
  fi
  log "installing $* (apt-get install)..."
  if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
    # Stale lists name versions the mirror no longer has: refresh, try once more.
    log "install failed; refreshing package lists (apt-get update) and retrying..."
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  fi
}

# module_dir MODULE VERSION: the module's folder in Go's module cache,
# downloaded when missing. The builds run there, as the module's own CI does,
# so its go.mod and go.sum pick every dependency.
module_dir() {
  local src
  src="$(cd "${CACHE}" && GOFLAGS=-mod=mod go mod download -json "$1@$2" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d ${src} ]] || die "failed to download $1@$2"
  echo "${src}"
}

CONTAINERD_BINARIES=(containerd containerd-shim-runc-v2 ctr)

build_containerd() {
  local dir; dir="$(tool_dir containerd "${CONTAINERD_VERSION}")"
  if is_cached "${dir}" "${CONTAINERD_BINARIES[@]}"; then mark_built "${dir}"; log "containerd ${CONTAINERD_VERSION}: cached (${dir})"; return; fi
  with_lock "${dir}" build_containerd_locked "${dir}"
}

# containerd 2.x for the local cluster's NRI runtime (cluster.RuntimeNRI):
# Debian bookworm's containerd 1.6 has no NRI, which 2.0 turned on by default.
# Built as containerd's Makefile does with STATIC=1 (the binaries then run on
# any Linux, the GPU machines' included): containerd and ctr with cgo and
# static_build, the shim without cgo and without gRPC. no_btrfs unless btrfs's
# headers are there, as the Makefile's BUILDTAGS suggest for hosts without them.
# The version is stamped without its v: the kubelet shows the CRI's
# RuntimeVersion as is, and containerd://2.4.2 is how nodes name a release.
build_containerd_locked() {
  local dir="$1"
  if is_cached "${dir}" "${CONTAINERD_BINARIES[@]}"; then mark_built "${dir}"; log "containerd ${CONTAINERD_VERSION}: cached (${dir})"; return; fi
  need_packages gcc libc6-dev linux-libc-dev
  local tmp src start=${SECONDS} tags="urfave_cli_no_docs osusergo netgo static_build"
  [[ -f /usr/include/btrfs/ioctl.h ]] || tags+=" no_btrfs"
  tmp="$(mktemp -d "${CACHE}/.containerd.XXXXXX")"
  trap 'rm -rf "${tmp}"' RETURN
  log "containerd ${CONTAINERD_VERSION}: downloading github.com/containerd/containerd/v2..."
  src="$(module_dir github.com/containerd/containerd/v2 "${CONTAINERD_VERSION}")"
  local pkg=github.com/containerd/containerd/v2
  local stamp="-X ${pkg}/version.Version=${CONTAINERD_VERSION#v} -X ${pkg}/version.Package=${pkg}"
  local b
  for b in containerd ctr; do
    local bstart=${SECONDS}
    log "building ${b} ${CONTAINERD_VERSION} (cgo, static, tags: ${tags}; first time, ~3 min on 2 cores)..."
    (cd "${src}" && GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -tags "${tags}" \
      -ldflags "-s -w ${stamp} -extldflags -static" -o "${tmp}/${b}" "./cmd/${b}")
    log "${b}: built in $(elapsed "${bstart}")"
  done
  local bstart=${SECONDS}
  log "building containerd-shim-runc-v2 ${CONTAINERD_VERSION} (no cgo, tags: urfave_cli_no_docs no_grpc)..."
  (cd "${src}" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags "urfave_cli_no_docs no_grpc" \
    -ldflags "-s -w ${stamp}" -o "${tmp}/containerd-shim-runc-v2" ./cmd/containerd-shim-runc-v2)
  log "containerd-shim-runc-v2: built in $(elapsed "${bstart}")"
  mkdir -p "${dir}"
  for b in "${CONTAINERD_BINARIES[@]}"; do mv -f "${tmp}/${b}" "${dir}/${b}"; done
  "${dir}/containerd" --version >&2
  mark_built "${dir}"
  log "containerd ${CONTAINERD_VERSION}: built in $(elapsed "${start}") -> ${dir}"
}

build_runc() {
  local dir; dir="$(tool_dir runc "${RUNC_VERSION}")"
  if is_cached "${dir}" runc; then mark_built "${dir}"; log "runc ${RUNC_VERSION}: cached (${dir}/runc)"; return; fi
  with_lock "${dir}" build_runc_locked "${dir}"
}

# runc for the NRI runtime, with seccomp (what every Kubernetes node's runc
# has: pods ask for RuntimeDefault). Static against Debian's libseccomp.a, as
# runc's own release builds are, so it runs where libseccomp is absent. runc
# takes its version from the module's VERSION file.
build_runc_locked() {
  local dir="$1"
  if is_cached "${dir}" runc; then mark_built "${dir}"; log "runc ${RUNC_VERSION}: cached (${dir}/runc)"; return; fi
  need_packages gcc libc6-dev linux-libc-dev pkg-config libseccomp-dev
  local tmp src start=${SECONDS}
  tmp="$(mktemp -d "${CACHE}/.runc.XXXXXX")"
  trap 'rm -rf "${tmp}"' RETURN
  log "runc ${RUNC_VERSION}: downloading github.com/opencontainers/runc..."
  src="$(module_dir github.com/opencontainers/runc "${RUNC_VERSION}")"
  log "building runc ${RUNC_VERSION} (cgo, static, tags: seccomp; first time, ~15 s)..."
  (cd "${src}" && GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -tags "seccomp urfave_cli_no_docs osusergo netgo" \
    -ldflags "-s -w -extldflags -static" -o "${tmp}/runc" .)
  mkdir -p "${dir}"
  mv -f "${tmp}/runc" "${dir}/runc"
  "${dir}/runc" --version >&2
  mark_built "${dir}"
  log "runc ${RUNC_VERSION}: built in $(elapsed "${start}") -> ${dir}/runc"
}

CRIO_BINARIES=(crio pinns)

build_crio() {
  local dir; dir="$(tool_dir crio "${CRIO_VERSION}")"
  if is_cached "${dir}" "${CRIO_BINARIES[@]}"; then mark_built "${dir}"; log "crio ${CRIO_VERSION}: cached (${dir})"; return; fi
  with_lock "${dir}" build_crio_locked "${dir}"
}

# CRI-O for the local cluster's CRI-O runtime (cluster.RuntimeCRIO): Debian
# bookworm packages no CRI-O. Its go.mod has no replace directives: built in
# its own folder of the module cache, as containerd is. The tags are those its Makefile picks on a host
# without gpgme, btrfs, devicemapper, SELinux or AppArmor headers (signatures
# in pure Go, no ostree), plus seccomp against Debian's libseccomp: pods ask
# for RuntimeDefault. Linked dynamically (libseccomp, glibc): it only ever runs
# on the machine that built it. pinns, the small C program with which CRI-O
# makes and pins a pod's namespaces (it has no infra container by default),
# is built from the module's own sources as its Makefile does: static, -Os.
# conmon, the monitor of each container, is Debian's (hack/install-runtime.sh).
build_crio_locked() {
  local dir="$1"
  if is_cached "${dir}" "${CRIO_BINARIES[@]}"; then mark_built "${dir}"; log "crio ${CRIO_VERSION}: cached (${dir})"; return; fi
  need_packages gcc libc6-dev linux-libc-dev pkg-config libseccomp-dev
  local tmp src start=${SECONDS} pkg=github.com/cri-o/cri-o
  local tags="containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper seccomp"
  tmp="$(mktemp -d "${CACHE}/.crio.XXXXXX")"
  trap 'rm -rf "${tmp}"' RETURN
  log "crio ${CRIO_VERSION}: downloading ${pkg}..."
  src="$(module_dir "${pkg}" "${CRIO_VERSION}")"
  log "building crio ${CRIO_VERSION} (cgo, tags: ${tags}; first time, ~6 min on 2 cores)..."
  (cd "${src}" && GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -tags "${tags}" \
    -ldflags "-s -w" -o "${tmp}/crio" ./cmd/crio)
  log "building pinns ${CRIO_VERSION} (gcc, static)..."
  gcc -std=c99 -Os -Wall -Wextra -static -o "${tmp}/pinns" "${src}"/pinns/src/*.c
  strip -s "${tmp}/pinns"
  mkdir -p "${dir}"
  for b in "${CRIO_BINARIES[@]}"; do mv -f "${tmp}/${b}" "${dir}/${b}"; done
  "${dir}/crio" --version >&2
  mark_built "${dir}"
  log "crio ${CRIO_VERSION}: built in $(elapsed "${start}") -> ${dir}"
}

# promtool, Prometheus's rule checker and rule unit test runner: hack/monitoring-test.sh
# runs the chart's alerts through it. Prometheus's Go module numbers its releases
# v0.3MM.P for Prometheus 3.MM.P. Its go.mod has no replace directives, so it builds in
# its own folder of the module cache (build_module_command).
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"

build_promtool() {
  build_module_command promtool "${PROMTOOL_VERSION}" github.com/prometheus/prometheus cmd/promtool "" \
    "~5 min: its service discovery links every cloud's SDK"
}

# The CNCF distribution registry (the `registry` of Docker's registry:3 image): the
# local cluster's private registry, which containerd pulls gpu-injector's image
# from and helm installs its chart from (e2e/cluster/registry.go, which names the
# same version). Its go.mod has no replace directives: built in its own folder of
# the module cache (build_module_command).
REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.0}"

build_registry() {
  local pkg=github.com/distribution/distribution/v3
  build_module_command registry "${REGISTRY_VERSION}" "${pkg}" cmd/registry \
    "-X ${pkg}/version.version=${REGISTRY_VERSION} -X ${pkg}/version.mainpkg=${pkg}" "~2 min"
}

# build_tool NAME: one tool, by its name on the command line.
build_tool() {
  case "$1" in
    etcd) build_etcd ;;
    kubernetes|k8s) build_kubernetes ;;
    helm) build_helm ;;
    nvidia-device-plugin) build_nvidia_device_plugin ;;
    nvidia-container-toolkit) build_nvidia_container_toolkit ;;
    containerd) build_containerd ;;
    runc) build_runc ;;
    crio) build_crio ;;
    promtool) build_promtool ;;
    registry) build_registry ;;
    *) die "unknown tool $1 (want etcd, kubernetes, helm, nvidia-device-plugin, nvidia-container-toolkit, containerd, runc, crio, promtool, registry or all)" ;;
  esac
}

# build_tools NAME...: the tools, TOOLS_JOBS at a time (2 unless set). On two
# cores one build's module downloads, cgo and single-threaded link overlap
# another's compile. Each build's output is printed whole when it ends; a
# failure stops the rest.
build_tools() {
  local jobs="${TOOLS_JOBS:-2}"
  # wait -n -p, which names the build that ended, is bash 5.1's.
  (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501 )) || jobs=1
  if (( $# == 1 || jobs <= 1 )); then
    local t; for t in "$@"; do build_tool "${t}"; done
    return
  fi
  local logs; logs="$(mktemp -d)"
  local -A names=()
  local t pid failed=""
  finish() {
    local done_pid
    if wait -n -p done_pid; then :; else failed="${names[${done_pid}]}"; fi
    cat "${logs}/${names[${done_pid}]}.log" >&2
    unset "names[${done_pid}]"
  }
  for t in "$@"; do
    while (( ${#names[@]} >= jobs )) && [[ -z ${failed} ]]; do finish; done
    [[ -z ${failed} ]] || break
    ( build_tool "${t}" ) >"${logs}/${t}.log" 2>&1 &
    names[$!]="${t}"
  done
  while (( ${#names[@]} > 0 )); do finish; done
  rm -rf "${logs}"
  [[ -z ${failed} ]] || die "building ${failed} failed (its output is above)"
}

main() {
  local targets=("$@") list=() t
  [[ ${#targets[@]} -gt 0 ]] || targets=(all)
  for t in "${targets[@]}"; do
    case "${t}" in
      # Longest first, so that the last to start is a short one.
      all) list+=(kubernetes promtool containerd etcd registry helm nvidia-device-plugin nvidia-container-toolkit runc) ;;
      -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; return ;;
      *) list+=("${t}") ;;
    esac
  done
  # crio among them (hack/test.sh asks for all and crio) goes first: its build is the longest.
  local ordered=() seen=" "
  for t in crio "${list[@]}"; do
    [[ " ${list[*]} " == *" ${t} "* && ${seen} != *" ${t} "* ]] || continue
    ordered+=("${t}"); seen+="${t} "
  done
  build_tools "${ordered[@]}"
}

main "$@"
