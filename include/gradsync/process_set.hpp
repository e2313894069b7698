// gradsync: process sets, groups reduced over a subset of the ranks (2-D hybrid parallelism).
//
//   struct Replicas {};                                   // names a kind of set
//   struct Tables {};
//   template <> struct gradsync::LocalVarPolicy<Tables> : gradsync::ReduceOver<Replicas> {};
//   sync.bind_process_set<Replicas>({s, s + m, s + 2 * m});  // this rank's set: its table shard's replicas
//   sync.add<Tables>(g_table);                            // summed over the set, not over all ranks
//
// Every rank binds one set per kind (the ranks it reduces with, itself included); the sets of one
// kind partition the ranks that bind it, and all ranks bind the same kinds in the same order. One
// backend communicator per set is created once (Backend::split), at the first synchronize() after
// the binding, when the ranks also check that the sets fit together and that the members of each
// set registered the same tensors of its groups (else every rank throws the same MismatchError,
// naming the set and the ranks). A group over a set is outside the world's fused exchange (as a
// local group is); its tensors are allreduced over the set after the dense chunks, in registration
// order, each in pieces of at most the backend's count limit (MpiBackend: impl::mpi_max_count(),
// INT_MAX), as the world's chunks are, one call per piece waited under the stall watchdog, then scaled:
//
//   SetScale::world_size (default): allreduce_S(g) · prescale · postscale / n   (n: the sync's ranks)
//   SetScale::set_size:             allreduce_S(g) · prescale · postscale / |S| (Horovod's process sets)
//   SetScale::samples:              allreduce_S(g) · prescale · postscale / N   (N: the step's samples)
//   (no division with ReduceOp::sum), after aggregation as for any group (Σ_k g_k, / N if averaged).
//
// world_size is the gradient of the global mean loss L = (1/n) Σ_r L_r when each member of S holds
// the sum of the contributions of the ranks it serves: a table shard replicated over the R members
// of S, each fed by the n/R ranks of its replica group, holds Σ_{r in its group} dL_r/dE, so the
// set's sum is Σ_r dL_r/dE = n dL/dE. RowSparse gradients may be reduced over a set too.
//
// After synchronize() every member of a set holds the same values of its set's tensors, so
// global_norm counts them with weight 1/|S| (each replicated shard once), and
// DistributedOptimizer::broadcast_parameters (or broadcast_set_parameter for parameters it does not
// hold) sends their parameters from the set's first rank, its lowest rank of the sync, over the
// set's communicator.
//
// Sharded (Options::shard), a set's dense tensors are sharded within the set: taken as one buffer
// in registration order and cut into pieces of at most max_count_of(backend) values, each piece is
// reduce-scattered over the set's communicator (Capability::shard_sums), member m of the set
// keeping shard_slice(piece, |S|, m), scaled as above; owned() lists those slices, which the
// sync's owned_slices() appends to the data-parallel ones, and gather() allgathers them back
// after the optimizer's update.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "config.hpp"
#include "error.hpp"
#include "impl/control_fwd.hpp"  // impl/stall.hpp defines Control: include it where the sets are used
#include "impl/demangle.hpp"
#include "impl/fusion_kernels.hpp"
#include "impl/hash.hpp"
#include "impl/pieces.hpp"
#include "impl/rank_text.hpp"
#include "impl/wait_site.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace gradsync {

/// How a group reduced over a process set is scaled (see the top of this file).
enum class SetScale {
  world_size,  ///< / n, the sync's ranks: the gradient of the global mean loss
  set_size,    ///< / |S|: the average over the set (Horovod's process sets)
  samples,     ///< / N, the step's samples over every rank (set_samples(), which it needs): for members
               ///< that hold sums over samples, such as replicated shards fed by an all-to-all
};

/// Policy: the group is summed over the process set bound for `Tag` (bind_process_set<Tag>).
template <class Tag, SetScale Scale = SetScale::world_size>
struct ReduceOver {
  /// Outside the world's fused exchange.
  static constexpr bool is_local = true;  // outside the world's fused exchange
  /// Unused: `set_scale` scales the group.
  static constexpr LocalScale scale = LocalScale::none;
  /// The process set's tag (bind_process_set<Tag>).
  using set_tag = Tag;
  /// How the set's sum is scaled.
  static constexpr SetScale set_scale = Scale;
};

