// gradsync: broadcast_set_parameter, a process set's parameter made equal on its members.
//
// For a parameter outside a DistributedOptimizer whose gradient a sync reduces over a process set
// (a table updated by the caller from a RowSparse gradient): its replicas must start equal, as
// broadcast_parameters makes those it holds. Included by distributed_optimizer.hpp.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "error.hpp"
#include "impl/demangle.hpp"
#include "impl/parameter_broadcast.hpp"
#include "impl/rank_text.hpp"
#include "impl/sync_access.hpp"
#include "local_var_policy.hpp"
#include "process_set.hpp"
#include "tensor_traits.hpp"

namespace gradsync {

/// Sends `param` from the first rank of this rank's process set for Group (a ReduceOver<Tag> group:
/// the set bound for Tag, its lowest rank of the sync) to the set's other members, over the set's
/// communicator, so that the replicas of a parameter whose gradient `sync` reduces over the set start
/// equal. DistributedOptimizer::broadcast_parameters does this for the parameters it holds; this is
/// for the others (a table updated by the caller from a RowSparse gradient). Collective over the set:
/// its members pass parameters of the same size, in the same order; a size that differs from the
/// first rank's is a MismatchError on every member, with the same message. The sets' communicators
/// must exist: call it after sync.prepare() or a synchronize(). Legal between steps (an Error while a
/// step is open or after a failure); an exception inside the exchange fails the sync. A setup-time
/// call: allocates small host cells, and a staging copy where the backend cannot reach the
/// parameter's memory.
template <class Group, class Sync, class P>
void broadcast_set_parameter(Sync& sync, const P& param) {
  using PT = TensorTraits<P>;
  static_assert(is_set_reduced_v<Group>,
                "gradsync::broadcast_set_parameter<Group>: Group's policy must be ReduceOver<Tag> (process_set.hpp)");
  static_assert(is_tensor_v<P> && PT::is_writable,
                "gradsync::broadcast_set_parameter: the parameter must be a writable tensor gradsync knows");
  using Space = typename PT::memory_space;
  const std::string tag = impl::type_name<typename LocalVarPolicy<Group>::set_tag>();
  const std::string what =
      impl::cat("broadcast_set_parameter<", impl::type_name<Group>(), "> on rank ", sync.backend().rank());
  const auto& sets = impl::SyncAccess::process_sets(sync).sets();
  const auto s = std::find_if(sets.begin(), sets.end(), [&](const auto& x) { return x.tag == tag; });
  if (s == sets.end())
    throw Error(impl::cat(what, ": process set ", tag, " is not bound (bind_process_set<", tag, ">)"));
  if (!s->backend)
    throw Error(impl::cat(what, ": process set ", tag,
                          " has no communicator yet: call it after the sync's prepare() "
                          "or first synchronize()"));
  if (!PT::is_contiguous(param)) throw Error(impl::cat(what, ": the parameter is not contiguous"));
  const int me = sync.backend().rank();
  Kokkos::fence();  // pending kernels may still write the parameter
  // Waited under the sync's stall watchdog, over the set's communicator (see broadcast_parameters).
  impl::SyncAccess::collective(
      sync, "broadcast_set_parameter()", "broadcast of a set's parameter",
      [&](const auto& world) {
        const auto b = world.over(*s->backend);
        std::int64_t n = std::int64_t(PT::size(param)), first = n;
        impl::broadcast_over<Kokkos::HostSpace, Space>(b, &first, 1, 0);
        constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
        std::int64_t bad[1] = {n == first ? none : std::int64_t(me)};
        impl::allreduce_min_over<Kokkos::HostSpace, Space>(b, bad, 1);
        if (bad[0] != none) {
          // Every member found it in the same completed allreduce: an agreed mismatch (no notice
          // races the peers' own finding), with one message on every member, so the lowest
          // differing rank's size crosses too (this path only).
          std::int64_t size_of_bad[1] = {bad[0] == me ? n : none};
          impl::allreduce_min_over<Kokkos::HostSpace, Space>(b, size_of_bad, 1);
          throw impl::AgreedMismatch(impl::cat("broadcast_set_parameter<", impl::type_name<Group>(), ">: process set ",
                                               tag, " ", impl::rank_list(s->ranks), ": rank ", bad[0],
                                               "'s parameter differs in size from the set's first rank's (rank ",
                                               s->ranks.front(), " has ", first, " values, rank ", bad[0], " has ",
                                               size_of_bad[0], ")"));
        }
        impl::broadcast_over<Space, Kokkos::HostSpace>(b, PT::data(param), std::size_t(n), 0);
      },
      false);
  Kokkos::fence();
}

}  // namespace gradsync
