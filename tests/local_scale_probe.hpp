// The deferred local scale as its user sees it: the factor DistributedOptimizer folds into its
// update, read the way it reads it (impl::SyncAccess::for_each_gradient and local_scale_pending),
// so the tests check what the optimizer is handed rather than a query of their own.
#pragma once

#include <gradsync/gradient_sync.hpp>

#include <cstddef>
#include <stdexcept>

namespace gradsync_test {

/// The factor a deferred local tensor's values wait for: 1/world_size by its policy (or
/// scale_local_gradients) times 1/N with average_aggregated_gradients, as the sync's own pass would
/// apply it; 1 for a tensor whose scale is not deferred (a data-parallel one, for instance).
template <class S, class U>
typename S::value_type deferred_scale(const S& sync, const U& tensor) {
  using V = typename S::value_type;
  const V* const data = gradsync::TensorTraits<U>::data(tensor);
  V factor(0);
  bool found = false;
  gradsync::impl::SyncAccess::for_each_gradient(sync, [&](const V* d, std::size_t, bool, V deferred) {
    if (d != data) return;
    factor = deferred;
    found = true;
  });
  if (!found) throw std::logic_error("deferred_scale: the tensor is not registered with the sync");
  return factor;
}

/// The factor the tensor's values still need: deferred_scale() after synchronize() returned true,
/// until the pending scales are applied (apply_local_scale, clip_grad_norm); 1 otherwise.
template <class S, class U>
typename S::value_type pending_scale(const S& sync, const U& tensor) {
  using V = typename S::value_type;
  return gradsync::impl::SyncAccess::local_scale_pending(sync) ? deferred_scale(sync, tensor) : V(1);
}

}  // namespace gradsync_test
