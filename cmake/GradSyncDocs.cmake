# gradsync's API reference (docs/Doxyfile.in). Two uses:
#   include(GradSyncDocs) in the top-level CMakeLists.txt: a `docs` target, output in
#     ${CMAKE_BINARY_DIR}/docs/api; where doxygen is missing, a `docs` target that fails and says so.
#   cmake -DGRADSYNC_DOCS_SOURCE_DIR=... -DGRADSYNC_DOCS_OUTPUT_DIR=... -P cmake/GradSyncDocs.cmake:
#     only writes ${GRADSYNC_DOCS_OUTPUT_DIR}/Doxyfile (cmake/docs.sh, no Kokkos or MPI needed).
# Doxygen fails on any warning (WARN_AS_ERROR = FAIL_ON_WARNINGS), after reporting them all.
if(CMAKE_SCRIPT_MODE_FILE)
  file(STRINGS "${GRADSYNC_DOCS_SOURCE_DIR}/include/gradsync/config.hpp" _v
       REGEX "^#define GRADSYNC_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
         GRADSYNC_DOCS_VERSION "${_v}")
  configure_file("${GRADSYNC_DOCS_SOURCE_DIR}/docs/Doxyfile.in" "${GRADSYNC_DOCS_OUTPUT_DIR}/Doxyfile" @ONLY)
  return()
endif()

find_program(DOXYGEN_EXECUTABLE doxygen)
if(DOXYGEN_EXECUTABLE)
  set(GRADSYNC_DOCS_SOURCE_DIR "${PROJECT_SOURCE_DIR}")
  set(GRADSYNC_DOCS_OUTPUT_DIR "${CMAKE_BINARY_DIR}/docs")
  set(GRADSYNC_DOCS_VERSION "${PROJECT_VERSION}")
  configure_file("${PROJECT_SOURCE_DIR}/docs/Doxyfile.in" "${GRADSYNC_DOCS_OUTPUT_DIR}/Doxyfile" @ONLY)
  add_custom_target(docs
    COMMAND "${DOXYGEN_EXECUTABLE}" "${GRADSYNC_DOCS_OUTPUT_DIR}/Doxyfile"
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    COMMENT "gradsync: API reference in ${GRADSYNC_DOCS_OUTPUT_DIR}/api (doxygen, warnings are errors)"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND "${CMAKE_COMMAND}" -E echo "gradsync: the docs target needs doxygen (apt-get install doxygen, or bash cmake/deps.sh doxygen), then re-run cmake"
    COMMAND "${CMAKE_COMMAND}" -E false
    VERBATIM)
endif()
