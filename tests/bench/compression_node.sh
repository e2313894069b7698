#!/usr/bin/env bash
# Wire compression on one node (issue 19): gradsync fp32 / bf16 / fp16 in one interleaved run
# (bench_sync compression), beside Horovod 0.28.1 (fp32, and its fp16 compression: a cast to half
# before the allreduce and back after) and PyTorch DDP over gloo (fp32, fp16_compress_hook,
# bf16_compress_hook) on the same models' gradient shapes. Appends the rows to OUT (CSV, as run.sh's)
# and prints them; a peer that refuses a format prints its error instead of a row.
#   bash tests/bench/compression_node.sh [OUT]
# Env: BUILD_DIR (default build/), MODELS_DIR, RANKS (default "2 4"), MODELS (name filters, default
# "ResNet ViT"), BUDGET (seconds for gradsync's methods per model, default 20; each peer run gets a third),
# NO_PEERS=1 (gradsync only).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
models="${MODELS_DIR:-$root/data/models}"
out="${1:-$build/compression_node.csv}"
budget="${BUDGET:-20}"
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
peer_budget=$(( ${budget%.*} / 3 > 2 ? ${budget%.*} / 3 : 2 ))
echo "load avg $(cut -d' ' -f1-3 /proc/loadavg) at start ($(date -u +%T) UTC)"
for np in ${RANKS:-2 4}; do
  for m in ${MODELS:-ResNet ViT}; do
    echo "== $m, $np ranks (load $(cut -d' ' -f1 /proc/loadavg))"
    mpirun -np "$np" --oversubscribe "$build/tests/bench/bench_sync" compression "$models" "$out" "$budget" "$m"
    [[ -n "${NO_PEERS:-}" ]] && continue
    if $py -c 'import horovod.torch' 2>/dev/null; then
      for f in "" --fp16; do
        HOROVOD_FUSION_THRESHOLD=$((4 << 20)) mpirun -np "$np" --oversubscribe \
          $py "$root/tests/bench/horovod_bench.py" "$models" "$out" compression "$peer_budget" "--only=$m" $f ||
          echo "horovod${f:+ $f} failed"
      done
    else
      echo "horovod not installed (tests/bench/multihost.sh installs 0.28.1): no Horovod rows"
    fi
    for h in "" --hook=fp16 --hook=bf16; do
      # PyTorch 1.13's bf16 hook refuses CPU tensors ("required CUDA 11+ and NCCL 2.10+"): its error
      # is the row's place, the script goes on.
      $py "$root/tests/bench/ddp_gloo.py" "$models" "$out" "$np" "$peer_budget" compression "$m" $h 2>&1 |
        grep -E "DDP|Error" | tail -1 || true
    done
  done
done
echo "load avg $(cut -d' ' -f1-3 /proc/loadavg) at end ($(date -u +%T) UTC)"
