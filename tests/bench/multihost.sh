#!/usr/bin/env bash
# Benchmarks across hosts: the models of tests/bench/run.sh on two hosts of the namespace test bed
# (tests/multihost/README.md), TCP between hosts, shared memory within one; gradsync beside raw
# chunked MPI_Allreduce, per-tensor MPI, Horovod 0.28.1 and PyTorch DDP over gloo, same runs.
# Writes docs/BENCHMARKS_HOSTS.md.
#   bash tests/bench/multihost.sh             # as root; about 30 minutes on 2 cores (+8 to build Horovod)
# Env: BUILD_DIR (default build/), BUDGET (seconds per model and block, default 3), RUNS (runs of
# gradsync's table per setting, default 3: the report keeps the median), LAYOUTS (default
# "2x1 2x2": hosts x ranks per host), LINKS (default "unshaped 25gbit 10gbit": tbf on each host's
# link, both directions), PEERS (default "horovod ddp"), ONLY (a model name filter for bench_sync).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
models="$root/data/models"
budget="${BUDGET:-3}"
py=/usr/bin/python3
[ "$(id -u)" = 0 ] || { echo "multihost.sh: needs root (network namespaces)" >&2; exit 1; }

bash "$root/cmake/deps.sh" python3-torch libtorch-dev pybind11-dev python3-dev iproute2 >/dev/null
# The peer: Horovod from PyPI, built against Debian's torch and Open MPI (about 8 minutes, once).
# CUDA is kept off its PATH: the CPU build is the one compared here.
if [[ " ${PEERS-horovod ddp} " == *" horovod "* ]] && ! $py -c 'import horovod.torch' 2>/dev/null; then
  echo "== installing horovod 0.28.1 from PyPI (about 8 minutes)"
  env PATH=/usr/sbin:/usr/bin:/sbin:/bin HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
    $py -m pip install --no-build-isolation --break-system-packages horovod==0.28.1 >"$build/horovod-install.log" 2>&1 ||
    echo "horovod did not build (see $build/horovod-install.log): its columns stay empty"
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_WERROR=ON >/dev/null
cmake --build "$build" --target bench_sync -j 2 >/dev/null
bench="$build/tests/bench/bench_sync"

out="$build/bench_hosts"
bed="$out/bed"
rm -rf "$out" && mkdir -p "$out"
csv="$out/results.csv"
: >"$csv"
bash "$root/tests/multihost/netns.sh" up "$bed" 2
trap 'bash "$root/tests/multihost/netns.sh" down "$bed" >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC1090
. "$bed/bed.env"
{
  echo "date:      $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu:       $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "mpi:       $(ompi_info --version 2>/dev/null | head -1), TCP between hosts (veth, MTU $(ip netns exec "$GSMH_NS_0" cat /sys/class/net/"$GSMH_IFACE"/mtu)), vader within"
  echo "kernel:    $(uname -r)"
  echo "horovod:   $($py -c 'import horovod; print(horovod.__version__)' 2>/dev/null || echo missing)"
  echo "torch:     $($py -c 'import torch; print(torch.__version__)' 2>/dev/null || echo missing)"
  echo "load avg:  $(cut -d' ' -f1-3 /proc/loadavg) at start"
} >"$out/machine.txt"

# tbf on both ends of the link between the hosts (each namespace shapes what it sends).
shape() {
  local i ns
  for ((i = 0; i < GSMH_HOSTS; i++)); do
    ns="GSMH_NS_$i"
    ip netns exec "${!ns}" tc qdisc del dev "$GSMH_IFACE" root 2>/dev/null || true
    [ "$1" = unshaped ] || ip netns exec "${!ns}" tc qdisc add dev "$GSMH_IFACE" root tbf rate "$1" burst 1mb latency 100ms
  done
}
run() { bash "$root/tests/multihost/mh_run.sh" "$bed" "$@"; }
step() { echo; echo "== $* ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for layout in ${LAYOUTS:-2x1 2x2}; do
  hosts="${layout%x*}" per="${layout#*x}"
  for link in ${LINKS:-unshaped 25gbit 10gbit}; do
    shape "$link"
    export BENCH_SECTION="hosts-$layout-$link"
    for r in $(seq "${RUNS:-3}"); do
      step "$BENCH_SECTION: gradsync, raw chunk sweep, per tensor (run $r of ${RUNS:-3})"
      GSMH_MPIRUN_ARGS="-x BENCH_SECTION" run "$hosts" "$per" "$bench" models "$models" "$csv" "$budget" "${ONLY:-}"
    done
    if [[ " ${PEERS-horovod ddp} " == *" horovod "* ]] && $py -c 'import horovod.torch' 2>/dev/null; then
      for fusion in 4194304 67108864; do
        step "$BENCH_SECTION: Horovod, fusion $((fusion >> 20)) MiB"
        HOROVOD_FUSION_THRESHOLD=$fusion GSMH_MPIRUN_ARGS="-x HOROVOD_FUSION_THRESHOLD" \
          run "$hosts" "$per" $py "$root/tests/bench/horovod_bench.py" "$models" "$csv" "$BENCH_SECTION" "$budget"
      done
      step "$BENCH_SECTION: Horovod fp16 compression, fusion 4 MiB"
      HOROVOD_FUSION_THRESHOLD=4194304 GSMH_MPIRUN_ARGS="-x HOROVOD_FUSION_THRESHOLD" \
        run "$hosts" "$per" $py "$root/tests/bench/horovod_bench.py" "$models" "$csv" "$BENCH_SECTION" "$budget" --fp16
    fi
    if [[ " ${PEERS-horovod ddp} " == *" ddp "* ]]; then
      step "$BENCH_SECTION: PyTorch DDP over gloo"
      MASTER_ADDR=10.77.0.1 MASTER_PORT=29517 GLOO_SOCKET_IFNAME="$GSMH_IFACE" \
        GSMH_MPIRUN_ARGS="-x MASTER_ADDR -x MASTER_PORT -x GLOO_SOCKET_IFNAME" \
        run "$hosts" "$per" $py "$root/tests/bench/ddp_gloo.py" "$models" "$csv" mpi "$budget" "$BENCH_SECTION"
    fi
  done
done
shape unshaped
cmd="bash tests/bench/multihost.sh"
[ -n "${LAYOUTS:-}${LINKS:-}${RUNS:-}${BUDGET:-}${ONLY:-}" ] && cmd="LAYOUTS='${LAYOUTS:-2x1 2x2}' LINKS='${LINKS:-unshaped 25gbit 10gbit}' RUNS=${RUNS:-3} BUDGET=$budget${ONLY:+ ONLY=$ONLY} $cmd"
$py "$root/tests/bench/report_hosts.py" "$csv" "$out/machine.txt" "$cmd" >"$root/docs/BENCHMARKS_HOSTS.md"
echo "wrote docs/BENCHMARKS_HOSTS.md (rows in $csv)"
