#!/usr/bin/env bash
# gradsync's sync under SimGrid's SMPI (docs/SCALING.md). The program (sim_sync, built by CMake with
# smpicxx where SimGrid is installed) is gradsync's own code on simulated ranks of a fat-tree.
#
#   sim.sh run SIM_SYNC HOSTS GBPS MODEL [RANKS_PER_HOST [sim_sync args after the model...]]
#       one simulation; prints sim_sync's RESULT line and the ring's alpha-beta bound
#   sim.sh machine SIM_SYNC RANKS MODEL [sim_sync args after the model...]
#       the same on this_machine.xml, the platform fitted to this 2-core machine's shared memory (a
#       one-way ping-pong, pingpong.c, within 4% from 8 B to 64 MiB), RANKS <= 4
#   sim.sh bed SIM_SYNC RANKS_PER_HOST MODEL [sim_sync args after the model...]
#       the same on bed.xml, the two-namespace bed of tests/multihost fitted (its veth carries one
#       direction at a time: SHARED), 2 hosts x 1 or 2 ranks
#   sim.sh smoke SIM_SYNC MODELS_DIR
#       ctest's `simulation` smoke: ResNet-50 on 16 simulated ranks, blocking; the simulated sync must
#       lie between the ring's alpha-beta bound and 3x it (exit 77 where SimGrid is not installed)
#
# Environment: SIM_CFG, more smpirun --cfg options for `run`; SIM_POLL=test, gradsync's ring polled
# with MPI_Testsome as written (the default models the poll as MPI_Waitsome: sim_sync.cpp).
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

# Alpha-beta lower bounds in ms, alpha 1 us host to host: the ring's 2(p-1)/p * B/bw + 2(p-1) * alpha;
# a pipelined (double binary) tree's 2 B/bw + 2 log2(p) * alpha; Rabenseifner's (recursive halving,
# then doubling: SMPI's rab_rdb) 2(p-1)/p * B/bw + 2 log2(p) * alpha.
bound_ms() {  # ranks bytes gbps
  python3 -c "p,B,g=$1,$2,$3; print('%.3f' % ((2*(p-1)/p*B/(g*1e9/8) + 2*(p-1)*1e-6)*1e3))"
}
bounds() {  # ranks bytes gbps
  python3 -c "
import math
p,B,g=$1,$2,$3; bw=g*1e9/8; a=1e-6; l=math.log2(p) if p > 1 else 0
print('tree_ms=%.3f rabenseifner_ms=%.3f' % ((2*B/bw + 2*l*a)*1e3, (2*(p-1)/p*B/bw + 2*l*a)*1e3))"
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
    "${bcast[@]}" ${SIM_CFG:-} \
    --log=root.thres:warning --log=xbt_cfg.thres:warning --log=smpi_config.thres:error \
    "$bin" "$model" "$@" | tee "$dir/out"
  local bytes
  bytes=$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' "$dir/out")
  echo "BOUND ranks=$ranks gbps=$gbps bound_ms=$(bound_ms "$ranks" "$bytes" "$gbps") $(bounds "$ranks" "$bytes" "$gbps")"
}

# this_machine.xml's fit: bandwidth factors by message size, latency as given, and the measured cost
# of one MPI_Test on a pending request (0.065 us).
machine_bw_factor="0:0.3;512:0.155;2048:0.225;8192:0.30;32768:0.465;131072:0.57;524288:0.60;16777216:0.56;33554432:0.54"
# One sync on a fitted platform, one rank per line of HOSTS (host names, space-separated):
# fitted PLATFORM "HOSTS" BW_FACTOR LAT_FACTOR TEST_COST SIM_SYNC MODEL [args...]
fitted() {
  local platform=$1 names=$2 bw=$3 lat=$4 test=$5 bin=$6 model=$7
  shift 7
  local hosts
  hosts=$(mktemp)
  trap 'rm -f "$hosts"' RETURN
  printf '%s\n' $names >"$hosts"
  smpirun -np "$(wc -l <"$hosts")" -platform "$platform" -hostfile "$hosts" \
    --cfg=smpi/bw-factor:"$bw" --cfg=smpi/lat-factor:"$lat" --cfg=smpi/coll-selector:ompi \
    --cfg=smpi/simulate-computation:no --cfg=smpi/test:"$test" --cfg=smpi/iprobe:"$test" \
    --cfg=smpi/grow-injected-times:no --cfg=contexts/stack-size:1024 --cfg=smpi/shared-malloc-blocksize:268435456 \
    --log=root.thres:warning --log=xbt_cfg.thres:warning --log=smpi_config.thres:error "$bin" "$model" "$@"
}
machine() {  # sim_sync ranks model [args...]
  local bin=$1 ranks=$2 model=$3
  shift 3
  fitted "$here/this_machine.xml" "$(seq -f 'node-%g' 0 $((ranks - 1)))" "$machine_bw_factor" 0:1 6.5e-8 "$bin" \
    "$model" "$@"
}

