# Warning flags for gradsync's own tests, examples and benchmarks (never imposed on consumers).
set(GRADSYNC_WARNINGS -Wall -Wextra -Wpedantic -Wshadow)
option(GRADSYNC_WERROR "Treat warnings as errors in gradsync's own targets" OFF)
if(GRADSYNC_WERROR)
  list(APPEND GRADSYNC_WARNINGS -Werror)
endif()

# Launching MPI programs from ctest. The flags and environment are the launcher's own, so they are
# chosen for the MPI implementation CMake found (GRADSYNC_MPI_IMPL: openmpi, mpich or unknown):
# - Open MPI: root needs the allow-run-as-root pair, a 2-core machine needs --oversubscribe for 3
#   and 4 ranks, and idle ranks should yield (mpi_yield_when_idle) so oversubscription works.
# - MPICH (Hydra, and its derivatives): oversubscribes without a flag and refuses Open MPI's. Its
#   blocking calls never yield (ch4: no setting does; MPIR_CVAR_POLLS_BEFORE_YIELD is ch3's,
#   MPI_THREAD_MULTIPLE and MPIR_CVAR_ASYNC_PROGRESS measured no better or worse), so the ranks'
#   environment preloads tests/tools/mpich_yield.cpp (GRADSYNC_TEST_MPICH_YIELD), which waits for
#   the nonblocking forms with a yield between tests; gradsync's own waits yield by themselves
#   (Tuning::spin_before_yield). docs/COMPATIBILITY.md, MPICH, has the measurements.
# With a Kokkos OpenMP backend, idle OpenMP threads spin by default; with more ranks x threads than
# cores they starve the ranks' MPI progress (gradient_sync.np3, 2 threads each, on 2 cores: over
# 200 s spinning, 2.6 s passive), so the tests' threads sleep when idle and are not pinned.
set(GRADSYNC_MPIEXEC "${MPIEXEC_EXECUTABLE}" CACHE STRING "MPI launcher for tests")
function(_gradsync_detect_mpi out)
  # The launcher says which implementation it belongs to; the header is the fallback (a launcher
  # such as srun says nothing about MPI).
  execute_process(COMMAND "${GRADSYNC_MPIEXEC}" --version OUTPUT_VARIABLE _v ERROR_VARIABLE _e
                  RESULT_VARIABLE _rc TIMEOUT 20)
  if("${_v}${_e}" MATCHES "Open MPI|OpenRTE|open-mpi")
    set(${out} openmpi PARENT_SCOPE)
    return()
  elseif("${_v}${_e}" MATCHES "HYDRA|MPICH|Intel\(R\) MPI")
    set(${out} mpich PARENT_SCOPE)
    return()
  endif()
  gradsync_mpi_flavor(_flavor ${MPI_CXX_INCLUDE_DIRS} ${MPI_CXX_COMPILER_INCLUDE_DIRS})  # GradSyncMpi.cmake
  set(${out} ${_flavor} PARENT_SCOPE)
