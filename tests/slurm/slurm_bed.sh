#!/usr/bin/env bash
# The Slurm test bed: a one-node Slurm cluster on this machine (Debian's Slurm 22.05), its own
# munged, slurmctld and slurmd, every file of it in BED_DIR (docs/SLURM.md).
#   slurm_bed.sh up BED_DIR     (re)start this bed; exit 77 (ctest: skipped) when it cannot run
#                               here: not root, or Slurm or munge not installed
#   slurm_bed.sh down BED_DIR   cancel its jobs, stop its daemons (their pid files), nothing else
# BED_DIR (in the build tree) names the bed: its cluster name and ports derive from a hash of it,
# so two build trees each have their own. bed.env in BED_DIR tells slurm_run.sh that it is up.
set -euo pipefail
cmd="${1:-}" bed="${2:-}"
[ -n "$cmd" ] && [ -n "$bed" ] || { echo "usage: slurm_bed.sh up|down BED_DIR" >&2; exit 2; }
mkdir -p "$bed"
bed="$(cd "$bed" && pwd)"
hash="$(printf %s "$bed" | md5sum | cut -c1-6)"
tag="gsync-$hash"
conf="$bed/slurm.conf"
# Unix sockets (munged's, slurmstepd's in the spool dir) hold at most 107 bytes of path: a deep
# build tree keeps them under /tmp instead, still named after this bed.
run="$bed/run"
[ ${#run} -le 64 ] || run="/tmp/$tag"
# Ports from the hash, below Linux's ephemeral range (32768-): a second build tree's bed beside this one.
port=$((20000 + (16#$hash % 6000) * 2))

skip() {
  echo "slurm: SKIP: $*"
  printf '%s\n' "$*" > "$bed/skip"
  exit 77
}

# The pid in $run/$1.pid while that process is still $1 (not a pid reused since).
pid_of() {
  local pid comm
  pid="$(cat "$run/$1.pid" 2>/dev/null)" && [ -n "$pid" ] || return 1
  read -r comm 2>/dev/null < "/proc/$pid/comm" && [ "$comm" = "$1" ] && echo "$pid"
}

# Stops what this bed started, by pid file: never another munged or Slurm on the machine.
down() {
  local f pid i
  if [ -f "$conf" ] && pid_of slurmctld >/dev/null; then
    # Jobs first, so that their slurmstepds (not the daemons' children) end with them.
    SLURM_CONF="$conf" scancel --full --quiet --user=root 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do
      [ -z "$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  # All three at once (each takes 1.5-2 s to stop), SIGKILL for any still there after 5 s.
  local pids=()
  for f in slurmd slurmctld munged; do
    if pid="$(pid_of "$f")"; then
      pids+=("$pid")
      kill "$pid" 2>/dev/null || true
    fi
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$bed/bed.env" "$bed/skip"
  rm -rf "$run"
}

# Waits up to $2 seconds for $1 (a command) to succeed.
wait_for() {
  local what="$1" secs="$2" i
  for ((i = 0; i < secs * 4; i++)); do
    eval "$what" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  return 1
}

fail() {
  echo "slurm_bed.sh: $*" >&2
  local l
  for l in "$bed"/log/*.log; do [ -f "$l" ] && { echo "--- $l (last lines)" >&2; tail -n 15 "$l" >&2; }; done
  down
  exit 1
}

up() {
  local host missing=() p
  rm -f "$bed/skip"
  [ "$(id -u)" -eq 0 ] || skip "not root: slurmd runs jobs as their users and must be root (CI runs as root)"
  for p in munged mungekey slurmctld slurmd srun sbatch salloc scancel sinfo squeue; do
    command -v "$p" >/dev/null || PATH="$PATH:/usr/sbin" command -v "$p" >/dev/null || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] ||
    skip "${missing[*]} not installed (apt-get install slurm-wlm munge, or bash cmake/deps.sh slurm-wlm munge)"
  export PATH="$PATH:/usr/sbin"
  down
  host="$(hostname -s)"
  mkdir -p "$bed/log" "$bed/state" "$run/spool" "$run/munge"
  chmod 755 "$run/munge"  # munged wants its socket reachable by every user
  : > "$bed/log/slurmctld.log"
  : > "$bed/log/slurmd.log"

  # munge: our own daemon, key and socket, whether or not the machine runs one.
  [ -s "$bed/munge.key" ] || mungekey --create --keyfile="$bed/munge.key" 2>/dev/null ||
    dd if=/dev/urandom of="$bed/munge.key" bs=128 count=1 status=none
  chmod 600 "$bed/munge.key"
  munged --force --key-file="$bed/munge.key" --socket="$run/munge/munge.socket" --pid-file="$run/munged.pid" \
    --log-file="$bed/log/munged.log" --seed-file="$run/munge/munged.seed" </dev/null >>"$bed/log/munged.log" 2>&1 ||
    fail "munged did not start"
  wait_for "munge --socket='$run/munge/munge.socket' -n </dev/null" 10 || fail "munged does not answer"

  cat > "$conf" <<EOF
# Written by tests/slurm/slurm_bed.sh for the bed in $bed
ClusterName=$tag
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$run/munge/munge.socket
StateSaveLocation=$bed/state
SlurmdSpoolDir=$run/spool
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.pid
SlurmctldLogFile=$bed/log/slurmctld.log
SlurmdLogFile=$bed/log/slurmd.log
# No cgroups in a container: processes tracked by parentage, tasks not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node's CPUs as written below, not the machine's: 4 tasks on a 2-core machine.
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
# A cancelled step gets SIGTERM, then SIGKILL this many seconds later (default 30).
KillWait=5
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES OverSubscribe=FORCE MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$conf"
  # -c: a clean start, no job from an earlier bed's state.
  slurmctld -c -f "$conf" </dev/null >>"$bed/log/slurmctld.log" 2>&1 || fail "slurmctld did not start"
  slurmd -f "$conf" </dev/null >>"$bed/log/slurmd.log" 2>&1 || fail "slurmd did not start"
  wait_for "sinfo -h -n '$host' -o %t | grep -qx idle" 60 ||
    fail "node $host not idle within 60 s (sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1 | head -3))"
  {
    echo "SLURM_CONF=$conf"
    echo "GSSL_NODE=$host"
    echo "GSSL_RUN=$run"
  } > "$bed/bed.env"
  echo "slurm: one-node cluster $tag up (node $host, 4 CPUs, ports $port-$((port + 1)), SLURM_CONF=$conf)"
}

case "$cmd" in
  up) up ;;
  down) down; echo "slurm: test bed $tag down" ;;
  *) echo "usage: slurm_bed.sh up|down BED_DIR" >&2; exit 2 ;;
esac
