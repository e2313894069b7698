#!/usr/bin/env bash
# Runs every gradsync benchmark and writes docs/BENCHMARKS.md and docs/benchmarks.png:
#   bash tests/bench/run.sh            # about 10 minutes on 2 cores
#   QUICK=1 bash tests/bench/run.sh    # shorter budgets, for a look (noisier)
# Env: BUILD_DIR (default build/), MODELS_DIR (default data/models), BUDGET (seconds per
# measurement block), MAX_MIB (largest size of the byte sweep, default 512), RUNS (runs of the
# models and overlap tables at 2 ranks, default 3; the report keeps the median).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
models="${MODELS_DIR:-$root/data/models}"
[[ -f "$models/resnet50.csv" ]] || { echo "model lists not found: set MODELS_DIR" >&2; exit 1; }
models="$(cd "$models" && pwd)"
if [[ -n "${QUICK:-}" ]]; then budget="${BUDGET:-2}"; max_mib="${MAX_MIB:-64}"; else budget="${BUDGET:-6}"; max_mib="${MAX_MIB:-512}"; fi
py=/usr/bin/python3

# The peers and tools the benchmark compares and plots with (installed when run as root).
bash "$root/cmake/deps.sh" python3-torch gnuplot-nox valgrind
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_WERROR=ON >/dev/null
cmake --build "$build" --target bench_sync -j 2 >/dev/null
bench="$build/tests/bench/bench_sync"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mpi() { local np="$1"; shift; mpirun -np "$np" --oversubscribe "$@"; }

out="$build/bench_results"
rm -rf "$out" && mkdir -p "$out"
csv="$out/results.csv"
: >"$csv"
{
  echo "date:      $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu:       $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "memory:    $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "mpi:       $(ompi_info --version 2>/dev/null | head -1) (vader shared memory, 1 node)"
  echo "kokkos:    $(grep -h 'define KOKKOS_VERSION ' /usr/include/trilinos/KokkosCore_config.h 2>/dev/null | awk '{print $3}' || true) (Serial)"
  echo "torch:     $($py -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)"
  echo "load avg:  $(cut -d' ' -f1-3 /proc/loadavg) at start"
} >"$out/machine.txt"

step() { echo; echo "== $* ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"; }
# The headline table: repeated, report.py keeps the median of the runs.
for run in $(seq "${RUNS:-3}"); do
  step "models, 2 ranks, run $run of ${RUNS:-3}: gradsync, raw chunk sweep, per tensor"
  mpi 2 "$bench" models "$models" "$csv" "$budget"
done
step "PyTorch DDP over gloo, 2 ranks"
if $py -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  $py "$root/tests/bench/ddp_gloo.py" "$models" "$csv" 2 "$budget"
else
  echo "python3-torch with gloo not found: DDP column left empty"
fi
step "chunk size sweep, 2 ranks"
mpi 2 "$bench" chunks "$models" "$csv" "$budget"
# Repeated too: one run's exposed fraction of a 5 ms sync (MobileNetV2) moves by 2x with the load.
for run in $(seq "${RUNS:-3}"); do
  step "overlap with a simulated backward, 2 ranks, run $run of ${RUNS:-3}"
  mpi 2 "$bench" overlap "$models" "$csv" "$budget" 2
done
step "growth: tensor count and bytes, 2 ranks"
mpi 2 "$bench" growth "$csv" "$max_mib" "$((${budget%.*} * 5))"
step "scaling: 1 and 4 ranks (4 oversubscribed on 2 cores)"
mpi 1 "$bench" models "$models" "$csv" "$(awk "BEGIN{print $budget/2}")"
mpi 4 "$bench" models "$models" "$csv" "$(awk "BEGIN{print $budget/2}")"
step "callgrind: host path of 1,000 one-value tensors, 1 rank"
if command -v valgrind >/dev/null; then
  # Two runs, 10 and 30 syncs after the plan build: the difference over 20 is the steady state.
  # The whole call: GradientSync::synchronize() hands the step to impl::StepPipeline, whose names
  # do not match the pattern (callgrind's toggles nest: a nested match would switch collection off).
  declare -A ir
  for reps in 10 30; do
    valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$reps.out" --collect-atstart=no \
      '--toggle-collect=*GradientSync*synchronize*' "$bench" hostpath 1000 "$reps" >"$out/callgrind.log" 2>&1 || true
    ir[$reps]="$(awk '/^(summary|totals):/ {print $2; exit}' "$out/callgrind.$reps.out" 2>/dev/null || true)"
  done
  if [[ -n "${ir[10]}" && -n "${ir[30]}" ]]; then
    per=$(( (ir[30] - ir[10]) / 20 ))
    {
      echo "\`valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=*GradientSync*synchronize*' bench_sync hostpath 1000 N\`"
      echo "for N = 10 and 30 (1 rank, MpiBackend, 1,000 data-parallel tensors of one float each; the first"
      echo "synchronize() builds the plan and is not counted in N):"
      echo
      echo "- instructions in synchronize(): ${ir[10]} (N = 10), ${ir[30]} (N = 30)"
      echo "- **steady state: $per instructions per synchronize(), $(( per / 1000 )) per tensor** (the difference over 20 calls)"
    } >"$out/callgrind.txt"
    cat "$out/callgrind.txt"
  fi
else
  echo "valgrind not installed: no instruction count"
fi
echo "load avg:  $(cut -d' ' -f1-3 /proc/loadavg) at end" >>"$out/machine.txt"

step "report"
$py "$root/tests/bench/report.py" "$csv" "$out" "$root/docs" "$out/machine.txt" "bash tests/bench/run.sh"
