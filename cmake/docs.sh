#!/usr/bin/env bash
# The API reference without a CMake build of the project (CI): writes the Doxyfile from
# docs/Doxyfile.in into a throwaway directory and runs doxygen on it. Exits non-zero on any doxygen
# warning (all are printed first). Usage: bash cmake/docs.sh [output dir, default build-docs]
# The HTML is in <output dir>/api. Same as `cmake --build <build dir> --target docs`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v doxygen >/dev/null || bash cmake/deps.sh doxygen
out="$(mkdir -p "${1:-build-docs}" && cd "${1:-build-docs}" && pwd)"
cmake -DGRADSYNC_DOCS_SOURCE_DIR="$PWD" -DGRADSYNC_DOCS_OUTPUT_DIR="$out" -P cmake/GradSyncDocs.cmake
rm -rf "$out/api"
doxygen "$out/Doxyfile"
echo "gradsync: API reference in $out/api/index.html, no doxygen warnings"
