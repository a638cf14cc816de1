#!/bin/sh
# A -toolexec wrapper for building fuzz targets: go test -fuzz compiles every
# package of the test binary with coverage counters (-d=libfuzzer), and the
# fuzzing worker clears and compares all of them around each execution. The
# Kubernetes API types, client libraries and JSON codecs hold far more
# counters than this module's own code, so the targets that link them spent
# most of each execution on counters of code they are not about. This keeps
# the counters in the packages whose path starts with $FUZZMODULE only.
tool=$1
shift
case ${tool##*/} in
compile) ;;
*) exec "$tool" "$@" ;;
esac
if [ "$1" = -V=full ]; then
	# The go command keys its build cache on this line: packages built
	# with every counter must not be taken for these, nor these for them.
	echo "$("$tool" "$@") X:fuzzmodule"
	exit
fi
pkg=
prev=
for a in "$@"; do
	[ "$prev" = -p ] && pkg=$a
	prev=$a
done
case $pkg in
"$FUZZMODULE" | "$FUZZMODULE"/*) exec "$tool" "$@" ;;
esac
for a in "$@"; do
	shift
	[ "$a" = -d=libfuzzer ] || set -- "$@" "$a"
done
exec "$tool" "$@"
