// gradsync: GRADSYNC_* environment variables, in the spirit of HOROVOD_FUSION_THRESHOLD.
//
// Precedence: a variable that is set overrides the value given in code (Options), so a job script
// can tune a binary without rebuilding it. A malformed value is a ConfigError naming the variable,
// never silently ignored. GradientSync applies them in its constructor unless
// Options::tuning.read_environment is false. known_env_vars() is the one list of the variables; the table
// in docs/ERRORS.md follows it (tests/test_config.cpp checks both ways). A GRADSYNC_* variable
// not on it is most likely a typo: the first plan build of the process warns about it once.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "error.hpp"
#include "options.hpp"

#if defined(__unix__) || defined(__APPLE__)
extern "C" char** environ;  // POSIX: the process environment
#endif

namespace gradsync {

/// One environment variable gradsync reads.
struct EnvVar {
  const char* name;    ///< GRADSYNC_...
  const char* option;  ///< the Options member it overrides, or what else it controls
  const char* values;  ///< what it accepts
};

/// Every GRADSYNC_* variable gradsync or its scripts read: the library's (options, logging, CUDA-
/// aware MPI) first, then those of tests/gpu/run.sh, so that they are not reported as unknown.
inline const std::vector<EnvVar>& known_env_vars() {
  static const std::vector<EnvVar> v = {
      {"GRADSYNC_FUSION_THRESHOLD", "tuning.fusion_threshold_bytes",
       "bytes, optional suffix K, M, G (1024-based); 0 = one call per tensor"},
      {"GRADSYNC_BACKWARD_PASSES_PER_STEP", "backward_passes_per_step", "integer >= 1"},
      {"GRADSYNC_STALL_TIMEOUT_S", "stall_timeout", "seconds >= 0; 0 waits forever"},
      {"GRADSYNC_STALL_WARNING_S", "tuning.stall_warning", "seconds >= 0; 0 no warning"},
      {"GRADSYNC_STALL_ACTION", "tuning.stall_action", "throw, abort"},
      {"GRADSYNC_SPIN_BEFORE_YIELD_S", "tuning.spin_before_yield",
       "auto, or seconds >= 0; 0 yields after every poll that finds the collective unfinished"},
      {"GRADSYNC_CONSISTENCY_CHECK", "tuning.consistency_check", "off, on_change, every_step"},
      {"GRADSYNC_CHECK_FINITE", "check_finite", "1/0, true/false, on/off, yes/no"},
      {"GRADSYNC_ALGORITHM", "tuning.algorithm", "auto, flat, hierarchical"},
      {"GRADSYNC_HOST_STAGING", "tuning.host_staging", "auto, always, never"},
      {"GRADSYNC_HUGE_PAGES", "tuning.huge_pages", "1/0, true/false, on/off, yes/no"},
      {"GRADSYNC_TIMELINE", "tuning.timeline", "a file path (one file per rank: .rank<r> before the extension)"},
      {"GRADSYNC_COMPRESSION", "compression", "none, fp16, bf16"},
      {"GRADSYNC_ERROR_FEEDBACK", "error_feedback", "1/0, true/false, on/off, yes/no"},
      {"GRADSYNC_LOG", "logging: describe(sync) on stderr at the first plan build",
       "off; info (rank 0 prints); info_all (every rank prints)"},
      {"GRADSYNC_CUDA_AWARE_MPI", "MpiBackend: hand device memory to MPI (overrides detection)", "0, 1"},
      {"GRADSYNC_GPU_DEPS", "tests/gpu/run.sh: folder of bundled Debian packages", "a path"},
      {"GRADSYNC_USE_BUNDLED_DEPS", "tests/gpu/run.sh: prefer the bundled packages", "0, 1"},
  };
  return v;
}

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
  if (*end == 'K' || *end == 'k')
    mult = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1ull << 30, ++end;
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
  if (s == "1" || s == "true" || s == "on" || s == "yes")
    out = true;
  else if (s == "0" || s == "false" || s == "off" || s == "no")
    out = false;
  else
    env_bad(var, v, "a boolean (1/0, true/false, on/off, yes/no)");
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

// Edit distance (insertions, deletions, substitutions, and swaps of neighbours, each 1): how far a
// misspelled name is from a known one.
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// The known variable closest to `name`, or nullptr when none is close enough to be a likely typo
// (at most a third of the name's own letters after GRADSYNC_, and at least 2, apart).
inline const char* closest_env_var(const std::string& name) {
  const char* best = nullptr;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const EnvVar& v : known_env_vars()) {
    const std::size_t d = edit_distance(name, v.name);
    if (d < best_d) best = v.name, best_d = d;
  }
  const std::size_t prefix = 9;  // "GRADSYNC_"
  const std::size_t tail = name.size() > prefix ? name.size() - prefix : 0;
  return best_d <= std::max<std::size_t>(2, tail / 3) ? best : nullptr;
}