template <class Group, class = void>
struct is_set_reduced : std::false_type {};
template <class Group>
struct is_set_reduced<Group, std::void_t<typename LocalVarPolicy<Group>::set_tag>> : std::true_type {};
/// Whether Group's policy is a ReduceOver<Tag> (reduced over a process set).
template <class Group>
inline constexpr bool is_set_reduced_v = is_set_reduced<Group>::value;

namespace impl {

// The most elements one call of a backend takes: its own max_count() where it has one (MpiBackend:
// impl::mpi_max_count(), which tests lower), else an int's range, the count type of MPI and NCCL.
template <class B>
std::size_t max_count_of(const B& b) {
  std::size_t n = std::size_t(INT_MAX);
  if constexpr (has_max_count<B>::value) n = std::size_t(b.max_count());
  return std::max<std::size_t>(n, 1);
}

template <class T>
struct SetScaleKernel {  // p[i] *= f
  T* p;
  T f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { p[i] *= f; }
};

// The memory space of a Kokkos execution space; host memory for one without (a CudaStream, whose
// syncs have no process sets).
template <class E, class = void>
struct exec_memory_space {
  using type = Kokkos::HostSpace;
};
template <class E>
struct exec_memory_space<E, std::void_t<typename E::memory_space>> {
  using type = typename E::memory_space;
};

/// The process sets of one GradientSync and the dense tensors reduced over them.
template <class Backend, class T, class ExecutionSpace>
class ProcessSets {
 public:
  using SetBackend = typename split_result<Backend>::type;
  struct Tensor {
    T* data;
    std::size_t size;
    std::string name, group;
    SetScale scale;
  };
  struct Set {
    std::string tag;
    std::vector<int> ranks;
    std::shared_ptr<SetBackend> backend;  // created at connect()
    std::vector<Tensor> tensors;
    std::vector<std::int64_t> sparse;               // the row-sparse registrations' sizes, for the check
    std::vector<std::pair<T*, std::size_t>> owned;  // sharded: this member's slices (at connect())
  };

  bool empty() const { return sets_.empty(); }

  /// Every bound set, in binding order (the order every rank binds its kinds in).
  const std::vector<Set>& sets() const { return sets_; }

  /// The set whose group holds the dense tensor at `data` (registered with a ReduceOver group),
  /// or null.
  const Set* set_holding(const T* data) const {
    for (const Set& s : sets_)
      for (const Tensor& t : s.tensors)
        if (t.data == data) return &s;
    return nullptr;
  }

  void bind(const std::string& tag, std::vector<int> ranks, int me, int n) {
    std::sort(ranks.begin(), ranks.end());
    const std::string what = cat("bind_process_set<", tag, ">(", rank_list(ranks), ") on rank ", me);
    if (ranks.empty() || ranks.front() < 0 || ranks.back() >= n)
      throw Error(cat(what, ": a set holds ranks of the sync's ", n, "-rank communicator"));
    if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
      throw Error(cat(what, ": a rank is listed twice"));
    if (!std::binary_search(ranks.begin(), ranks.end(), me))
      throw Error(cat(what, ": the set must contain this rank (each rank binds the set it reduces with)"));
    Set* s = find(tag);
    if (s && s->ranks != ranks) throw Error(cat(what, ": already bound to ", rank_list(s->ranks)));
    if (!s) sets_.push_back(Set{tag, std::move(ranks), nullptr, {}, {}, {}});
  }

  Set& set_of(const std::string& tag, const std::string& name, const std::string& group, int me) {
    Set* s = find(tag);
    if (!s)
      throw Error(cat("tensor '", name, "' (group ", group, ") is reduced over process set ", tag, ", which rank ", me,
                      " has not bound: call bind_process_set<", tag, ">(ranks) first"));
    return *s;
  }

  void add(const std::string& tag, T* data, std::size_t size, const std::string& name, const std::string& group,
           SetScale scale, int me) {
    set_of(tag, name, group, me).tensors.push_back(Tensor{data, size, name, group, scale});
  }

