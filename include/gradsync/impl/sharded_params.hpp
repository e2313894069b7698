// gradsync internals: a DistributedOptimizer's data-parallel parameters under Options::shard.
//
// The sync says which slices of the data-parallel gradients this rank owns
// (GradientSync::owned_slices()). Each slice, cut at tensor boundaries, becomes one slot of the
// wrapped optimizer over the matching slice of the parameter, so the optimizer keeps state for
// those values only and updates only them; local parameters keep one slot each. After the update,
// the slices travel through the gradients' own memory: each rank copies its updated parameter
// slices into its gradient slices, the sync allgathers them in the regions of its reduce-scatter
// (impl::SyncEngine::gather), and every rank copies the other ranks' slices into its parameters.
// Exact: the update of a slice is the unsharded update of those values, and copies are copies.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "memory_ops.hpp"
#include "range_index.hpp"

namespace gradsync::impl {

template <class V, class MemorySpace>
class ShardedParams {
 public:
  // A slice of one data-parallel parameter and of its gradient.
  struct Piece {
    V* param;
    V* grad;
    std::size_t count;
    std::size_t slot = 0;  // the optimizer's
    std::size_t from = 0;  // the owned slice it was cut from
  };
  // A run of a data-parallel parameter and of its gradient: a whole one, or the part other ranks own.
  struct Whole {
    V* param;
    V* grad;
    std::size_t count;
  };

  bool built() const { return built_; }
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Cuts `owned` (pointer, count into gradients) at the data-parallel parameters in `dp` and calls
  // add(piece) for each, in order. Once: the optimizer's slots cannot move (require_same() refuses a
  // later plan with other slices).
  template <class Add>
  void build(const std::vector<std::pair<V*, std::size_t>>& owned, const std::vector<Whole>& dp, Add&& add) {
    RangeIndex<V> by_grad;
    for (std::size_t i = 0; i < dp.size(); ++i)
      if (dp[i].count > 0) by_grad.insert(dp[i].grad, dp[i].count, i);
    for (std::size_t from = 0; from < owned.size(); ++from) {
      auto [g, n] = owned[from];
      while (n > 0) {
        const std::size_t i = by_grad.holding(g);
        if (i == RangeIndex<V>::npos)
          throw Error(
              "sharded DistributedOptimizer: a slice the sync owns lies outside every data-parallel "
              "parameter's gradient (a gradient registered with the sync but not with add<Group>())");
        const Whole& w = dp[i];
        const std::size_t off = std::size_t(g - w.grad), k = std::min(n, w.count - off);
        pieces_.push_back(Piece{w.param + off, g, k, 0, from});
        add(pieces_.back());
        g += k;
        n -= k;
      }
    }
    // What the allgather brings: each parameter but this rank's pieces (already its values).
    std::vector<std::pair<std::uintptr_t, std::size_t>> mine;
    for (const Piece& p : pieces_) mine.emplace_back(reinterpret_cast<std::uintptr_t>(p.grad), p.count);
    std::sort(mine.begin(), mine.end());
    for (const Whole& w : dp) {
      std::uintptr_t at = reinterpret_cast<std::uintptr_t>(w.grad);
      const std::uintptr_t end = at + w.count * sizeof(V);
      const auto rest = [&](std::uintptr_t to) {
        if (to > at)
          others_.push_back(Whole{w.param + (at - reinterpret_cast<std::uintptr_t>(w.grad)) / sizeof(V),
                                  reinterpret_cast<V*>(at), (to - at) / sizeof(V)});
      };
      for (auto it = std::lower_bound(mine.begin(), mine.end(), std::make_pair(at, std::size_t(0)));
           it != mine.end() && it->first < end; ++it) {
        rest(it->first);
        at = it->first + it->second * sizeof(V);
      }
      rest(end);
    }
    owned_ = owned;
    built_ = true;
  }
  // The optimizer's slots were cut from `owned_`: a plan with other slices is refused.
  void require_same(const std::vector<std::pair<V*, std::size_t>>& owned, int rank) const {
    if (owned != owned_)
      throw ConfigError(
          cat("DistributedOptimizer (shard = optimizer_state): the sync's slices changed after the "
              "first apply() (registrations changed, or register_local_var) on rank ",
              rank, "; sharded optimizer state cannot follow them yet"));
  }

  // Before the allgather: this rank's updated slices (pieces [i, j)) into its gradients' slices.
  void slices_to_gradients(std::size_t i = 0, std::size_t j = std::size_t(-1)) const {
    for (j = std::min(j, pieces_.size()); i < j; ++i) copy(pieces_[i].grad, pieces_[i].param, pieces_[i].count);
    Kokkos::fence();
  }
  // After it: the rest of every data-parallel parameter from its gradient, which now holds every
  // owner's slice.
  void gradients_to_parameters() const {
    for (const Whole& w : others_) copy(w.param, w.grad, w.count);
    Kokkos::fence();
  }

 private:
  static void copy(V* to, const V* from, std::size_t n) { copy_values<MemorySpace, MemorySpace>(to, from, n); }

  bool built_ = false;
  std::vector<Piece> pieces_;
  std::vector<Whole> others_;  // the parameters' values other ranks own
  std::vector<std::pair<V*, std::size_t>> owned_;
};

}  // namespace gradsync::impl
