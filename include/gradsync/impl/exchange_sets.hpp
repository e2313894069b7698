// gradsync internals: impl::SetExchange, the dense tensors of ReduceOver groups over their sets.
//
// The exchange (impl/exchange.hpp) of ProcessSets: after the world's chunks, each set's tensors
// are summed over the set's own communicator (made in the step's agreement, when registrations
// changed) and scaled by their SetScale. The sets are held by a shared handle so that parking them
// on failure keeps them (their communicators may have collectives pending) while the failed sync
// still answers queries.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "../process_set.hpp"
#include "exchange.hpp"

namespace gradsync::impl {

template <class Backend, class V, class ExecutionSpace>
class SetExchange : public ExchangeBase {
 public:
  using Sets = ProcessSets<Backend, V, ExecutionSpace>;
  // Process sets need a backend that splits its communicator and a Kokkos execution space.
  static constexpr bool supported = has_split<Backend>::value && Kokkos::is_execution_space<ExecutionSpace>::value;

  SetExchange() : sets_(std::make_shared<Sets>()) {}

  Sets& sets() { return *sets_; }
  const Sets& sets() const { return *sets_; }

  // Made collectively over the world's ranks, in the step's agreement (every rank: `needed` is agreed).
  template <class Watched>
  void connect(const Watched& world) {
    if constexpr (supported) sets_->connect(world);
  }

  template <class Frame, class Scan>
  void finish(Frame& f, Scan&&) {
    if constexpr (supported)
      if (sets_->has_tensors())
        sets_->reduce(f.cx.exec, f.cx.opt, f.cx.ctl, f.cx.backend.size(), std::int64_t(f.cx.stats.passes), f.cx.stats,
                      f.plan.weighted(), f.plan.weights().total);
  }
  // Options::shard, after the optimizer's update: each set's slices allgathered over the set.
  template <class Context>
  void gather(Context& cx) {
    if constexpr (supported)
      if (sets_->has_tensors()) sets_->gather(cx.exec, cx.opt, cx.ctl, std::int64_t(cx.stats.passes), cx.stats);
  }
  std::shared_ptr<void> park() { return sets_; }

 private:
  std::shared_ptr<Sets> sets_;
};

}  // namespace gradsync::impl
