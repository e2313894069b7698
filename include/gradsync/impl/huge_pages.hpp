// gradsync internals: transparent huge pages for host gradients and host buffers.
//
// Why: on one node Open MPI moves large messages with one kernel copy (CMA), which walks and pins
// the sender's pages; under virtualization every 4 KiB page is also a two-level translation. 2 MiB
// pages make both the allreduce and gradsync's sync of separately allocated gradients faster
// (docs/BENCHMARKS.md, docs/TUNING.md). Where THP is set to
// "madvise", a common default, memory gets huge pages only if advised before its first touch
// (gradsync's own buffers) or collapsed in place afterwards (the gradients a program registers).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../config.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace gradsync::impl {

inline constexpr std::size_t huge_page_bytes = std::size_t(2) << 20;

/// Asks for huge pages under [p, p + bytes), which should be untouched and 2 MiB aligned. A hint:
/// without THP (or off Linux) nothing changes and nothing fails.
inline void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Bytes from `p` up to the next 2 MiB boundary.
inline std::size_t to_huge_page_boundary(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return std::size_t((huge_page_bytes - a % huge_page_bytes) % huge_page_bytes);
}

/// `n` uninitialized values in host memory (View: a rank-1 HostSpace View) that start on a 2 MiB
/// boundary and are advised for huge pages before their first touch: one huge page more is
/// allocated, and the View shares its ownership.
template <class View>
View allocate_on_huge_pages(const std::string& label, std::size_t n) {
  using T = typename View::non_const_value_type;
  const View whole(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n + huge_page_bytes / sizeof(T));
  const std::size_t at = to_huge_page_boundary(whole.data()) / sizeof(T);
  const View v = Kokkos::subview(whole, std::make_pair(at, at + n));
  advise_huge_pages(v.data(), (n * sizeof(T)) / huge_page_bytes * huge_page_bytes);
  return v;
}

/// Whether the administrator left transparent huge pages on ("always" or "madvise").
inline bool transparent_huge_pages_enabled() {
  static const bool on = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    return !s.empty() && s.find("[never]") == std::string::npos;
  }();
  return on;
}

/// Moves registered host memory onto huge pages in place, contents unchanged (Linux 6.1 and later:
/// MADV_COLLAPSE; elsewhere nothing happens). `ranges` are [begin, end) byte addresses. A 2 MiB
/// page is collapsed only if each of its 4 KiB pages holds part of some range: no page the program
/// never touched is populated, and no page holding only other data is moved. Returns the bytes
/// collapsed.
inline std::size_t collapse_to_huge_pages(std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges) {
#if defined(__linux__)
#if defined(MADV_COLLAPSE)
  constexpr int collapse = MADV_COLLAPSE;
#else
  constexpr int collapse = 25;  // asm-generic/mman-common.h, for C libraries older than the kernel
#endif
  constexpr std::uintptr_t page = 4096, huge = huge_page_bytes;
  if (ranges.empty() || sysconf(_SC_PAGESIZE) != long(page) || !transparent_huge_pages_enabled()) return 0;
  // Each range rounded out to whole pages; ranges that then touch form one run.
  for (auto& r : ranges) r = {r.first / page * page, (r.second + page - 1) / page * page};
  std::sort(ranges.begin(), ranges.end());
  std::size_t done = 0;
  for (std::size_t i = 0; i < ranges.size();) {
    std::uintptr_t begin = ranges[i].first, end = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= end; ++i) end = std::max(end, ranges[i].second);
    const std::uintptr_t a = (begin + huge - 1) / huge * huge, b = end / huge * huge;
    // One call per huge page: a page that cannot be collapsed (pinned, say) leaves the others.
    for (std::uintptr_t p = a; p + huge <= b; p += huge)
      if (madvise(reinterpret_cast<void*>(p), huge, collapse) == 0) done += huge;
  }
  return done;
#else
  (void)ranges;
  return 0;
#endif
}

}  // namespace gradsync::impl
