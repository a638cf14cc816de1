#!/usr/bin/env bash
# root-image.sh: pack a root folder (hack/gpu/make-driverless-root.sh's) as a
# one-layer container image in the docker-archive format, which
# `ctr images import` and `docker load` read. Needs only tar and sha256sum, so
# it runs on a GPU machine with no Go and no Docker.
#
#   hack/gpu/root-image.sh ROOT_DIR IMAGE_REF OUT.tar [NAME=VALUE]...
#
# Each NAME=VALUE is one more entry of the image's ENV, after PATH (an image's
# own LD_LIBRARY_PATH, NVIDIA_REQUIRE_CUDA), as a Dockerfile's ENV writes it.
# Files are owned by root, with their modes, sorted, mtime 0: the same root
# gives the same image ID.
set -euo pipefail

[[ $# -ge 3 ]] || { echo "usage: $0 ROOT_DIR IMAGE_REF OUT.tar [NAME=VALUE]..." >&2; exit 2; }
root=$1 ref=$2 out=$3
shift 3
env='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
for e in "$@"; do
	[[ $e == [A-Za-z_]*=* ]] || { echo "root-image: $e is not NAME=VALUE" >&2; exit 2; }
	# JSON string: backslashes and quotes escaped; a control character has no place in ENV.
	[[ $e != *[[:cntrl:]]* ]] || { echo "root-image: $e holds a control character" >&2; exit 2; }
	e=${e//\\/\\\\}
	env+=",\"${e//\"/\\\"}\""
done
[[ -d $root ]] || { echo "root-image: $root is not a folder" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar --sort=name --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$root" -cf "$tmp/layer.tar" .
diff=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
mkdir "$tmp/$diff"
mv "$tmp/layer.tar" "$tmp/$diff/layer.tar"
printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":[%s]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$env" "$diff" >"$tmp/config.json"
cfg=$(sha256sum "$tmp/config.json" | cut -d' ' -f1)
mv "$tmp/config.json" "$tmp/$cfg.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$ref" "$diff" >"$tmp/manifest.json"
mkdir -p "$(dirname "$out")"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$tmp" -cf "$out" manifest.json "$cfg.json" "$diff/layer.tar"
echo "root-image: $out: $ref, layer sha256:$diff ($(du -h "$tmp/$diff/layer.tar" | cut -f1)), config sha256:$cfg" >&2
