#!/usr/bin/env bash
# Runs a test against the Slurm test bed (slurm_bed.sh), with SLURM_CONF set to the bed's:
#   slurm_run.sh BED_DIR exec COMMAND [ARGS...]           COMMAND as it is (srun ..., salloc ...)
#   slurm_run.sh BED_DIR sbatch NP MPIRUN PROGRAM [ARGS...]   a batch job of NP tasks, srun and MPIRUN in it
#   slurm_run.sh BED_DIR mismatch NP PROGRAM [ARGS...]    an MPICH program under srun --mpi=pmix
#   slurm_run.sh BED_DIR cancel MODE PMI NP PROGRAM [ARGS...]   a step ended while it syncs
# Exit 77 (ctest: skipped) when the bed is not up, with the reason slurm_bed.sh recorded.
set -euo pipefail
bed="$1" what="$2"
shift 2
if [ ! -f "$bed/bed.env" ]; then
  echo "slurm: SKIP: $(cat "$bed/skip" 2>/dev/null || echo "the test bed is not set up (slurm_bed.sh up $bed)")"
  exit 77
fi
# A test run inside someone's Slurm job must not become a step of that job id in this cluster.
for v in $(compgen -e | grep '^SLURM_' || true); do unset "$v"; done
# shellcheck disable=SC1091
. "$bed/bed.env"
export SLURM_CONF
work="$bed/work"
mkdir -p "$work"

# A batch job (sbatch --wait) of NP tasks that runs PROGRAM twice, as a user's script would:
# srun --mpi=pmix, then Open MPI's mpirun (which takes the allocation's NP slots, no -np). Its
# output file must hold both runs' "check PASSED: NP ranks".
run_sbatch() {
  local np="$1" mpirun="$2" out script rc=0 n
  shift 2
  out="$work/sbatch.$$.out"
  script="$work/sbatch.$$.sh"
  {
    echo "#!/bin/bash"
    echo "#SBATCH --ntasks=$np"
    echo "#SBATCH --time=5"
    echo "#SBATCH --job-name=gsync-sbatch"
    echo "#SBATCH --output=$out"
    echo "set -euo pipefail"
    printf 'srun --mpi=pmix'; printf ' %q' "$@"; echo
    printf '%q' "$mpirun"; printf ' %q' "$@"; echo
  } > "$script"
  rm -f "$out"
  sbatch --wait --quiet "$script" || rc=$?
  echo "--- $out:"
  cat "$out" 2>/dev/null || true
  n=$(grep -c "check PASSED: $np ranks" "$out" 2>/dev/null || true)
  rm -f "$script" "$out"
  [ "$rc" -eq 0 ] && [ "$n" -eq 2 ] || { echo "slurm: FAILED: sbatch exit status $rc, $n of 2 runs passed on $np ranks"; exit 1; }
  echo "slurm: batch job of $np tasks: srun and mpirun both passed"
}

# An MPICH program under --mpi=pmix: srun starts NP processes that never meet (each a 1-rank
# MPI job). Each must say so: gradsync's launcher warning, once per process.
run_mismatch() {
  local np="$1" out warn n_warn n_alone rc=0
  shift
  out="$work/mismatch.$$.out"
  srun --mpi=pmix -n "$np" --time=5 "$@" > "$out" 2>&1 || rc=$?
  cat "$out"
  warn="gradsync: warning: srun started $np processes (SLURM_STEP_NUM_TASKS=$np) but MPI_COMM_WORLD holds 1"
  n_warn=$(grep -cF "$warn" "$out" || true)
  n_alone=$(grep -c "check PASSED: 1 rank " "$out" || true)
  rm -f "$out"
  [ "$n_warn" -eq "$np" ] && [ "$n_alone" -eq "$np" ] ||
    { echo "slurm: FAILED: $n_warn of $np processes warned, $n_alone ran alone (srun exit status $rc)"; exit 1; }
  echo "slurm: $np lone 1-rank processes under srun --mpi=pmix, each warned"
}

# The pids of PROGRAM's processes (by name) that carry this test's mark in their environment.
ranks() {
  local p comm
  for p in /proc/[0-9]*; do
    read -r comm 2>/dev/null < "$p/comm" || continue
    [ "$comm" = "$1" ] || continue
    tr '\0' '\n' 2>/dev/null < "$p/environ" | grep -qx "GSSL_MARK=$GSSL_MARK" && echo "${p#/proc/}"
  done
  return 0
}

