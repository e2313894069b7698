#!/usr/bin/env bash
# The multi-host test bed: HOSTS "hosts" as Linux network namespaces on this machine, joined by
# veth (two hosts: one veth pair; more: a bridge in a switch namespace), each with its own
# address in 10.77.0.0/24 and, once mh_run.sh starts it, its own hostname (a UTS namespace).
#   netns.sh up BED_DIR [HOSTS]   (re)create this bed; exit 77 (ctest: skipped) when it cannot be
#                                 built here: not root, or no network namespaces or veth
#   netns.sh down BED_DIR         remove it, and the processes still inside it
# BED_DIR (in the build tree) names the bed: its namespaces are gsmh-<hash of BED_DIR>-..., so two
# build trees never share or delete each other's, and nothing outside them is touched. Every
# address lives inside namespaces created here; the machine's own interfaces and routes are not
# involved. bed.env in BED_DIR tells mh_run.sh and rsh_agent.sh what exists.
set -euo pipefail
cmd="${1:-}" bed="${2:-}"
[ -n "$cmd" ] && [ -n "$bed" ] || { echo "usage: netns.sh up|down BED_DIR [HOSTS]" >&2; exit 2; }
mkdir -p "$bed"
bed="$(cd "$bed" && pwd)"
tag="gsmh-$(printf %s "$bed" | md5sum | cut -c1-6)"
iface=gsmh0                                   # the veth end inside every host
# veth's largest MTU: with GSO/GRO a veth moves 64 KiB segments whatever the MTU, but a large MTU
# also keeps TCP's segments large when segmentation offload is off (tests/multihost/README.md).
mtu="${GSMH_MTU:-65535}"

skip() {
  echo "multihost: SKIP: $*"
  printf '%s\n' "$*" > "$bed/skip"
  exit 77
}

ours() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag}-" || true; }

down() {
  local ns pid
  command -v ip >/dev/null || return 0
  for ns in $(ours); do
    # Leftovers of a killed run (an orted, a rank) would keep the namespace alive unnamed.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true  # only when empty: no other bed, nothing of anyone else's
  rm -f "$bed/bed.env" "$bed/skip" "$bed"/hostfile.*
}

up() {
  local hosts="${1:-2}" i ns
  [ "$hosts" -ge 2 ] 2>/dev/null || { echo "netns.sh: HOSTS must be 2 or more" >&2; exit 2; }
  rm -f "$bed/skip"
  [ "$(id -u)" -eq 0 ] || skip "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN (CI runs as root)"
  if ! command -v ip >/dev/null; then
    echo "multihost: installing iproute2"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2; } \
      >/dev/null 2>&1 || skip "iproute2 (ip) is missing and apt-get could not install it"
  fi
  command -v unshare >/dev/null || skip "unshare (util-linux) is missing"
  down
  # A failure half way leaves nothing behind (the skips below tidy up themselves).
  trap 'echo "netns.sh: setup failed; removing what it made" >&2; down' ERR
  # Probe what the bed needs, so an environment without it skips instead of failing.
  ip netns add "$tag-h0" 2>/dev/null || skip "'ip netns add' is not permitted here (a container without CAP_SYS_ADMIN?)"
  ip netns exec "$tag-h0" unshare --uts true 2>/dev/null || { down; skip "'unshare --uts' is not permitted here"; }
  for ((i = 1; i < hosts; i++)); do ip netns add "$tag-h$i"; done
  if [ "$hosts" -eq 2 ]; then
    ip link add "$iface" netns "$tag-h0" type veth peer name "$iface" netns "$tag-h1" 2>/dev/null ||
      { down; skip "veth interfaces are not available here"; }
  else
    ip netns add "$tag-sw"
    ip -n "$tag-sw" link add br0 type bridge
    ip -n "$tag-sw" link set br0 mtu "$mtu" up
    for ((i = 0; i < hosts; i++)); do
      ip link add "$iface" netns "$tag-h$i" type veth peer name "p$i" netns "$tag-sw" 2>/dev/null ||
        { down; skip "veth interfaces are not available here"; }
      ip -n "$tag-sw" link set "p$i" mtu "$mtu" master br0 up
    done
  fi
  {
    echo "GSMH_TAG=$tag"
    echo "GSMH_HOSTS=$hosts"
    echo "GSMH_IFACE=$iface"
    echo "GSMH_SUBNET=10.77.0.0/24"
  } > "$bed/bed.env.tmp"
  for ((i = 0; i < hosts; i++)); do
    ns="$tag-h$i"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$iface" mtu "$mtu"
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "$iface"
    ip -n "$ns" link set "$iface" up
    # Segmentation and checksum offloads are veth's defaults; off, MTU 1500 TCP ran 3-4x slower
    # (README.md). Made sure of where ethtool exists; not installed for this alone.
    if command -v ethtool >/dev/null; then
      ip netns exec "$ns" ethtool -K "$iface" tx on sg on tso on gso on >/dev/null 2>&1 || true
    fi
    echo "GSMH_NS_$i=$ns" >> "$bed/bed.env.tmp"
    echo "GSMH_HOSTNAME_$i=gsmh-h$i" >> "$bed/bed.env.tmp"
  done
  # Each host resolves every host's name to its address: 'ip netns exec' shows
  # /etc/netns/<ns>/hosts as /etc/hosts inside that namespace only.
  for ((i = 0; i < hosts; i++)); do
    mkdir -p "/etc/netns/$tag-h$i"
    { echo "127.0.0.1 localhost"; for ((j = 0; j < hosts; j++)); do echo "10.77.0.$((j + 1)) gsmh-h$j"; done; } \
      > "/etc/netns/$tag-h$i/hosts"
  done
  # Every host's end of the link is up (operstate) before anyone relies on it: a veth's carrier comes
  # a moment after 'link set up', and UCX (MPICH) skips a device that is not up yet.
  for ((i = 0; i < hosts; i++)); do
    for ((k = 0; k < 100; k++)); do
      [ "$(ip netns exec "$tag-h$i" cat "/sys/class/net/$iface/operstate")" = up ] && break
      sleep 0.1
    done
  done
  # Each host reaches the others (the veth is up) before anyone relies on it.
  for ((i = 1; i < hosts; i++)); do
    ip netns exec "$tag-h0" ping -c 1 -W 2 "10.77.0.$((i + 1))" >/dev/null 2>&1 ||
      { [ -x "$(command -v ping)" ] || break; down; echo "netns.sh: host 0 cannot reach 10.77.0.$((i + 1))" >&2; exit 1; }
  done
  mv "$bed/bed.env.tmp" "$bed/bed.env"
  echo "multihost: $hosts hosts up ($tag-h0..h$((hosts - 1)), 10.77.0.1-$hosts on $iface, MTU $mtu)"
}

case "$cmd" in
  up) up "${3:-2}" ;;
  down) down; echo "multihost: test bed $tag down" ;;
  *) echo "usage: netns.sh up|down BED_DIR [HOSTS]" >&2; exit 2 ;;
esac
