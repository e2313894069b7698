// gradsync internals: impl::DenseExchange, the fused chunks of the data-parallel tensors.
//
// The exchange (impl/exchange.hpp) that SyncEngine runs: chunks launched as their tensors are
// marked ready, the rest reduced at synchronize(), then the local tensors scaled in place (their
// segments belong to the same fused layout). Everything else of the engine (accumulation between
// passes, residuals, deferred scales, the fp16 overflow flag) stays reachable through it.
#pragma once

#include <memory>
#include <type_traits>
#include <vector>

#include "exchange.hpp"
#include "sync_engine.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class DenseExchange : public SyncEngine<Backend, V, MemorySpace, ExecutionSpace>, public ExchangeBase {
  using Engine = SyncEngine<Backend, V, MemorySpace, ExecutionSpace>;

 public:
  static constexpr bool scanned = true;  // the data-parallel chunks: check_finite's scan

  // The plan's layout, provisioned with the registered tensors' keepalives (a stalled collective
  // may still write into them).
  template <class Frame, class Layout>
  void provision(Frame& f, const Layout& layout) {
    std::vector<std::shared_ptr<void>> keep;
    for (const auto& e : f.registry)
      if (!e.local() && e.keepalive) keep.push_back(e.keepalive);
    Engine::provision(f.cx, f.plan, layout, keep);
  }
  template <class Frame, class Scan>
  void advance(Frame& f, Scan&& scan) {
    Engine::progress(f.cx, f.plan, f.aggregated, std::forward<Scan>(scan));
  }
  template <class Frame, class Scan>
  void finish(Frame& f, Scan&& scan) {
    Engine::reduce(f.cx, f.plan, f.aggregated, std::forward<Scan>(scan));
    Engine::finish_local(f.cx, f.plan, f.aggregated);
  }
  using Engine::park;
  using ExchangeBase::describe;  // the registry describes the dense tensors
};

}  // namespace gradsync::impl
