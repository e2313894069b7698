#!/usr/bin/env bash
# Open MPI's remote shell for the test bed (--mca plm_rsh_agent): called as ssh would be,
#   rsh_agent.sh HOSTNAME COMMAND...
# it runs COMMAND (an orted) inside that host's network namespace, in a new UTS namespace that
# carries the host's name, through sh -c as ssh's remote shell would. The orted and the ranks it
# starts inherit both, so MPI_Get_processor_name and Open MPI's notion of a node follow the host.
set -euo pipefail
: "${GSMH_BED:?rsh_agent.sh: set GSMH_BED to the directory of the bed}"
# shellcheck disable=SC1091
. "$GSMH_BED/bed.env"
host="$1"
shift
for ((i = 0; i < GSMH_HOSTS; i++)); do
  name="GSMH_HOSTNAME_$i" ns="GSMH_NS_$i"
  if [ "${!name}" = "$host" ]; then
    exec ip netns exec "${!ns}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
  fi
done
echo "rsh_agent.sh: no host $host in $GSMH_BED/bed.env" >&2
exit 255
