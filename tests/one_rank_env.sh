#!/usr/bin/env bash
# Runs a command with one environment variable set on one MPI rank only, the way a job script that
# exports it on some nodes does:  one_rank_env.sh RANK VAR VALUE command [args...]
# Every rank also gets GSTEST_ONE_RANK_ENV=VAR=VALUE@RANK, so the test knows what to expect.
set -euo pipefail
target="$1" var="$2" value="$3"
shift 3
me="${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-}}}"
if [ -z "$me" ]; then
  echo "one_rank_env.sh: no MPI rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK)" >&2
  exit 2
fi
if [ "$me" = "$target" ]; then export "$var=$value"; fi
export GSTEST_ONE_RANK_ENV="$var=$value@$target"
exec "$@"
