// gradsync: a sharded step (Options::shard) for a program that updates its parameters itself.
//
// A DistributedOptimizer does all of it. Without one: synchronize() leaves each data-parallel
// gradient's average in this rank's slices only (GradientSync::owned_slices()); the program updates
// the same slices of its parameters (the same offsets in each parameter as in its gradient), then
// calls allgather_parameters(), which sends each rank's slices to every rank:
//
//   if (sync.synchronize()) {
//     for (auto [g, n] : sync.owned_slices()) update(param_of(g), g, n);   // this rank's slices
//     gradsync::allgather_parameters(sync, pairs);                          // every parameter whole
//   }
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "gradient_sync.hpp"
#include "impl/sharded_params.hpp"
#include "impl/sync_access.hpp"
#include "tensor_traits.hpp"

namespace gradsync {

/// After a sharded synchronize() and the program's update of its slices: every data-parallel
/// parameter whole on every rank, each slice from the rank that owns it. `pairs` holds each
/// data-parallel (parameter, gradient) the sync has, as Spans (any order; local ones are ignored
/// if given). The slices travel through the gradients' own memory, which holds parameter values
/// afterwards (the next backward pass overwrites them). Collective, under the sync's stall
/// watchdog; between steps. An Error when the sync is not sharded or a slice lies outside the
/// given gradients.
template <class Backend, class Tensor>
void allgather_parameters(
    GradientSync<Backend, Tensor>& sync,
    const std::vector<std::pair<
        Span<typename GradientSync<Backend, Tensor>::value_type, typename GradientSync<Backend, Tensor>::memory_space>,
        Span<typename GradientSync<Backend, Tensor>::value_type,
             typename GradientSync<Backend, Tensor>::memory_space>>>& pairs) {
  using S = GradientSync<Backend, Tensor>;
  using V = typename S::value_type;
  if (sync.options().shard == Shard::none)
    throw Error("allgather_parameters: the sync is not sharded (Options::shard is none)");
  std::vector<const V*> local;  // whole on their rank (a process set's tensors are sharded within it)
  const auto& sets = impl::SyncAccess::process_sets(sync);
  impl::SyncAccess::for_each_gradient(sync, [&](const V* d, std::size_t, bool l, V) {
    if (l && !sets.set_holding(d)) local.push_back(d);
  });
  impl::ShardedParams<V, typename S::memory_space> shards;
  std::vector<typename decltype(shards)::Whole> dp;
  for (const auto& [p, g] : pairs)
    if (std::find(local.begin(), local.end(), g.data()) == local.end()) dp.push_back({p.data(), g.data(), g.size()});
  shards.build(sync.owned_slices(), std::move(dp), [](auto&) {});
  shards.slices_to_gradients();
  impl::SyncAccess::gather_slices(sync, "allgather_parameters()");
  shards.gradients_to_parameters();
}

}  // namespace gradsync
