#!/usr/bin/env bash
# gpu-cluster.sh: a one-node Kubernetes on a GPU machine with gpu-injector
# installed by Helm, and the classic GPU workloads run on it (docs/real-gpu.md).
#
#   hack/gpu-cluster.sh --build [DIR]   here, with Go and apt: build the payload
#                          into DIR (default .device/gpu-cluster): part1/ (the
#                          Kubernetes components as one binary, etcd, helm) and
#                          part2/ (containerd, runc, CNI plugins, cluster-up, the
#                          gpu-injector image, NVIDIA's device plugin image,
#                          standin-server) and part3/ (the NRI runtime:
#                          containerd 2.x, its shim, ctr and runc, built by
#                          hack/tools.sh), xz-compressed
#   hack/gpu-cluster.sh --stage DIR     on the GPU machine: keep a payload part in
#                          /tmp/gpu-cluster-payload, for a transport that carries
#                          one part at a time
#   hack/gpu-cluster.sh [--payload DIR]...   on the GPU machine (root, nvcc, no Go,
#                          no network), from the repository root: the run
#   hack/gpu-cluster.sh --fake [--payload DIR]...   the same run here against the
#                          stand-in driver (e2e/standin), in a private mount
#                          namespace where it sits at /usr/local/nvidia: needs Go,
#                          gcc and root; proves the plumbing, not a GPU
#   --runtime nri          with the run or --fake: runtime injection. The node runs
#                          the NRI runtime of part3 (containerd 2.x with NRI, its
#                          default validator on) in place of Debian's containerd,
#                          the chart runs with runtimeInjection.enabled=true, and
#                          the workloads run in a namespace that enforces Pod
#                          Security baseline: the driver comes from gpu-injector's
#                          NRI plugin as each container is created, and no pod spec
#                          holds a hostPath volume. Then the node's decisions, with
#                          images built here with an ENV of their own: one whose
#                          LD_LIBRARY_PATH names its own library folder runs its
#                          CUDA program (the plugin appends the driver's folder to
#                          the image's value), one whose NVIDIA_REQUIRE_CUDA asks
#                          for a CUDA above the driver's is refused at creation
#                          with the reason, one within it runs, and the refused one
#                          runs with NVIDIA_DISABLE_REQUIRE=true. Then the negative control: with
#                          the plugin turned off (helm upgrade) and the Node's
#                          gpu-injector.io/nri-plugin label gone, the same CUDA pod
#                          is refused by Pod Security for its hostPath volumes.
#                          --runtime debian (the default) is the hostPath run.
#
# The run: unpack the payload; build the CUDA program (nvcc -cudart static) and a
# driverless image around it (make-driverless-root.sh, root-image.sh); start the
# local cluster (hack/cluster-up: etcd, kube-apiserver, controller-manager,
# scheduler, containerd + runc, a kubelet on cgroup v2 with the cgroupfs driver)
# and the images imported into containerd; NVIDIA's device plugin (built from its
# Go module) as a DaemonSet pod with --pass-device-specs and no container
# toolkit, e2e/deviceplugin/nvidia-device-plugin.yaml as users apply it; `helm install` the chart;
# wait for the probe pod to label the Node from NVML; label a namespace; run the
# nvidia-smi Job, the CUDA pod and the TensorFlow-style Deployment of
# hack/gpu/cluster/; the negative controls; a PASS/FAIL table. Exit status 0
# only when every check passed.
#
# Payload folders are searched in order: each --payload DIR, .device/gpu-cluster/
# part1, part2 and part3, /tmp/gpu-cluster-payload. part3 (the NRI runtime, e2e/
# cluster's RuntimeNRI) is needed only by --runtime nri.
#
# Environment: OUT (results, default ./gpu-cluster-out), NVCC, NVCC_ARCH (default:
# the first GPU's compute capability, as nvidia-smi reports it), EXPECT_GPU,
# EXPECT_DRIVER, EXPECT_MEMORY_MIB (default: what nvidia-smi, an NVML client,
# reports of the first GPU on this machine), KEEP=1 (leave the cluster running
# until Ctrl-C).
#
# Results in $OUT (at most 8 files): summary.txt, gpu-cluster.log (every command
# and its output), node.yaml (the Node after the probe), workloads.txt (the
# workloads' logs and the webhook's changes), cluster-logs.tar.gz (component and
# pod logs, `kubectl get -A`, events).
set -uo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
cd "$(dirname "$self")/.." || exit 1
repo=$(pwd)
# Run from a copy in a side folder (.gpucarry/), the repository is its parent.
[[ -d $repo/charts/gpu-injector ]] || { echo "gpu-cluster: run from the repository (no charts/ in $repo)" >&2; exit 1; }

STAGE=/tmp/gpu-cluster-payload
# The versions the local cluster runs (KUBERNETES_VERSION=... in the environment wins).
# shellcheck source=versions.sh
source "$repo/hack/versions.sh"
K8S_VERSION=$KUBERNETES_VERSION
KUBE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
DRIVERLESS_IMAGE=gpu-injector.local/driverless-cuda:gpu
# The gpu-injector image as `make image` builds it, under the name a user of a
# private registry would give it (image.repository and image.tag below).
IMAGE_REPOSITORY=gpu-injector.local/gpu-injector
IMAGE_TAG=gpu
# NVIDIA's device plugin, built from its Go module (e2e/deviceplugin).
NVDP_IMAGE=gpu-injector.local/nvidia-device-plugin:v0.19.1
RELEASE_NS=gpu-injector
NS=gpu-demo
NS_OFF=gpu-demo-unlabelled

