# ctest driver: install gradsync into a scratch prefix, build tests/consumer against it with
# find_package(GradSync CONFIG REQUIRED), and run it on 2 ranks.
#   cmake -DBUILD=<gradsync build dir> -DSRC=<consumer source> -DWORK=<scratch> -DMPIEXEC=... -P run_consumer.cmake
file(REMOVE_RECURSE "${WORK}")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${ARGN}")
  endif()
endfunction()
step(${CMAKE_COMMAND} --install "${BUILD}" --prefix "${WORK}/prefix")
step(${CMAKE_COMMAND} -S "${SRC}" -B "${WORK}/build" "-DCMAKE_PREFIX_PATH=${WORK}/prefix" -DCMAKE_BUILD_TYPE=Release
     "-DKokkos_DIR=${KOKKOS_DIR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
step(${CMAKE_COMMAND} --build "${WORK}/build")
step(${MPIEXEC} -np 2 --oversubscribe "${WORK}/build/consumer")
