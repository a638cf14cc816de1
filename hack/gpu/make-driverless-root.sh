#!/usr/bin/env bash
# make-driverless-root.sh: build a minimal container root folder from this
# host's glibc for the given programs, with no file of the NVIDIA driver in it.
#
#   hack/gpu/make-driverless-root.sh [--libs-for PROGRAM]... OUT_DIR PROGRAM...
#
# The root holds: each PROGRAM at /usr/local/bin/NAME; every library ldd
# resolves for it; the host's glibc libraries and dynamic loader; /usr/bin/env;
# empty /proc /dev /sys /tmp /etc; and Ubuntu's merged-/usr links (/lib ->
# usr/lib, ...). It is what a driverless image is: the application and its
# libc, nothing of the driver, which gpu-injector must bring.
#
# --libs-for PROGRAM copies the non-driver libraries PROGRAM needs without the
# program itself: for the driver's own tools (nvidia-smi), which arrive by a
# mount but still need the image's libc.
#
# A PROGRAM whose libraries resolve to a driver file (libcuda, libnvidia-*) is
# refused: it would smuggle the driver into the root. The last step checks
# that no path in the root names nvidia or libcuda, and fails otherwise.
set -euo pipefail

usage() {
	echo "usage: $0 [--libs-for PROGRAM]... OUT_DIR PROGRAM..." >&2
	exit 2
}

libs_for=()
while [[ $# -gt 0 ]]; do
	case "$1" in
	--libs-for)
		[[ $# -ge 2 ]] || usage
		libs_for+=("$2")
		shift 2
		;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) echo "unknown flag $1" >&2; usage ;;
	*) break ;;
	esac
done
[[ $# -ge 2 ]] || usage
out=$1
shift

die() {
	echo "make-driverless-root: $*" >&2
	exit 1
}

# is_driver_file says whether a library belongs to the NVIDIA driver: these
# must come from the node, never from the image.
is_driver_file() {
	case "$(basename "$1")" in
	libcuda.so* | libcudadebugger.so* | libnvidia* | libnvcuvid.so* | libnvoptix.so* | libGLX_nvidia* | libEGL_nvidia* | libGLESv*_nvidia*) return 0 ;;
	esac
	return 1
}

# resolve_program prints the absolute path of a program given by path or name.
resolve_program() {
	local p=$1
	if [[ $p != */* ]]; then
		p=$(type -P "$p") || die "program $1 not found in PATH"
	fi
	[[ -f $p && -x $p ]] || die "program $p is not an executable file"
	readlink -f "$p"
}

# libs_of prints the absolute paths of the libraries and loader ldd resolves
# for a program, and "NOTFOUND name" for each it cannot; a static program has none.
libs_of() {
	local prog=$1 out_ldd
	if ! out_ldd=$(LC_ALL=C ldd "$prog" 2>&1); then
		if grep -q 'not a dynamic executable' <<<"$out_ldd"; then
			return 0
		fi
		die "ldd $prog failed: $out_ldd"
	fi
	# "name => /path (0x..)", "name => not found" and "/lib64/ld-linux-x86-64.so.2 (0x..)"
	awk '$2 == "=>" && $3 == "not" { print "NOTFOUND " $1; next }
		$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out_ldd"
}

# copy_in copies a host file to the same path in the root, dereferenced, through
# the root's merged-/usr links.
copy_in() {
	local src=$1 dst=$out$2
	mkdir -p "$(dirname "$dst")"
	cp -L --preserve=mode "$src" "$dst"
}

if [[ -e $out ]] && [[ -n "$(ls -A "$out")" ]]; then
	die "$out exists and is not empty"
fi
mkdir -p "$out"
out=$(readlink -f "$out")

# Ubuntu 24.04's layout: /bin, /sbin, /lib, /lib64 are links into /usr.
mkdir -p "$out"/usr/{bin,sbin,lib,lib64,local/bin} "$out"/{proc,dev,sys,etc,root}
for d in bin sbin lib lib64; do
	ln -s "usr/$d" "$out/$d"
done
mkdir -m 1777 "$out/tmp"

declare -A libs=()
add_libs() {
	local prog=$1 strict=$2 lib
	while IFS= read -r lib; do
		[[ -n $lib ]] || continue
		if [[ $lib == NOTFOUND* ]]; then
			if [[ $strict == strict ]]; then
				die "ldd cannot find ${lib#NOTFOUND } for $prog"
			fi
			echo "make-driverless-root: ldd cannot find ${lib#NOTFOUND } for $prog; skipped (a driver library comes with the mount)" >&2
			continue
		fi
		if is_driver_file "$lib"; then
			if [[ $strict == strict ]]; then
				die "$prog links $lib, a file of the NVIDIA driver: a driverless image must not carry it"
			fi
			echo "make-driverless-root: skipping driver library $lib of $prog (it comes with the mount)" >&2
			continue
		fi
		libs[$lib]=1
	done < <(libs_of "$prog")
}

for p in "$@"; do
	path=$(resolve_program "$p")
	add_libs "$path" strict
	copy_in "$path" "/usr/local/bin/$(basename "$p")"
	echo "make-driverless-root: program /usr/local/bin/$(basename "$p") <- $path" >&2
done
for p in "${libs_for[@]}"; do
	add_libs "$(resolve_program "$p")" lenient
done

envpath=$(resolve_program env)
add_libs "$envpath" strict
copy_in "$envpath" /usr/bin/env

# The rest of glibc, beside libc.so.6: programs that arrive by mount (the
# driver's tools) link some of these, and an image has them all.
libc=$(LC_ALL=C ldd "$envpath" | awk '$1 == "libc.so.6" { print $3 }')
[[ -n $libc ]] || die "cannot find libc.so.6 with ldd $envpath"
libdir=$(dirname "$libc")
for name in libc.so.6 libm.so.6 libmvec.so.1 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 libnss_files.so.2 libnss_dns.so.2 libgcc_s.so.1; do
	if [[ -e $libdir/$name ]]; then
		libs[$libdir/$name]=1
	fi
done

for lib in "${!libs[@]}"; do
	copy_in "$lib" "$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$out/etc/passwd"
printf 'root:x:0:\n' >"$out/etc/group"

# The check the driverless image stands on: nothing of the driver in the root.
if leaks=$(cd "$out" && find . | grep -Ei 'nvidia|libcuda'); then
	die "the root holds NVIDIA driver files:"$'\n'"$leaks"
fi
echo "make-driverless-root: $out: $(cd "$out" && find . -type f | wc -l) files, $(du -sh "$out" | cut -f1); no path matches nvidia|libcuda" >&2
