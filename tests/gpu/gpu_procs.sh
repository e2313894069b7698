#!/usr/bin/env bash
# How many test processes may share this machine's GPU at once: prints that number, for ctest -j.
#   bash tests/gpu/gpu_procs.sh BUILD_DIR [MAX]      # MAX: the most to allow (default: nproc)
# Without MPS, kernels of different processes (CUDA contexts) never run together: a small launch and
# its wait can take every other busy process's turn on the GPU. The first H200 run gave ctest 16
# processes and its two programs with the most launches timed out at 1.3-1.8 ms a launch
# (docs/GPU.md). So this runs BUILD_DIR/tests/cuda/gpu_launch_latency alone and as 4, 8 and 16 copies
# in step (about 25 s), and answers the most of 16 and 8 whose median launch and wait costs at most
# 10 times a lone process's, else 4 (fewer would not finish the suite within one device call).
# ctest -j counts every MPI test's ranks (PROCESSORS), so it bounds the processes on the GPU.
# The medians, by copies and phase, go to stderr and to BUILD_DIR/latency.txt. Without a GPU or the
# program it prints MAX and measures nothing.
set -uo pipefail
build="$1"
max="${2:-$(nproc)}"
bin="$build/tests/cuda/gpu_launch_latency"

latency() {  # $1: copies; prints "phase median_us ..." for the phases that ran
  local k=$1 start i p
  start=$(($(date +%s) + 3 + k / 4))  # after every copy's CUDA and Kokkos start
  for i in $(seq "$k"); do "$bin" --seconds 1 --start-at "$start" >"$build/latency.$k.$i" 2>&1 & done
  wait
  for p in cuda kokkos-range kokkos-team kokkos-copy1; do
    grep -h "^latency $p " "$build"/latency."$k".* | awk '{print $4}' | sort -n |
      awk -v p="$p" '{a[NR] = $1} END {if (NR) printf "%s %s ", p, a[int((NR + 1) / 2)]}'
  done
}
us_of() { echo "$1" | awk '{for (i = 1; i < NF; i += 2) if ($i == "cuda") print $(i + 1)}'; }

rm -f "$build"/latency.*
table=""
declare -A lat
if [ -x "$bin" ]; then
  for k in 1 4 8 16; do
    lat[$k]=$(latency "$k")
    if [ -z "${lat[1]}" ]; then
      table="not measured: $(head -c 200 "$build/latency.1.1")"
      break
    fi
    table+="$k: ${lat[$k]}; "
  done
else
  table="not measured: no $bin"
fi
echo "$table" >"$build/latency.txt"
echo "== launch+wait, median us per phase, by processes on the GPU: $table" >&2

procs=$max
alone=$(us_of "${lat[1]:-}")
if [ -n "$alone" ]; then
  procs=4
  for k in 8 16; do
    m=$(us_of "${lat[$k]:-}")
    if [ -n "$m" ] && awk -v m="$m" -v a="$alone" 'BEGIN {exit !(m <= 10 * a)}'; then procs=$k; else break; fi
  done
  [ "$procs" -gt "$max" ] && procs=$max
fi
echo "$procs"