  /// Undoes the add() of the tensor at `data` when it was the set's last (a registration rolled back).
  void withdraw(const std::string& tag, const T* data) {
    Set* s = find(tag);
    if (s && !s->tensors.empty() && s->tensors.back().data == data) s->tensors.pop_back();
  }

  /// The backend and factor of a set (after connect()).
  const SetBackend& backend_of(const std::string& tag) const { return *find_const(tag)->backend; }
  std::size_t set_size(const std::string& tag) const { return find_const(tag)->ranks.size(); }

  // The factor after the set's sum. Weighted (set_samples()), an average divides by the step's
  // samples (`total`: 1 / N; world_size members weighed their own samples before the sum, and
  // GradientSync refuses set_size there); SetScale::samples is refused unweighted.
  static T factor(SetScale scale, const Options& o, int world, std::size_t set, bool weighted = false, T total = T(1)) {
    double f = o.prescale_factor * o.postscale_factor;
    if (o.op == ReduceOp::average)
      f = weighted ? f * double(total) : f / (scale == SetScale::set_size ? double(set) : double(world));
    return T(f);
  }

  /// Collective over the sync's ranks, at a consistency check: validates the sets and their
  /// registrations against every rank's (one or two small allgathers, watched: `world` is an
  /// impl::Watched in the sync), then splits a communicator for every set that has none yet.
  template <class World>
  void connect(const World& world) {
    const int n = world.size(), me = world.rank();
    // Round 1: the kinds of sets, in binding order.
    std::uint64_t h = fnv1a(nullptr, 0);
    for (const Set& s : sets_) h = fnv1a(s.tag.data(), s.tag.size(), h);
    std::vector<std::int64_t> mine = {std::int64_t(sets_.size()), std::int64_t(h >> 1)}, all(2 * std::size_t(n));
    world.allgather(mine.data(), all.data(), 2);
    std::vector<int> differ;  // from rank 0's: every rank sees the same list
    for (int r = 0; r < n; ++r)
      if (all[2 * std::size_t(r)] != all[0] || all[2 * std::size_t(r) + 1] != all[1]) differ.push_back(r);
    if (!differ.empty())
      throw AgreedMismatch(cat("process sets: rank(s) ", rank_list(differ), " bound other kinds of process sets than ",
                               "rank 0 (this rank, ", me, ", bound ", sets_.size(), ": ", tags(),
                               "); every rank binds the same kinds, in the same order"));
    if (sets_.empty()) return;
    // Round 2: per kind, each rank's set (lowest rank, size, hash of the list) and its registrations.
    const std::size_t k = sets_.size(), words = 4;
    mine.assign(words * k, 0);
    for (std::size_t i = 0; i < k; ++i) {
      const Set& s = sets_[i];
      mine[words * i] = s.ranks.front();
      mine[words * i + 1] = std::int64_t(fnv1a(s.ranks.data(), s.ranks.size() * sizeof(int)) >> 1);
      std::uint64_t rh = fnv1a(nullptr, 0);
      for (const Tensor& t : s.tensors) rh = fnv1a(&t.size, sizeof t.size, rh);
      for (std::int64_t x : s.sparse) rh = fnv1a(&x, sizeof x, rh);
      const std::int64_t counts = std::int64_t(s.tensors.size()) * 1000003 + std::int64_t(s.sparse.size());
      rh = fnv1a(&counts, sizeof counts, rh);
      mine[words * i + 2] = std::int64_t(rh >> 1);
      mine[words * i + 3] = std::int64_t(s.ranks.size());
    }
    all.assign(words * k * std::size_t(n), 0);
    world.allgather(mine.data(), all.data(), words * k);
    const auto at = [&](int r, std::size_t i, std::size_t w) {
      return all[std::size_t(r) * words * k + words * i + w];
    };
    for (std::size_t i = 0; i < k; ++i) {
      const std::string what = cat("process sets ", sets_[i].tag, ": ");
      const std::string mine_is = cat(" (this rank, ", me, ", bound ", rank_list(sets_[i].ranks), ")");
      // Rank r claims the set led by its lowest rank; the leader must bind the same list, and as
      // many ranks as the list holds must claim it (each claimant is in the list it bound).
      std::vector<std::int64_t> claimants(std::size_t(n), 0);
      for (int r = 0; r < n; ++r) {
        const int lead = int(at(r, i, 0));
        if (at(lead, i, 0) != lead || at(lead, i, 1) != at(r, i, 1))
          throw AgreedMismatch(cat(what, "rank ", r, "'s set (led by rank ", lead, ") differs from the set rank ", lead,
                                   " bound; the sets of one kind must partition the ranks, every member binding "
                                   "the same list",
                                   mine_is));
        ++claimants[std::size_t(lead)];
      }
      for (int lead = 0; lead < n; ++lead)
        if (at(lead, i, 0) == lead && claimants[std::size_t(lead)] != at(lead, i, 3))
          throw AgreedMismatch(cat(what, "rank ", lead, "'s set of ", at(lead, i, 3), " ranks is bound by ",
                                   claimants[std::size_t(lead)],
                                   " of them; the sets of one kind must partition the "
                                   "ranks, every member binding the same list",
                                   mine_is));
      for (int r = 0; r < n; ++r) {
        const int lead = int(at(r, i, 0));
        if (at(lead, i, 2) != at(r, i, 2))
          throw AgreedMismatch(cat(what, "rank ", r,
                                   " registered other tensors (count or sizes) in the groups reduced "
                                   "over its set than rank ",
                                   lead,
                                   "; the members of a set register the same tensors, "
                                   "in the same order (this rank, ",
                                   me, ", has ", sets_[i].tensors.size(), " dense and ", sets_[i].sparse.size(),
                                   " row-sparse)"));
      }
    }
    // Every set is consistent: one communicator per set, created once.
    for (std::size_t i = 0; i < k; ++i)
      if (!sets_[i].backend) sets_[i].backend = std::make_shared<SetBackend>(world.split(sets_[i].ranks.front(), me));
    for (Set& s : sets_) find_owned(s);
    // A backend that cannot reach the tensors' memory (device memory, an MPI that is not
    // CUDA-aware) sums a host copy: one staging buffer, as large as the largest piece, made here.
    largest_ = 0;
    for (const Set& s : sets_)
      for (const Tensor& t : s.tensors) largest_ = std::max(largest_, t.size);
    staged_ = !world.template can_access<memory_space>();
    if (staged_) provision_staging(max_count_of(*sets_.front().backend));
  }

