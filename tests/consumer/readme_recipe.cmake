# ctest driver: the README's install recipe and consumer project, run exactly as README.md writes
# them. The shell blocks between <!-- install-recipe --> and <!-- consumer-build --> markers and the
# CMakeLists.txt between <!-- consumer-cmakelists --> markers are taken from README.md, not copied
# here: the recipe runs in a scratch directory where `gradsync` is a link to this source tree and
# HOME is a scratch home, the consumer is the README's CMakeLists.txt with tests/consumer/main.cpp as
# main.cpp, and it runs on 2 ranks.
#   cmake -DSRC=<gradsync source> -DWORK=<scratch> -DMPIEXEC=... "-DMPIEXEC_FLAGS=-n 2 <launcher flags>"
#         -DMPI_FLAVOR=<this build's GRADSYNC_MPI_FLAVOR> -DKOKKOS_DIR=<Kokkos_DIR> -DCXX=<compiler>
#         -DCXX_FLAGS=<flags> -P readme_recipe.cmake
# The build's toolchain reaches the recipe the way a user's would, through the environment CMake
# reads at a first configure (CXX, CXXFLAGS, Kokkos_DIR); the lines themselves are unchanged.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/home" "${WORK}/app")
file(CREATE_LINK "${SRC}" "${WORK}/gradsync" SYMBOLIC)

file(READ "${SRC}/README.md" readme)
# The text between <!-- name --> and <!-- /name -->, without its ``` fence lines.
function(readme_block name out)
  string(FIND "${readme}" "<!-- ${name} -->" begin)
  string(FIND "${readme}" "<!-- /${name} -->" end)
  if(begin LESS 0 OR end LESS begin)
    message(FATAL_ERROR "readme recipe: README.md has no <!-- ${name} --> ... <!-- /${name} --> block")
  endif()
  string(LENGTH "<!-- ${name} -->" skip)
  math(EXPR begin "${begin} + ${skip}")
  math(EXPR len "${end} - ${begin}")
  string(SUBSTRING "${readme}" ${begin} ${len} text)
  string(REGEX REPLACE "^[ \n]*```[a-z]*\n" "" text "${text}")
  string(REGEX REPLACE "```[ \n]*$" "" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
readme_block(install-recipe recipe)
readme_block(consumer-cmakelists consumer_cmakelists)
readme_block(consumer-build consumer_build)

# Every line a command, run by sh -e in WORK with HOME=WORK/home; a failing line stops the test.
function(run_lines what lines)
  message(STATUS "readme recipe: ${what}:\n${lines}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "HOME=${WORK}/home" "CXX=${CXX}" "CXXFLAGS=${CXX_FLAGS}"
                          "Kokkos_DIR=${KOKKOS_DIR}" sh -e -x -c "${lines}"
                  WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readme recipe: the README's ${what} failed (${rc})")
  endif()
endfunction()

run_lines("install recipe" "${recipe}")
# The launcher given is this build's MPI's; the recipe's configure found its MPI by itself.
set(config "${WORK}/gradsync-build/GradSyncConfig.cmake")
file(STRINGS "${config}" flavor_line REGEX "^set\\(GRADSYNC_MPI_FLAVOR ")
string(REGEX REPLACE "^set\\(GRADSYNC_MPI_FLAVOR \"([^\"]*)\"\\).*" "\\1" flavor "${flavor_line}")
if(NOT flavor STREQUAL MPI_FLAVOR)
  message(STATUS "readme recipe: skipped: the recipe found MPI '${flavor}', this build uses '${MPI_FLAVOR}' "
                 "(whose launcher cannot run it); the README's lines install, nothing else to check here")
  return()
endif()

file(WRITE "${WORK}/app/CMakeLists.txt" "${consumer_cmakelists}")
file(COPY "${SRC}/tests/consumer/main.cpp" DESTINATION "${WORK}/app")
run_lines("consumer build" "${consumer_build}")

separate_arguments(launch UNIX_COMMAND "${MPIEXEC_FLAGS}")
execute_process(COMMAND ${MPIEXEC} ${launch} "${WORK}/app-build/app" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readme recipe: the consumer failed on 2 ranks (${rc})")
endif()
message(STATUS "readme recipe: every line of the README's recipe worked")
