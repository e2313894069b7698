#!/usr/bin/env bash
# gradsync on a GPU, one command (about 3-6 minutes on 16 cores):
#   bash tests/gpu/run.sh
# The steps come in the order of what a device minute is worth, each printed with its time as it
# ends and its logs copied to OUT at once, so that a run cut short still reports what it measured:
# 1. checks the machine: an NVIDIA GPU and driver, the CUDA toolkit with NCCL, and gradsync's Debian
#    packages: installed (cmake/deps.sh installs them as root when apt can reach a mirror), or
#    unpacked without root from .gpu-deps/, made by tests/gpu/bundle_deps.sh on a machine with apt;
# 2. builds, with CUDA and NCCL required, for this GPU's architecture: first the two measuring
#    programs (bench_gpu, gpu_launch_latency), the rest after step 4;
# 3. measures a small launch and its wait with 1, 4, 8 and 16 processes on the GPU, and gives ctest
#    the most processes (16 or 8, else 4) at which that latency stays within 10x of a lone process's;
# 4. runs the GPU benchmark on two real models (pack/unpack against cudaMemcpy, target >= 80%, the raw
#    CUDA and the Kokkos team kernels; the NCCL sync against one ncclAllReduce of the same bytes,
#    target 1.1x, at 4 MiB, 64 MiB, one chunk and the plan's pick);
# 5. builds the rest;
# 6. runs the whole test suite; the CUDA tests must run, not skip (every semantics row on device
#    memory through NcclBackend, staged MpiBackend and SelfBackend; every NcclBackend collective);
#    a program that timed out is run again alone, to tell slow from slowed by sharing the GPU;
#    and prints a short table last.
# Environment: CUDA_HOME (default /usr/local/cuda), NCCL_HOME (if NCCL is elsewhere), GRADSYNC_GPU_DEPS
# (the bundle folder, default .gpu-deps; GRADSYNC_USE_BUNDLED_DEPS=1 prefers it), OUT (logs are copied
# there when it is a folder), BUILD_DIR
# (default build-gpu), JOBS, REPS (benchmark repetitions, default 20), KOKKOS_ROOT (a Kokkos 4.x
# install with its CUDA backend: every test then runs on device Views; default: the bundle's kokkos/
# when there is one, else Debian's Kokkos 3.4, Serial, with only the raw-CUDA and NCCL tests on the GPU).
# A short rerun of what failed (device minutes are few): TARGETS (build only these), CTEST_ARGS
# (e.g. "-R process_set"), BENCH=0 (no benchmark), WERROR=ON (warnings fail the build; default OFF:
# a GPU node's newer host compiler may warn where CI's does not, and the summary counts them),
# DIAG (a command run last, in the same environment, e.g. one test binary under mpirun), LATENCY=0
# (no latency measurement), GPU_PROCS (ctest -j: processes on the GPU at once; default: from step 3),
# SUITE_S (stop the suite after that many seconds and report what ran), RUN_S (the whole run's
# seconds, e.g. a device call's limit less a margin: the rest of the build, the suite and the
# reruns are bounded so that the summary still prints within it).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
jobs="${JOBS:-$(nproc)}"
reps="${REPS:-20}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda/bin:$PATH"
export LD_LIBRARY_PATH="$cuda/lib64:$cuda/lib${NCCL_HOME:+:$NCCL_HOME/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Debian's PMIx next to another zlib: its compression component fails to load, harmlessly.
export PMIX_MCA_pcompress=^zlib PMIX_MCA_pcompress_base_silence_warning=1
log="$build/gpu-run.log"
die() { echo "tests/gpu/run.sh: $*" >&2; exit 2; }
t_start=$(date +%s)
since() { echo $(($(date +%s) - $1)); }
say() { echo "== [$(since "$t_start") s] $*"; }
# Seconds left of RUN_S once `keep` more are set aside (a large number without RUN_S).
left() { [ -n "${RUN_S:-}" ] && echo $((RUN_S - $(since "$t_start") - $1)) || echo 1000000; }
# Logs to OUT (a batch system's or the device tool's output folder) after every step.
save_logs() {
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] || return 0
  cp "$build"/ctest.log "$build"/bench.log "$build"/diag.log "$build"/timeouts.log "$build"/latency.* "$OUT/" 2>/dev/null
  tail -200 "$log" >"$OUT/build-tail.log" 2>/dev/null
  return 0
}

