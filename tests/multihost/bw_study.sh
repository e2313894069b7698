#!/usr/bin/env bash
# Why TCP over a veth pair can look slow, measured on the test bed (README.md has the findings):
#   bash bw_study.sh MH_PROBE [ROUNDS] [MODEL_CSV]
# Builds its own 2-host bed, then for each configuration (veth MTU, offloads, qdisc, Open MPI's
# TCP settings, ranks per host, yielding) runs mh_probe's ping-pong / allreduce bandwidth and one
# MPI_Allreduce per tensor of MODEL_CSV; configurations take turns, ROUNDS times (default 3), so
# the machine's drifting load falls on all alike. Prints every run, then medians per configuration.
# Needs root and ethtool (for the offload rows; installed with apt-get when missing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
csv_default="$here/../../data/models/resnet50.csv"  # the repository's model lists
probe="$1" rounds="${2:-3}" csv="${3:-$csv_default}"
bed="$(mktemp -d /tmp/gsmh-study.XXXXXX)"
out="$bed/runs.txt"
command -v ethtool >/dev/null || apt-get install -y -qq --no-install-recommends ethtool >/dev/null
trap 'bash "$here/netns.sh" down "$bed" >/dev/null; rm -rf "$bed"' EXIT
bash "$here/netns.sh" up "$bed" 2
. "$bed/bed.env"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# link MTU OFFLOADS(on|off) QDISC(noqueue|fq|...): both ends of the veth alike
link() {
  local ns
  for ns in "$GSMH_NS_0" "$GSMH_NS_1"; do
    ip -n "$ns" link set "$GSMH_IFACE" mtu "$1"
    ip netns exec "$ns" ethtool -K "$GSMH_IFACE" tx "$2" sg "$2" tso "$2" gso "$2" >/dev/null 2>&1 || true
    ip netns exec "$ns" tc qdisc del dev "$GSMH_IFACE" root 2>/dev/null || true
    [ "$3" = noqueue ] || ip netns exec "$ns" tc qdisc add dev "$GSMH_IFACE" root "$3" ||
      echo "bw_study.sh: qdisc $3 unavailable, the row runs without it" >&2
  done
}

# name | link args | ranks per host | yield_when_idle | extra mpirun args
configs=(
  "veth MTU 1500 (veth default)|1500 on noqueue|1|1|"
  "veth MTU 65535 (the bed)|65535 on noqueue|1|1|"
  "veth MTU 1500, offloads off|1500 off noqueue|1|1|"
  "veth MTU 65535, offloads off|65535 off noqueue|1|1|"
  "veth MTU 1500, qdisc pfifo_fast|1500 on pfifo_fast|1|1|"
  "veth MTU 1500, btl_tcp_snd/rcvbuf 128K|1500 on noqueue|1|1|--mca btl_tcp_sndbuf 131072 --mca btl_tcp_rcvbuf 131072"
  "veth MTU 65535, btl_tcp_snd/rcvbuf 128K|65535 on noqueue|1|1|--mca btl_tcp_sndbuf 131072 --mca btl_tcp_rcvbuf 131072"
  "veth MTU 65535, 2x2 ranks, yield|65535 on noqueue|2|1|"
  "veth MTU 65535, 2x2 ranks, no yield|65535 on noqueue|2|0|"
  "veth MTU 1500, offloads off, 2x2 ranks, yield|1500 off noqueue|2|1|"
)

run_one() {  # config line, round
  local name largs per yield extra
  IFS='|' read -r name largs per yield extra <<< "$1"
  # shellcheck disable=SC2086
  link $largs
  local res
  res=$(OMPI_MCA_mpi_yield_when_idle=$yield GSMH_MPIRUN_ARGS="$extra" timeout 300 \
          bash "$here/mh_run.sh" "$bed" 2 "$per" "$probe" bw "$per" 3 2>&1 || true)
  res+=$'\n'$(OMPI_MCA_mpi_yield_when_idle=$yield GSMH_MPIRUN_ARGS="$extra" timeout 300 \
          bash "$here/mh_run.sh" "$bed" 2 "$per" "$probe" tensors "$csv" 3 2>&1 || true)
  echo "$res" | sed "s|^|$name #$2: |" | grep -E "mh_probe|rror" | tee -a "$out"
}

for ((r = 1; r <= rounds; r++)); do
  for c in "${configs[@]}"; do run_one "$c" "$r"; done
  # References off the veth: one namespace's loopback (TCP), and shared memory.
  for ref in "loopback TCP, one namespace|--mca btl tcp,self --mca btl_tcp_if_include lo" \
             "shared memory (vader), one host|--mca btl vader,self"; do
    IFS='|' read -r name extra <<< "$ref"
    # shellcheck disable=SC2086
    { export OMPI_MCA_mpi_yield_when_idle=1
      ip netns exec "$GSMH_NS_0" timeout 300 mpirun -np 2 --bind-to none $extra "$probe" bw 1 3 2>&1
      ip netns exec "$GSMH_NS_0" timeout 300 mpirun -np 2 --bind-to none $extra "$probe" tensors "$csv" 3 2>&1; } |
      sed "s|^|$name #$r: |" | grep -E "mh_probe|rror" | tee -a "$out" || true
  done
done

echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo
echo "== medians over $rounds rounds (GB/s; tensors: seconds) =="
python3 - "$out" <<'PY'
import re, sys, statistics, collections
d = collections.OrderedDict()
for line in open(sys.argv[1]):
    m = re.match(r"(.*) #\d+: mh_probe bw: +(\d+) MiB +ping-pong ([\d.]+) GB/s +allreduce ([\d.]+) GB/s", line)
    if m:
        d.setdefault(m[1], collections.defaultdict(list))
        d[m[1]][f"pp{m[2]}"].append(float(m[3])); d[m[1]][f"ar{m[2]}"].append(float(m[4]))
    m = re.match(r"(.*) #\d+: mh_probe tensors: .*each: ([\d.]+) s", line)
    if m:
        d.setdefault(m[1], collections.defaultdict(list))["tensors"].append(float(m[2]))
cols = ["pp4", "pp16", "pp64", "ar4", "ar16", "ar64", "tensors"]
print("| configuration | ping-pong 4 / 16 / 64 MiB | allreduce 4 / 16 / 64 MiB | per-tensor ResNet-50 (s) |")
print("| --- | --- | --- | --- |")
for k, v in d.items():
    med = {c: (statistics.median(v[c]) if v[c] else float("nan")) for c in cols}
    rng = lambda c: f"{min(v[c]):.3f}-{max(v[c]):.3f}" if v[c] else "n/a"
    print(f"| {k} | {med['pp4']:.2f} / {med['pp16']:.2f} / {med['pp64']:.2f} | {med['ar4']:.2f} / {med['ar16']:.2f} / {med['ar64']:.2f} | {med['tensors']:.3f} ({rng('tensors')}) |")
PY
