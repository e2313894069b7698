// gradsync: the global gradient norm of a hybrid model, and clipping by it.
//
// The norm is that of the whole model's gradient as if it ran on one process. After synchronize()
// a data-parallel gradient holds the same values on every rank and must count once, not n times;
// a gradient reduced over a process set (ReduceOver) holds the same values on every member of its
// set S and must count once per set, not once per replica; a local gradient is one rank's shard and
// counts once where it lives. Each rank therefore contributes
//   Σ_local |g|² + Σ_set-reduced |g|² / |S| + Σ_data-parallel |g|² / n
// and one allreduce of that single value gives the square of the norm on every rank (dividing the
// replicated parts, rather than counting them on one rank, makes the result independent of
// last-bit differences between ranks' copies). Row-sparse gradients count the rows() rows they
// hold after the sync, by the same weights. Sharded (Options::shard), a data-parallel gradient (or
// a process set's dense one) holds its average only in the slice a rank owns (its set's slice):
// each rank counts its own slices, with weight 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "impl/profiling.hpp"
#include "impl/segment_table.hpp"
#include "impl/stall.hpp"
#include "impl/sync_access.hpp"

namespace gradsync {
namespace impl {

template <class T>
struct NormSegment {
  T* ptr = nullptr;
  std::int64_t count = 0;
  double weight = 1;  // 1 for local tensors, 1/|S| for those reduced over a set S, 1/n for data-parallel ones
  T factor = T(1);    // a deferred local scale (GradientSync::defer_local_scale)
};

template <class T, class MemorySpace>
using NormSegmentView = Kokkos::View<NormSegment<T>*, MemorySpace>;

// partial(seg) = weight · Σ ptr[i]² of one segment, accumulated in double whatever T is. Partial sums
// per segment, added up on the host in a fixed order, rather than a parallel_reduce: Kokkos 4's
// parallel_reduce builds a std::string fence label at every call (a heap allocation per step).
template <class T, class ExecutionSpace, class MemorySpace>
struct SquaredNormKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  NormSegmentView<T, MemorySpace> segs;
  Kokkos::View<double*, MemorySpace> partial;
  bool scaled;  // deferred scales are pending: the values the pass would have left, rounded as it would

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const NormSegment<T> s = segs(team.league_rank());
    const T f = scaled ? s.factor : T(1);
    double part = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, s.count),
        [&](std::int64_t i, double& acc) {
          const double x = double(T(s.ptr[i] * f));
          acc += x * x;
        },
        part);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { partial(team.league_rank()) = s.weight * part; });
  }
};

// ptr[i] *= factor
template <class T, class ExecutionSpace, class MemorySpace>
struct ScaleKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  NormSegmentView<T, MemorySpace> segs;
  T factor;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const NormSegment<T> s = segs(team.league_rank());
    const T f = factor;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) { s.ptr[i] *= f; });
  }
};

}  // namespace impl

/// Global norm and clipping over every gradient a GradientSync holds. Keeps its kernel table between
/// calls (rebuilt when registrations change), so repeated calls allocate nothing. Collective: every
/// rank of the sync's communicator calls it, after synchronize() returned true.
template <class Sync>
class GlobalNorm {
 public:
  using value_type = typename Sync::value_type;            ///< The gradients' value type.
  using memory_space = typename Sync::memory_space;        ///< Where the gradients live.
  using execution_space = typename Sync::execution_space;  ///< Where the norm and clip kernels run.

  /// A norm whose kernels run on `exec`. Local; allocates nothing (the table comes at the first call).
  explicit GlobalNorm(execution_space exec = {}) : exec_(exec) {}

