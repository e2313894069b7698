// gradsync internals: the segment tables of the optimizer and global-norm kernels (a team per
// segment, as in the fusion kernels), cut and uploaded the same way.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusion_plan.hpp"

namespace gradsync::impl {

/// Calls f(offset, count) for the consecutive pieces of a tensor of n values, none longer than
/// max_segment_elements.
template <class F>
void for_each_segment(std::size_t n, F&& f) {
  for (std::int64_t done = 0; done < std::int64_t(n); done += max_segment_elements)
    f(done, std::min(std::int64_t(n) - done, max_segment_elements));
}

/// Replaces `dev` with a copy of the host table `host` in MemorySpace. Setup time only: it allocates.
template <class Seg, class MemorySpace>
void upload_segments(const std::vector<Seg>& host, Kokkos::View<Seg*, MemorySpace>& dev, const char* label) {
  dev =
      Kokkos::View<Seg*, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), host.size());
  auto mirror = Kokkos::create_mirror_view(dev);
  std::copy(host.begin(), host.end(), mirror.data());
  Kokkos::deep_copy(dev, mirror);
}

}  // namespace gradsync::impl
