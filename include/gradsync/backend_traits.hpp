// gradsync: what the fused sync should know about a backend beyond its collectives.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gradsync {

/// True when a backend's blocking allreduce of a chunk beats its nonblocking one in the sync's
/// pipeline; Options::collectives = automatic follows it. False by default: nonblocking chunks
/// overlap packing, unpacking and (with mark_ready) backward. A backend may instead answer at run
/// time with a member `bool prefers_blocking_allreduce() const`, which wins over this trait:
/// MpiBackend does (blocking only where its nonblocking sums would go to Open MPI's libnbc, whose
/// reduce-then-broadcast schedule for fewer than 4 ranks measured 1.7x slower on ResNet-50).
template <class Backend>
struct prefers_blocking_allreduce : std::false_type {};

template <class Backend>
inline constexpr bool prefers_blocking_allreduce_v = prefers_blocking_allreduce<Backend>::value;

namespace impl {

template <class B, class = void>
struct has_folds_factor : std::false_type {};
template <class B>
struct has_folds_factor<B, std::void_t<decltype(std::declval<const B&>().folds_factor(std::size_t()))>>
    : std::true_type {};

// A backend whose use of device memory is a run-time decision (MpiBackend: CUDA-aware MPI or not);
// the ranks must agree on it, since it changes the collectives.
template <class B, class = void>
struct has_cuda_aware : std::false_type {};
template <class B>
struct has_cuda_aware<B, std::void_t<decltype(bool(std::declval<const B&>().cuda_aware()))>> : std::true_type {};

template <class B, class = void>
struct has_blocking_preference : std::false_type {};
template <class B>
struct has_blocking_preference<B, std::void_t<decltype(bool(std::declval<const B&>().prefers_blocking_allreduce()))>>
    : std::true_type {};

/// The backend's run-time answer where it has one, else the trait's.
template <class Backend>
bool prefers_blocking(const Backend& b) {
  if constexpr (has_blocking_preference<Backend>::value)
    return b.prefers_blocking_allreduce();
  else
    return prefers_blocking_allreduce_v<Backend>;
}

// A backend that sums arrays of WireFp16 / WireBf16 (compression.hpp) says so with a public
// `static constexpr bool sums_wire_values = true;` (MpiBackend, NcclBackend, SelfBackend). Others
// are never handed 16-bit values: a compressed sync over them is a ConfigError.
template <class B, class = void>
struct sums_wire : std::false_type {};
template <class B>
struct sums_wire<B, std::void_t<decltype(B::sums_wire_values)>> : std::bool_constant<B::sums_wire_values> {};

template <class B, class M, class = void>
struct has_can_reduce_wire : std::false_type {};
template <class B, class M>
struct has_can_reduce_wire<B, M, std::void_t<decltype(bool(std::declval<const B&>().template can_reduce_wire<M>()))>>
    : std::true_type {};

/// Whether the backend sums 16-bit wire values (compression.hpp) held in MemorySpace: its answer
/// where it has one (MpiBackend: host memory only), else wherever it can access.
template <class MemorySpace, class Backend>
bool reduces_wire_in(const Backend& b) {
  if constexpr (has_can_reduce_wire<Backend, MemorySpace>::value)
    return b.template can_reduce_wire<MemorySpace>();
  else
    return b.template can_access<MemorySpace>();
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
