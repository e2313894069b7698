// gradsync: GRADSYNC_* environment variables, in the spirit of HOROVOD_FUSION_THRESHOLD.
//
// Precedence: a variable that is set overrides the value given in code (Options), so a job script
// can tune a binary without rebuilding it. A malformed value is a ConfigError naming the variable,
// never silently ignored. GradientSync applies them in its constructor unless
// Options::read_environment is false. The full list is in docs/ERRORS.md and README.md.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "error.hpp"
#include "options.hpp"

namespace gradsync {
namespace impl {

// The value of `var`, or nullptr when unset. An empty value is an error: "set but empty" is
// almost always a broken job script.
inline const char* env_value(const char* var) {
  const char* v = std::getenv(var);
  if (v && !*v) throw ConfigError(cat("environment variable ", var, " is set but empty; unset it or give a value"));
  return v;
}

[[noreturn]] inline void env_bad(const char* var, const char* value, const char* expect) {
  throw ConfigError(cat("environment variable ", var, "='", value, "' is not ", expect));
}

// A whole-string unsigned integer, optionally with a K, M or G suffix (powers of 1024).
inline bool env_parse_size(const char* var, std::size_t& out) {
  const char* v = env_value(var);
  if (!v) return false;
  const char* expect = "a non-negative integer (bytes, optional suffix K, M or G)";
  if (*v < '0' || *v > '9') env_bad(var, v, expect);
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno == ERANGE) env_bad(var, v, expect);
  unsigned long long mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') mult = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') mult = 1ull << 30, ++end;
  if (*end != '\0' || n > std::numeric_limits<std::size_t>::max() / mult) env_bad(var, v, expect);
  out = std::size_t(n * mult);
  return true;
}

inline bool env_parse_int(const char* var, int& out, int min_value) {
  const char* v = env_value(var);
  if (!v) return false;
  errno = 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || n < min_value || n > std::numeric_limits<int>::max())
    env_bad(var, v, min_value == 1 ? "an integer >= 1" : "an integer");
  out = int(n);
  return true;
}

inline bool env_parse_seconds(const char* var, double& out) {
  const char* v = env_value(var);
  if (!v) return false;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || errno == ERANGE || !std::isfinite(x) || x < 0)
    env_bad(var, v, "a finite number of seconds >= 0 (0 disables)");
  out = x;
  return true;
}

inline bool env_parse_bool(const char* var, bool& out) {
  const char* v = env_value(var);
  if (!v) return false;
  const std::string s(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") out = true;
  else if (s == "0" || s == "false" || s == "off" || s == "no") out = false;
  else env_bad(var, v, "a boolean (1/0, true/false, on/off, yes/no)");
  return true;
}

// One of `names` (nullptr-terminated); out = its index.
inline bool env_parse_choice(const char* var, int& out, const char* const* names, const char* expect) {
  const char* v = env_value(var);
  if (!v) return false;
  for (int i = 0; names[i]; ++i)
    if (std::string(v) == names[i]) {
      out = i;
      return true;
    }
  env_bad(var, v, expect);
}

}  // namespace impl

/// Returns `o` with every GRADSYNC_* variable that is set applied over it:
///   GRADSYNC_FUSION_THRESHOLD          fusion_threshold_bytes (bytes, suffix K/M/G; 0 = per tensor)
///   GRADSYNC_BACKWARD_PASSES_PER_STEP  backward_passes_per_step (>= 1)
///   GRADSYNC_STALL_TIMEOUT_S           stall_timeout (seconds, 0 = wait forever)
///   GRADSYNC_STALL_WARNING_S           stall_warning (seconds, 0 = no warning)
///   GRADSYNC_STALL_ACTION              stall_action: throw | abort
///   GRADSYNC_CONSISTENCY_CHECK         consistency_check: off | on_change | every_step
///   GRADSYNC_CHECK_FINITE              check_finite: 1/0, true/false, on/off, yes/no
///   GRADSYNC_HOST_STAGING              host_staging: auto | always | never
///   GRADSYNC_HUGE_PAGES                huge_pages: 1/0, true/false, on/off, yes/no
/// Throws ConfigError naming the variable when a value is malformed.
inline Options apply_env(Options o) {
  impl::env_parse_size("GRADSYNC_FUSION_THRESHOLD", o.fusion_threshold_bytes);
  impl::env_parse_int("GRADSYNC_BACKWARD_PASSES_PER_STEP", o.backward_passes_per_step, 1);
  impl::env_parse_seconds("GRADSYNC_STALL_TIMEOUT_S", o.stall_timeout);
  impl::env_parse_seconds("GRADSYNC_STALL_WARNING_S", o.stall_warning);
  int i = 0;
  static const char* const actions[] = {"throw", "abort", nullptr};
  if (impl::env_parse_choice("GRADSYNC_STALL_ACTION", i, actions, "one of: throw, abort"))
    o.stall_action = StallAction(i);
  static const char* const modes[] = {"off", "on_change", "every_step", nullptr};
  if (impl::env_parse_choice("GRADSYNC_CONSISTENCY_CHECK", i, modes, "one of: off, on_change, every_step"))
    o.consistency_check = CheckMode(i);
  impl::env_parse_bool("GRADSYNC_CHECK_FINITE", o.check_finite);
  impl::env_parse_bool("GRADSYNC_HUGE_PAGES", o.huge_pages);
  static const char* const staging[] = {"auto", "always", "never", nullptr};
  if (impl::env_parse_choice("GRADSYNC_HOST_STAGING", i, staging, "one of: auto, always, never"))
    o.host_staging = HostStaging(i);
  return o;
}

}  // namespace gradsync
