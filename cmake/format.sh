#!/usr/bin/env bash
# The project's C and C++ files in .clang-format's style: `bash cmake/format.sh` rewrites them,
# `bash cmake/format.sh --check` (CI) lists the files that differ and fails. Generated reference data
# (tests/reference/*.hpp, examples/torch_hybrid/reference.hpp: written by their make_*.py) is left out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || bash cmake/deps.sh clang-format
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.c' '*.cu' '*.cuh' |
                     grep -v -e '^tests/reference/.*\.hpp$' -e '^examples/torch_hybrid/reference\.hpp$')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f"); done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "gradsync: not in .clang-format's style (run bash cmake/format.sh): ${bad[*]}" >&2
    exit 1
  fi
  echo "gradsync: ${#files[@]} files in .clang-format's style ($(clang-format --version))"
else
  clang-format -i "${files[@]}"
fi
