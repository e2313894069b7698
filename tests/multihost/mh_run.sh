#!/usr/bin/env bash
# Runs an MPI program across the test bed's hosts, with Open MPI's mpirun or (GSMH_MPI_IMPL=mpich)
# MPICH's Hydra, GSMH_MPIEXEC naming the launcher:
#   mh_run.sh BED_DIR HOSTS PER_HOST COMMAND [ARGS...]
# HOSTS x PER_HOST ranks, ranks 0..PER_HOST-1 on host 0 and so on (mapped by slot). mpirun runs
# on host 0 (its namespace and hostname) and starts the other hosts' orteds through rsh_agent.sh.
# Between hosts: Open MPI's TCP transport on the veth only; within a host: shared memory (vader).
# Exit 77 (ctest: skipped) when the bed is not up, with the reason netns.sh recorded.
# GSMH_MPIRUN_ARGS: extra mpirun arguments (the bandwidth study uses it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bed="$1" hosts="$2" per_host="$3"
shift 3
if [ ! -f "$bed/bed.env" ]; then
  echo "multihost: SKIP: $(cat "$bed/skip" 2>/dev/null || echo "the test bed is not set up (netns.sh up $bed)")"
  exit 77
fi
# shellcheck disable=SC1091
. "$bed/bed.env"
[ "$hosts" -le "$GSMH_HOSTS" ] || { echo "mh_run.sh: $hosts hosts asked, the bed has $GSMH_HOSTS" >&2; exit 2; }
hostfile="$bed/hostfile.${hosts}x${per_host}"
for ((i = 0; i < hosts; i++)); do
  name="GSMH_HOSTNAME_$i"
  echo "${!name} slots=$per_host"
done > "$hostfile"
export GSMH_BED="$bed"
# The world size the programs must find (tests/launch_check.hpp, the examples): a program of another
# MPI than this mpirun's would run as separate 1-rank jobs and fail instead of passing alone.
export GSYNC_TEST_RANKS=$((hosts * per_host))
# More ranks than cores: busy-polling ranks starve each other's TCP progress (README.md: 40x
# slower per-tensor allreduces at 2x2 on 2 cores); ctest sets this already.
if [ $((hosts * per_host)) -gt "$(nproc)" ]; then export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"; fi
# Traffic on host 0's veth, before and after: what crossed between the hosts.
bytes() {
  local rx tx
  { read -r rx; read -r tx; } < <(ip netns exec "$GSMH_NS_0" cat "/sys/class/net/$GSMH_IFACE/statistics/rx_bytes" \
                                    "/sys/class/net/$GSMH_IFACE/statistics/tx_bytes")
  echo $((rx + tx))
}
before=$(bytes)
rc=0
n=$((hosts * per_host))
if [ "${GSMH_MPI_IMPL:-openmpi}" = mpich ]; then
  # Hydra: its proxies started through the same agent (the rsh launcher passes host, then command),
  # hostnames resolved to the veth's addresses by /etc/netns/<ns>/hosts, UCX kept on the veth.
  while read -r h rest; do echo "$h:$per_host"; done < "$hostfile" > "$hostfile.hydra"
  preload=()
  [ -n "${GSMH_PRELOAD:-}" ] && preload=(-genv LD_PRELOAD "$GSMH_PRELOAD")
  ip netns exec "$GSMH_NS_0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$GSMH_HOSTNAME_0" \
    "${GSMH_MPIEXEC:-mpiexec.mpich}" -launcher rsh -launcher-exec "$here/rsh_agent.sh" -f "$hostfile.hydra" -n "$n" \
      -iface "$GSMH_IFACE" -genv UCX_NET_DEVICES "$GSMH_IFACE" -genv UCX_TLS tcp,self \
      -genv GSYNC_TEST_RANKS "$n" "${preload[@]}" "$@" || rc=$?
else
  # --bind-to none: every "host" sees the same cores, so per-host binding would stack ranks on them.
  ip netns exec "$GSMH_NS_0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$GSMH_HOSTNAME_0" \
    "${GSMH_MPIEXEC:-mpirun}" --allow-run-as-root -np "$n" --hostfile "$hostfile" --map-by slot --bind-to none \
      --mca plm_rsh_agent "$here/rsh_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
      --mca btl tcp,self,vader --mca btl_tcp_if_include "$GSMH_SUBNET" --mca oob_tcp_if_include "$GSMH_SUBNET" \
      -x GSYNC_TEST_RANKS ${GSMH_MPIRUN_ARGS:-} "$@" || rc=$?
fi
echo "multihost: ${hosts} hosts x ${per_host} ranks, $(( ($(bytes) - before) / 1024 )) KiB crossed $GSMH_IFACE between the hosts, exit status $rc"
exit $rc
