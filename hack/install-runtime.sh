#!/usr/bin/env bash
# Installs the node runtime the local cluster's kubelet drives: containerd, runc and
# the reference CNI plugins (bridge, host-local, loopback), from Debian packages,
# plus gcc and a static libc, which build the sandbox ("pause") image and the
# test images, and iproute2, with which the launcher removes its bridge; and, for
# the CRI-O runtime (CRI-O itself is built by hack/tools.sh crio), conmon, the
# monitor CRI-O runs beside each container, and skopeo, which loads the test
# images' docker-archive tars into CRI-O's storage. A no-op when they are
# already there. Needs root (apt-get).
set -euo pipefail

log() { printf '[runtime] %s\n' "$*" >&2; }

missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v ctr >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || missing+=(containernetworking-plugins)
command -v gcc >/dev/null || missing+=(gcc)
command -v ip >/dev/null || missing+=(iproute2)
command -v conmon >/dev/null || missing+=(conmon)
command -v skopeo >/dev/null || missing+=(skopeo)
[[ -f "/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/libc.a" ]] || missing+=(libc6-dev)

if [[ ${#missing[@]} -eq 0 ]]; then
  log "containerd $(containerd --version | awk '{print $3}'), runc, CNI plugins, gcc, iproute2, conmon and skopeo already installed"
  exit 0
fi

# Unique package names, in order.
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++')

if [[ ${EUID} -ne 0 ]]; then
  log "error: missing ${pkgs[*]}; run as root or: sudo apt-get install -y ${pkgs[*]}"
  exit 1
fi
command -v apt-get >/dev/null || { log "error: no apt-get; install ${pkgs[*]} by hand"; exit 1; }

export DEBIAN_FRONTEND=noninteractive
# An image with empty package lists cannot install anything; refresh them once.
if ! apt-cache show "${pkgs[0]}" >/dev/null 2>&1; then
  log "refreshing package lists (apt-get update)..."
  apt-get update -qq
fi
log "installing ${pkgs[*]} (apt-get install)..."
if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; then
  # Stale package lists name versions the mirror no longer has (a security
  # update replaced them): refresh and try once more.
  log "install failed; refreshing package lists (apt-get update) and retrying..."
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi
# The package starts a system containerd where an init system runs; the cluster does
# not use it (it runs its own containerd on a private socket), so leave it be.
log "installed: containerd $(containerd --version | awk '{print $3}'), $(runc --version | head -1)"