  /// sqrt(Σ over the whole model of g²), equal on every rank. Collective over the sync's
  /// communicator, under its stall watchdog: a rank that skips it is named by the ranks that wait.
  /// Legal between steps, meant after synchronize() returned true (an Error while a step is open, or
  /// after a failure); an exception inside it fails the sync. Allocates its kernel table at the
  /// first call and when the sync's registrations change, nothing otherwise.
  double norm(Sync& sync) {
    // Refused before the kernel: while a step is open its exchange is still writing the gradients.
    impl::SyncAccess::require_between_steps(sync, "global_norm()");
    impl::ProfileRegion region(impl::Region::global_norm);
    refresh(sync);
    double local_part = 0;
    const std::int64_t nsegs = std::int64_t(segs_.extent(0));
    if (nsegs > 0) {
      impl::launch_per_segment(impl::label_norm(), exec_, nsegs,
                               impl::SquaredNormKernel<value_type, execution_space, memory_space>{
                                   segs_, partial_, impl::SyncAccess::local_scale_pending(sync)});
      Kokkos::deep_copy(exec_, partial_host_, partial_);  // the same View when memory_space is the host's
      impl::fence(exec_, impl::label_fence_reduce());
      for (std::int64_t k = 0; k < nsegs; ++k) local_part += partial_host_(k);
    }
    // The value crosses in a cell of its own, not on the stack: a collective abandoned by a stall
    // may be completed by a late peer, which then writes there (the cell is parked on failure).
    if (!cell_) cell_ = std::make_shared<double>();
    *cell_ = local_part;
    try {
      impl::SyncAccess::collective(sync, "global_norm()", "global norm's allreduce", [&](const auto& b) {
        if (b.template can_access<Kokkos::HostSpace>()) {
          b.allreduce_sum(cell_.get(), 1);
          local_part = *cell_;
        } else {  // a device-only backend: reduce through a one-value View in the gradients' memory space
          if (!device_value_.data()) device_value_ = Kokkos::View<double, memory_space>("gradsync::global_norm");
          Kokkos::deep_copy(exec_, device_value_, impl::HostScalar<double>(&local_part));
          impl::fence(exec_, impl::label_fence_reduce());
          b.allreduce_sum(device_value_.data(), 1);
          Kokkos::deep_copy(exec_, impl::HostScalar<double>(&local_part), device_value_);
          impl::fence(exec_, impl::label_fence_reduce());
        }
      });
    } catch (...) {
      impl::graveyard().push_back(std::make_shared<Kokkos::View<double, memory_space>>(device_value_));
      impl::graveyard().push_back(std::move(cell_));
      throw;
    }
    return std::sqrt(local_part);
  }

  /// torch.nn.utils.clip_grad_norm_: scales every gradient by max_norm / (norm + 1e-6) when that is
  /// below 1 and returns the norm before clipping. A non-finite norm throws with error_if_nonfinite,
  /// else (as in PyTorch) the gradients are scaled by the resulting NaN or zero factor. Collective
  /// and legal as norm(), which it calls; max_norm < 0 is a ConfigError before anything collective.
  /// Applies the sync's pending deferred local scales first when it scales. Allocates as norm().
  double clip(Sync& sync, double max_norm, bool error_if_nonfinite = false) {
    if (!(max_norm >= 0)) throw ConfigError(impl::cat("clip_grad_norm: max_norm must be >= 0, got ", max_norm));
    impl::ProfileRegion region(impl::Region::clip);
    const double total = norm(sync);
    if (error_if_nonfinite && !std::isfinite(total))
      throw Error(impl::cat("clip_grad_norm: the global gradient norm is ", total, " on rank ", sync.backend().rank(),
                            " (and every other rank)"));
    const double coef = max_norm / (total + 1e-6);
    if (!(coef >= 1)) {                           // also NaN, as torch.clamp(NaN, max=1) is NaN
      impl::SyncAccess::apply_local_scale(sync);  // deferred scales first: the same two roundings as without deferral
      impl::launch_per_segment(impl::label_clip(), exec_, std::int64_t(segs_.extent(0)),
                               impl::ScaleKernel<value_type, execution_space, memory_space>{segs_, value_type(coef)});
      impl::fence(exec_, impl::label_fence_clip());
    }
    return total;
  }

 private:
  struct Key {
    const value_type* data;
    std::size_t size;
    bool local;
    value_type factor;
    bool sparse;  // a RowSparse's values (size: its capacity)
    bool operator==(const Key& o) const {
      return data == o.data && size == o.size && local == o.local && factor == o.factor && sparse == o.sparse;
    }
  };

  // A segment of a row-sparse gradient: its count follows the rows the gradient holds this step.
  struct SparseSegment {
    std::size_t seg, tensor;  // index in segs_, index among the sync's row-sparse gradients
    std::int64_t offset, capacity;
  };

  // Rebuilds the segment table when the sync's tensors or their local flags changed, then sets the
  // row-sparse segments' counts to this step's rows.
  void refresh(const Sync& sync) {
    scratch_.clear();
    used_.clear();
    impl::SyncAccess::for_each_gradient(sync, [&](const value_type* d, std::size_t n, bool local, value_type factor) {
      scratch_.push_back(Key{d, n, local, factor, false});
    });
    impl::SyncAccess::row_sparse(sync).for_each_norm_tensor(
        [&](const value_type* d, std::size_t capacity, std::size_t used, const std::string&, bool local) {
          scratch_.push_back(Key{d, capacity, local, value_type(1), true});
          used_.push_back(std::int64_t(used));
        });
    const int n = sync.backend().size();
    const bool rebuilt = n != world_ || scratch_ != keys_ || sync.owned_slices() != owned_;
    if (rebuilt) rebuild(sync, n);
    bool changed = rebuilt;
    for (const SparseSegment& d : sparse_segs_) {
      const std::int64_t count = std::max<std::int64_t>(0, std::min(used_[d.tensor] - d.offset, d.capacity));
      changed = changed || segs_host_(d.seg).count != count;
      segs_host_(d.seg).count = count;
    }
    if (changed) Kokkos::deep_copy(exec_, segs_, segs_host_);  // nothing to copy when memory_space is the host's
  }

