#!/usr/bin/env bash
# By hand (not in CI: CI has no Spack): install gradsync from this checkout with the user's Spack and
# its recipe (cmake/spack/spack_repo/gradsync), then build tests/consumer against that installation
# and run it on 2 ranks, the components the variants ask for required and the others refused.
#   SPACK=/path/to/spack/bin/spack bash tests/spack.sh [variants, e.g. "+hdf5 +fortran"]
# Spack's own configuration (compilers, externals such as a site's Kokkos and MPI) is the user's;
# docs/COMPATIBILITY.md shows the one this ran with. Scratch under ${WORK:-/tmp/gradsync-spack}.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
spack="${SPACK:-spack}"
command -v "$spack" > /dev/null || { echo "spack.sh: no Spack ('$spack'); set SPACK=/path/to/spack/bin/spack"; exit 77; }
variants="${1:-}"
work="${WORK:-/tmp/gradsync-spack}"
repo="$here/cmake/spack/spack_repo/gradsync"

"$spack" repo list | grep -q "$repo" || "$spack" repo add "$repo"
# dev-build builds in the source tree (spack-build-*): give it a copy of the checkout's tracked files,
# uncommitted changes included.
rm -rf "$work" && mkdir -p "$work/src"
(cd "$here" && git ls-files -z | xargs -0 cp --parents -t "$work/src")
spec="gradsync@main $variants dev_path=$work/src"
# An earlier run's installation from the same scratch path would make the spec below ambiguous.
"$spack" uninstall -y --all "gradsync dev_path=$work/src" > /dev/null 2>&1 || true
"$spack" dev-build -d "$work/src" gradsync@main $variants
# What was built, from the installed spec itself (whatever spelling the variants were given in).
IFS='|' read -r prefix built mpi_prefix kokkos_prefix < <("$spack" find --format \
  '{prefix}|{name}@{version}{variants} ^{^mpi.name}@{^mpi.version}|{^mpi.prefix}|{^kokkos.prefix}' "$spec" | tail -1)
echo "spack.sh: installed $built in $prefix"

# The consumer with Spack's MPI launcher and the installation's Kokkos.
mpiexec="$mpi_prefix/bin/mpiexec"
flags="-n 2"
if "$mpiexec" --version 2>&1 | grep -q "Open MPI"; then
  flags="$flags --oversubscribe"
  [[ $(id -u) == 0 ]] && flags="$flags --allow-run-as-root"
fi
kokkos_dir="$(dirname "$(find "$kokkos_prefix" -path '*cmake/Kokkos/KokkosConfig.cmake' -print -quit)")"
have() { [[ "$built" =~ \+$1([~+[:space:]]|$) ]] && echo ON || echo OFF; }  # "+c~cuda+fortran..."
version="$(sed -n 's/^project(GradSync VERSION \([0-9.]*\).*/\1/p' "$here/CMakeLists.txt")"
cd "$work"  # the consumer writes its checkpoint file here
cmake -DPREFIX="$prefix" -DSRC="$here/tests/consumer" -DWORK="$work/consumer" -DMPIEXEC="$mpiexec" \
  "-DMPIEXEC_FLAGS=$flags" -DVERSION="$version" -DHAVE_CUDA="$(have cuda)" -DHAVE_NCCL="$(have nccl)" \
  -DHAVE_C="$(have c)" -DHAVE_FORTRAN="$(have fortran)" -DHAVE_TORCH="$(have torch)" -DHAVE_HDF5="$(have hdf5)" \
  -DKOKKOS_DIR="$kokkos_dir" -DCXX="${CXX:-c++}" -P "$here/tests/consumer/run_consumer.cmake"
echo "spack.sh: consumer passed against $prefix"