  /// The dense tensors over their sets, after the world's exchange: in registration order, each in
  /// pieces of at most max_count_of(backend) elements (every member splits alike: the limit is a
  /// property of the backend type, the sizes agree within a set), one allreduce per piece under
  /// the stall watchdog; then their factor.
  void reduce(const ExecutionSpace& exec, const Options& o, Control<Backend>& ctl, int world, std::int64_t call,
              Stats& stats, bool weighted = false, T total = T(1)) {
    fence(exec, label_fence_pack());
    for (Set& s : sets_) {
      if (!s.backend) throw Error(cat("process set ", s.tag, " has no communicator (internal: connect() did not run)"));
      const SetBackend& sb = *s.backend;
      if (o.shard != Shard::none) {
        reduce_scatter(exec, s, o, ctl, world, call, stats, weighted, total);
        continue;
      }
      const std::size_t piece = max_count_of(sb);
      if (staged_) provision_staging(piece);  // only when a test raised the limit since connect()
      for (std::size_t j = 0; j < s.tensors.size(); ++j) {
        const Tensor& t = s.tensors[j];
        const View here(t.data, t.size);
        for_pieces(t.size, piece, [&](std::size_t off, std::size_t count) {
          const auto part = Kokkos::subview(here, std::make_pair(off, off + count));
          const auto host = Kokkos::subview(staging_, std::make_pair(std::size_t(0), staged_ ? count : 0));
          if (staged_) copy_now(exec, host, part);  // after the copy back of the previous piece
          sum_over_set(sb, staged_ ? staging_.data() : t.data + off, count, o, ctl,
                       WaitSite{"process set allreduce", call, std::int64_t(j), std::int64_t(s.tensors.size())});
          if (staged_) copy_now(exec, part, host);
          stats.process_set_bytes += count * sizeof(T);
          ++stats.process_set_calls;
        });
        const T f = factor(t.scale, o, world, s.ranks.size(), weighted, total);
        if (f != T(1) && t.size > 0)
          Kokkos::parallel_for(label_process_set_scale(), step_range(exec, std::int64_t(t.size)),
                               SetScaleKernel<T>{t.data, f});
      }
    }
  }

