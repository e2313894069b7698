# Warning flags for gradsync's own tests, examples and benchmarks (never imposed on consumers).
set(GRADSYNC_WARNINGS -Wall -Wextra -Wpedantic -Wshadow)
option(GRADSYNC_WERROR "Treat warnings as errors in gradsync's own targets" OFF)
if(GRADSYNC_WERROR)
  list(APPEND GRADSYNC_WARNINGS -Werror)
endif()

# Launching MPI programs from ctest: root needs the allow-run-as-root pair, a 2-core machine
# needs --oversubscribe for 3 and 4 ranks, and idle ranks should yield so oversubscription works.
# With a Kokkos OpenMP backend, idle OpenMP threads spin by default; with more ranks x threads than
# cores they starve the ranks' MPI progress (gradient_sync.np3, 2 threads each, on 2 cores: over
# 200 s spinning, 2.6 s passive), so the tests' threads sleep when idle and are not pinned.
set(GRADSYNC_MPIEXEC "${MPIEXEC_EXECUTABLE}" CACHE STRING "MPI launcher for tests")
set(GRADSYNC_MPIEXEC_FLAGS "--oversubscribe" CACHE STRING "Launcher flags for tests")
set(GRADSYNC_MPI_ENV
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1"
  "OMP_WAIT_POLICY=passive;OMP_PROC_BIND=false")

# gradsync_add_mpi_test(NAME <name> COMMAND <exe> [args...] RANKS <n...> [TIMEOUT <s>])
# adds one ctest per rank count, named <name>.np<n>.
function(gradsync_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "COMMAND;RANKS;LABELS;PROPERTIES" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  separate_arguments(_flags UNIX_COMMAND "${GRADSYNC_MPIEXEC_FLAGS}")
  foreach(np IN LISTS A_RANKS)
    set(_t "${A_NAME}.np${np}")
    add_test(NAME "${_t}" COMMAND "${GRADSYNC_MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} ${np} ${_flags} ${A_COMMAND})
    set_tests_properties("${_t}" PROPERTIES TIMEOUT ${A_TIMEOUT} PROCESSORS ${np}
                         ENVIRONMENT "${GRADSYNC_MPI_ENV}" LABELS "mpi;${A_LABELS}" ${A_PROPERTIES})
  endforeach()
endfunction()

# AddressSanitizer + UndefinedBehaviorSanitizer for gradsync's own tests, examples and benchmarks
# (.ci/run builds the whole suite this way in build-asan). Open MPI's allocations outlive
# MPI_Finalize and would all be reported by LeakSanitizer, so leak detection is off; every UBSan
# finding ends the run.
option(GRADSYNC_SANITIZE "Build gradsync's own targets with -fsanitize=address,undefined" OFF)
if(GRADSYNC_SANITIZE)
  set(_gradsync_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options(${_gradsync_san})
  add_link_options(${_gradsync_san})
  list(APPEND GRADSYNC_MPI_ENV "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
       "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()
