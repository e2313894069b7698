// gradsync internals: the exchange concept, what a step moves between ranks besides its checks.
//
// A step (impl/step_pipeline.hpp) keeps its exchanges in one list, in the order they finish:
//
//   DenseExchange      the fused chunks of the data-parallel tensors (and the local tensors' scale)
//   SetExchange        the dense tensors of ReduceOver groups, over their process sets
//   RowSparseExchange  the rows of RowSparse gradients, world first, then the sets
//
// Each offers the same operations, called by the step only:
//
//   provision(f, layout)  after a plan build: buffers for the new layout (never during a step)
//   advance(f, scan)      during backward (mark_ready, progress): launch what is ready, test what is
//                         in flight; never blocks, and issues collectives in an order every rank shares
//   finish(f, scan)       in synchronize(): everything left, waited; the tensors hold the results
//   park()                on failure: a handle on everything collectives in flight may still touch,
//                         kept until exit (never freed); the exchange still answers queries
//   describe(regs)        its registrations, for the ranks' consistency check
//
// `f` is the StepFrame below; `scan(begin, end)` checks segments before they leave
// (Options::check_finite), given only to an exchange that declares `scanned`. ExchangeBase gives the no-op forms, so an
// exchange writes only what it does. Adding an exchange is one file with its class and one entry in StepPipeline's
// list.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "consistency.hpp"
#include "sync_context.hpp"

namespace gradsync::impl {

// What an exchange is handed for one call (never stored: the sync moves).
template <class Context, class Plan, class Registry, class Sets>
struct StepFrame {
  Context& cx;
  const Plan& plan;
  const Registry& registry;
  const Sets& sets;  // the process sets (row-sparse rows of ReduceOver groups go over them)
  bool aggregated;   // backward_passes_per_step > 1: the sums of the cycle are in the buffers
};

struct ExchangeBase {
  static constexpr bool scanned = false;  // check_finite scans its values before they leave
  template <class Frame, class Layout>
  void provision(Frame&, const Layout&) {}
  template <class Frame, class Scan>
  void advance(Frame&, Scan&&) {}
  template <class Frame, class Scan>
  void finish(Frame&, Scan&&) {}
  void describe(std::vector<RegDesc>&) const {}
};

// f(exchange) for each exchange of the list, in its order.
template <class Tuple, class F>
void for_each_exchange(Tuple& list, F&& f) {
  std::apply([&](auto&... x) { (f(x), ...); }, list);
}

}  // namespace gradsync::impl