# srun --mpi=PMI -n NP PROGRAM ARGS (a training that would run for days) is ended while every rank
# syncs, and every rank must be gone within a deadline, srun too:
#   scancel      scancel JOB.STEP (Slurm's default for a step: SIGKILL to every task)
#   sigterm      scancel --signal=TERM JOB.STEP (SIGTERM only, nothing follows it)
#   time_limit   srun --time=1: Slurm ends it at the limit (SIGTERM, KillWait 5 s, SIGKILL); ranks
#                reniced to 19 once training, so the minute or so it runs costs the tests beside it little
#   rank_killed  kill -9 of one rank; srun must end the others (Open MPI: PMIx; MPICH: -K, below)
run_cancel() {
  local mode="$1" pmi="$2" np="$3" prog out srun_pid name step t0 t_act deadline left=0 rc=0 secs said pids
  shift 3
  prog="$(basename "$1")"
  GSSL_MARK="$$-$RANDOM"
  export GSSL_MARK
  name="gsync-cancel-$GSSL_MARK"
  out="$work/cancel.$GSSL_MARK.out"
  local opts=(--mpi="$pmi" -n "$np" --job-name="$name" --time=5) pre=(stdbuf -oL)
  case "$mode" in
    scancel | sigterm) ;;
    time_limit) opts=(--mpi="$pmi" -n "$np" --job-name="$name" --time=1) ;;
    # MPICH's PMI-2 does not end a step when one task dies; without -K (--kill-on-bad-exit) the
    # others wait in MPI for ever, or in gradsync until stall_timeout (docs/SLURM.md).
    rank_killed) [ "$pmi" = pmi2 ] && opts+=(--kill-on-bad-exit=1) ;;
    *) echo "slurm_run.sh: unknown cancel mode $mode" >&2; exit 2 ;;
  esac
  # A failure says why and leaves nothing of this test running.
  failed() {
    cat "$out"
    echo "slurm: FAILED: $*"
    scancel --quiet --name="$name" || true
    sleep 2
    local p
    for p in $(ranks "$prog"); do kill -9 "$p" 2>/dev/null || true; done
    kill -9 "$srun_pid" 2>/dev/null || true
    rm -f "$out"
    exit 1
  }
  t0=$(date +%s)
  srun "${opts[@]}" "${pre[@]}" "$@" > "$out" 2>&1 &
  srun_pid=$!
  # Training: its first step done (the "step 0" line: one sync behind it), all NP ranks present.
  until grep -qE '^step +[0-9]+ ' "$out" && [ "$(ranks "$prog" | wc -l)" -eq "$np" ]; do
    kill -0 "$srun_pid" 2>/dev/null || failed "srun ended before its step was training"
    [ "$(date +%s)" -lt $((t0 + 60)) ] || failed "the step was not training within 60 s"
    sleep 0.1
  done
  step="$(squeue -h -s --name="$name" -o %i | head -1)"
  [ -n "$step" ] || failed "squeue does not show the step of job $name"
  echo "slurm: step $step: $np ranks training ($(grep -E '^step' "$out" | tail -1 | awk '{print "step", $2}')); ending it: $mode"
  t_act=$(date +%s.%N)
  deadline=$(($(date +%s) + 30))
  case "$mode" in
    scancel) scancel "$step" ;;
    sigterm) scancel --signal=TERM "$step" ;;
    # The limit (60 s), slurmctld's check every 30 s, KillWait. Meanwhile the ranks yield to
    # the tests beside this one.
    time_limit)
      deadline=$((t0 + 120))
      mapfile -t pids < <(ranks "$prog")
      renice -n 19 -p "${pids[@]}" >/dev/null
      ;;
    rank_killed) kill -9 "$(ranks "$prog" | tail -1)" ;;
  esac
  while :; do
    left="$(ranks "$prog" | wc -l)"
    if [ "$left" -eq 0 ] && ! kill -0 "$srun_pid" 2>/dev/null; then break; fi
    [ "$(date +%s)" -lt "$deadline" ] || break
    sleep 0.1
  done
  secs=$(awk -v a="$t_act" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$left" -ne 0 ] || kill -0 "$srun_pid" 2>/dev/null; then
    failed "$secs s after '$mode': $left of $np ranks still running$(kill -0 "$srun_pid" 2>/dev/null && echo ", srun too")"
  fi
  wait "$srun_pid" || rc=$?
  [ "$rc" -ne 0 ] || failed "srun exited 0, as if the step had not been ended"
  # Ended as meant, not by something else on the way.
  case "$mode" in
    scancel | sigterm) said="STEP $step ON .* CANCELLED AT" ;;
    time_limit) said="CANCELLED AT .* DUE TO TIME LIMIT" ;;
    rank_killed) said="task [0-9]+: Killed" ;;
  esac
  grep -qE "$said" "$out" || failed "srun's output does not say /$said/"
  tail -n 4 "$out"
  rm -f "$out"
  echo "slurm: '$mode': every rank and srun (exit status $rc) gone $secs s after it (the step ran $(($(date +%s) - t0)) s)"
}

case "$what" in
  exec) exec "$@" ;;
  sbatch) run_sbatch "$@" ;;
  mismatch) run_mismatch "$@" ;;
  cancel) run_cancel "$@" ;;
  *) echo "usage: slurm_run.sh BED_DIR exec|sbatch|mismatch|cancel ..." >&2; exit 2 ;;
esac
