#!/usr/bin/env bash
# Builds gradsync and runs the flagship example, hybrid_dlrm, on several ranks: first the proof that
# n ranks train exactly the single-process model (--check), then a short training run.
#   bash examples/run.sh [ranks] [extra hybrid_dlrm options for the training run]
# (default 4 ranks; ranks beyond the cores are oversubscribed)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
ranks="${1:-4}"
shift || true
bash "$root/cmake/deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target hybrid_dlrm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
# The launcher CMake found, with Open MPI's flag for more ranks than cores (MPICH's Hydra needs none
# and refuses it).
launcher="$(sed -n 's/^GRADSYNC_MPIEXEC:STRING=//p' "$build/CMakeCache.txt")"
launcher="${launcher:-mpirun}"
flags=()
if "$launcher" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then flags=(--oversubscribe); fi
run() { "$launcher" -np "$ranks" "${flags[@]}" "$build/examples/hybrid_dlrm" "$@"; }
echo "== $ranks ranks vs 1 process: the same gradients and parameters, to 1e-10 =="
run --check
echo
echo "== the same check without the 1/world_size scale on the tables: it must fail by a factor $ranks =="
if run --check --table-scale none --steps 1 2>/dev/null; then
  [ "$ranks" -eq 1 ] || { echo "unexpected: the unscaled tables passed" >&2; exit 1; }
fi
echo
echo "== training =="
run --steps 200 --log-every 20 "$@"
