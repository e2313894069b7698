#!/usr/bin/env bash
# A subset of the suite built in C++20 (build-cxx20/), against the Kokkos CMake finds (Debian's 3.4
# in CI) or KOKKOS_ROOT: the core sync, the step API, checkpoints (parallel HDF5), the flagship's
# check, the .cu test (nvcc in C++20 where CUDA is found) and the installed package's consumer,
# itself compiled in C++20. The whole suite in C++20 is a by-hand run (docs/COMPATIBILITY.md).
#   bash tests/cxx20.sh
#   KOKKOS_ROOT=<a Kokkos built in C++20> BUILD_DIR=... bash tests/cxx20.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-cxx20}"
bash "$root/cmake/deps.sh"
kokkos=()
[ -n "${KOKKOS_ROOT:-}" ] && kokkos+=(-DKokkos_ROOT="$KOKKOS_ROOT")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20 -DGRADSYNC_WERROR=ON \
  -DGRADSYNC_BUILD_BENCHMARKS=OFF "${kokkos[@]}" >/dev/null
targets=(test_gradient_sync test_step test_checkpoint hybrid_dlrm)
# The install test installs what was built: the compiled C interface and Fortran module, when configured.
have="$(cmake --build "$build" --target help)"
for t in gradsync_c gradsync_fortran test_gpu_sync; do
  grep -q -w "$t" <<<"$have" && targets+=("$t")
done
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
cd "$build"
ctest -R '^((gradient_sync|step|checkpoint)\.np|example_dlrm_(check|uneven)\.np|gpu_sync\.np|install_and_consume$)' \
  --timeout 300 --output-on-failure
