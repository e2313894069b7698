// A tiny Kokkos Tools library for test_profiling: records every region push and pop, in order,
// for the test to read back. Kokkos loads it from KOKKOS_TOOLS_LIBS (Kokkos 4 and later) or
// KOKKOS_PROFILE_LIBRARY (Kokkos 3); the test finds the accessors below with dlopen(RTLD_NOLOAD)
// on the same path and dlsym.
//
// The log is a list of events: "+name" for a push, "-name" for a pop (the name of the region it
// closes, the innermost open one: Kokkos' pop carries no name). A pop with no region open is
// logged as "-" and counted in gradsync_region_tool_errors().
#include <cstdint>
#include <string>
#include <vector>

namespace {
std::vector<std::string>& events() {
  static std::vector<std::string> e;
  return e;
}
std::vector<std::string>& open_regions() {
  static std::vector<std::string> s;
  return s;
}
int errors = 0;
bool initialized = false;
}  // namespace

extern "C" {

// Kokkos' callbacks (the names and signatures of the Kokkos Tools interface).
void kokkosp_init_library(const int, const std::uint64_t, const std::uint32_t, void*) { initialized = true; }
void kokkosp_finalize_library() { initialized = false; }
void kokkosp_push_profile_region(const char* name) {
  events().push_back(std::string("+") + name);
  open_regions().push_back(name);
}
void kokkosp_pop_profile_region() {
  if (open_regions().empty()) {
    ++errors;
    events().push_back("-");
    return;
  }
  events().push_back("-" + open_regions().back());
  open_regions().pop_back();
}

// For the test.
int gradsync_region_tool_initialized() { return initialized ? 1 : 0; }
int gradsync_region_tool_count() { return int(events().size()); }
const char* gradsync_region_tool_event(int i) { return events()[std::size_t(i)].c_str(); }
int gradsync_region_tool_depth() { return int(open_regions().size()); }
int gradsync_region_tool_errors() { return errors; }
void gradsync_region_tool_clear() { events().clear(); }
}
