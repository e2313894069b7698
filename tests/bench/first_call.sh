#!/usr/bin/env bash
# Measures the one-time costs of a sync's first call (plan build, huge-page move, auto-tuning) and
# what prepare() moves ahead of training, at 2 ranks; writes tests/bench/first_call.md, which
# docs/BENCHMARKS.md includes (tests/bench/report.py). About 5 minutes and 10 GiB of memory here.
#   bash tests/bench/first_call.sh
# Env: BUILD_DIR (default build/), MODELS_DIR (default data/models), REPS (default 5), COPIES (copies
# of ViT-B/16 in the multi-GB model, default 12, 3.9 GiB), BIG_REPS (its repetitions, default 3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
models="${MODELS_DIR:-$root/data/models}"
bash "$root/cmake/deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_WERROR=ON >/dev/null
cmake --build "$build" --target bench_first_call -j 2 >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
load0="$(cut -d' ' -f1-3 /proc/loadavg)"
table="$(mpirun -np 2 --oversubscribe "$build/tests/bench/bench_first_call" "$models" "${REPS:-5}" "${COPIES:-12}" "${BIG_REPS:-3}")"
cmd="bash tests/bench/first_call.sh"
[[ -n "${REPS:-}${COPIES:-}${BIG_REPS:-}" ]] && cmd="REPS=${REPS:-5} COPIES=${COPIES:-12} BIG_REPS=${BIG_REPS:-3} $cmd"
{
  echo "## First-call costs and prepare(), 2 ranks"
  echo
  echo "\`$cmd\` ($(date -u '+%Y-%m-%d %H:%M UTC'), load $load0 at start, $(cut -d' ' -f1-3 /proc/loadavg) at end;"
  echo "median of ${REPS:-5} repetitions, ${BIG_REPS:-3} for the multi-GB model; float gradients, one allocation each, written"
  echo "once before the sync as backward leaves them; times of the slowest rank):"
  echo
  echo "$table"
  echo
  echo "*First-call overhead* is the first \`synchronize()\` minus a steady one: the consistency check, the"
  echo "plan build, the buffers and the move of the gradients onto 2 MiB pages (\`Options::tuning.huge_pages\`)."
  echo "\`prepare()\` pays the same before training (the *huge-page move* is \`prepare()\` minus \`prepare()\`"
  echo "with \`huge_pages = false\`, on other fresh gradients), after which the first \`synchronize()\` is a"
  echo "steady one. \`fusion_threshold_auto\` times 5 chunk sizes for 4 steps each: those steps are real,"
  echo "exact synchronizations, and the *tuning excess* is their time minus as many steps at the chosen"
  echo "size. \`prepare()\` cannot pay it (it needs the real exchange); set \`GRADSYNC_FUSION_THRESHOLD\` to"
  echo "the size chosen once to skip it."
} >"$root/tests/bench/first_call.md"
cat "$root/tests/bench/first_call.md"