  /// Sharded: this rank's slices of its sets' dense tensors, appended to `out` (binding order).
  void append_owned(std::vector<std::pair<T*, std::size_t>>& out) const {
    for (const Set& s : sets_) out.insert(out.end(), s.owned.begin(), s.owned.end());
  }

  /// Sharded, after the optimizer's update wrote each member's slices: every set's pieces
  /// allgathered over its communicator, in the pieces of the reduce-scatter, under the stall watchdog.
  void gather([[maybe_unused]] const ExecutionSpace& exec, [[maybe_unused]] const Options& o,
              [[maybe_unused]] Control<Backend>& ctl, [[maybe_unused]] std::int64_t call,
              [[maybe_unused]] Stats& stats) {
    if constexpr (has_shard_sums<SetBackend>::value) {
      fence(exec, label_fence_pack());
      for (const Set& s : sets_) {
        if (s.tensors.empty()) continue;
        const SetBackend& sb = *s.backend;
        std::int64_t j = 0;
        const std::int64_t pieces = num_pieces(s, max_count_of(sb));
        for_each_piece(s, max_count_of(sb), [&](const std::vector<SumRegion<T>>& regions, std::size_t n) {
          auto req = sb.iallgather_regions(regions.data(), regions.size());
          ctl.wait_until_done([&] { return sb.test(req); }, o, WaitSite{"process set allgather", call, j++, pieces});
          stats.process_set_bytes += n * sizeof(T);
          ++stats.process_set_calls;
        });
      }
    }
  }

  bool has_tensors() const {
    return std::any_of(sets_.begin(), sets_.end(), [](const Set& s) { return !s.tensors.empty(); });
  }

  // A dense tensor averaged over its set's size ("tensor 'x' (group G)"), or "": set_samples()
  // refuses them (the weighted form would need each set's own samples, which nothing exchanges).
  std::string set_size_tensor() const {
    for (const Set& s : sets_)
      for (const Tensor& t : s.tensors)
        if (t.scale == SetScale::set_size) return cat("tensor '", t.name, "' (group ", t.group, ")");
    return {};
  }

 private:
  std::string tags() const {
    std::string s;
    for (const Set& x : sets_) s += cat(s.empty() ? "" : ", ", x.tag);
    return s.empty() ? std::string("none") : s;
  }
  Set* find(const std::string& tag) {
    for (Set& s : sets_)
      if (s.tag == tag) return &s;
    return nullptr;
  }
  const Set* find_const(const std::string& tag) const {
    for (const Set& s : sets_)
      if (s.tag == tag) return &s;
    throw Error(cat("process set ", tag, " is not bound"));
  }

  using memory_space = typename exec_memory_space<ExecutionSpace>::type;
  using View = Kokkos::View<T*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Staging = Kokkos::View<T*, staging_space_t<memory_space>>;

  // The exchange's one collective: a sum of n values over the set, started nonblocking and waited
  // under the stall watchdog.
  static void sum_over_set(const SetBackend& sb, T* data, std::size_t n, const Options& o, Control<Backend>& ctl,
                           const WaitSite& site) {
    auto req = sb.iallreduce_sum(data, n);
    ctl.wait_until_done([&] { return sb.test(req); }, o, site);
  }

  // The set's dense tensors as one buffer in registration order, cut into pieces of at most
  // `limit` values: f(regions of the piece, its values), in order (every member cuts alike).
  template <class F>
  static void for_each_piece(const Set& s, std::size_t limit, F&& f) {
    std::vector<SumRegion<T>> regions;
    std::size_t n = 0;
    for (const Tensor& t : s.tensors)
      for (std::size_t off = 0; off < t.size;) {
        const std::size_t k = std::min(t.size - off, limit - n);
        regions.push_back(SumRegion<T>{t.data + off, k});
        n += k;
        off += k;
        if (n == limit) {
          f(regions, n);
          regions.clear();
          n = 0;
        }
      }
    if (n > 0) f(regions, n);
  }

