// gradsync: the exceptions a user can meet. Every one derives from gradsync::Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync {

/// Base of every gradsync exception; what() names the tensor, group and ranks involved.
class Error : public std::runtime_error {
 public:
  /// An error whose what() is "gradsync: " followed by `what`.
  explicit Error(const std::string& what) : std::runtime_error("gradsync: " + what) {}
};

/// Ranks disagree on the data-parallel registrations or the options that shape the exchange.
class MismatchError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

/// A collective did not complete within Options::stall_timeout.
class StallError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

/// A malformed option or GRADSYNC_* environment variable.
class ConfigError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

namespace impl {

// Builds a message from streamable pieces: throw Error(impl::cat("tensor ", name, ...)).
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A MismatchError every rank of the sync's communicator throws, each having found it in the result
// of a collective that all of them completed (the consistency check, the arrival round, the process
// sets' validation, broadcast_parameters' comparison). No peer needs telling: a notice would race
// the peers' own finding and replace their message with "rank r failed before ...".
class AgreedMismatch : public MismatchError {
 public:
  using MismatchError::MismatchError;
};

}  // namespace impl
}  // namespace gradsync