# ---- 1. the machine ----
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver on this machine"
gpus=$(nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader) || die "nvidia-smi failed"
[ -n "$gpus" ] || die "nvidia-smi lists no GPU"
ngpu=$(echo "$gpus" | wc -l)
cap=$(echo "$gpus" | head -1 | awk -F', ' '{print $(NF-1)}' | tr -d .)
command -v nvcc >/dev/null || die "nvcc not found (set CUDA_HOME; looked in $cuda/bin)"
mkdir -p "$build"
# NCCL: the toolkit's, NCCL_HOME's, the system's, or else the one a pip PyTorch brings
# (nvidia-nccl-cu*: nccl.h and libnccl.so.2 only, so give CMake a prefix with libnccl.so in it).
if ! [ -f "${NCCL_HOME:-$cuda}/include/nccl.h" ] && ! [ -f /usr/include/nccl.h ]; then
  for py in python3 /usr/bin/python3; do
    p=$($py -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) && [ -f "$p/include/nccl.h" ] && break
    p=""
  done
  [ -n "$p" ] && compgen -G "$p/lib/libnccl.so*" >/dev/null ||
    die "nccl.h not found in ${NCCL_HOME:-$cuda}/include, /usr/include or a pip nvidia-nccl package (set NCCL_HOME)"
  mkdir -p "$build/nccl/lib" && ln -sfn "$p/include" "$build/nccl/include"
  ln -sf "$(ls "$p"/lib/libnccl.so* | head -1)" "$build/nccl/lib/libnccl.so"
  export NCCL_HOME="$build/nccl" LD_LIBRARY_PATH="$p/lib:$LD_LIBRARY_PATH"
  echo "== NCCL: from pip, $p"
fi
# gradsync's Debian packages: installed (cmake/deps.sh installs them as root with a mirror), or
# unpacked from a bundle made by tests/gpu/bundle_deps.sh on a Debian 12 machine that has a mirror.
bundle="${GRADSYNC_GPU_DEPS:-$root/.gpu-deps}"
if [ "${GRADSYNC_USE_BUNDLED_DEPS:-0}" != 1 ] && bash "$root/cmake/deps.sh" 2>/dev/null; then
  echo "== dependencies: installed packages"
elif compgen -G "$bundle/*.deb" >/dev/null; then
  command -v dpkg-deb >/dev/null || command -v ar >/dev/null || die "dpkg-deb or ar is needed to unpack $bundle"
  sysroot="$build/sysroot"
  lib="$sysroot/usr/lib/x86_64-linux-gnu"
  rm -rf "$sysroot" && mkdir -p "$sysroot"
  for f in "$bundle"/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$sysroot"
    else (cd "$sysroot" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -xJ); fi || die "cannot unpack $f"
  done
  # Keep only the libraries this machine lacks (Open MPI's and Kokkos' own always): a bundled copy
  # of one it has could be older than what its own programs (cmake, nvcc) need.
  have=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null)
  for so in "$lib"/lib*.so.*; do
    n=$(basename "$so")
    case "$n" in libmpi*|libopen-*|libmca_*|liboshmem*|libompitrace*|libpmix*|libtrilinos*) continue ;; esac
    echo "$have" | grep -q "^[[:space:]]$n " && rm -f "$so"
  done
  # Relocation: Open MPI follows OPAL_PREFIX; PMIx reads its component path from its own file.
  sed -i "s|= /usr/lib/|= $sysroot/usr/lib/|" "$lib/pmix2/share/pmix-mca-params.conf" 2>/dev/null
  # Debian's doctest CMake package names /usr outright.
  sed -i "s|set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$sysroot/usr\")|" "$sysroot"/usr/lib/cmake/*/*Targets.cmake
  for t in mpicxx mpic++ mpicc mpirun mpiexec; do ln -sf "$t.openmpi" "$sysroot/usr/bin/$t"; done
  export OPAL_PREFIX="$sysroot/usr" PATH="$sysroot/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib:$LD_LIBRARY_PATH"
  export CMAKE_PREFIX_PATH="$sysroot/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  echo "== dependencies: $(ls "$bundle"/*.deb | wc -l) bundled packages unpacked into $sysroot"
else
  die "gradsync's Debian packages are missing and could not be installed (no root or no apt mirror).
  Either install: cmake make g++ libtrilinos-kokkos-dev libopenmpi-dev openmpi-bin doctest-dev,
  or run 'bash tests/gpu/bundle_deps.sh' on a Debian 12 machine with a mirror and bring .gpu-deps/ here"
fi
command -v cmake >/dev/null || die "cmake not found"
generator=()
# Ninja where there is one: CMake's Makefiles build the targets named on one command line one after
# another (.NOTPARALLEL), which made a TARGETS rerun of 9 targets slower than the whole build.
if command -v ninja >/dev/null; then generator=(-G Ninja)
elif ! command -v make >/dev/null; then die "neither ninja nor make found"; fi
# CMake 4 refuses package files written for CMake < 3.5 unless told a minimum policy version.
[ "$(cmake --version | sed -n 's/cmake version \([0-9]*\).*/\1/p')" -ge 4 ] &&
  generator+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
