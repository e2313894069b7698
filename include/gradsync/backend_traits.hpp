// gradsync: what the fused sync derives from a backend's optional capabilities (backend.hpp lists
// them and detects each): the backend's answer where it has one, else the default.
#pragma once

#include <cstddef>

#include "backend.hpp"

namespace gradsync {
namespace impl {

/// The backend's run-time answer where it has one, else the trait's.
template <class Backend>
bool prefers_blocking(const Backend& b) {
  if constexpr (has_blocking_preference<Backend>::value)
    return b.prefers_blocking_allreduce();
  else
    return prefers_blocking_allreduce_v<Backend>;
}

/// Whether the backend sums 16-bit wire values (compression.hpp) held in MemorySpace: its answer
/// where it has one (MpiBackend: host memory only), else wherever it can access.
template <class MemorySpace, class Backend>
bool reduces_wire_in(const Backend& b) {
  if constexpr (has_can_reduce_wire<Backend, MemorySpace>::value)
    return b.template can_reduce_wire<MemorySpace>();
  else
    return b.template can_access<MemorySpace>();
}

/// The failure path's call before it throws (a stall, a peer's failure, an error inside a
/// collective phase): abandons the backend's collectives in flight where it can; nothing
/// otherwise. The backend, and every copy sharing its communicator, is unusable afterwards.
template <class Backend>
void abort_collectives(const Backend& b) noexcept {
  if constexpr (has_abort<Backend>::value) {
    static_assert(noexcept(b.abort()), "gradsync: a backend's abort() is called on the failure path: noexcept");
    b.abort();
  }
}

/// Whether `b.iallreduce_sum(buf, n, factor)` multiplies a sum of `bytes` by factor inside the
/// reduction (an optional capability: backends without folds_factor() never do, and the sync
/// scales in its own kernels).
template <class Backend>
bool folds_factor(const Backend& b, std::size_t bytes) {
  if constexpr (has_folds_factor<Backend>::value)
    return b.folds_factor(bytes);
  else
    return false;
}

}  // namespace impl
}  // namespace gradsync