  void rebuild(const Sync& sync, int n) {
    std::vector<impl::NormSegment<value_type>> host;
    sparse_segs_.clear();
    const auto& sets = impl::SyncAccess::process_sets(sync);
    const bool sharded = sync.options().shard != Shard::none;
    owned_ = sync.owned_slices();
    for (const auto& [data, size] : owned_)
      impl::for_each_segment(size, [&, data = data](std::int64_t off, std::int64_t count) {
        host.push_back(impl::NormSegment<value_type>{data + off, count, 1.0, value_type(1)});
      });
    for (const Key& k : scratch_) {
      if (k.sparse) continue;
      const auto* set = sets.set_holding(k.data);
      if (sharded && (set || !k.local)) continue;  // its owned slices, above (sets': sharded within the set)
      const double weight = set ? 1.0 / double(set->ranks.size()) : k.local ? 1.0 : 1.0 / double(n);
      // for_each_gradient hands out const pointers; clip() scales these same gradients in place.
      value_type* const data = const_cast<value_type*>(k.data);
      impl::for_each_segment(k.size, [&](std::int64_t off, std::int64_t count) {
        host.push_back(impl::NormSegment<value_type>{data + off, count, weight, k.factor});
      });
    }
    std::size_t tensor = 0;
    impl::SyncAccess::row_sparse(sync).for_each_norm_tensor(
        [&](const value_type* d, std::size_t capacity, std::size_t, const std::string& tag, bool local) {
          const double weight = !tag.empty() ? 1.0 / double(sets.set_size(tag)) : local ? 1.0 : 1.0 / double(n);
          value_type* const data = const_cast<value_type*>(d);
          impl::for_each_segment(capacity, [&](std::int64_t off, std::int64_t count) {
            sparse_segs_.push_back(SparseSegment{host.size(), tensor, off, count});
            host.push_back(impl::NormSegment<value_type>{data + off, 0, weight, value_type(1)});
          });
          ++tensor;
        });
    segs_ = impl::NormSegmentView<value_type, memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("gradsync::norm_segments")), host.size());
    segs_host_ = Kokkos::create_mirror_view(segs_);
    std::copy(host.begin(), host.end(), segs_host_.data());
    partial_ = Kokkos::View<double*, memory_space>(
        Kokkos::view_alloc("gradsync::norm_partials", Kokkos::WithoutInitializing), host.size());
    partial_host_ = Kokkos::create_mirror_view(partial_);
    keys_.assign(scratch_.begin(), scratch_.end());  // scratch_ keeps its capacity: no allocation next time
    world_ = n;
  }

  execution_space exec_;
  int world_ = 0;  // the world size the table was built for; 0 before the first build
  std::vector<Key> keys_, scratch_;
  std::vector<std::pair<value_type*, std::size_t>> owned_;  // sharded: the sync's slices the table holds
  std::vector<std::int64_t> used_;                          // this call's values in use of each row-sparse gradient
  std::vector<SparseSegment> sparse_segs_;                  // the segments whose count follows used_
  impl::NormSegmentView<value_type, memory_space> segs_;
  typename impl::NormSegmentView<value_type, memory_space>::HostMirror segs_host_;  // segs_ itself on the host
  Kokkos::View<double*, memory_space> partial_;                                     // one partial sum per segment
  typename Kokkos::View<double*, memory_space>::HostMirror partial_host_;
  Kokkos::View<double, memory_space> device_value_;  // allocated on first use, by device-only backends only
  std::shared_ptr<double> cell_;                     // the host path's value in flight (see norm)
};

/// The global gradient norm of everything `sync` holds (GlobalNorm::norm: collective over the sync's
/// communicator, between steps). Builds and allocates its kernel table at every call: keep a
/// GlobalNorm (or use DistributedOptimizer::global_norm()) in a training loop.
template <class Sync>
double global_norm(Sync& sync) {
  return GlobalNorm<Sync>().norm(sync);
}

/// Clips everything `sync` holds by the global norm; returns the norm before clipping
/// (GlobalNorm::clip: collective over the sync's communicator, between steps). Allocates its
/// kernel table at every call, as global_norm().
template <class Sync>
double clip_grad_norm(Sync& sync, double max_norm, bool error_if_nonfinite = false) {
  return GlobalNorm<Sync>().clip(sync, max_norm, error_if_nonfinite);
}

}  // namespace gradsync