echo "== GPUs: $(echo "$gpus" | tr '\n' ';') nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), arch sm_$cap"

# ---- 2. build: configure, then the measuring programs ----
# A Kokkos with its CUDA backend makes every default View a device View: the whole suite, the
# semantics table, DistributedOptimizer and hybrid_dlrm --check included, then runs on the GPU.
# KOKKOS_ROOT names the install; bundle_deps.sh copies one into the bundle as kokkos/.
[ -z "${KOKKOS_ROOT:-}" ] && compgen -G "$bundle/kokkos/lib*/cmake/Kokkos" >/dev/null && KOKKOS_ROOT="$bundle/kokkos"
extra=()
if [ -n "${KOKKOS_ROOT:-}" ]; then
  extra+=(-DKokkos_ROOT="$KOKKOS_ROOT")
  # nvcc_wrapper's default architecture (sm_70) is one CUDA 13 rejects: name this GPU's.
  [ -x "$KOKKOS_ROOT/bin/nvcc_wrapper" ] &&
    extra+=(-DCMAKE_CXX_COMPILER="$KOKKOS_ROOT/bin/nvcc_wrapper" -DCMAKE_CXX_FLAGS="-arch=sm_$cap")
fi
t0=$(date +%s)
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGRADSYNC_WERROR="${WERROR:-OFF}" -DGRADSYNC_ENABLE_CUDA=ON \
  -DGRADSYNC_ENABLE_NCCL=ON -DGRADSYNC_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_ARCHITECTURES="$cap" "${extra[@]}" >"$log" 2>&1 ||
  { tail -30 "$log"; die "configure failed (log: $log)"; }
