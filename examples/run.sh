#!/usr/bin/env bash
# Builds gradsync and runs the flagship example on several ranks.
#   bash examples/run.sh [ranks]      (default 4; ranks beyond the cores are oversubscribed)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
ranks="${1:-4}"
bash "$root/cmake/deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target quickstart
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
exec mpirun -np "$ranks" --oversubscribe "$build/examples/quickstart"