  static std::int64_t num_pieces(const Set& s, std::size_t limit) {
    std::size_t n = 0;
    for (const Tensor& t : s.tensors) n += t.size;
    return std::int64_t((n + limit - 1) / limit);
  }

  // Sharded: this member's slice of each piece (shard_slice over the set's communicator), as
  // pieces of the tensors; neighbours within one tensor merge.
  void find_owned(Set& s) const {
    s.owned.clear();
    if (!s.backend || s.tensors.empty()) return;
    const SetBackend& sb = *s.backend;
    for_each_piece(s, max_count_of(sb), [&](const std::vector<SumRegion<T>>& regions, std::size_t n) {
      const auto [lo, hi] = shard_slice(n, sb.size(), sb.rank());
      std::size_t at = 0;
      for (const SumRegion<T>& r : regions) {
        const std::size_t x = std::max(lo, at), y = std::min(hi, at + r.count);
        if (x < y) {
          T* p = r.data + (x - at);
          if (!s.owned.empty() && s.owned.back().first + s.owned.back().second == p &&
              same_tensor(s, s.owned.back().first, p))
            s.owned.back().second += y - x;
          else
            s.owned.emplace_back(p, y - x);
        }
        at += r.count;
      }
    });
  }
  static bool same_tensor(const Set& s, const T* a, const T* b) {
    for (const Tensor& t : s.tensors)
      if (a >= t.data && a < t.data + t.size) return b >= t.data && b <= t.data + t.size;
    return false;
  }

  // Sharded: each piece reduce-scattered over the set (the sum on this member's slice only), then
  // each tensor's factor on the slices this member owns.
  void reduce_scatter([[maybe_unused]] const ExecutionSpace& exec, [[maybe_unused]] Set& s,
                      [[maybe_unused]] const Options& o, [[maybe_unused]] Control<Backend>& ctl,
                      [[maybe_unused]] int world, [[maybe_unused]] std::int64_t call, [[maybe_unused]] Stats& stats,
                      [[maybe_unused]] bool weighted, [[maybe_unused]] T total) {
    if constexpr (has_shard_sums<SetBackend>::value) {  // else GradientSync refused the plan
      const SetBackend& sb = *s.backend;
      std::int64_t j = 0;
      const std::int64_t pieces = num_pieces(s, max_count_of(sb));
      for_each_piece(s, max_count_of(sb), [&](const std::vector<SumRegion<T>>& regions, std::size_t n) {
        auto req = sb.ireduce_scatter_sum_regions(regions.data(), regions.size(), T(1));
        ctl.wait_until_done([&] { return sb.test(req); }, o, WaitSite{"process set reduce-scatter", call, j++, pieces});
        stats.process_set_bytes += n * sizeof(T);
        ++stats.process_set_calls;
      });
      for (const auto& [p, n] : s.owned)
        for (const Tensor& t : s.tensors)
          if (p >= t.data && p < t.data + t.size) {
            const T f = factor(t.scale, o, world, s.ranks.size(), weighted, total);
            if (f != T(1))
              Kokkos::parallel_for(label_process_set_scale(), step_range(exec, std::int64_t(n)),
                                   SetScaleKernel<T>{p, f});
            break;
          }
    }
  }

  // The staging buffer holds one piece: the largest tensor, or the backend's limit if smaller.
  void provision_staging(std::size_t piece) {
    const std::size_t want = std::min(largest_, piece);
    if (staging_.extent(0) < want)
      staging_ = Staging(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("gradsync::set_staging")), want);
  }

  std::vector<Set> sets_;
  bool staged_ = false;
  std::size_t largest_ = 0;  // elements of the largest dense tensor over a set
  Staging staging_;          // host copy of one piece at a time, when staged_
};

}  // namespace impl
}  // namespace gradsync