kokkos_line="$(sed -n 's/.*Enabled Kokkos devices: //p' "$log" | head -1)"
kokkos_line="${KOKKOS_ROOT:-Debian Kokkos 3.4} (${kokkos_line:-Serial})"
say "configured: Kokkos $kokkos_line"
# The measuring programs first, so that their numbers come before a long build can run out of time.
first=()
[ "${BENCH:-1}" != 0 ] && first+=(bench_gpu)
[ -z "${GPU_PROCS:-}" ] && [ "${LATENCY:-1}" != 0 ] && first+=(gpu_launch_latency)
if [ ${#first[@]} -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "${first[@]}" >>"$log" 2>&1 ||
    { save_logs; grep -E "error" "$log" | head -30; die "build of ${first[*]} failed (log: $log)"; }
fi
t_build=$(since "$t0")
say "built ${first[*]:-nothing first} in $t_build s"

# ---- 3. how many processes may share the GPU: ctest's -j (tests/gpu/gpu_procs.sh) ----
if [ -n "${GPU_PROCS:-}" ]; then
  ctest_jobs=$GPU_PROCS
  echo "measured nothing: GPU_PROCS=$GPU_PROCS" >"$build/latency.txt"
elif [ "${LATENCY:-1}" = 0 ]; then
  ctest_jobs=$jobs
  echo "not measured: LATENCY=0" >"$build/latency.txt"
else
  ctest_jobs=$(bash "$root/tests/gpu/gpu_procs.sh" "$build" "$jobs")
fi
latency_table=$(cat "$build/latency.txt")
save_logs
say "ctest -j $ctest_jobs, from the launch latency"

# ---- 4. the benchmark (before the suite: a run cut short still has its numbers) ----
t0=$(date +%s)
bench_out=""
bench_rc=0
models=(resnet50 vit_b_16)
[ "${BENCH:-1}" = 0 ] && models=()
for model in "${models[@]}"; do
  out=$(cd "$build" && mpirun -np 1 ./tests/cuda/bench_gpu "$root/data/models/$model.csv" "$reps" 2>&1) || bench_rc=1
  bench_out+="$out"$'\n'
done
if [ "$ngpu" -ge 2 ] && [ "${BENCH:-1}" != 0 ]; then
  out=$(cd "$build" && mpirun -np 2 ./tests/cuda/bench_gpu "$root/data/models/resnet50.csv" "$reps" 2>&1) || bench_rc=1
  bench_out+="$out"$'\n'
fi
t_bench=$(since "$t0")
echo "$bench_out" >"$build/bench.log"

# pack/unpack against the 80% target: the "vs ref" column of those rows.
worst=$(echo "$bench_out" | awk '/^(pack|unpack) kernel/ {gsub("%","",$5); if (w=="" || $5+0 < w) w=$5+0} END {print w}')
target="n/a"
[ -n "$worst" ] && { [ "$worst" -ge 80 ] && target="met ($worst% worst)" || target="MISSED ($worst% worst)"; }
# The device sync in place against one ncclAllReduce (target 1.1x): the rows that carry that target.
sync_target=$(echo "$bench_out" | awk '/^sync\/nccl\// && /in place/ && />=91%/ {n++; if (/MISSED/) m++}
  END {if (n) printf "%d of %d rows met (MISSED: %d)", n - m, n, m; else print "n/a"}')
if [ $bench_rc -ne 0 ]; then
  bench_state="FAILED: $(echo "$bench_out" | grep -m1 -E '^bench_gpu:|error' | cut -c1-200)"
elif echo "$bench_out" | grep -q 'WRONG'; then bench_state="WRONG VALUES"
else bench_state="values correct"; fi
save_logs
if [ ${#models[@]} -gt 0 ]; then
  echo "$bench_out" | sed -n '/^gradsync GPU benchmark/,/^values checked/p'
  say "benchmark in $t_bench s, $bench_state; pack/unpack >= 80% memcpy: $target; sync/nccl <= 1.1x: $sync_target"
fi

# ---- 5. the rest of the build ----
# RUN_S: keep 90 s for the suite's start, one rerun and the summary; a build cut there leaves the
# programs it finished, and ctest reports the others as not run.
t0=$(date +%s)
targets=()
[ -n "${TARGETS:-}" ] && targets=(--target ${TARGETS})  # one invocation: built in parallel
bounded=()
[ -n "${RUN_S:-}" ] && bounded=(timeout -k 10 "$(l=$(left 90); echo $((l < 1 ? 1 : l)))")
"${bounded[@]}" cmake --build "$build" -j "$jobs" "${targets[@]}" >>"$log" 2>&1
build_rc=$?
t_build=$((t_build + $(since "$t0")))
save_logs
if [ $build_rc -eq 124 ] || [ $build_rc -eq 137 ]; then
  build_state="STOPPED by RUN_S=$RUN_S after $t_build s"
  say "$build_state: testing what was built"
elif [ $build_rc -ne 0 ]; then
  grep -E "error" "$log" | head -30
  die "build failed (log: $log)"
else
  build_state="$t_build s"
  say "built everything in $t_build s"
fi

# ---- 6. the test suite, CUDA tests included ----
t0=$(date +%s)
# The two-host bed (label multihost) needs network namespaces: CI runs it, a GPU node need not.
# SUITE_S bounds it (a device call has a time limit): the summary then counts what ran.
# RUN_S: keep 75 s for one rerun and the summary.
suite_limit=${SUITE_S:-}
if [ -n "${RUN_S:-}" ]; then
  avail=$(left 75)
  [ "$avail" -lt 1 ] && avail=1
  [ -z "$suite_limit" ] || [ "$avail" -lt "$suite_limit" ] && suite_limit=$avail
fi
suite_s=()
[ -n "$suite_limit" ] && suite_s=(timeout -k 10 "$suite_limit")
(cd "$build" && "${suite_s[@]}" ctest -j "$ctest_jobs" --output-on-failure --timeout 300 -LE multihost ${CTEST_ARGS:-}) >"$build/ctest.log" 2>&1
ctest_rc=$?
t_test=$(( $(date +%s) - t0 ))
tests_line=$(grep -E "tests passed|tests failed" "$build/ctest.log" | tail -1)
if [ $ctest_rc -eq 124 ] || [ $ctest_rc -eq 137 ]; then
  tests_line="STOPPED after $suite_limit s (SUITE_S, RUN_S): $(grep -cE 'Test +#[0-9]+: .* Passed' "$build/ctest.log") passed, $(grep -cE 'Test +#[0-9]+: .*\*\*\*' "$build/ctest.log") failed or timed out before that"
fi
save_logs
say "test suite in $t_test s at ctest -j $ctest_jobs: ${tests_line:-no summary}"
skipped=$(grep -E "\(Skipped\)" "$build/ctest.log" | sed 's/^[[:space:]]*//' | tr '\n' ' ')
cuda_lines=$(grep -E "Test +#[0-9]+: (nccl_backend|gpu_sync)" "$build/ctest.log" |
  sed -E 's/^.*Test +#[0-9]+: //; s/ \.+ *(\*\*\*)?/ /; s/ +/ /g' | tr '\n' ';')
[ $ctest_rc -eq 0 ] || grep -B2 -A20 -E "\*\*\*Failed|\*\*\*Timeout" "$build/ctest.log" | head -80
# The five slowest tests, for the launch counts of docs/GPU.md.
slowest=$(sed -nE 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/p' "$build/ctest.log" | sort -rn | head -5 |
  awk '{printf "%s %.0f s; ", $2, $1}')
# Each program that timed out, again alone at 1 rank for 60 s under doctest's XML reporter, which
# names every test case and subcase as it starts. Finishing alone says the suite's sharing of the
# GPU made it slow; else the last cases named are where it hangs or crawls. Its Kokkos counts (deep
# copies, launches, allocations per case) are checked on the CPU already.
# RUN_S: only while 60 s and the summary's 15 are left.
for t in $(sed -nE 's/.*Test +#[0-9]+: ([A-Za-z0-9_]+)\.np[0-9]+ .*\*\*\*Timeout.*/\1/p' "$build/ctest.log" | sort -u); do
  [ -x "$build/tests/test_$t" ] || continue
  [ "$(left 15)" -ge 60 ] || { echo "== $t timed out in the suite; no time left (RUN_S) to run it alone"; continue; }
  t1=$(date +%s.%N)
  (cd "$build" && timeout 60 mpirun -np 1 "./tests/test_$t" -r=xml >"$build/alone.$t.xml" 2>&1)
  rc=$?
  took=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  if [ $rc -eq 124 ]; then
    echo "== $t timed out in the suite; alone at 1 rank, still running after 60 s, in:"
    grep -E "<TestCase|<SubCase" "$build/alone.$t.xml" | tail -4
  else
    echo "== $t timed out in the suite; alone at 1 rank it ended in $took s (exit $rc)"
  fi
done >"$build/timeouts.log" 2>&1
cat "$build/timeouts.log"
save_logs

echo "================ gradsync GPU run ($(since "$t_start") s) ================"
printf "%-28s %s\n" "GPU(s)" "$ngpu x $(echo "$gpus" | head -1)"
printf "%-28s %s\n" "Kokkos" "$kokkos_line"
printf "%-28s %s\n" "build (s)" "$build_state, $(grep -c 'warning' "$log") warning lines"
printf "%-28s %s\n" "launch+wait us, by procs" "$latency_table"
printf "%-28s %s\n" "test suite (s)" "$t_test at ctest -j $ctest_jobs: ${tests_line:-no summary}"
printf "%-28s %s\n" "slowest tests" "${slowest:-none}"
printf "%-28s %s\n" "CUDA tests" "${cuda_lines:-none ran}"
printf "%-28s %s\n" "skipped tests" "${skipped:-none}"
printf "%-28s %s\n" "benchmark (s)" "$t_bench, $bench_state"
printf "%-28s %s\n" "pack/unpack >= 80% memcpy" "$target"
printf "%-28s %s\n" "sync/nccl <= 1.1x allreduce" "$sync_target"
printf "%-28s %s\n" "logs" "$log $build/ctest.log $build/bench.log${OUT:+ (copied to $OUT)}"
if [ -n "${DIAG:-}" ]; then
  echo "== DIAG: $DIAG"
  (cd "$build" && eval "$DIAG") 2>&1 | tee "$build/diag.log" | tail -60
  save_logs
fi
# Fail when the build or a test failed, when a CUDA test skipped on a GPU machine, or the benchmark failed.
[ $build_rc -eq 0 ] && [ $ctest_rc -eq 0 ] && [ -z "$(echo "$skipped" | grep -E 'gpu_sync')" ] && [ $bench_rc -eq 0 ]