// One warning per GRADSYNC_* variable in `env` (a null-terminated "NAME=value" array, as environ)
// that gradsync does not know.
inline std::vector<std::string> unknown_env_warnings(char** env) {
  std::vector<std::string> out;
  for (char** e = env; e && *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("GRADSYNC_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    const auto& known = known_env_vars();
    if (std::any_of(known.begin(), known.end(), [&](const EnvVar& v) { return name == v.name; })) continue;
    const char* near = closest_env_var(name);
    out.push_back(
        cat("gradsync: warning: unknown environment variable ", name, " is ignored",
            near ? cat("; did you mean ", near, "?") : std::string("; the known ones are in docs/ERRORS.md")));
  }
  return out;
}

// Once per process (the first plan build of any GradientSync): tests reset it.
inline bool& unknown_env_warned() {
  static bool warned = false;
  return warned;
}

inline void warn_unknown_env_once() {
  if (unknown_env_warned()) return;
  unknown_env_warned() = true;
#if defined(__unix__) || defined(__APPLE__)
  for (const std::string& w : unknown_env_warnings(environ)) std::fprintf(stderr, "%s\n", w.c_str());
  std::fflush(stderr);
#endif
}

/// GRADSYNC_LOG: what a GradientSync prints about itself (describe.hpp) at its first plan build.
enum class LogLevel { off, info, info_all };

inline LogLevel env_log_level() {
  int i = 0;
  static const char* const levels[] = {"off", "info", "info_all", nullptr};
  if (env_parse_choice("GRADSYNC_LOG", i, levels, "one of: off, info, info_all")) return LogLevel(i);
  return LogLevel::off;
}

}  // namespace impl

/// Returns `o` with every GRADSYNC_* variable that is set applied over it:
///   GRADSYNC_FUSION_THRESHOLD          fusion_threshold_bytes (bytes, suffix K/M/G; 0 = per tensor)
///   GRADSYNC_BACKWARD_PASSES_PER_STEP  backward_passes_per_step (>= 1)
///   GRADSYNC_STALL_TIMEOUT_S           stall_timeout (seconds, 0 = wait forever)
///   GRADSYNC_STALL_WARNING_S           stall_warning (seconds, 0 = no warning)
///   GRADSYNC_STALL_ACTION              stall_action: throw | abort
///   GRADSYNC_SPIN_BEFORE_YIELD_S       spin_before_yield: auto | seconds (0 = yield at once)
///   GRADSYNC_CONSISTENCY_CHECK         consistency_check: off | on_change | every_step
///   GRADSYNC_CHECK_FINITE              check_finite: 1/0, true/false, on/off, yes/no
///   GRADSYNC_HOST_STAGING              host_staging: auto | always | never
///   GRADSYNC_HUGE_PAGES                huge_pages: 1/0, true/false, on/off, yes/no
///   GRADSYNC_TIMELINE                  timeline: a path (docs/TIMELINE.md)
///   GRADSYNC_COMPRESSION               compression: none | fp16 | bf16
///   GRADSYNC_ERROR_FEEDBACK            error_feedback: 1/0, true/false, on/off, yes/no
/// Throws ConfigError naming the variable when a value is malformed. Local (this process's
/// environment: set the same variables on every rank); the GradientSync constructor calls it.
inline Options apply_env(Options o) {
  impl::env_parse_size("GRADSYNC_FUSION_THRESHOLD", o.tuning.fusion_threshold_bytes);
  impl::env_parse_int("GRADSYNC_BACKWARD_PASSES_PER_STEP", o.backward_passes_per_step, 1);
  impl::env_parse_seconds("GRADSYNC_STALL_TIMEOUT_S", o.stall_timeout);
  impl::env_parse_seconds("GRADSYNC_STALL_WARNING_S", o.tuning.stall_warning);
  int i = 0;
  static const char* const actions[] = {"throw", "abort", nullptr};
  if (impl::env_parse_choice("GRADSYNC_STALL_ACTION", i, actions, "one of: throw, abort"))
    o.tuning.stall_action = StallAction(i);
  if (const char* v = impl::env_value("GRADSYNC_SPIN_BEFORE_YIELD_S")) {
    if (std::string(v) == "auto")
      o.tuning.spin_before_yield = spin_before_yield_auto;
    else
      impl::env_parse_seconds("GRADSYNC_SPIN_BEFORE_YIELD_S", o.tuning.spin_before_yield);
  }
  static const char* const modes[] = {"off", "on_change", "every_step", nullptr};
  if (impl::env_parse_choice("GRADSYNC_CONSISTENCY_CHECK", i, modes, "one of: off, on_change, every_step"))
    o.tuning.consistency_check = CheckMode(i);
  static const char* const algorithms[] = {"auto", "flat", "hierarchical", nullptr};
  if (impl::env_parse_choice("GRADSYNC_ALGORITHM", i, algorithms, "one of: auto, flat, hierarchical"))
    o.tuning.algorithm = Algorithm(i);
  impl::env_parse_bool("GRADSYNC_CHECK_FINITE", o.check_finite);
  impl::env_parse_bool("GRADSYNC_HUGE_PAGES", o.tuning.huge_pages);
  static const char* const staging[] = {"auto", "always", "never", nullptr};
  if (impl::env_parse_choice("GRADSYNC_HOST_STAGING", i, staging, "one of: auto, always, never"))
    o.tuning.host_staging = HostStaging(i);
  if (const char* v = impl::env_value("GRADSYNC_TIMELINE")) o.tuning.timeline = v;
  static const char* const formats[] = {"none", "fp16", "bf16", nullptr};
  if (impl::env_parse_choice("GRADSYNC_COMPRESSION", i, formats, "one of: none, fp16, bf16"))
    o.compression = Compression(i);
  impl::env_parse_bool("GRADSYNC_ERROR_FEEDBACK", o.error_feedback);
  return o;
}

}  // namespace gradsync
