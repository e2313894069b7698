# Passes only when a command exits non-zero AND prints what it must: a failure that is the
# expected one, not a crash. ctest alone can check one or the other, not both.
#   cmake -DCOMMAND=prog|arg|... -DREGEX=... -P expect_failure.cmake     ('|' separates arguments)
string(REPLACE "|" ";" _cmd "${COMMAND}")
execute_process(COMMAND ${_cmd} OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
message("${_out}${_err}")
# A process killed by a signal reports a text (e.g. "Segmentation fault"), not an exit status.
if(NOT _rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected a non-zero exit status, got: ${_rc}")
endif()
if(_rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
endif()
if(NOT "${_out}${_err}" MATCHES "${REGEX}")  # either stream: sanitizers report on stderr
  message(FATAL_ERROR "the output does not match: ${REGEX}")
endif()
message("failed as expected (exit status ${_rc})")
