#!/usr/bin/env bash
# Builds gradsync and runs the whole test suite under ctest (real MPI ranks, 1 to 4).
#   bash tests/run.sh               # Release build in build/
#   BUILD_DIR=... JOBS=... bash tests/run.sh
#   KOKKOS_ROOT=<a Kokkos 4.x install> bash tests/run.sh     # OpenMP: also set OMP_NUM_THREADS
# With a Kokkos-CUDA install on a GPU machine, ctest's parallelism is what tests/gpu/gpu_procs.sh
# measures the GPU to bear (the test processes share it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
jobs="${JOBS:-$(nproc)}"
bash "$root/cmake/deps.sh"
# KOKKOS_ROOT: your own Kokkos install instead of Debian's 3.4. One with CUDA is used through its
# nvcc_wrapper, for the architecture it was built for (CMake's compiler check needs it named).
kokkos=()
if [ -n "${KOKKOS_ROOT:-}" ]; then
  kokkos+=(-DKokkos_ROOT="$KOKKOS_ROOT")
  arch=$(sed -n 's/^ *set(Kokkos_CUDA_ARCHITECTURES \([0-9]*\)).*/\1/p' "$KOKKOS_ROOT"/lib*/cmake/Kokkos/KokkosConfigCommon.cmake 2>/dev/null | head -1)
  [ -n "$arch" ] && [ -x "$KOKKOS_ROOT/bin/nvcc_wrapper" ] &&
    kokkos+=(-DCMAKE_CXX_COMPILER="$KOKKOS_ROOT/bin/nvcc_wrapper" -DCMAKE_CXX_FLAGS="-arch=sm_$arch" -DCMAKE_CUDA_ARCHITECTURES="$arch")
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DGRADSYNC_WERROR=ON "${kokkos[@]}" ${CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
# With Kokkos' CUDA backend every test process holds a context on the GPU; without MPS they take
# turns, so ctest runs as many at once as tests/gpu/gpu_procs.sh measures the GPU to bear.
test_jobs=$jobs
if [ -n "${arch:-}" ] && nvidia-smi -L >/dev/null 2>&1; then
  test_jobs=$(bash "$root/tests/gpu/gpu_procs.sh" "$build" "$jobs")
fi
cd "$build"
ctest -j "$test_jobs" --output-on-failure --timeout 600 ${CTEST_ARGS:-}
