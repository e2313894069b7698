#!/usr/bin/env bash
# gradsync's sync under SimGrid's SMPI (docs/SCALING.md). The program (sim_sync, built by CMake with
# smpicxx where SimGrid is installed) is gradsync's own code on simulated ranks of a fat-tree.
#
#   sim.sh run SIM_SYNC HOSTS GBPS MODEL [RANKS_PER_HOST [sim_sync args after the model...]]
#       one simulation; prints sim_sync's RESULT line and the ring's alpha-beta bound
#   sim.sh machine SIM_SYNC RANKS MODEL [sim_sync args after the model...]
#       the same on this_machine.xml, the platform fitted to this 2-core machine's shared memory (a
#       one-way ping-pong, pingpong.c, within 4% from 8 B to 64 MiB), RANKS <= 4
#   sim.sh smoke SIM_SYNC MODELS_DIR
#       ctest's `simulation` smoke: ResNet-50 on 16 simulated ranks, blocking; the simulated sync must
#       lie between the ring's alpha-beta bound and 3x it (exit 77 where SimGrid is not installed)
#
# Simulation settings (why, in docs/SCALING.md): computation not simulated, MPI_Test and MPI_Iprobe
# 0.1 us each and not growing, a 256 MiB shared-malloc block (one mapping per rank's tensors), local
# shared malloc (the global one backs every rank with a file in /tmp: its page faults took 61% of
# the wall time at 256 ranks where /tmp is on disk; the same simulated times).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode=${1:?usage: sim.sh run|smoke ...}
shift

if ! command -v smpirun >/dev/null; then
  echo "sim.sh: skipped: SimGrid's smpirun is not installed (apt-get install libsimgrid-dev)"
  exit 77
fi

# The ring's lower bound in ms: 2(p-1)/p * B/bw + 2(p-1) * alpha, alpha 1 us host to host.
bound_ms() {  # ranks bytes gbps
  python3 -c "p,B,g=$1,$2,$3; print('%.3f' % ((2*(p-1)/p*B/(g*1e9/8) + 2*(p-1)*1e-6)*1e3))"
}

run() {  # sim_sync hosts gbps model [ranks_per_host [args...]]
  local bin=$1 hosts=$2 gbps=$3 model=$4 per=${5:-1}
  shift $(($# < 5 ? $# : 5))
  local dir
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  mapfile -t files < <(python3 "$here/platforms.py" "$dir" "$hosts" --gbps "$gbps" --ranks-per-host "$per")
  local ranks=$((hosts * per))
  # From 512 ranks, a binomial-tree bcast: SMPI's ompi selection runs two allgathers over every rank
  # for each new communicator's id (113 s of wall time for the sync's constructor at 1024 ranks);
  # the simulated sync moves by +0.05% (ResNet-50) and +2% (DLRM's MLP) with it.
  local bcast=()
  [ "$ranks" -ge 512 ] && bcast=(--cfg=smpi/bcast:binomial_tree)
  smpirun -np "$ranks" -platform "${files[0]}" -hostfile "${files[1]}" \
    --cfg=smpi/simulate-computation:no --cfg=smpi/test:1e-7 --cfg=smpi/iprobe:1e-7 \
    --cfg=smpi/grow-injected-times:no --cfg=contexts/stack-size:1024 \
    --cfg=smpi/shared-malloc-blocksize:268435456 --cfg=smpi/shared-malloc:local --cfg=smpi/coll-selector:ompi \
    "${bcast[@]}" \
    --log=root.thres:warning --log=xbt_cfg.thres:warning --log=smpi_config.thres:error \
    "$bin" "$model" "$@" | tee "$dir/out"
  local bytes
  bytes=$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' "$dir/out")
  echo "BOUND ranks=$ranks gbps=$gbps bound_ms=$(bound_ms "$ranks" "$bytes" "$gbps")"
}

# this_machine.xml's fit: bandwidth factors by message size, latency as given, and the measured cost
# of one MPI_Test on a pending request (0.065 us).
machine_bw_factor="0:0.3;512:0.155;2048:0.225;8192:0.30;32768:0.465;131072:0.57;524288:0.60;16777216:0.56;33554432:0.54"
machine() {  # sim_sync ranks model [args...]
  local bin=$1 ranks=$2 model=$3
  shift 3
  local hosts
  hosts=$(mktemp)
  trap 'rm -f "$hosts"' RETURN
  for ((i = 0; i < ranks; ++i)); do echo "node-$i"; done >"$hosts"
  smpirun -np "$ranks" -platform "$here/this_machine.xml" -hostfile "$hosts" \
    --cfg=smpi/bw-factor:"$machine_bw_factor" --cfg=smpi/lat-factor:0:1 --cfg=smpi/coll-selector:ompi \
    --cfg=smpi/simulate-computation:no --cfg=smpi/test:6.5e-8 --cfg=smpi/iprobe:6.5e-8 \
    --cfg=smpi/grow-injected-times:no --cfg=contexts/stack-size:1024 --cfg=smpi/shared-malloc-blocksize:268435456 \
    --log=root.thres:warning --log=xbt_cfg.thres:warning --log=smpi_config.thres:error "$bin" "$model" "$@"
}

case $mode in
  run) run "$@" ;;
  machine) machine "$@" ;;
  smoke)
    bin=${1:?sim.sh smoke SIM_SYNC MODELS_DIR}
    models=${2:?sim.sh smoke SIM_SYNC MODELS_DIR}
    out=$(run "$bin" 16 100 "$models/resnet50.csv" 1 1 blocking)
    echo "$out"
    python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
t = float(re.search(r"sync_ms=([0-9.]+)", out).group(1))
b = float(re.search(r"bound_ms=([0-9.]+)", out).group(1))
print(f"simulated {t:.3f} ms, ring bound {b:.3f} ms, ratio {t / b:.2f}")
if not (b <= t <= 3 * b):
    sys.exit(f"sim.sh smoke: the simulated sync ({t:.3f} ms) is not within [bound, 3 x bound] = [{b:.3f}, {3 * b:.3f}] ms")
PY
    ;;
  *) echo "sim.sh: unknown mode $mode" >&2; exit 2 ;;
esac
