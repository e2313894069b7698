// gradsync internals: NaN/Inf detection in data-parallel gradients before the exchange
// (Options::check_finite). One batched reduction over the segments the pack kernel reads.
#pragma once

#include <cstdint>
#include <limits>

#include "../config.hpp"
#include "fusion_kernels.hpp"

namespace gradsync::impl {

// The smallest segment index holding a NaN or Inf, or `none` if every value is finite.
template <class T, class ExecutionSpace, class MemorySpace>
struct FirstNonFiniteKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  static constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  SegmentView<T, MemorySpace> segs;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team, std::int64_t& first) const {
    const Segment<T> s = segs(team.league_rank());
    const T* const p = s.ptr;
    int bad = 0;
    // x - x is 0 for every finite x and NaN for NaN and +-Inf: no math library needed on device.
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i, int& b) { b += !(p[i] - p[i] == T(0)); }, bad);
    if (bad > 0 && std::int64_t(team.league_rank()) < first) first = team.league_rank();
  }
};

// T and MemorySpace are given explicitly: SegmentView is an alias template they cannot be deduced
// through.
template <class T, class MemorySpace, class ExecutionSpace>
std::int64_t first_non_finite_segment(const ExecutionSpace& exec, const SegmentView<T, MemorySpace>& segs,
                                      std::int64_t nsegs) {
  using K = FirstNonFiniteKernel<T, ExecutionSpace, MemorySpace>;
  std::int64_t first = K::none;
  if (nsegs <= 0) return first;
  Kokkos::parallel_reduce("gradsync::check_finite", Kokkos::TeamPolicy<ExecutionSpace>(exec, int(nsegs), Kokkos::AUTO),
                          K{segs}, Kokkos::Min<std::int64_t>(first));
  return first;  // a reduction into a host scalar has completed on return
}

}  // namespace gradsync::impl
