// gradsync internals: where a wait is, as the watchdog's reports and the peers' notices name it.
//
// Every wait carries a WaitSite (which collective, which synchronize() call, which chunk); the text
// made from it is what a stall report prints and what an ARRIVED notice tells the peers, so both
// describe a wait in the same words.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "../error.hpp"

namespace gradsync::impl {

/// Where a wait happens, for the reports: "the allreduce of chunk 2 of 5 in exchange 17".
struct WaitSite {
  const char* what = "collective";
  std::int64_t step = 0;    // synchronize() call number (1-based), the same on every rank
  std::int64_t chunk = -1;  // chunk index, or -1
  std::int64_t chunks = 0;
};

inline std::string where_of(const WaitSite& site) {
  std::string where = site.what;
  if (site.chunk >= 0) where += cat(" of chunk ", site.chunk + 1, " of ", site.chunks);
  return where;
}
// Where a wait is, with its call: what peers are told and reports name.
// A step's calls carry its number (synchronize() call k); a helper, the number of the last one.
inline std::string where_in_call(const WaitSite& site, const char* call) {
  const std::string where = where_of(site);
  if (std::strcmp(call, "synchronize()") == 0) return cat(where, " in synchronize() call ", site.step);
  if (std::strcmp(call, "mark_ready()") == 0 || std::strcmp(call, "progress()") == 0 ||
      std::strcmp(call, "prepare()") == 0)
    return cat(where, " in ", call, " of synchronize() call ", site.step);
  if (site.step <= 0) return cat(where, " in ", call, " before the first synchronize()");
  return cat(where, " in ", call, " after synchronize() call ", site.step);
}

}  // namespace gradsync::impl
