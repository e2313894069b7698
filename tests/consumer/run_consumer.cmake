# ctest driver: install gradsync into a scratch prefix, build tests/consumer against it with
# find_package(GradSync CONFIG REQUIRED COMPONENTS <those built>), run it on 2 ranks, and check that
# a component this installation lacks (cuda, nccl, c, fortran, torch, hdf5 when not built) fails find_package
# with a message naming it.
#   cmake -DBUILD=<gradsync build dir> -DSRC=<consumer source> -DWORK=<scratch> -DMPIEXEC=...
#         "-DMPIEXEC_FLAGS=-n 2 <the launcher's flags for this MPI: GRADSYNC_MPIEXEC_FLAGS>"
#         -DVERSION=<project version> -DHAVE_CUDA=ON|OFF -DHAVE_NCCL=ON|OFF -DHAVE_C=ON|OFF -DHAVE_FORTRAN=ON|OFF -DHAVE_TORCH=ON|OFF -DHAVE_HDF5=ON|OFF
#         -DKOKKOS_DIR=<Kokkos_DIR> -DCXX=<compiler> -DCXX_FLAGS=<flags> [-DCXX_STANDARD=<17|20|...>]
#         -P run_consumer.cmake
# Or, instead of -DBUILD, -DPREFIX=<an installation made elsewhere> (tests/spack.sh: Spack's).
file(REMOVE_RECURSE "${WORK}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${ARGN}")
  endif()
endfunction()
if(NOT PREFIX)
  set(PREFIX "${WORK}/prefix")
  step(${CMAKE_COMMAND} --install "${BUILD}" --prefix "${PREFIX}")
endif()

set(have "")
set(lacking "")
foreach(c cuda nccl c fortran torch hdf5)
  string(TOUPPER "${c}" C)
  if(HAVE_${C})
    list(APPEND have ${c})
  else()
    list(APPEND lacking ${c})
  endif()
endforeach()

# The consumer builds with this build's Kokkos and compiler (nvcc_wrapper for Kokkos-CUDA), and in
# its C++ standard when the build named one (else what Kokkos' and gradsync's cxx_std_N give); the
# consumer prints the standard it was compiled in.
set(same_toolchain "-DKokkos_DIR=${KOKKOS_DIR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
if(CXX_STANDARD)
  list(APPEND same_toolchain "-DCMAKE_CXX_STANDARD=${CXX_STANDARD}")
endif()

# A component no gradsync has: refused whatever was built (so the refusal is always exercised).
list(APPEND lacking nosuch)
set(why_nosuch "GradSync has no component 'nosuch'")

# Lists travel comma-separated: step() would split a semicolon list into separate arguments.
string(REPLACE ";" "," have_csv "${have}")
string(REPLACE ";" "," lacking_csv "${lacking}")

# Components the installation lacks: find_package fails, and says which and why.
set(why_torch "GradSync component 'torch' was not built: gradsync ${VERSION} was configured without LibTorch")
set(why_cuda "GradSync component 'cuda' was not built: gradsync ${VERSION} was configured without CUDA")
set(why_nccl "GradSync component 'nccl' was not built: gradsync ${VERSION} was configured without NCCL")
set(why_c "GradSync component 'c' was not built")
set(why_fortran "GradSync component 'fortran' was not built")
set(why_hdf5 "GradSync component 'hdf5' was not built: gradsync ${VERSION} was configured without a parallel HDF5")
foreach(c IN LISTS lacking)
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${SRC}" -B "${WORK}/build-${c}" "-DCMAKE_PREFIX_PATH=${PREFIX}"
                          ${same_toolchain} "-DREQUIRE=${have_csv},${c}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \n]+" " " all "${out} ${err}")  # CMake wraps long messages
  string(FIND "${all}" "${why_${c}}" at)
  if(rc EQUAL 0 OR at LESS 0)
    message(FATAL_ERROR "consumer: requiring the missing component '${c}' should fail naming it (rc ${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "consumer: REQUIRED component '${c}' refused: ${why_${c}}")
endforeach()

# The components it has, required; the lacking ones optional; the version checked. Built and run.
step(${CMAKE_COMMAND} -S "${SRC}" -B "${WORK}/build" "-DCMAKE_PREFIX_PATH=${PREFIX}" -DCMAKE_BUILD_TYPE=Release
     ${same_toolchain} "-DREQUIRE=${have_csv}" "-DOPTIONAL=${lacking_csv}" "-DEXPECTED_VERSION=${VERSION}")
step(${CMAKE_COMMAND} --build "${WORK}/build")
separate_arguments(launch UNIX_COMMAND "${MPIEXEC_FLAGS}")
step(${MPIEXEC} ${launch} "${WORK}/build/consumer")
if(EXISTS "${WORK}/build/consumer_c")
  step(${MPIEXEC} ${launch} "${WORK}/build/consumer_c")
endif()
if(EXISTS "${WORK}/build/consumer_f")
  step("${WORK}/build/consumer_f")
endif()
message(STATUS "consumer: every check passed (required [${have}], refused [${lacking}], version ${VERSION})")