# bed.xml's fit (the two-namespace bed of tests/multihost): factors at 87 sizes from a dense one-way
# ping-pong, keys offset by 16 bytes (SMPI 3.32 applies a key K from K-15 bytes), and MPI_Test's cost
# with the TCP BTL loaded (0.2925 us).
bed_bw_factor="0:1;27:1;35:1;43:1;51:1;59:1;71:1;83:1;95:1;111:1;131:1;155:1;179:1;207:1;246:1;294:1;346:1;406:1;481:1;573:0.184793;677:0.191068;801:0.229427;952:0.250598;1131:0.141321;1342:0.159541;1594:0.17379;1892:0.187007;2247:0.212975;2669:0.237831;3172:0.253992;3769:0.271031;4479:0.299495;5323:0.314486;6332:0.330296;7527:0.338955;8946:0.35073;10635:0.363904;12648:0.376961;15039:0.402452;17881:0.408982;21260:0.440779;25281:0.445897;30063:0.417034;35749:0.436648;42508:0.454512;50546:0.467684;60110:0.314176;71483:0.368287;85004:0.407502;101084:0.441933;120208:0.486091;142951:0.537453;169993:0.587079;202152:0.625972;240400:0.670944;285886:0.71325;339975:0.753716;404297:0.78531;480790:0.81485;571752:0.831874;679926:0.843013;808574:0.856225;961564:0.837129;1143493:0.919763;1359844:0.942165;1617137:0.897577;1923113:0.852124;2286974:0.84413;2719681:0.823139;3234260:0.761335;3846205:0.743141;4573936:0.754497;5439354:0.713464;6468513:0.71723;7692399:0.709943;9147857:0.698665;10878693:0.657775;12937014:0.63267;15384788:0.618136;18295699:0.602872;21757370:0.579267;25874015:0.574301;30769564:0.58033;36591382:0.564487;43514727:0.553178;51748020:0.541345;61539113:0.529641"
bed_lat_factor="0:0.996881;27:1.00398;35:1.004;43:0.997673;51:1.00066;59:0.995286;71:0.994182;83:0.998494;95:0.991669;111:1.00907;131:1.05187;155:1.06325;179:1.0748;207:1.07449;246:1.07548;294:1.08356;346:1.05341;406:1.07751;481:1.09461;573:1;677:1;801:1;952:1;1131:1;1342:1;1594:1;1892:1;2247:1;2669:1;3172:1;3769:1;4479:1;5323:1;6332:1;7527:1;8946:1;10635:1;12648:1;15039:1;17881:1;21260:1;25281:1;30063:1;35749:1;42508:1;50546:1;60110:1;71483:1;85004:1;101084:1;120208:1;142951:1;169993:1;202152:1;240400:1;285886:1;339975:1;404297:1;480790:1;571752:1;679926:1;808574:1;961564:1;1143493:1;1359844:1;1617137:1;1923113:1;2286974:1;2719681:1;3234260:1;3846205:1;4573936:1;5439354:1;6468513:1;7692399:1;9147857:1;10878693:1;12937014:1;15384788:1;18295699:1;21757370:1;25874015:1;30769564:1;36591382:1;43514727:1;51748020:1;61539113:1"
bed() {  # sim_sync ranks_per_host model [args...]
  local bin=$1 per=$2 model=$3
  shift 3
  local names="" h i
  for h in gsmh-h0 gsmh-h1; do for ((i = 0; i < per; ++i)); do names+="$h "; done; done
  fitted "$here/bed.xml" "$names" "$bed_bw_factor" "$bed_lat_factor" 2.925e-7 "$bin" "$model" "$@"
}

case $mode in
  run) run "$@" ;;
  machine) machine "$@" ;;
  bed) bed "$@" ;;
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
