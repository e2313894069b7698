// gradsync internals: a sync's row-sparse gradients and their exchange protocol (row_sparse.hpp).
//
// RowSparseSet registers the row-sparse gradients of one GradientSync and, after the dense chunks,
// exchanges them: local ones are scaled; for the others, one allgather of every rank's row count,
// capacity and bad-row count, checked alike on every rank, then per tensor the cheaper exchange
// every rank computes the same way: an allgather of row numbers and rows merged in rank order, or an
// allreduce of the densified table with a count column. Process sets' tensors follow, set by set.
// NoRowSparse stands in where the memory has no Kokkos execution space.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "../local_var_policy.hpp"
#include "../process_set.hpp"
#include "../stats.hpp"
#include "../tensor_traits.hpp"  // overlaps
#include "consistency.hpp"       // RegDesc
#include "demangle.hpp"
#include "memory_ops.hpp"
#include "row_sparse_erasure.hpp"
#include "row_sparse_kernels.hpp"
#include "sample_weights.hpp"

namespace gradsync::impl {

/// The row-sparse gradients of one GradientSync and their exchange (see the top of this file).
template <class T, class MemorySpace, class ExecutionSpace>
class RowSparseSet {
  using Base = SparseTensorBase<T, MemorySpace, ExecutionSpace>;
  using I64 = typename Base::I64;
  using Vals = typename Base::Vals;

 public:
  bool empty() const { return all_.empty(); }
  std::size_t size() const { return all_.size(); }

  template <class Group, class RS>
  void add(const RS& rs, std::string name, std::size_t index_in_group, int world_size, int rank) {
    auto t = std::make_shared<SparseTensor<RS, ExecutionSpace>>(rs);
    t->group = type_name<Group>();
    t->index_in_group = index_in_group;
    t->named = !name.empty();
    t->name = name.empty() ? cat(t->group, "[", index_in_group, "]") : std::move(name);
    t->local = is_local_v<Group>;
    t->local_factor = local_scale_v<Group> == LocalScale::world_size ? T(1) / T(world_size) : T(1);
    t->weighting = sample_weighting_of<Group>();
    if constexpr (is_set_reduced_v<Group>) {
      t->set_tag = type_name<typename LocalVarPolicy<Group>::set_tag>();
      t->set_scale = LocalVarPolicy<Group>::set_scale;
    }
    t->capacity = rs.capacity();
    t->width = rs.row_width();
    t->table_rows = rs.table_rows();
    for (const auto& o : all_)
      if (overlaps(t->values(), std::size_t(t->capacity * t->width), o->values(), std::size_t(o->capacity * o->width)))
        throw Error(cat("row-sparse gradient '", t->name, "' (group ", t->group, ") overlaps '", o->name,
                        "' already registered on rank ", rank));
    all_.push_back(std::move(t));
  }

  /// The group of a registered name, for index_in_group.
  std::size_t count_in_group(const std::string& group) const {
    return std::size_t(std::count_if(all_.begin(), all_.end(), [&](const auto& t) { return t->group == group; }));
  }

  /// Values ranges, for the dense registrations' overlap check.
  template <class F>
  void for_each_values(F&& f) const {
    for (const auto& t : all_) f(t->values(), std::size_t(t->capacity * t->width), t->name, t->group);
  }

  /// For GradientSync::registrations(), in registration order: f(name, group, local, reduced over a process set,
  /// the dense table's values (table rows x row width)).
  template <class F>
  void for_each_registration(F&& f) const {
    for (const auto& t : all_)
      f(t->name, t->group, t->local, !t->set_tag.empty(), std::size_t(t->table_rows * t->width));
  }

  /// For global_norm, in registration order: f(values, capacity (values), values in use (rows()),
  /// set tag (empty: none), local). After synchronize() a data-parallel one holds the same rows on
  /// every rank, a set-reduced one on every member of its set.
  template <class F>
  void for_each_norm_tensor(F&& f) const {
    for (const auto& t : all_)
      f(t->values(), std::size_t(t->capacity * t->width), std::size_t(t->rows() * t->width), t->set_tag, t->local);
  }

  /// The data-parallel ones join the consistency check: table rows and width must agree.
  void describe(std::vector<RegDesc>& regs) const {
    for (const auto& t : all_)
      regs.push_back({cat(t->group, " (row-sparse, rows of ", t->width, ")"), t->name,
                      std::size_t(t->table_rows * t->width), t->index_in_group, t->local, false, t->named});
  }

