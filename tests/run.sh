#!/usr/bin/env bash
# Builds gradsync and runs the whole test suite under ctest (real MPI ranks, 1 to 4).
#   bash tests/run.sh               # Release build in build/
#   BUILD_DIR=... JOBS=... bash tests/run.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
jobs="${JOBS:-$(nproc)}"
bash "$root/cmake/deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" -DGRADSYNC_WERROR=ON ${CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
cd "$build"
ctest -j "$jobs" --output-on-failure --timeout 600 ${CTEST_ARGS:-}
