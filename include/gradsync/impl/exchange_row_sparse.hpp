// gradsync internals: impl::RowSparseExchange, the rows of RowSparse gradients.
//
// The exchange (impl/exchange.hpp) of the registered RowSparse gradients, after the dense ones:
// local rows scaled in place, data-parallel rows gathered over the world (under the sync's stall
// watchdog), then each process set's rows over its set. Weighted (set_samples), the rows carry
// this rank's samples before the sum and 1/N after.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../row_sparse.hpp"
#include "exchange.hpp"
#include "watched.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class RowSparseExchange : public ExchangeBase {
 public:
  using Rows = row_sparse_set_t<V, MemorySpace, ExecutionSpace>;

  RowSparseExchange() : rows_(std::make_shared<Rows>()) {}

  Rows& rows() { return *rows_; }
  const Rows& rows() const { return *rows_; }

  template <class Frame, class Scan>
  void finish(Frame& f, Scan&&) {
    if (rows_->empty()) return;
    auto& cx = f.cx;
    const auto& plan = f.plan;
    const SampleWeights<V>& w = plan.weights();
    const V dp_factor =
        plan.weighted() ? V(cx.opt.prescale_factor) * plan.post_factor() : plan.pre_factor() * plan.post_factor();
    using SetBackend = typename split_result<Backend>::type;
    rows_->finish(
        cx.backend, cx.exec, dp_factor, cx.stats, f.sets.sets(),
        [&](const std::string& tag, SetScale scale) -> std::pair<const SetBackend*, V> {
          if constexpr (has_split<Backend>::value && Kokkos::is_execution_space<ExecutionSpace>::value)
            return {&f.sets.backend_of(tag),
                    f.sets.factor(scale, cx.opt, cx.backend.size(), f.sets.set_size(tag), plan.weighted(), w.total)};
          else
            return {nullptr, V(1)};  // never asked: no sets without split()
        },
        [&](const auto& b) -> decltype(auto) {  // the sync's own backend type: watched
          if constexpr (std::is_same_v<std::decay_t<decltype(b)>, Backend>)
            return Watched<Backend>(b, cx.ctl, cx.opt, std::int64_t(cx.stats.passes), "row-sparse exchange");
          else
            return (b);
        },
        w);
  }
  std::shared_ptr<void> park() { return rows_; }
  void describe(std::vector<RegDesc>& regs) const { rows_->describe(regs); }

 private:
  std::shared_ptr<Rows> rows_;
};

}  // namespace gradsync::impl
