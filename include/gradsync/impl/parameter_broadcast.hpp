// gradsync internals: the collectives of parameter broadcasts, on values wherever they live.
//
// broadcast_parameters and broadcast_set_parameter move parameters (device or host memory) and small
// host counters through one backend; where the backend cannot reach the memory, the values cross
// through a staging copy. Setup-time calls: simplicity over speed, but never a stack buffer in a
// collective a late peer may still write into (via_cell).
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graveyard.hpp"
#include "memory_ops.hpp"

namespace gradsync::impl {

// Runs op(p) on the n values at `data` (in DataSpace), through a copy in OtherSpace when the
// backend cannot reach DataSpace (device memory and an MPI that is not CUDA-aware, host counters
// and a device-only backend). Collectives are setup-time here: simplicity over speed.
template <class DataSpace, class OtherSpace, class Backend, class T, class Op>
void via_reachable(const Backend& b, T* data, std::size_t n, Op&& op) {
  if (b.template can_access<DataSpace>()) {
    op(data);
    return;
  }
  Kokkos::View<T*, DataSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> src(data, n);
  Kokkos::View<T*, OtherSpace> copy(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("gradsync::staging")),
                                    n);
  Kokkos::deep_copy(copy, src);  // fences before and after: op sees the copy complete
  try {
    op(copy.data());
  } catch (...) {  // a late peer may still complete the abandoned collective into the copy
    graveyard().push_back(std::make_shared<decltype(copy)>(copy));
    throw;
  }
  Kokkos::deep_copy(src, copy);
}

// Runs op on n host values through a heap cell of their own, parked if op throws: the counts
// broadcast_parameters exchanges live on the stack, where a late peer must never write.
template <class T, class Op>
void via_cell(T* data, std::size_t n, Op&& op) {
  auto cell = std::make_shared<std::vector<T>>(data, data + n);
  try {
    op(cell->data());
  } catch (...) {
    graveyard().push_back(std::move(cell));
    throw;
  }
  std::copy(cell->begin(), cell->end(), data);
}

// The collectives of broadcast_parameters, one function each, on n values in DataSpace (through a
// copy in OtherSpace where the backend cannot reach them). `b` is the sync's impl::Watched: each
// waits under the stall watchdog.
template <class DataSpace, class OtherSpace, class Backend, class T>
void broadcast_over(const Backend& b, T* data, std::size_t n, int root) {
  if (n == 0) return;
  via_reachable<DataSpace, OtherSpace>(b, data, n, [&](T* p) {
    if constexpr (std::is_same_v<DataSpace, Kokkos::HostSpace>)
      if (p == data) return via_cell(p, n, [&](T* q) { b.broadcast(q, n, root); });
    b.broadcast(p, n, root);
  });
}
template <class DataSpace, class OtherSpace, class Backend, class T>
void allreduce_min_over(const Backend& b, T* data, std::size_t n) {
  if (n == 0) return;
  via_reachable<DataSpace, OtherSpace>(b, data, n, [&](T* p) {
    if constexpr (std::is_same_v<DataSpace, Kokkos::HostSpace>)
      if (p == data) return via_cell(p, n, [&](T* q) { b.allreduce_min(q, n); });
    b.allreduce_min(p, n);
  });
}

}  // namespace gradsync::impl