  /// After the dense exchange: local ones scaled, data-parallel ones summed over the ranks and
  /// multiplied by `dp_factor` (prescale, postscale, 1/n for average), then those over process sets,
  /// set by set in binding order (`sets`, each with its `tag`): route(tag, scale) gives the set's
  /// backend and factor. watch(backend) gives the collectives to use on a backend (the sync's, waited
  /// under its watchdog: impl::Watched).
  /// Weighted (`w`, set_samples()): a data-parallel or world_size set's rows are weighted by this
  /// rank's samples before the sum (the factors then hold 1/N); local ones take their group's
  /// weighting instead of local_factor.
  template <class Backend, class Sets, class Route, class Watch>
  void finish(const Backend& b, const ExecutionSpace& exec, T dp_factor, Stats& stats, const Sets& sets, Route&& route,
              Watch&& watch, const SampleWeights<T>& w = {}) {
    // The lists below are members, cleared and refilled: a step allocates nothing once they have grown.
    in_.clear();
    for (const auto& t : all_) {
      if (!t->set_tag.empty()) continue;
      if (!t->local) {
        in_.push_back(t.get());
        continue;
      }
      const std::int64_t n = t->rows() * t->width;
      const T f = w.weighted ? w.before(t->weighting) * w.after(t->weighting) : t->local_factor;
      if (f != T(1) && n > 0)
        Kokkos::parallel_for(label_row_sparse_scale(), step_range(exec, n), SparseScale<T>{t->values(), f});
    }
    if (!in_.empty()) {
      factors_.assign(in_.size(), dp_factor);
      weights_.assign(in_.size(), w.own);
      exchange(watch(b), exec, stats);
    }
    for (const auto& set : sets) {
      const std::string& tag = set.tag;
      in_.clear(), factors_.clear(), weights_.clear();
      decltype(route(tag, SetScale::world_size).first) sb = nullptr;
      for (const auto& t : all_)
        if (t->set_tag == tag) {
          const auto [backend, f] = route(tag, t->set_scale);
          sb = backend;
          in_.push_back(t.get());
          factors_.push_back(f);
          weights_.push_back(w.before(t->weighting));
        }
      if (!in_.empty()) exchange(watch(*sb), exec, stats);
    }
    fence(exec, label_fence_sync());
  }

  // A row-sparse gradient averaged over its set's size, or "" (see ProcessSets::set_size_tensor).
  std::string set_size_tensor() const {
    for (const auto& t : all_)
      if (!t->set_tag.empty() && t->set_scale == SetScale::set_size)
        return cat("row-sparse gradient '", t->name, "' (group ", t->group, ")");
    return {};
  }

