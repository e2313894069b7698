// Kokkos Tools callbacks that count deep copies, launches and allocations (kokkos_counts.hpp).
#include "kokkos_counts.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gradsync_test {
namespace {

namespace tools = Kokkos::Tools::Experimental;

std::atomic<long> g_deep_copies{0}, g_small_copies{0}, g_launches{0}, g_allocations{0};
bool g_counting = false;
char g_last_allocation[128] = "none";  // no std::string: the callbacks must not allocate

void on_deep_copy(Kokkos::Tools::SpaceHandle, const char*, const void*, Kokkos::Tools::SpaceHandle, const char*,
                  const void*, std::uint64_t bytes) {
  ++g_deep_copies;
  if (bytes <= 16) ++g_small_copies;
}

void on_launch(const char*, std::uint32_t, std::uint64_t* id) {
  ++g_launches;
  *id = 0;
}

// Zero-byte allocations are left out: Kokkos-CUDA (4.x, CudaInternal::resize_team_scratch_space)
// "allocates" a 0-byte TeamScratchMemory at every TeamPolicy launch without level-1 scratch, because
// a pool of size 0 counts as never allocated. It holds no memory; counting it made a steady step
// look like 8 allocations on the first GPU run.
void on_allocate(Kokkos::Tools::SpaceHandle space, const char* label, const void*, std::uint64_t bytes) {
  if (bytes == 0) return;
  ++g_allocations;
  std::snprintf(g_last_allocation, sizeof g_last_allocation, "%s '%s' %llu bytes", space.name, label,
                static_cast<unsigned long long>(bytes));
}

// These callbacks only count: Kokkos need not fence around every event for them. By default Kokkos
// 4 does (a tool "requires global fencing"), and each of those fences builds a std::string label, a
// heap allocation per launch that only the counting makes: the allocation tests would count it.
void on_settings(const std::uint32_t, Kokkos::Tools::Experimental::ToolSettings* settings) {
  settings->requires_global_fencing = false;
}

// A tools library named by the environment (the profiling test) owns the callbacks.
bool tools_library_named() { return std::getenv("KOKKOS_TOOLS_LIBS") || std::getenv("KOKKOS_PROFILE_LIBRARY"); }

}  // namespace

void prepare_kokkos_counting() {
  if (tools_library_named()) return;
  auto events = tools::get_callbacks();  // Kokkos 3.4 has the field, not its setter
  events.request_tool_settings = on_settings;
  tools::set_callbacks(events);
}

KokkosCounts kokkos_counts() {
  return {g_deep_copies.load(), g_small_copies.load(), g_launches.load(), g_allocations.load()};
}

bool kokkos_counting() { return g_counting; }

std::string last_kokkos_allocation() { return g_last_allocation; }

void start_kokkos_counting() {
  // A tools library named by the environment owns the callbacks; counting would replace its own.
  const auto set = tools::get_callbacks();
  if (set.begin_parallel_for || set.begin_deep_copy || set.allocate_data) return;
  tools::set_begin_deep_copy_callback(on_deep_copy);
  tools::set_begin_parallel_for_callback(on_launch);
  tools::set_begin_parallel_reduce_callback(on_launch);
  tools::set_begin_parallel_scan_callback(on_launch);
  tools::set_allocate_data_callback(on_allocate);
  g_counting = true;
}

DeepCopiesUncounted::DeepCopiesUncounted() : was_(g_counting) {
  if (was_) tools::set_begin_deep_copy_callback(nullptr);
}

DeepCopiesUncounted::~DeepCopiesUncounted() {
  if (was_) tools::set_begin_deep_copy_callback(on_deep_copy);
}

}  // namespace gradsync_test
