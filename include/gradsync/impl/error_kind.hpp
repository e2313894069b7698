// gradsync internals: the kind of an error, as it crosses from one rank to another.
//
// A rank that fails sends its peers the message and its kind (a notice carries no exception), and
// the peers rethrow the same exception type, so that every rank's catch clause sees what the failing
// rank's would have.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "../error.hpp"

namespace gradsync::impl {

enum class ErrorKind : std::int64_t { error = 0, mismatch = 1, stall = 2, config = 3 };

// The kind of an exception, as throw_kind() rethrows it on another rank (ErrorKind::error for
// anything not a gradsync::Error subclass).
inline ErrorKind kind_of(const std::exception& e) {
  if (dynamic_cast<const MismatchError*>(&e)) return ErrorKind::mismatch;
  if (dynamic_cast<const StallError*>(&e)) return ErrorKind::stall;
  if (dynamic_cast<const ConfigError*>(&e)) return ErrorKind::config;
  return ErrorKind::error;
}

[[noreturn]] inline void throw_kind(ErrorKind k, const std::string& msg) {
  // The message already carries the "gradsync: " prefix when it came from what().
  const std::string m = msg.rfind("gradsync: ", 0) == 0 ? msg.substr(10) : msg;
  switch (k) {
    case ErrorKind::mismatch:
      throw MismatchError(m);
    case ErrorKind::stall:
      throw StallError(m);
    case ErrorKind::config:
      throw ConfigError(m);
    case ErrorKind::error:
      break;
  }
  throw Error(m);
}

}  // namespace gradsync::impl