 private:
  template <class V>
  static void grow(V& v, std::size_t n, const char* label) {
    if (v.extent(0) >= n && v.data()) return;
    v = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), std::max<std::size_t>(n, 1));
  }

  // v's host mirror, kept in m and made again only when v grew: v itself where MemorySpace is the
  // host's. A mirror made per step would be a host allocation per step on a GPU.
  template <class V>
  static const typename V::HostMirror& mirror(typename V::HostMirror& m, const V& v) {
    if (!m.data() || m.extent(0) != v.extent(0)) m = Kokkos::create_mirror_view(v);
    return m;
  }

  // op(pointers) on Views the backend can reach: the Views themselves, or their host mirrors.
  template <class Backend, class V, class Op>
  static void reachable(const Backend& b, const ExecutionSpace& exec, const V& send, typename V::HostMirror& send_h,
                        const V& recv, typename V::HostMirror& recv_h, Op&& op) {
    if (b.template can_access<MemorySpace>()) {
      op(send.data(), recv.data());
      return;
    }
    copy_now(exec, mirror(send_h, send), send);
    op(send_h.data(), mirror(recv_h, recv).data());
    copy_now(exec, recv, recv_h);
  }

  // The tensors in_ (factors_, weights_: theirs) summed over b's ranks.
  template <class Backend>
  void exchange(const Backend& b, const ExecutionSpace& exec, Stats& stats) {
    const int n = b.size();
    const auto& dp = in_;
    const std::size_t S = dp.size(), rec = 3;
    // Every rank's row count, capacity and count of bad row numbers, for every tensor: one allgather.
    grow(counts_, rec * S, "gradsync::row_sparse_counts");
    grow(all_counts_, rec * S * std::size_t(n), "gradsync::row_sparse_counts");
    const auto& mine = mirror(counts_h_, counts_);
    for (std::size_t s = 0; s < S; ++s) {
      mine(rec * s) = dp[s]->rows();
      mine(rec * s + 1) = dp[s]->capacity;
      mine(rec * s + 2) = 0;
    }
    copy_now(exec, counts_, mine);
    for (std::size_t s = 0; s < S; ++s) dp[s]->count_bad(exec, counts_.data() + rec * s + 2);
    fence(exec, label_fence_pack());
    reachable(b, exec, counts_, counts_h_, all_counts_, all_counts_h_,
              [&](const std::int64_t* s, std::int64_t* r) { b.allgather(s, r, rec * S); });
    const auto& all = mirror(all_counts_h_, all_counts_);
    copy_now(exec, all, all_counts_);
    const auto at = [&](int r, std::size_t s, std::size_t k) { return all(std::size_t(r) * rec * S + rec * s + k); };

    for (std::size_t s = 0; s < S; ++s) {
      const Base& t = *dp[s];
      std::int64_t total = 0, widest = 0;
      std::string bad, small;
      for (int r = 0; r < n; ++r) {
        total += at(r, s, 0);
        widest = std::max(widest, at(r, s, 0));
        if (at(r, s, 2) > 0) bad += cat(bad.empty() ? "" : ", ", r, " (", at(r, s, 2), " rows)");
      }
      const std::int64_t need = std::min(total, t.table_rows);
      for (int r = 0; r < n; ++r)
        if (at(r, s, 1) < need) small += cat(small.empty() ? "" : ", ", r, " (", at(r, s, 1), ")");
      const auto what = [&] {  // built for an error only
        return cat("row-sparse gradient '", t.name, "' (group ", t.group, ", ", t.table_rows, " rows of ", t.width,
                   ")");
      };
      if (!bad.empty())
        throw Error(cat(what(), ": row numbers outside [0, ", t.table_rows, ") on rank(s) ", bad,
                        "; every rank stops at this synchronize()"));
      if (!small.empty())
        throw Error(cat(what(), ": the summed rows may need ", need, " rows (the ", n, " ranks hold ", total,
                        " together) but the capacity is smaller on rank(s) ", small,
                        "; give every rank capacity for the union of the ranks' rows"));
      if (total == 0) {
        t.set_rows(0);
        continue;
      }
      // Bytes each rank receives: the padded allgather against the densified table's allreduce
      // (a ring moves about twice the buffer). Every rank computes the same choice.
      const double sparse_bytes = double(n) * double(widest) * double(t.width * std::int64_t(sizeof(T)) + 8);
      const double dense_bytes = 2.0 * double(t.table_rows) * double(t.width + 1) * double(sizeof(T));
      if (sparse_bytes <= dense_bytes)
        gather(b, exec, t, widest, weights_[s], factors_[s], stats);
      else
        densify(b, exec, t, weights_[s], factors_[s], stats);
    }
  }

  template <class Backend>
  void gather(const Backend& b, const ExecutionSpace& exec, const Base& t, std::int64_t widest, T weight, T f,
              Stats& stats) {
    const int n = b.size();
    const std::int64_t w = t.width, rows = t.rows();
    grow(idx_send_, std::size_t(widest), "gradsync::row_sparse_send");
    grow(val_send_, std::size_t(widest * w), "gradsync::row_sparse_send");
    grow(idx_recv_, std::size_t(widest) * std::size_t(n), "gradsync::row_sparse_recv");
    grow(val_recv_, std::size_t(widest * w) * std::size_t(n), "gradsync::row_sparse_recv");
    t.read_indices(exec, idx_send_, widest);
    Kokkos::parallel_for(label_row_sparse_values(), step_range(exec, widest * w),
                         SparseReadValues<T>{t.values(), val_send_.data(), rows * w, weight});
    fence(exec, label_fence_pack());
    reachable(b, exec, idx_send_, idx_send_h_, idx_recv_, idx_recv_h_,
              [&](const std::int64_t* s, std::int64_t* r) { b.allgather(s, r, std::size_t(widest)); });
    reachable(b, exec, val_send_, val_send_h_, val_recv_, val_recv_h_,
              [&](const T* s, T* r) { b.allgather(s, r, std::size_t(widest * w)); });
    stats.row_sparse_bytes += std::uint64_t(widest) * std::uint64_t(w * std::int64_t(sizeof(T)) + 8);
    stats.row_sparse_collectives += 2;

    // Which gathered rows go to which output row: row number, then rank order (host bookkeeping on
    // the row numbers only; the sums run in one kernel).
    const auto& h = mirror(idx_recv_h_, idx_recv_);
    copy_now(exec, h, idx_recv_);
    order_.clear();
    const std::int64_t m = widest * n;
    for (std::int64_t k = 0; k < m; ++k)
      if (h(std::size_t(k)) >= 0) order_.emplace_back(h(std::size_t(k)), k);
    std::sort(order_.begin(), order_.end());
    grow(uniq_, order_.size(), "gradsync::row_sparse_rows");
    grow(begin_, order_.size() + 1, "gradsync::row_sparse_rows");
    grow(src_, order_.size(), "gradsync::row_sparse_rows");
    const auto& hu = mirror(uniq_h_, uniq_);
    const auto& hb = mirror(begin_h_, begin_);
    const auto& hs = mirror(src_h_, src_);
    std::int64_t u = 0;
    for (std::size_t q = 0; q < order_.size(); ++q) {
      if (q == 0 || order_[q].first != order_[q - 1].first) {
        hu(std::size_t(u)) = order_[q].first;
        hb(std::size_t(u)) = std::int64_t(q);
        ++u;
      }
      hs(q) = order_[q].second;
    }
    hb(std::size_t(u)) = std::int64_t(order_.size());
    copy_now(exec, uniq_, hu);
    copy_now(exec, begin_, hb);
    copy_now(exec, src_, hs);
    t.write_merged(exec, uniq_, begin_, src_, val_recv_, u, f);
    t.set_rows(u);
  }

  template <class Backend>
  void densify(const Backend& b, const ExecutionSpace& exec, const Base& t, T weight, T f, Stats& stats) {
    const std::int64_t w = t.width, rows = t.rows(), len = t.table_rows * (w + 1);
    grow(dense_, std::size_t(len), "gradsync::row_sparse_dense");
    grow(idx_send_, std::size_t(rows), "gradsync::row_sparse_send");
    Kokkos::parallel_for(label_row_sparse_zero(), step_range(exec, len), SparseZero<T>{dense_.data()});
    t.read_indices(exec, idx_send_, rows);
    Kokkos::parallel_for(label_row_sparse_scatter(), step_range(exec, rows * (w + 1)),
                         SparseScatter<T>{idx_send_.data(), t.values(), dense_.data(), w, weight});
    fence(exec, label_fence_pack());
    if (b.template can_access<MemorySpace>()) {
      b.allreduce_sum(dense_.data(), std::size_t(len));
    } else {
      const auto& h = mirror(dense_h_, dense_);
      copy_now(exec, h, dense_);
      b.allreduce_sum(h.data(), std::size_t(len));
      copy_now(exec, dense_, h);
    }
    stats.row_sparse_bytes += std::uint64_t(len) * sizeof(T);
    stats.row_sparse_collectives += 1;
    stats.row_sparse_densified += 1;
    grow(compacted_, 1, "gradsync::row_sparse_rows");
    t.write_compacted(exec, dense_, f, compacted_.data());
    const auto& h = mirror(compacted_h_, compacted_);
    copy_now(exec, h, compacted_);
    t.set_rows(h(0));
  }

  std::vector<std::shared_ptr<Base>> all_;
  I64 counts_, all_counts_, idx_send_, idx_recv_, uniq_, begin_, src_, compacted_;
  Vals val_send_, val_recv_, dense_;
  // Their host mirrors (the Views themselves in host memory), made when the Views grow.
  typename I64::HostMirror counts_h_, all_counts_h_, idx_send_h_, idx_recv_h_, uniq_h_, begin_h_, src_h_, compacted_h_;
  typename Vals::HostMirror val_send_h_, val_recv_h_, dense_h_;
  std::vector<std::pair<std::int64_t, std::int64_t>> order_;
  std::vector<const Base*> in_;       // the tensors of one exchange
  std::vector<T> factors_, weights_;  // theirs
};

/// What a GradientSync over memory without a Kokkos execution space (gradsync's raw CUDA spaces)
/// holds instead: RowSparse takes Kokkos Views only.
struct NoRowSparse {
  bool empty() const { return true; }
  std::size_t count_in_group(const std::string&) const { return 0; }
  template <class F>
  void for_each_values(F&&) const {}
  template <class F>
  void for_each_norm_tensor(F&&) const {}
  template <class F>
  void for_each_registration(F&&) const {}
  void describe(std::vector<RegDesc>&) const {}
  template <class Backend, class E, class T, class Sets, class Route, class Watch, class W>
  void finish(const Backend&, const E&, T, Stats&, const Sets&, Route&&, Watch&&, const W&) {}
  std::string set_size_tensor() const { return {}; }
};

template <class T, class MemorySpace, class ExecutionSpace>
using row_sparse_set_t =
    std::conditional_t<Kokkos::is_memory_space<MemorySpace>::value && Kokkos::is_execution_space<ExecutionSpace>::value,
                       RowSparseSet<T, MemorySpace, ExecutionSpace>, NoRowSparse>;

}  // namespace gradsync::impl
