// gradsync internals: NaN/Inf detection in data-parallel gradients before the exchange
// (Options::check_finite). One batched kernel over the segments the pack kernel reads.
#pragma once

#include <cstdint>
#include <limits>

#include "../config.hpp"
#include "fusion_kernels.hpp"

namespace gradsync::impl {

// flags(seg) = 1 when the segment holds a NaN or Inf. Per-segment flags scanned on the host, rather
// than a parallel_reduce: Kokkos 4's parallel_reduce builds a std::string fence label at every call
// (a heap allocation per step).
template <class T, class ExecutionSpace, class MemorySpace>
struct FirstNonFiniteKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  static constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  SegmentView<T, MemorySpace> segs;
  Kokkos::View<int*, MemorySpace> flags;
  std::int64_t first = 0;  // the segments scanned are [first, first + league size)

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const Segment<T> s = segs(first + team.league_rank());
    const T* const p = s.ptr;
    int bad = 0;
    // x - x is 0 for every finite x and NaN for NaN and +-Inf: no math library needed on device.
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i, int& b) { b += !(p[i] - p[i] == T(0)); }, bad);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { flags(team.league_rank()) = bad > 0; });
  }
};

/// The flags of the scan and their host copy, grown when a plan has more segments (so at the first
/// scan of a plan only).
template <class MemorySpace>
struct FiniteScratch {
  Kokkos::View<int*, MemorySpace> flags;
  typename Kokkos::View<int*, MemorySpace>::HostMirror host;
};

struct NoFiniteScratch {};  // the raw CUDA path: no scan kernel

// The smallest segment index in [first, first + nsegs) holding a NaN or Inf, or `none` if every
// value is finite. T and MemorySpace are given explicitly: SegmentView is an alias template they
// cannot be deduced through.
template <class T, class MemorySpace, class ExecutionSpace>
std::int64_t first_non_finite_segment(const ExecutionSpace& exec, const SegmentView<T, MemorySpace>& segs,
                                      std::int64_t nsegs, FiniteScratch<MemorySpace>& scratch, std::int64_t first = 0) {
  using K = FirstNonFiniteKernel<T, ExecutionSpace, MemorySpace>;
  if (nsegs <= 0) return K::none;
  if (std::int64_t(scratch.flags.extent(0)) < nsegs) {
    scratch.flags = Kokkos::View<int*, MemorySpace>(
        Kokkos::view_alloc("gradsync::finite_flags", Kokkos::WithoutInitializing), std::size_t(nsegs));
    scratch.host = Kokkos::create_mirror_view(scratch.flags);
  }
  launch_per_segment(label_check_finite(), exec, nsegs, K{segs, scratch.flags, first});
  Kokkos::deep_copy(exec, scratch.host, scratch.flags);  // the same View when MemorySpace is the host's
  fence(exec, label_fence_reduce());
  for (std::int64_t k = 0; k < nsegs; ++k)
    if (scratch.host(k)) return first + k;
  return K::none;
}

}  // namespace gradsync::impl
