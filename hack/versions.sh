# Sourced by the scripts of hack/: the tools' versions from e2e/cluster/versions.env
# (a variable already set in the environment wins, as KUBERNETES_VERSION does in
# `make e2e K8S_VERSION=v1.33.13`), exported so that the Go tests see the same ones,
# and GPU_INJECTOR_CACHE_DIR, where hack/tools.sh builds them.
_versions_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/e2e/cluster/versions.env"
while IFS='=' read -r _name _value; do
	[[ ${_name} =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
	[[ -n ${!_name:-} ]] || printf -v "${_name}" '%s' "${_value}"
	# Every tool names a release v1.37.2, never 1.37.2: a bare number fails later and obscurely.
	if [[ ! ${!_name} =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "${_name}=${!_name} is not a release such as v1.37.2 (from the environment or ${_versions_file})" >&2
		exit 2
	fi
	export "${_name?}"
done <"${_versions_file}"
unset _name _value _versions_file
GPU_INJECTOR_CACHE_DIR="${GPU_INJECTOR_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/gpu-injector}"
