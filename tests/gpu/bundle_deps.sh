#!/usr/bin/env bash
# Downloads the Debian 12 packages gradsync's build and tests need (Kokkos 3.4, Open MPI 4.1,
# doctest, and their libraries) into a folder, for a GPU machine that has CUDA and a C++ compiler
# but no package mirror. tests/gpu/run.sh unpacks them there into its build folder, without root.
#   bash tests/gpu/bundle_deps.sh [folder]      # default: .gpu-deps/ in the repository (git-ignored)
#   KOKKOS_ROOT=<your Kokkos-CUDA install> bash tests/gpu/bundle_deps.sh    # copies it along as kokkos/
# The toolchain and base system (gcc, glibc, libstdc++, perl, ...) are left out: every CUDA machine
# has them, and at unpack time run.sh also drops any library the machine already has.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$root/.gpu-deps}"
top=(doctest-dev libtrilinos-kokkos-dev libtrilinos-kokkos-13.2 trilinos-dev
     libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common)
skip='^(gcc|g\+\+|cpp|libgcc|libstdc\+\+|libc6|libc-dev|linux-libc|gfortran|libgfortran|flang|libflang|libllvm'
skip+='|libclang|libmlir|perl|libperl|binutils|libbinutils|libctf|libgprofng|autoconf|automake|autotools|m4$|dpkg'
skip+='|tar$|debconf|cdebconf|adduser|passwd|libpam|debianutils|install-info|openssh|libasan|libtsan|liblsan'
skip+='|libubsan|libitm|libquadmath|libatomic|libcc1|libisl|libmpc|libmpfr|libgmp|libz3|libicu|libxml2|libjs-'
skip+='|libssl|libkrb|libgss|libk5|libcom-err|libkeyutils|libselinux|libsemanage|libsepol|libaudit|libcap'
skip+='|libcrypt|libdb5|libgdbm|readline|libreadline|libtinfo|libedit|libbz2|liblzma|libzstd|zlib|libpcre|libffi'
skip+='|libuuid|libnsl|libtirpc|rpcsvc|libnewt|libslang|libtextwrap|libdebian|libfido|libcbor|libjansson|libgomp)'
pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
         --no-enhances "${top[@]}" | grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$skip")
mkdir -p "$out"
cd "$out"
# shellcheck disable=SC2086
apt-get download $pkgs >/dev/null
# A Kokkos install with its CUDA backend, built by the user (KOKKOS_ROOT), goes along as kokkos/:
# tests/gpu/run.sh then builds the whole suite on it, so every default View is a device View.
if [ -n "${KOKKOS_ROOT:-}" ]; then
  compgen -G "$KOKKOS_ROOT/lib*/cmake/Kokkos" >/dev/null || { echo "no Kokkos install in KOKKOS_ROOT=$KOKKOS_ROOT" >&2; exit 1; }
  rm -rf "$out/kokkos" && cp -a "$KOKKOS_ROOT" "$out/kokkos"
fi
echo "gradsync: $(ls ./*.deb | wc -l) packages${KOKKOS_ROOT:+ and Kokkos from $KOKKOS_ROOT}, $(du -sh . | cut -f1) in $out"
