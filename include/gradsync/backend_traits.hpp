// gradsync: what the fused sync should know about a backend beyond its collectives.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gradsync {

/// True when a backend's blocking allreduce of a chunk beats its nonblocking one in the sync's
/// pipeline; Options::tuning.collectives = automatic follows it. False by default: nonblocking chunks
/// overlap packing, unpacking and (with mark_ready) backward. A backend may instead answer at run
/// time with a member `bool prefers_blocking_allreduce() const`, which wins over this trait:
/// MpiBackend does (blocking only where its nonblocking sums would go to Open MPI's libnbc, whose
/// reduce-then-broadcast schedule for fewer than 4 ranks is slower: docs/BENCHMARKS.md).
template <class Backend>
struct prefers_blocking_allreduce : std::false_type {};

/// prefers_blocking_allreduce<Backend>::value.
template <class Backend>
inline constexpr bool prefers_blocking_allreduce_v = prefers_blocking_allreduce<Backend>::value;

namespace impl {

// A backend that can never read some memory spaces, whatever the run time (NcclBackend: CUDA device
// memory only), says so at compile time with a public
// `template <class MemorySpace> static constexpr bool reads_memory_space = ...;`, and GradientSync
// refuses the others with a static_assert. Backends without it decide at run time (can_access).
template <class B, class M, class = void>
struct reads_memory_space : std::true_type {};
template <class B, class M>
struct reads_memory_space<B, M, std::void_t<decltype(B::template reads_memory_space<M>)>>
    : std::bool_constant<B::template reads_memory_space<M>> {};

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

// A backend that can abandon the collectives it has in flight has a public
// `void abort() const noexcept` (NcclBackend: ncclCommAbort, so that a kernel waiting for a peer
// that stalled or failed leaves the user's stream). MPI cannot cancel a collective: MpiBackend has
// none, and its requests are kept alive until they complete instead (Control::keep_on_failure).
template <class B, class = void>
struct has_abort : std::false_type {};
template <class B>
struct has_abort<B, std::void_t<decltype(std::declval<const B&>().abort())>> : std::true_type {};

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