usage() { # the header: the comment lines after the first
	awk 'NR > 1 && !/^#/ { exit } NR > 1' "$self" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

mode=real
runtime=debian
payloads=()
build_dir=.device/gpu-cluster
while [[ $# -gt 0 ]]; do
	case "$1" in
	--build)
		mode=build
		if [[ $# -ge 2 && $2 != -* ]]; then build_dir=$2; shift; fi
		;;
	--stage)
		[[ $# -ge 2 ]] || usage
		mkdir -p "$STAGE" && cp -a "$2"/. "$STAGE"/ && ls -la "$STAGE" && exit 0
		exit 1
		;;
	--fake) mode=fake ;;
	--runtime)
		[[ $# -ge 2 && $2 =~ ^(debian|nri)$ ]] || usage
		runtime=$2
		shift
		;;
	--payload)
		[[ $# -ge 2 ]] || usage
		payloads+=("$(cd "$2" && pwd)") || exit 1
		shift
		;;
	--in-namespace) in_ns=1 ;;
	*) usage ;;
	esac
	shift
done
given=("${payloads[@]}")
payloads+=("$repo/.device/gpu-cluster/part1" "$repo/.device/gpu-cluster/part2" "$repo/.device/gpu-cluster/part3" "$STAGE")

# ---------------------------------------------------------------------------
# --build: here, with Go. Each part stays under 60 MiB so that one part fits a
# 64 MiB transport beside the repository.
if [[ $mode == build ]]; then
	set -e
	mkdir -p "$build_dir/part1" "$build_dir/part2" "$build_dir/part3"
	b=$(cd "$build_dir" && pwd)
	cache=$GPU_INJECTOR_CACHE_DIR
	hack/tools.sh all
	xzf() { # xzf SRC DEST.xz: compress unless DEST is newer than SRC
		if [[ ! -f $2 || $1 -nt $2 ]]; then
			echo "xz $1 -> $2" >&2
			xz -9 -T1 -c "$1" >"$2.tmp" && mv "$2.tmp" "$2"
		fi
	}
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# The five Kubernetes components as one binary, as hack/tools.sh builds and
	# caches them (hack/gpu/kube-multicall.go). Its version beside it: a payload
	# built for another release is rebuilt here, and refused by the run.
	if [[ ! -f $b/part1/kube.xz || $(cat "$b/part1/kube.version" 2>/dev/null) != "$K8S_VERSION" ]]; then
		rm -f "$b/part1/kube.xz"
		xzf "$(readlink -f "$cache/kubernetes-$K8S_VERSION/kube")" "$b/part1/kube.xz"
		echo "$K8S_VERSION" >"$b/part1/kube.version"
	fi
	if [[ ! -f $b/part1/etcd.xz || $(cat "$b/part1/etcd.version" 2>/dev/null) != "$ETCD_VERSION" ]]; then
		rm -f "$b/part1/etcd.xz"
		cp "$cache/etcd-$ETCD_VERSION/etcd" "$tmp/etcd" && strip "$tmp/etcd"
		xzf "$tmp/etcd" "$b/part1/etcd.xz"
		echo "$ETCD_VERSION" >"$b/part1/etcd.version"
	fi
	xzf "$cache/helm-$HELM_VERSION/helm" "$b/part1/helm.xz"
	# containerd 1.6, runc 1.1 and the CNI plugins from Debian's packages, as
	# hack/install-runtime.sh installs them here.
	if [[ ! -f $b/part2/runtime.tar.xz ]]; then
		mkdir "$tmp/deb" && (cd "$tmp/deb" && apt-get download containerd runc containernetworking-plugins)
		for d in "$tmp"/deb/*.deb; do dpkg-deb -x "$d" "$tmp/deb/x"; done
		tar -C "$tmp/deb/x" -cf - usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr usr/sbin/runc \
			usr/lib/cni/bridge usr/lib/cni/host-local usr/lib/cni/loopback | xz -9 -T1 >"$b/part2/runtime.tar.xz"
	fi
	# The NRI runtime (containerd 2.x, its shim, ctr, runc: static, built by
	# hack/tools.sh) in the tool cache's own layout, so that the run unpacks it
	# where the launcher's RuntimeNRI looks. A part of its own (14 MiB), which
	# the run does without: in part2 it would take that part to 54 of its 60 MiB.
	nri_version="containerd-$CONTAINERD_VERSION runc-$RUNC_VERSION"
	if [[ ! -f $b/part3/nri-runtime.tar.xz || $(cat "$b/part3/nri-runtime.version" 2>/dev/null) != "$nri_version" ]]; then
		echo "staging the NRI runtime ($nri_version): stripped, xz -9..." >&2
		rm -f "$b/part3/nri-runtime.tar.xz"
		mkdir -p "$tmp/nri/containerd-$CONTAINERD_VERSION" "$tmp/nri/runc-$RUNC_VERSION"
		for f in containerd containerd-shim-runc-v2 ctr; do
			cp "$cache/containerd-$CONTAINERD_VERSION/$f" "$tmp/nri/containerd-$CONTAINERD_VERSION/"
		done
		cp "$cache/runc-$RUNC_VERSION/runc" "$tmp/nri/runc-$RUNC_VERSION/"
		strip "$tmp"/nri/*/*
		tar -C "$tmp/nri" -cf - "containerd-$CONTAINERD_VERSION" "runc-$RUNC_VERSION" | xz -9 -T1 >"$b/part3/nri-runtime.tar.xz.tmp"
		mv "$b/part3/nri-runtime.tar.xz.tmp" "$b/part3/nri-runtime.tar.xz"
		echo "$nri_version" >"$b/part3/nri-runtime.version"
	fi
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/cluster-up" ./hack/cluster-up
	xzf "$tmp/cluster-up" "$b/part2/cluster-up.xz"
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/standin-server" ./hack/demo/standin-server
	xzf "$tmp/standin-server" "$b/part2/standin-server.xz"
	go run ./hack/image -o "$tmp/gpu-injector-image.tar" -ref "$IMAGE_REPOSITORY:$IMAGE_TAG"
	xzf "$tmp/gpu-injector-image.tar" "$b/part2/gpu-injector-image.tar.xz"
	go run ./e2e/deviceplugin/cmd/nvidia-device-plugin-image -o "$tmp/nvidia-device-plugin-image.tar"
	xzf "$tmp/nvidia-device-plugin-image.tar" "$b/part2/nvidia-device-plugin-image.tar.xz"
	ls -la "$b"/part1 "$b"/part2 "$b"/part3
	for p in part1 part2 part3; do
		size=$(du -sb "$b/$p" | cut -f1)
		echo "$p: $((size / 1024 / 1024)) MiB" >&2
		[[ $size -lt $((60 * 1024 * 1024)) ]] || echo "warning: $p is over 60 MiB" >&2
	done
	exit 0
fi

# ---------------------------------------------------------------------------
# --fake: the stand-in driver must sit at the real /usr/local/nvidia, where the
# kubelet bind-mounts it from; a private mount namespace with an overlay on
# /usr/local gives it that path without touching this machine.
if [[ $mode == fake && -z ${in_ns:-} ]]; then
	[[ $EUID -eq 0 ]] || { echo "gpu-cluster --fake: needs root" >&2; exit 1; }
	args=(--fake --in-namespace --runtime "$runtime")
	for p in "${given[@]}"; do args+=(--payload "$p"); done
	exec unshare --mount --propagation private -- "$self" "${args[@]}"
fi

OUT=${OUT:-./gpu-cluster-out}
run_name=$mode
[[ $runtime == nri ]] && run_name="$mode, runtime nri"
# What the probe must publish is what NVML reports on this machine, as
# nvidia-smi (an NVML client) reads it: the first GPU's product, memory and
# driver, and its compute capability for nvcc. EXPECT_* and NVCC_ARCH win.
smi=$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)
gpu_facts=
if [[ $mode != fake && -x $smi ]]; then
	gpu_facts=$("$smi" --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits 2>/dev/null | head -1)
fi
IFS=, read -r nvml_name nvml_mem nvml_driver nvml_cc <<<"$gpu_facts"
trim() { local v=$1; v=${v#"${v%%[![:space:]]*}"}; echo "${v%"${v##*[![:space:]]}"}"; }
nvml_name=$(trim "$nvml_name") nvml_mem=$(trim "$nvml_mem") nvml_driver=$(trim "$nvml_driver") nvml_cc=$(trim "$nvml_cc")
EXPECT_GPU=${EXPECT_GPU:-${nvml_name:-H100}}
EXPECT_DRIVER=${EXPECT_DRIVER:-${nvml_driver:-580.}}
EXPECT_MEMORY_MIB=${EXPECT_MEMORY_MIB:-${nvml_mem:-81559}}
NVCC_ARCH=${NVCC_ARCH:-sm_${nvml_cc//./}}
[[ $NVCC_ARCH == sm_ ]] && NVCC_ARCH=sm_90
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu-cluster.log
: >"$LOG"
: >"$OUT/workloads.txt"
work=$(mktemp -d /tmp/gpu-cluster.XXXXXX)
chmod 755 "$work"
cluster_pid=

names=()
results=()
details=()
record() {
	names+=("$1")
	results+=("$2")
	details+=("$3")
	printf '\n>>> %s: %s (%s)\n' "$2" "$1" "$3" | tee -a "$LOG"
}
section() { printf '\n===== %s [%s] =====\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$LOG"; }
# run CMD...: the command and its output into the log; returns its status.
run() {
	local rc
	printf '$ %s\n' "$*" | tee -a "$LOG"
	"$@" >"$work/run.out" 2>&1
	rc=$?
	tee -a "$LOG" <"$work/run.out"
	printf '[exit status %d]\n' "$rc" | tee -a "$LOG"
	return "$rc"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
timings=()
timing() { timings+=("$(printf '%-48s %6s s' "$1" "$2")"); }

collect() {
	section "collect"
	if [[ -n ${KUBECONFIG:-} ]]; then
		mkdir -p "$work/logs/kubectl"
		{
			$kubectl get nodes -o wide
			$kubectl get all,events -A -o wide
		} >"$work/logs/kubectl/get-all.txt" 2>&1
		$kubectl get node "$NODE_NAME" -o yaml >"$work/logs/kubectl/node.yaml" 2>&1
		$kubectl describe pods -A >"$work/logs/kubectl/describe-pods.txt" 2>&1
		for p in $($kubectl get pods -n "$RELEASE_NS" -o name 2>/dev/null); do
			$kubectl logs -n "$RELEASE_NS" --all-containers "$p" >"$work/logs/kubectl/$RELEASE_NS-${p#pod/}.log" 2>&1
		done
		$kubectl logs -n kube-system -l app.kubernetes.io/name=nvidia-device-plugin --tail=-1 >"$work/logs/kubectl/nvidia-device-plugin.log" 2>&1
	fi
	tar -C "$work" -czf "$OUT/cluster-logs.tar.gz" logs 2>/dev/null
}
cleanup() {
	collect
	if [[ -n $cluster_pid ]] && kill -0 "$cluster_pid" 2>/dev/null; then
		kill -TERM "$cluster_pid"
		for _ in $(seq 60); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.5; done
	fi
	[[ ${#made_dev[@]} -eq 0 ]] || rm -f "${made_dev[@]}"
	rm -rf "$work"
}
made_dev=()
trap cleanup EXIT

section "machine"
{
	echo "mode: $mode"
	echo "runtime: $runtime"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "kernel: $(uname -srm)"
	grep PRETTY_NAME /etc/os-release 2>/dev/null
	echo "cgroup: $(stat -fc %T /sys/fs/cgroup)"
	echo "git: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	ls -la /dev/nvidia* 2>&1
	[[ $mode == real ]] && nvidia-smi -L 2>&1
} 2>&1 | tee -a "$LOG"

# ---------------------------------------------------------------------------
section "1. unpack the payload"
t0=$(now)
find_payload() { # find_payload FILE: the first payload folder that has it
	local d
	for d in "${payloads[@]}"; do
		[[ -f $d/$1 ]] && { echo "$d/$1"; return 0; }
	done
	return 1
}
missing=()
for f in kube.xz etcd.xz helm.xz runtime.tar.xz cluster-up.xz standin-server.xz gpu-injector-image.tar.xz nvidia-device-plugin-image.tar.xz; do
	find_payload "$f" >/dev/null || missing+=("$f")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	record "payload" FAIL "missing ${missing[*]} in ${payloads[*]}: run hack/gpu-cluster.sh --build on a machine with Go and copy .device/gpu-cluster here"
	exit 1
fi
for v in "kube.version:$K8S_VERSION" "etcd.version:$ETCD_VERSION"; do
	f=${v%%:*} want=${v#*:}
	if ! got=$(cat "$(find_payload "$f")" 2>/dev/null) || [[ $got != "$want" ]]; then
		record "payload" FAIL "the payload's ${f%.version} is ${got:-of no recorded version}, this run wants $want: run hack/gpu-cluster.sh --build again"
		exit 1
	fi
done
cache=$work/cache
bin=$work/bin
mkdir -p "$cache/kubernetes-$K8S_VERSION" "$cache/etcd-$ETCD_VERSION" "$bin" "$work/rt" "$work/images"
xz -dc "$(find_payload kube.xz)" >"$cache/kubernetes-$K8S_VERSION/kube"
for c in "${KUBE_COMPONENTS[@]}"; do ln -s kube "$cache/kubernetes-$K8S_VERSION/$c"; done
xz -dc "$(find_payload etcd.xz)" >"$cache/etcd-$ETCD_VERSION/etcd"
xz -dc "$(find_payload helm.xz)" >"$bin/helm"
xz -dc "$(find_payload cluster-up.xz)" >"$bin/cluster-up"
xz -dc "$(find_payload standin-server.xz)" >"$work/standin-server"
xz -dc "$(find_payload gpu-injector-image.tar.xz)" >"$work/images/gpu-injector.tar"
xz -dc "$(find_payload nvidia-device-plugin-image.tar.xz)" >"$work/images/nvidia-device-plugin.tar"
tar -C "$work/rt" -xJf "$(find_payload runtime.tar.xz)"
# The NRI runtime, when the payload has it at this run's versions: into the
# tool cache, where e2e/cluster's RuntimeNRI finds it. --runtime nri needs it.
nri_want="containerd-$CONTAINERD_VERSION runc-$RUNC_VERSION"
nri_got=
if nri_tar=$(find_payload nri-runtime.tar.xz); then
	nri_got=$(cat "$(find_payload nri-runtime.version)" 2>/dev/null)
	if [[ $nri_got == "$nri_want" ]]; then
		tar -C "$cache" -xJf "$nri_tar"
		echo "NRI runtime unpacked: containerd $CONTAINERD_VERSION, runc $RUNC_VERSION" | tee -a "$LOG"
	fi
fi
if [[ $runtime == nri && $nri_got != "$nri_want" ]]; then
	if [[ -z $nri_tar ]]; then
		record "payload" FAIL "--runtime nri: no nri-runtime.tar.xz (part3) in ${payloads[*]}: run hack/gpu-cluster.sh --build and stage part3 too"
	else
		record "payload" FAIL "--runtime nri: part3's runtime is '${nri_got:-of no recorded version}', this run wants '$nri_want': run hack/gpu-cluster.sh --build again"
	fi
	exit 1
fi
cp "$work"/rt/usr/bin/* "$work"/rt/usr/sbin/* "$bin"/
chmod +x "$bin"/* "$cache/kubernetes-$K8S_VERSION/kube" "$cache/etcd-$ETCD_VERSION/etcd" "$work/standin-server"
# The launcher looks for the CNI plugins where Debian installs them.
mkdir -p /usr/lib/cni
for p in bridge host-local loopback; do
	[[ -x /usr/lib/cni/$p ]] || cp "$work/rt/usr/lib/cni/$p" /usr/lib/cni/
done
export PATH=$bin:$PATH GPU_INJECTOR_CACHE=$cache
# helm keeps a cache and config per user; keep them with the run.
export HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data
kubectl=$cache/kubernetes-$K8S_VERSION/kubectl
helm=$bin/helm
run "$kubectl" version --client && run "$helm" version --short
if [[ $runtime == nri ]]; then
	run "$cache/containerd-$CONTAINERD_VERSION/containerd" --version && run "$cache/runc-$RUNC_VERSION/runc" --version
else
	run containerd --version && run runc --version
fi
t_unpack=$(since "$t0")
timing "unpack the payload" "$t_unpack"
parts=(kube.xz etcd.xz helm.xz)
[[ $runtime == nri ]] && parts+=(nri-runtime.tar.xz)
record "payload unpacked" PASS "$(du -sh "$work" | cut -f1) from $(for f in "${parts[@]}"; do basename "$(dirname "$(find_payload "$f")")"; done | sort -u | xargs)"

# ---------------------------------------------------------------------------
section "2. the CUDA program and the driverless image"
prog=$work/cuda-smoke
if [[ $mode == fake ]]; then
	# The stand-in runs no kernels: its test program is e2e/workloads'
	# cuda-check, which loads libcuda.so.1 by SONAME as the CUDA runtime does.
	expect_cuda_ok='loaded libcuda\.so\.1 from /usr/local/nvidia/lib64/'
	expect_cuda_fail='cannot load libcuda\.so\.1'
	expect_gpu='Stand-in GPU'
	run gcc -O2 -o "$prog" e2e/workloads/csrc/cuda-check.c -ldl && record "build the CUDA program" PASS "gcc e2e/workloads/csrc/cuda-check.c (stand-in)" ||
		record "build the CUDA program" FAIL "gcc failed"
	# The stand-in driver at /usr/local/nvidia, in this namespace only.
	mkdir -p "$work/usrlocal/upper" "$work/usrlocal/work" "$work/node"
	run go run ./hack/gpu/standin-node --root "$work/node" --layout usr-local-nvidia --version 580.159.04 &&
		mount -t overlay overlay -o "lowerdir=/usr/local,upperdir=$work/usrlocal/upper,workdir=$work/usrlocal/work" /usr/local &&
		mkdir -p /usr/local/nvidia && mount --bind -o ro "$work/node/usr/local/nvidia" /usr/local/nvidia &&
		record "stand-in driver at /usr/local/nvidia" PASS "private mount namespace" ||
		record "stand-in driver at /usr/local/nvidia" FAIL "see the log"
	# The device nodes a driver makes for the stand-in's two GPUs, for NVIDIA's
	# plugin to hand out (the numbers of the nvidia module; nothing answers them
	# here): only those missing, removed at exit.
	for n in nvidia0:195:0 nvidia1:195:1 nvidiactl:195:255 nvidia-uvm:511:0 nvidia-uvm-tools:511:1; do
		IFS=: read -r name major minor <<<"$n"
		[[ -e /dev/$name ]] && continue
		mknod -m 666 "/dev/$name" c "$major" "$minor" && made_dev+=("/dev/$name")
	done
else
	expect_cuda_ok='CUDA kernel result: OK'
	expect_cuda_fail='CUDA error|insufficient|cannot open shared object'
	expect_gpu=$EXPECT_GPU
	nvcc=${NVCC:-$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)}
	if [[ -n $nvcc ]] && run "$nvcc" -O2 -cudart static -arch="$NVCC_ARCH" -o "$prog" hack/gpu/cuda-smoke.cu; then
		record "build the CUDA program" PASS "$nvcc -cudart static -arch=$NVCC_ARCH"
	else
		record "build the CUDA program" FAIL "no nvcc, or nvcc failed"
	fi
fi
cp "$work/standin-server" "$work/standin-server.bin"
libs_for=()
[[ -x /usr/local/nvidia/bin/nvidia-smi ]] && libs_for=(--libs-for /usr/local/nvidia/bin/nvidia-smi)
root=$work/driverless-root
if run bash hack/gpu/make-driverless-root.sh "${libs_for[@]}" "$root" "$prog" "$work/standin-server" &&
	run bash hack/gpu/root-image.sh "$root" "$DRIVERLESS_IMAGE" "$work/images/driverless.tar"; then
	record "driverless image" PASS "$DRIVERLESS_IMAGE: $(cd "$root" && find . -type f | wc -l) files, none matching nvidia|libcuda"
else
	record "driverless image" FAIL "make-driverless-root.sh or root-image.sh failed"
fi

# ---------------------------------------------------------------------------
section "3. the cluster"
t0=$(now)
mkdir -p "$work/logs/cluster"
# nvidia.com/gpu.present is what NVIDIA's GPU feature discovery labels GPU nodes
# with; the chart's probe DaemonSet selects it.
cluster_args=(--node-labels nvidia.com/gpu.present=true
	--write-env "$work/cluster.env" --logs-dir "$work/logs/cluster" --timeout 5m)
if [[ $runtime == nri ]]; then
	if ! cluster-up -h 2>&1 | grep -q -- -runtime; then
		record "cluster up" FAIL "--runtime nri: this payload's cluster-up has no -runtime flag: run hack/gpu-cluster.sh --build again"
		exit 1
	fi
	cluster_args+=(--runtime nri)
fi
# cluster-up imports the images once the node is Ready; an older one cannot,
# and the script imports them with ctr below.
import_by_ctr=1
if cluster-up -h 2>&1 | grep -q -- -import-image; then
	import_by_ctr=0
	cluster_args+=(--import-image "$work/images/gpu-injector.tar" --import-image "$work/images/driverless.tar"
		--import-image "$work/images/nvidia-device-plugin.tar")
fi
printf '$ cluster-up %s\n' "${cluster_args[*]}" | tee -a "$LOG"
setsid cluster-up "${cluster_args[@]}" >"$work/logs/cluster-up.log" 2>&1 &
cluster_pid=$!
for _ in $(seq 600); do
	[[ -f $work/cluster.env ]] && break
	kill -0 "$cluster_pid" 2>/dev/null || break
	sleep 0.5
done
cat "$work/logs/cluster-up.log" >>"$LOG"
if [[ ! -f $work/cluster.env ]]; then
	record "cluster up" FAIL "cluster-up did not start the cluster (log in cluster-logs.tar.gz)"
	tail -30 "$work/logs/cluster-up.log"
	exit 1
fi
# shellcheck disable=SC1091
source "$work/cluster.env"
export KUBECONFIG
t_cluster=$(since "$t0")
timing "cluster start (etcd to node Ready, images imported)" "$t_cluster"
if [[ $runtime == nri ]]; then
	# cluster-up names the NRI socket only when containerd serves NRI.
	if [[ ${RUNTIME:-} == nri && -n ${NRI_SOCKET:-} ]]; then
		record "cluster up" PASS "node $NODE_NAME ($NODE_IP), Kubernetes $K8S_VERSION, containerd $CONTAINERD_VERSION with NRI, in ${t_cluster}s"
	else
		record "cluster up" FAIL "cluster-up's runtime is '${RUNTIME:-}', NRI socket '${NRI_SOCKET:-}': want nri and a socket"
	fi
else
	record "cluster up" PASS "node $NODE_NAME ($NODE_IP), Kubernetes $K8S_VERSION, in ${t_cluster}s"
fi

if [[ $import_by_ctr == 1 ]]; then
	t0=$(now)
	for img in gpu-injector driverless nvidia-device-plugin; do
		run "$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io images import "$work/images/$img.tar"
	done
	t_import=$(since "$t0")
else
	# cluster-up imported the images once the node was Ready: their time is the
	# gap between its "local cluster ready" and its last "imported image" lines.
	t_import=$(awk '/local cluster ready/ { r = $1 } /imported image/ { i = $1 }
		function secs(t) { split(substr(t, 12, 12), a, ":"); return a[1] * 3600 + a[2] * 60 + a[3] }
		END { if (r != "" && i != "") printf "%.1f", secs(i) - secs(r) }' "$work/logs/cluster-up.log")
fi
timing "image import (gpu-injector, driverless, nvidia-device-plugin)" "${t_import:-?}"
run "$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io images ls -q
if grep -q "^$IMAGE_REPOSITORY:$IMAGE_TAG\$" "$work/run.out" && grep -q "^$DRIVERLESS_IMAGE\$" "$work/run.out" && grep -q "^$NVDP_IMAGE\$" "$work/run.out"; then
	record "images imported into containerd" PASS "$IMAGE_REPOSITORY:$IMAGE_TAG, $DRIVERLESS_IMAGE and $NVDP_IMAGE in ${t_import:-?}s"
else
	record "images imported into containerd" FAIL "an image is missing from containerd's k8s.io namespace"
fi

# NVIDIA's device plugin as users apply it without the container toolkit; its
# driver folder is this machine's /usr/local/nvidia (the manifest's default).
t0=$(now)
sed "s#image: nvcr.io/nvidia/k8s-device-plugin:.*#image: $NVDP_IMAGE#" e2e/deviceplugin/nvidia-device-plugin.yaml >"$work/nvidia-device-plugin.yaml"
run "$kubectl" apply -f "$work/nvidia-device-plugin.yaml"
gpus=
for _ in $(seq 120); do
	gpus=$($kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null)
	[[ -n $gpus && $gpus != 0 ]] && break
	sleep 0.5
done
run "$kubectl" get node "$NODE_NAME" -o jsonpath='{.status.allocatable}{"\n"}'
if [[ -n $gpus && $gpus != 0 ]]; then
	record "NVIDIA's device plugin advertises the GPU" PASS "nvidia.com/gpu: $gpus ($(ls -d /dev/nvidia[0-9]* | xargs)), $NVDP_IMAGE Running in $(since "$t0")s"
else
	record "NVIDIA's device plugin advertises the GPU" FAIL "no nvidia.com/gpu in the node's allocatable"
fi
run "$kubectl" get pods -n kube-system -l app.kubernetes.io/name=nvidia-device-plugin -o wide
run "$kubectl" logs -n kube-system -l app.kubernetes.io/name=nvidia-device-plugin --tail=40

# ---------------------------------------------------------------------------
section "4. helm install"
t0=$(now)
# privileged: the probe reads NVML, which opens /dev/nvidiactl and /dev/nvidia0.
# This node has no NVIDIA container toolkit, so no RuntimeClass adds those
# nodes (runtimeClassName would name a handler containerd does not have), and
# the probe asks for no GPU, so the device plugin gives it none either: only a
# privileged container passes the device cgroup. It stays non-root with every
# capability dropped and the host root read-only.
helm_args=(install gpu-injector charts/gpu-injector --namespace "$RELEASE_NS" --create-namespace
	--set image.repository=$IMAGE_REPOSITORY --set image.tag=$IMAGE_TAG --set image.pullPolicy=Never
	--set nodeprobe.privileged=true
	--wait --timeout 3m)
if [[ $runtime == nri ]]; then
	# The NRI plugin beside each probe; -v=1 logs each injection, the run's
	# record of what the plugin did.
	helm_args+=(--set runtimeInjection.enabled=true --set 'runtimeInjection.extraArgs={-v=1}')
else
	# The hostPath run: no plugin, whatever NRI the node's runtime has.
	helm_args+=(--set runtimeInjection.enabled=false)
fi
helm_ok=1
if run "$helm" "${helm_args[@]}"; then
	record "helm install" PASS "release gpu-injector in $RELEASE_NS, ready in $(since "$t0")s"
else
	helm_ok=0
	record "helm install" FAIL "helm install --wait failed"
fi
timing "helm install --wait (chart pods Ready)" "$(since "$t0")"
run "$kubectl" get pods -n "$RELEASE_NS" -o wide
not_running=$($kubectl get pods -n "$RELEASE_NS" --no-headers 2>/dev/null | awk '$3 != "Running" {print $1}')
total=$($kubectl get pods -n "$RELEASE_NS" --no-headers 2>/dev/null | wc -l)
[[ $total -gt 0 && -z $not_running ]] && record "chart pods Running" PASS "$total pods" ||
	record "chart pods Running" FAIL "$total pods, not running: ${not_running:-none listed}"

t0=$(now)
state=
for _ in $(seq 240); do
	state=$($kubectl get node "$NODE_NAME" -o jsonpath='{.metadata.labels.gpu-injector\.io/state}' 2>/dev/null)
	[[ $state == ready ]] && break
	sleep 0.5
done
timing "probe pod labels the Node" "$(since "$t0")"
$kubectl get node "$NODE_NAME" -o yaml >"$OUT/node.yaml" 2>&1
run "$kubectl" get node "$NODE_NAME" -o jsonpath='{range .metadata.labels}{}{end}' >/dev/null
grep -E 'gpu-injector.io/' "$OUT/node.yaml" | tee -a "$LOG"
label() { $kubectl get node "$NODE_NAME" -o jsonpath="{.metadata.labels.gpu-injector\.io/$1}"; }
drv=$(label driver-version) product=$(label gpu-product) mem=$(label gpu-memory-mib) src=$($kubectl get node "$NODE_NAME" -o jsonpath='{.metadata.annotations.gpu-injector\.io/driver-version-source}')
if [[ $mode == fake ]]; then
	want_product='Stand-in' want_mem='.*'
else
	# The label's spelling of the product: runs of other characters as one dash.
	want_product=$(sed -E 's/[^A-Za-z0-9._]+/-/g' <<<"$EXPECT_GPU") want_mem=$EXPECT_MEMORY_MIB
fi
if [[ $state == ready && $drv == "$EXPECT_DRIVER"* && $product == *"$want_product"* && $mem =~ ^$want_mem$ && $src == NVML ]]; then
	record "probe pod labels the Node from NVML" PASS "driver $drv, $product, $mem MiB, source $src"
else
	record "probe pod labels the Node from NVML" FAIL "state '$state', driver '$drv', product '$product', memory '$mem', source '$src'"
fi
if [[ $runtime == nri ]]; then
	# The probe labels its Node once the plugin beside it is registered with
	# containerd; the webhook delivers the driver at the runtime only to nodes
	# with that label. Timed from helm's return.
	nri_label=
	for _ in $(seq 240); do
		nri_label=$(label nri-plugin)
		[[ $nri_label == v1 ]] && break
		sleep 0.5
	done
	t_label=$(since "$t0")
	timing "NRI plugin registered: Node labelled, after helm" "$t_label"
	if [[ $nri_label == v1 ]]; then
		record "NRI plugin registered, Node labelled" PASS "gpu-injector.io/nri-plugin=v1 ${t_label}s after helm returned"
	else
		record "NRI plugin registered, Node labelled" FAIL "no gpu-injector.io/nri-plugin=v1 on the Node after ${t_label}s (label '$nri_label')"
		run "$kubectl" logs -n "$RELEASE_NS" -l app.kubernetes.io/component=nodeprobe -c nri-plugin --tail=20
	fi
	$kubectl get node "$NODE_NAME" -o yaml >"$OUT/node.yaml" 2>&1
fi

# Without the chart's pods nothing below can pass: say why and stop, while the
# logs can still be collected.
summary() {
	section "summary"
	failed=0
	{
		printf '%-4s  %-44s  %s\n' "" "check" "detail"
		for i in "${!names[@]}"; do
			printf '%-4s  %-44s  %s\n' "${results[$i]}" "${names[$i]}" "${details[$i]}"
			[[ ${results[$i]} == PASS ]] || failed=$((failed + 1))
		done
		echo
		printf '%s\n' "${timings[@]}"
		echo
		if [[ $failed -eq 0 ]]; then
			echo "gpu-cluster ($run_name): PASS, ${#names[@]} checks"
		else
			echo "gpu-cluster ($run_name): FAIL, $failed of ${#names[@]} checks failed"
		fi
	} | tee "$OUT/summary.txt" | tee -a "$LOG"
}
if [[ $helm_ok == 0 || $state != ready ]]; then
	for p in $($kubectl get pods -n "$RELEASE_NS" -o name 2>/dev/null); do
		run "$kubectl" logs -n "$RELEASE_NS" --tail=5 "$p"
	done
	record "workloads" FAIL "not run: the chart's pods are not ready"
	summary
	exit 1
fi

# ---------------------------------------------------------------------------
if [[ $runtime == nri ]]; then
	section "5. the workloads in an opted-in namespace that enforces Pod Security baseline"
else
	section "5. the workloads in an opted-in namespace"
fi
run "$kubectl" create namespace "$NS"
run "$kubectl" label namespace "$NS" gpu-injector.io/inject=enabled
# baseline forbids hostPath volumes: only runtime injection gets a GPU pod in.
[[ $runtime == nri ]] && run "$kubectl" label namespace "$NS" pod-security.kubernetes.io/enforce=baseline
run "$kubectl" create namespace "$NS_OFF"
# wait_pod NS SELECTOR PHASES SECONDS: until a pod matching SELECTOR is in one of PHASES.
pod_of() { $kubectl get pods -n "$1" -l "$2" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
wait_phase() {
	local ns=$1 pod=$2 want=$3 secs=$4 phase
	for _ in $(seq $((secs * 2))); do
		phase=$($kubectl get pod -n "$ns" "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)
		[[ $phase =~ ^($want)$ ]] && { echo "$phase"; return 0; }
		sleep 0.5
	done
	echo "${phase:-none}"
	return 1
}
workload_log() { # workload_log TITLE CMD...: into workloads.txt and the log
	{
		printf '\n## %s\n$ %s\n' "$1" "${*:2}"
		"${@:2}" 2>&1
	} | tee -a "$OUT/workloads.txt" >>"$LOG"
}
# runtime_spec TITLE NS POD CONTAINER: with --runtime nri, the pod as admitted
# holds no hostPath volume and carries the webhook's marker naming CONTAINER.
runtime_spec() {
	[[ $runtime == nri ]] || return 0
	local vols marker
	vols=$($kubectl get pod -n "$2" "$3" -o jsonpath='{range .spec.volumes[?(@.hostPath)]}{.name}={.hostPath.path} {end}' 2>&1)
	marker=$($kubectl get pod -n "$2" "$3" -o jsonpath='{.metadata.annotations.gpu-injector\.io/runtime-inject}' 2>&1)
	if [[ -n $3 && -z $vols && $marker == "$4" ]]; then
		record "$1: no hostPath, marked" PASS "no hostPath volume in the pod spec; gpu-injector.io/runtime-inject=$marker"
	else
		record "$1: no hostPath, marked" FAIL "pod '$3': hostPath volumes '$vols', gpu-injector.io/runtime-inject '$marker' (want '$4')"
	fi
}
# driver_mounts SPEC: the mounts at /usr/local/nvidia in an OCI spec, one a
# line (its JSON without blanks and line breaks).
driver_mounts() { tr -d ' \n\t' <"$1" | grep -o '{"destination":"/usr/local/nvidia[^}]*}'; }
# runtime_mounts TITLE NS POD: with --runtime nri, the driver mounts in the
# OCI spec containerd handed to runc (kubectl never shows them): every plan
# folder bound read-only at /usr/local/nvidia.
runtime_mounts() {
	[[ $runtime == nri ]] || return 0
	local id mounts
	id=$($kubectl get pod -n "$2" "$3" -o jsonpath='{.status.containerStatuses[0].containerID}' 2>/dev/null)
	id=${id#containerd://}
	"$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io containers info --spec "$id" >"$work/spec.json" 2>"$work/spec.err"
	mounts=$(driver_mounts "$work/spec.json")
	workload_log "$1: the driver mounts in the container's OCI spec (ctr containers info --spec ${id:0:12})" driver_mounts "$work/spec.json"
	if [[ -n $id && -n $mounts ]] && ! grep -v '"ro"' <<<"$mounts" | grep -q .; then
		record "$1: driver mounted by the runtime" PASS "OCI spec: $(grep -o '"destination":"[^"]*"' <<<"$mounts" | cut -d'"' -f4 | xargs | tr ' ' ,), bind, ro"
	else
		record "$1: driver mounted by the runtime" FAIL "container '${id:0:12}': no read-only /usr/local/nvidia mounts in its OCI spec: '$mounts'"
	fi
}

t0=$(now)
run "$kubectl" create -n "$NS" -f hack/gpu/cluster/nvidia-smi-job.yaml
if run "$kubectl" wait -n "$NS" --for=condition=Complete job/nvidia-smi --timeout=120s; then
	t_job=$(since "$t0")
	timing "nvidia-smi Job: kubectl create to Complete" "$t_job"
fi
pod=$(pod_of "$NS" job-name=nvidia-smi)
workload_log "nvidia-smi Job: what the webhook changed" $kubectl get pod -n "$NS" "$pod" -o jsonpath='{.metadata.annotations}{"\n"}{.spec.nodeSelector}{"\n"}{.spec.volumes}{"\n"}{.spec.containers[0].volumeMounts}{"\n"}{.spec.containers[0].env}{"\n"}{.spec.containers[0].resources}{"\n"}'
workload_log "kubectl logs job/nvidia-smi" $kubectl logs -n "$NS" job/nvidia-smi
$kubectl logs -n "$NS" job/nvidia-smi >"$work/smi.log" 2>&1
if [[ -n ${t_job:-} ]] && grep -q "$expect_gpu" "$work/smi.log"; then
	record "nvidia-smi Job Completed, GPU in its log" PASS "in ${t_job}s: $(grep -m1 -o "[^|]*$expect_gpu[^|]*" "$work/smi.log" | xargs)"
else
	record "nvidia-smi Job Completed, GPU in its log" FAIL "job not Complete or no '$expect_gpu' in its log"
fi
runtime_spec "nvidia-smi Job's pod" "$NS" "$pod" nvidia-smi

t0=$(now)
run "$kubectl" create -n "$NS" -f hack/gpu/cluster/cuda-pod.yaml
phase=$(wait_phase "$NS" cuda-smoke 'Succeeded|Failed' 120)
t_cuda=$(since "$t0")
workload_log "kubectl logs cuda-smoke" $kubectl logs -n "$NS" cuda-smoke
$kubectl logs -n "$NS" cuda-smoke >"$work/cuda.log" 2>&1
timing "CUDA pod: kubectl create to Succeeded" "$t_cuda"
[[ $phase == Succeeded ]] && grep -Eq "$expect_cuda_ok" "$work/cuda.log" &&
	record "CUDA pod: kernel OK" PASS "Succeeded in ${t_cuda}s, log matches '$expect_cuda_ok'" ||
	record "CUDA pod: kernel OK" FAIL "phase $phase; want Succeeded and '$expect_cuda_ok'"
runtime_spec "CUDA pod" "$NS" cuda-smoke cuda-smoke
runtime_mounts "CUDA pod" "$NS" cuda-smoke

t0=$(now)
run "$kubectl" create -n "$NS" -f hack/gpu/cluster/tensorflow-style.yaml
if run "$kubectl" rollout status -n "$NS" deployment/tensorflow-style --timeout=120s; then
	timing "TensorFlow-style Deployment: create to Available" "$(since "$t0")"
fi
sleep 1
workload_log "kubectl logs deployment/tensorflow-style" $kubectl logs -n "$NS" deployment/tensorflow-style
$kubectl logs -n "$NS" deployment/tensorflow-style >"$work/tf.log" 2>&1
restarts=$($kubectl get pods -n "$NS" -l app=tensorflow-style -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}')
[[ $restarts == 0 ]] && grep -Eq "$expect_cuda_ok" "$work/tf.log" &&
	record "TensorFlow-style Deployment: kernel OK" PASS "Available, 0 restarts, log matches '$expect_cuda_ok'" ||
	record "TensorFlow-style Deployment: kernel OK" FAIL "restarts '$restarts'; want 0 and '$expect_cuda_ok'"
runtime_spec "TensorFlow-style pod" "$NS" "$(pod_of "$NS" app=tensorflow-style)" tensorflow-style
if [[ $runtime == nri ]]; then
	# The plugin logs each injection at -v=1; its pod goes with the helm
	# upgrade below, so its log is kept here.
	workload_log "the NRI plugin's log" $kubectl logs -n "$RELEASE_NS" -l app.kubernetes.io/component=nodeprobe -c nri-plugin --tail=-1
fi

# ---------------------------------------------------------------------------
section "6. negative controls in a namespace that did not opt in"
# The Deployment holds the GPU; the controls that schedule need it back.
run "$kubectl" delete -n "$NS" -f hack/gpu/cluster/tensorflow-style.yaml --wait=true
run "$kubectl" wait -n "$NS" --for=delete pod -l app=tensorflow-style --timeout=60s
run "$kubectl" create -n "$NS_OFF" -f hack/gpu/cluster/nvidia-smi-job.yaml
pending=
for _ in $(seq 60); do
	pod=$(pod_of "$NS_OFF" job-name=nvidia-smi)
	[[ -n $pod ]] && pending=$($kubectl get events -n "$NS_OFF" --field-selector "involvedObject.name=$pod,reason=FailedScheduling" -o jsonpath='{.items[*].message}' 2>/dev/null)
	[[ -n $pending ]] && break
	sleep 0.5
done
phase=$($kubectl get pod -n "$NS_OFF" "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)
workload_log "unlabelled namespace: the same Job" $kubectl get events -n "$NS_OFF" --field-selector "involvedObject.name=$pod"
[[ $phase == Pending && $pending == *"Insufficient alpha.kubernetes.io/nvidia-gpu"* ]] &&
	record "same Job, no opt-in: Pending" PASS "$pending" ||
	record "same Job, no opt-in: Pending" FAIL "phase '$phase', scheduler said '$pending'"

# The resource renamed by hand, no injection: it schedules and runs, without the driver.
sed -e 's/alpha.kubernetes.io\/nvidia-gpu/nvidia.com\/gpu/' -e 's/name: nvidia-smi$/name: nvidia-smi-renamed/' hack/gpu/cluster/nvidia-smi-job.yaml >"$work/renamed-job.yaml"
run "$kubectl" create -n "$NS_OFF" -f "$work/renamed-job.yaml"
run "$kubectl" wait -n "$NS_OFF" --for=condition=Failed job/nvidia-smi-renamed --timeout=90s
pod=$(pod_of "$NS_OFF" job-name=nvidia-smi-renamed)
why=$($kubectl get pod -n "$NS_OFF" "$pod" -o jsonpath='{.status.containerStatuses[0].state.terminated.reason}: {.status.containerStatuses[0].state.terminated.message}' 2>/dev/null)
workload_log "unlabelled namespace: nvidia-smi Job with nvidia.com/gpu by hand" $kubectl get pod -n "$NS_OFF" "$pod" -o jsonpath='{.status.phase} {.status.containerStatuses[0].state}{"\n"}'
vols=$($kubectl get pod -n "$NS_OFF" "$pod" -o jsonpath='{.spec.volumes[*].hostPath.path}')
[[ -z $vols && $why == *nvidia-smi* ]] &&
	record "renamed by hand, no injection: no nvidia-smi" PASS "${why//$'\n'/ }" ||
	record "renamed by hand, no injection: no nvidia-smi" FAIL "hostPath volumes '$vols', container ended '$why'"

sed -e 's/name: cuda-smoke$/name: cuda-smoke-uninjected/' hack/gpu/cluster/cuda-pod.yaml >"$work/cuda-off.yaml"
run "$kubectl" create -n "$NS_OFF" -f "$work/cuda-off.yaml"
phase=$(wait_phase "$NS_OFF" cuda-smoke-uninjected 'Succeeded|Failed' 90)
workload_log "kubectl logs cuda-smoke-uninjected (no opt-in)" $kubectl logs -n "$NS_OFF" cuda-smoke-uninjected
$kubectl logs -n "$NS_OFF" cuda-smoke-uninjected >"$work/cuda-off.log" 2>&1
[[ $phase == Failed ]] && grep -Eq "$expect_cuda_fail" "$work/cuda-off.log" &&
	record "CUDA pod, no injection: no driver" PASS "Failed: $(grep -Em1 "$expect_cuda_fail" "$work/cuda-off.log" | cut -c1-100)" ||
	record "CUDA pod, no injection: no driver" FAIL "phase $phase; want Failed and '$expect_cuda_fail'"

# ---------------------------------------------------------------------------
if [[ $runtime == nri ]]; then
	section "7. the node's decisions: the image's LD_LIBRARY_PATH, its CUDA requirement"
	# Images as users build them: the driverless root with an ENV of their own.
	# app-env needs its own library through the image's LD_LIBRARY_PATH, then
	# runs the CUDA program, which needs the driver's folder appended to it.
	app_root=$work/app-root
	cp -a "$root" "$app_root" && mkdir -p "$app_root/opt/app/lib" &&
		printf 'int app_answer(void) { return 42; }\n' | gcc -O2 -shared -fPIC -o "$app_root/opt/app/lib/libapp.so" -x c - &&
		gcc -O2 -o "$app_root/usr/local/bin/app-env" hack/gpu/csrc/app-env.c -L"$app_root/opt/app/lib" -lapp
	app_built=$?
	# The node's CUDA version as the probe labels it: one major release above
	# it is a need the driver cannot meet, it itself one that it meets.
	cuda=$(label cuda-driver-version)
	too_new="cuda>=$((${cuda%%.*} + 1)).0 brand=tesla,driver>=470,driver<471"
	within="cuda>=$cuda brand=tesla,driver>=470,driver<471"
	APP_IMAGE=gpu-injector.local/app-env-cuda:gpu TOO_NEW_IMAGE=gpu-injector.local/cuda-too-new:gpu WITHIN_IMAGE=gpu-injector.local/cuda-within:gpu
	if [[ $app_built == 0 && $cuda =~ ^[0-9]+\.[0-9]+$ ]] &&
		run bash hack/gpu/root-image.sh "$app_root" "$APP_IMAGE" "$work/images/app-env.tar" LD_LIBRARY_PATH=/opt/app/lib &&
		run bash hack/gpu/root-image.sh "$root" "$TOO_NEW_IMAGE" "$work/images/cuda-too-new.tar" "NVIDIA_REQUIRE_CUDA=$too_new" &&
		run bash hack/gpu/root-image.sh "$root" "$WITHIN_IMAGE" "$work/images/cuda-within.tar" "NVIDIA_REQUIRE_CUDA=$within" &&
		run "$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io images import "$work/images/app-env.tar" &&
		run "$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io images import "$work/images/cuda-too-new.tar" &&
		run "$CTR" --address "$CONTAINERD_SOCKET" --namespace k8s.io images import "$work/images/cuda-within.tar"; then
		record "images with an ENV of their own" PASS "LD_LIBRARY_PATH=/opt/app/lib; NVIDIA_REQUIRE_CUDA '$too_new' and '$within' (node: CUDA $cuda)"
	else
		record "images with an ENV of their own" FAIL "app-env build $app_built, node CUDA '$cuda', or root-image.sh/ctr import failed"
	fi
	# gpu_pod NAME IMAGE [ENV=VALUE] -- CMD...: a GPU pod as a user writes it.
	gpu_pod() {
		local name=$1 image=$2 envs=() c
		shift 2
		while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
		shift
		printf 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n  restartPolicy: Never\n  containers:\n  - name: %s\n    image: %s\n    imagePullPolicy: Never\n    command:\n' "$name" "$name" "$image"
		for c in "$@"; do printf '    - "%s"\n' "$c"; done
		if [[ ${#envs[@]} -gt 0 ]]; then
			printf '    env:\n'
			for c in "${envs[@]}"; do printf '    - name: %s\n      value: "%s"\n' "${c%%=*}" "${c#*=}"; done
		fi
		printf '    resources:\n      limits:\n        nvidia.com/gpu: 1\n'
	}
	# done_pod TITLE NAME: the pod Succeeded with the kernel's line in its log;
	# its GPU is back for the next one.
	done_pod() {
		local phase
		phase=$(wait_phase "$NS" "$2" 'Succeeded|Failed' 120)
		workload_log "kubectl logs $2" $kubectl logs -n "$NS" "$2"
		$kubectl logs -n "$NS" "$2" >"$work/$2.log" 2>&1
		run "$kubectl" delete pod -n "$NS" "$2" --wait=true
		[[ $phase == Succeeded ]] && grep -Eq "$expect_cuda_ok" "$work/$2.log"
	}

	gpu_pod app-env "$APP_IMAGE" -- /usr/local/bin/app-env "/usr/local/bin/$(basename "$prog")" >"$work/app-env.yaml"
	run "$kubectl" create -n "$NS" -f "$work/app-env.yaml"
	spec_env=$($kubectl get pod -n "$NS" app-env -o jsonpath='{.spec.containers[0].env}')
	runtime_spec "image with its own LD_LIBRARY_PATH" "$NS" app-env app-env
	if done_pod "image with its own LD_LIBRARY_PATH" app-env && [[ -z $spec_env ]] &&
		grep -q '^LD_LIBRARY_PATH=/opt/app/lib:/usr/local/nvidia/lib64$' "$work/app-env.log" && grep -q '^libapp: 42$' "$work/app-env.log"; then
		record "image's LD_LIBRARY_PATH kept, driver appended" PASS "no env in the pod spec; $(grep -m1 '^LD_LIBRARY_PATH=' "$work/app-env.log"); libapp and the kernel ran"
	else
		record "image's LD_LIBRARY_PATH kept, driver appended" FAIL "pod spec env '$spec_env'; see workloads.txt for its log"
	fi

	gpu_pod cuda-too-new "$TOO_NEW_IMAGE" -- "/usr/local/bin/$(basename "$prog")" >"$work/too-new.yaml"
	run "$kubectl" create -n "$NS" -f "$work/too-new.yaml"
	why=
	for _ in $(seq 240); do
		why=$($kubectl get pod -n "$NS" cuda-too-new -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}: {.status.containerStatuses[0].state.waiting.message}' 2>/dev/null)
		[[ $why == CreateContainerError:* ]] && break
		sleep 0.5
	done
	workload_log "an image that needs a newer CUDA: the kubelet's reason" $kubectl get pod -n "$NS" cuda-too-new -o jsonpath='{.status.containerStatuses[0].state}{"\n"}'
	run "$kubectl" delete pod -n "$NS" cuda-too-new --wait=true
	if [[ $why == CreateContainerError:* && $why == *NVIDIA_REQUIRE_CUDA* && $why == *"$drv"* && $why == *"CUDA $cuda"* && $why == *cuda-driver-version-number* ]]; then
		record "image needing a newer CUDA: refused" PASS "${why:0:220}"
	else
		record "image needing a newer CUDA: refused" FAIL "want CreateContainerError naming NVIDIA_REQUIRE_CUDA, driver $drv, CUDA $cuda and the label: '${why:0:220}'"
	fi

	gpu_pod cuda-within "$WITHIN_IMAGE" -- "/usr/local/bin/$(basename "$prog")" >"$work/within.yaml"
	run "$kubectl" create -n "$NS" -f "$work/within.yaml"
	done_pod "an image whose CUDA need the driver meets" cuda-within &&
		record "image within the driver's CUDA: runs" PASS "NVIDIA_REQUIRE_CUDA '$within', log matches '$expect_cuda_ok'" ||
		record "image within the driver's CUDA: runs" FAIL "see workloads.txt"

	gpu_pod cuda-disabled "$TOO_NEW_IMAGE" NVIDIA_DISABLE_REQUIRE=true -- "/usr/local/bin/$(basename "$prog")" >"$work/disabled.yaml"
	run "$kubectl" create -n "$NS" -f "$work/disabled.yaml"
	done_pod "the newer-CUDA image with NVIDIA_DISABLE_REQUIRE=true" cuda-disabled &&
		record "NVIDIA_DISABLE_REQUIRE=true: runs" PASS "the check off, as with NVIDIA's toolkit; log matches '$expect_cuda_ok'" ||
		record "NVIDIA_DISABLE_REQUIRE=true: runs" FAIL "see workloads.txt"
fi

# ---------------------------------------------------------------------------
if [[ $runtime == nri ]]; then
	section "8. the plugin turned off: Pod Security refuses the hostPath pod"
	# With no node carrying the plugin's label the webhook falls back to
	# hostPath volumes, which the baseline namespace must refuse at create
	# (docs/runtime-injection.md): the pods above ran there only because the
	# runtime mounted the driver.
	t0=$(now)
	run "$helm" upgrade gpu-injector charts/gpu-injector --namespace "$RELEASE_NS" --reuse-values \
		--set runtimeInjection.enabled=false --wait --timeout 3m
	nri_label=v1
	for _ in $(seq 240); do
		nri_label=$(label nri-plugin)
		[[ -z $nri_label ]] && break
		sleep 0.5
	done
	t_gone=$(since "$t0")
	timing "helm upgrade (plugin off) until the label is gone" "$t_gone"
	# The webhook's hostPath volumes come from the layout of a ready node: the
	# probe pod that replaced the one with the plugin.
	run "$kubectl" rollout status -n "$RELEASE_NS" daemonset -l app.kubernetes.io/component=nodeprobe --timeout=120s
	for _ in $(seq 240); do
		state=$(label state)
		[[ $state == ready ]] && break
		sleep 0.5
	done
	run "$kubectl" get node "$NODE_NAME" --show-labels
	sed -e 's/name: cuda-smoke$/name: cuda-smoke-no-plugin/' hack/gpu/cluster/cuda-pod.yaml >"$work/cuda-no-plugin.yaml"
	run "$kubectl" create -n "$NS" -f "$work/cuda-no-plugin.yaml"
	created=$?
	# The API server's answer, after the webhook's warning that foresaw it.
	refusal=$(grep -o 'is forbidden: .*' "$work/run.out" | head -1)
	[[ -n $refusal ]] || refusal=$(tr '\n' ' ' <"$work/run.out")
	workload_log "plugin off, baseline namespace: kubectl create the CUDA pod" cat "$work/run.out"
	if [[ -n $nri_label ]]; then
		record "plugin off: baseline refuses hostPath pod" FAIL "the Node still has gpu-injector.io/nri-plugin=$nri_label ${t_gone}s after the upgrade"
	elif [[ $created -ne 0 && $refusal == *PodSecurity* && $refusal == *hostPath* ]]; then
		record "plugin off: baseline refuses hostPath pod" PASS "label gone ${t_gone}s after helm upgrade began; ${refusal:0:150}"
	else
		record "plugin off: baseline refuses hostPath pod" FAIL "kubectl create exit $created, want a PodSecurity refusal naming hostPath: ${refusal:0:200}"
		run "$kubectl" get pod -n "$NS" cuda-smoke-no-plugin -o yaml
	fi
fi

summary
if [[ ${KEEP:-} == 1 ]]; then
	echo "KEEP=1: cluster left running; KUBECONFIG=$KUBECONFIG; Ctrl-C to stop" >&2
	wait "$cluster_pid"
fi
grep -q ': PASS,' "$OUT/summary.txt"