endfunction()
_gradsync_detect_mpi(GRADSYNC_MPI_IMPL)
message(STATUS "gradsync: tests launched with ${GRADSYNC_MPIEXEC} (MPI implementation: ${GRADSYNC_MPI_IMPL})")
if(GRADSYNC_MPI_IMPL STREQUAL "openmpi")
  set(_gradsync_flags "--oversubscribe")
  set(GRADSYNC_MPI_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1")
elseif(GRADSYNC_MPI_IMPL STREQUAL "mpich")
  option(GRADSYNC_TEST_MPICH_YIELD "MPICH: the test ranks' blocking MPI calls yield while they wait (tests/tools/mpich_yield.cpp)" ON)
  set(_gradsync_flags "")
  if(GRADSYNC_TEST_MPICH_YIELD AND GRADSYNC_BUILD_TESTS)
    # -genv: the ranks only, not mpiexec, Hydra's proxies or the cmake scripts some tests run.
    set(GRADSYNC_MPICH_YIELD_LIB "${PROJECT_BINARY_DIR}/tests/libgradsync_mpich_yield.so")
    set(_gradsync_flags "-genv LD_PRELOAD ${GRADSYNC_MPICH_YIELD_LIB}")
  endif()
  set(GRADSYNC_MPI_ENV "")
else()
  set(_gradsync_flags "")
  set(GRADSYNC_MPI_ENV "")
endif()
list(APPEND GRADSYNC_MPI_ENV "OMP_WAIT_POLICY=passive;OMP_PROC_BIND=false")
# Overridable; a value that is the default of another implementation (the cache of a build dir
# reconfigured for another MPI, or made before the defaults depended on it: --oversubscribe)
# follows the new default instead of breaking every launch.
if(NOT DEFINED _GRADSYNC_MPIEXEC_FLAGS_DEFAULT)
  set(_GRADSYNC_MPIEXEC_FLAGS_DEFAULT "--oversubscribe")
endif()
if(DEFINED CACHE{GRADSYNC_MPIEXEC_FLAGS} AND "${GRADSYNC_MPIEXEC_FLAGS}" STREQUAL "${_GRADSYNC_MPIEXEC_FLAGS_DEFAULT}"
   AND NOT "${_gradsync_flags}" STREQUAL "${_GRADSYNC_MPIEXEC_FLAGS_DEFAULT}")
  set_property(CACHE GRADSYNC_MPIEXEC_FLAGS PROPERTY VALUE "${_gradsync_flags}")
endif()
set(GRADSYNC_MPIEXEC_FLAGS "${_gradsync_flags}" CACHE STRING
    "Launcher flags for tests (default: chosen for the MPI implementation found)")
set(_GRADSYNC_MPIEXEC_FLAGS_DEFAULT "${_gradsync_flags}" CACHE INTERNAL "")

# gradsync_add_mpi_test(NAME <name> COMMAND <exe> [args...] RANKS <n...> [TIMEOUT <s>]
#                       [PROPERTIES ...]): one ctest per rank count, named <name>.np<n>; @NP@ in
# PROPERTIES is that count (programs without GSYNC_TEST_RANKS's check print theirs). Exit code 77
# is a skip (SKIP_RETURN_CODE): a test program none of whose cases can run at that rank count says
# why and exits 77 (tests/test_main.cpp). A command that runs a program built with a user's flags
# (a test program without the test hooks, an example) gets the label user_build.
# Whether the examples a test command runs ($<TARGET_FILE:example>) are built: with
# GRADSYNC_BUILD_EXAMPLES=OFF their tests are registered as skipped, the reason in <out>_WHY.
set(GRADSYNC_EXAMPLE_TARGETS quickstart multi_tower hybrid_dlrm online_closure torch_hybrid fortran_hybrid)
function(gradsync_examples_built out)
  set(${out} TRUE PARENT_SCOPE)
  foreach(_ex IN LISTS GRADSYNC_EXAMPLE_TARGETS)
    if("${ARGN}" MATCHES "\\$<TARGET_FILE:${_ex}>" AND NOT TARGET ${_ex})
      set(${out} FALSE PARENT_SCOPE)
      if(GRADSYNC_BUILD_EXAMPLES)
        set(${out}_WHY "the example ${_ex} is not built in this configuration" PARENT_SCOPE)
      else()
        set(${out}_WHY "the example ${_ex} is not built (GRADSYNC_BUILD_EXAMPLES=OFF)" PARENT_SCOPE)
      endif()
      get_property(_said GLOBAL PROPERTY gradsync_examples_said)
      if(NOT _said)
        message(STATUS "gradsync: the examples' tests are skipped (GRADSYNC_BUILD_EXAMPLES=OFF or example not built)")
        set_property(GLOBAL PROPERTY gradsync_examples_said TRUE)
      endif()
    endif()
  endforeach()
endfunction()

# <out>: user_build when `cmd` runs a program built as a user's is (see above), else empty.
function(_gradsync_build_label out)
  set(${out} "" PARENT_SCOPE)
  string(REGEX MATCHALL "\\$<TARGET_FILE:[A-Za-z0-9_.+-]+>" _refs "${ARGN}")
  foreach(_ref IN LISTS _refs)
    string(REGEX REPLACE "^\\$<TARGET_FILE:(.*)>$" "\\1" _tgt "${_ref}")
    if(TARGET ${_tgt})
      get_target_property(_user ${_tgt} GRADSYNC_USER_BUILD)
      if(_user OR _tgt IN_LIST GRADSYNC_EXAMPLE_TARGETS)
        set(${out} user_build PARENT_SCOPE)
      endif()
    endif()
  endforeach()
endfunction()

# Tests <name>.np<n> for each rank count given (<name> itself when none is) that only say why they
# cannot run here: exit 77, skipped, where leaving them out would be a silent gap in the suite.
function(_gradsync_add_skip_tests name why)
  set(_names "${name}")
  if(ARGN)
    list(TRANSFORM ARGN PREPEND "${name}.np" OUTPUT_VARIABLE _names)
  endif()
  foreach(_t IN LISTS _names)
    add_test(NAME "${_t}" COMMAND sh -c "echo 'skipped: ${why}'; exit 77")
    set_tests_properties("${_t}" PROPERTIES SKIP_RETURN_CODE 77 LABELS "mpi;skipped")
  endforeach()
endfunction()

function(gradsync_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "COMMAND;RANKS;LABELS;PROPERTIES" ${ARGN})
  gradsync_examples_built(_built ${A_COMMAND})
  if(NOT _built)
    _gradsync_add_skip_tests("${A_NAME}" "${_built_WHY}" ${A_RANKS})
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  _gradsync_build_label(_user ${A_COMMAND})
  set(_labels mpi ${_user} ${A_LABELS})
  separate_arguments(_flags UNIX_COMMAND "${GRADSYNC_MPIEXEC_FLAGS}")
  foreach(np IN LISTS A_RANKS)
    set(_t "${A_NAME}.np${np}")
    string(REPLACE "@NP@" "${np}" _props "${A_PROPERTIES}")
    add_test(NAME "${_t}" COMMAND "${GRADSYNC_MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} ${np} ${_flags} ${A_COMMAND})
    # GSYNC_TEST_RANKS: the world size the test was launched for; the test programs and the
    # examples fail when MPI's differs (a launcher of another MPI starts n separate 1-rank processes).
    set_tests_properties("${_t}" PROPERTIES TIMEOUT ${A_TIMEOUT} PROCESSORS ${np} SKIP_RETURN_CODE 77
                         ENVIRONMENT "${GRADSYNC_MPI_ENV};GSYNC_TEST_RANKS=${np}" LABELS "${_labels}"
                         ${_props})
  endforeach()
endfunction()

# A multi-rank run that must fail and say what it must (tests/expect_failure.cmake: a non-zero exit
# and REGEX in the output, so a crash does not pass): one test per rank count, NAME.np<n>, as
# gradsync_add_mpi_test; @NP@ in REGEX is the rank count.
function(gradsync_add_mpi_failure_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;REGEX" "COMMAND;RANKS" ${ARGN})
  gradsync_examples_built(_built ${A_COMMAND})
  if(NOT _built)
    _gradsync_add_skip_tests("${A_NAME}" "${_built_WHY}" ${A_RANKS})
    return()
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  _gradsync_build_label(_user ${A_COMMAND})
  separate_arguments(_flags UNIX_COMMAND "${GRADSYNC_MPIEXEC_FLAGS}")
  string(REPLACE ";" "|" _flags "${_flags}")
  string(REPLACE ";" "|" _cmd "${A_COMMAND}")  # expect_failure.cmake's '|'-separated arguments
  foreach(np IN LISTS A_RANKS)
    set(_t "${A_NAME}.np${np}")
    string(REPLACE "@NP@" "${np}" _regex "${A_REGEX}")
    add_test(NAME "${_t}"
             COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${GRADSYNC_MPIEXEC}|${MPIEXEC_NUMPROC_FLAG}|${np}|${_flags}|${_cmd}"
                     "-DREGEX=${_regex}" -P "${PROJECT_SOURCE_DIR}/tests/expect_failure.cmake")
    set_tests_properties("${_t}" PROPERTIES TIMEOUT ${A_TIMEOUT} PROCESSORS ${np}
                         ENVIRONMENT "${GRADSYNC_MPI_ENV};GSYNC_TEST_RANKS=${np}" LABELS "mpi;${_user}")
  endforeach()
endfunction()

# AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer for gradsync's own tests, examples
# and benchmarks (.ci/run builds the whole suite this way in build-asan); every finding ends the run.
# Open MPI's own allocations outlive MPI_Finalize: tests/lsan.supp suppresses exactly those, by
# library, and tests/tools/no_dlclose.cpp, preloaded into the ranks, keeps its components mapped so
# that the report at exit can name them. Any other leak fails the test (tests/CMakeLists.txt proves
# it with a leak made on purpose).
option(GRADSYNC_SANITIZE "Build gradsync's own targets with -fsanitize=address,undefined" OFF)
if(GRADSYNC_SANITIZE)
  set(_gradsync_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options(${_gradsync_san})
  add_link_options(${_gradsync_san})
  # verify_asan_link_order=0: the preloaded library comes before the ASan runtime in the ranks.
  list(APPEND GRADSYNC_MPI_ENV "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:verify_asan_link_order=0"
       "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0"
       "LD_PRELOAD=${PROJECT_BINARY_DIR}/tests/libgradsync_no_dlclose.so"
       "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
endif()
