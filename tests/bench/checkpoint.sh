#!/usr/bin/env bash
# Checkpoint throughput (issue 33): bench_checkpoint (gradsync::save_checkpoint of the DLRM example's
# state against raw MPI-IO of the same bytes) at 1, 2 and 4 ranks; prints each run and then the rows
# of docs/BENCHMARKS.md's checkpoint table. Needs a build with GradSync::hdf5 (libhdf5-openmpi-dev).
# About a minute here; writes and deletes files of about 320 MiB.
#   bash tests/bench/checkpoint.sh
# Env: BUILD_DIR (default build/), DIR (where the files go; default the bench's, under the build tree),
# REPS (default 5), RANKS (default "1 2 4"), ARGS (more bench_checkpoint arguments: --fsync, --rows N).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
cmake --build "$build" --target bench_checkpoint >/dev/null
exe="$build/tests/bench/bench_checkpoint"
dir="${DIR:-$build/tests/bench/checkpoint_bench}"
mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
launcher="${MPIEXEC:-mpirun}"
flags=()
if "$launcher" --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then flags=(--oversubscribe); fi
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "file system of $dir (df -T):"
df -T "$dir" | tail -n 1
rows=()
for np in ${RANKS:-1 2 4}; do
  # shellcheck disable=SC2086  # ARGS: words on purpose
  out="$("$launcher" -np "$np" "${flags[@]}" "$exe" --dir "$dir" --reps "${REPS:-5}" --parts ${ARGS:-})"
  echo "$out"
  rows+=("$(grep '^| ' <<<"$out")")
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at end"
echo
echo "| ranks | MiB | gradsync MiB/s | raw MPI-IO (write_at_all) MiB/s | gradsync / raw | raw independent (write_at) MiB/s | gradsync / raw independent | every rank its whole copy MiB/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
