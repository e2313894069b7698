// gradsync: what the fused sync derives from a backend's optional capabilities (backend.hpp lists
// them and detects each): the backend's answer where it has one, else the default.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "backend.hpp"
#include "error.hpp"

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

template <class B, class = void>
struct detects_retire : std::false_type {};
template <class B>
struct detects_retire<B, std::void_t<decltype(std::declval<const B&>().retire(std::string())),
                                     decltype(std::declval<const B&>().retired())>> : std::true_type {};
template <class B>
struct has_retire : std::bool_constant<declares<B>(Capability::retire)> {};
template <class B>
constexpr bool check_retire() {
  GRADSYNC_CHECK_CAPABILITY(retire, detects_retire<B>::value,
                            "void retire(std::string) const noexcept and std::string retired() const");
  return true;
}

/// The failure path's mark on a backend whose communicator a failed sync may have left with
/// collectives pending (in different numbers on different ranks): every copy refuses a new sync.
template <class Backend>
void retire_backend(const Backend& b, const std::string& why) noexcept {
  if constexpr (has_retire<Backend>::value) {
    static_assert(noexcept(b.retire(why)), "gradsync: a backend's retire() is called on the failure path: noexcept");
    b.retire(why);
  }
}

/// `b`, unless a failed sync retired its communicator: a new sync over it would pair its collectives
/// with the pending ones of the failed sync and return wrong sums, silently. Every rank's sync
/// failed, so every rank throws this, before anything collective.
template <class Backend>
Backend unfailed(Backend b) {
  if constexpr (has_retire<Backend>::value)
    if (!b.retired().empty())
      throw Error(cat("this ", Backend::name(), " backend (rank ", b.rank(), ") served a GradientSync that failed (",
                      b.retired(),
                      "); its communicator may still hold that sync's collectives, which would pair with a new "
                      "sync's and corrupt its sums. Build a new backend from your communicator for the new "
                      "GradientSync, on every rank (e.g. gradsync::MpiBackend(MPI_COMM_WORLD))"));
  return b;
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
