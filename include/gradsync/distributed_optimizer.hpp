// gradsync: DistributedOptimizer, Horovod's optimizer workflow for hybrid models.
//
//   gradsync::DistributedOptimizer dopt(gradsync::AdamW<Grad>(o), gradsync::GradientSync<MpiBackend, Grad>(...));
//   dopt.add<Trunk>(w, grad_w);            // the gradient goes to the sync, the pair to the optimizer
//   dopt.add<Trunk>(b, grad_b);
//   dopt.add<Tower>(t, grad_t);            // a local group: never communicated
//   dopt.register_local_var(b);            // run time: b's gradient becomes local (Horovod parity)
//   dopt.broadcast_parameters(0);          // data-parallel parameters and their state from rank 0 (a
//                                          // process set's from its first rank; local ones kept)
//   ... backward pass ...
//   bool updated = dopt.step();            // synchronize; the optimizer runs on every Nth pass only
//   // or, with clipping:  if (dopt.synchronize()) { dopt.clip_grad_norm(1.0); dopt.apply(); }
//
// The DistributedOptimizer owns the wrapped optimizer. It owns the sync too, unless `Sync` is a
// reference type (DistributedOptimizer<Opt, GradientSync<B, T>&>), which shares a sync the caller
// keeps (for example one sync under two optimizers). The optimizer interface is documented at the
// top of optimizers.hpp; any type providing it can be wrapped.
//
// When it owns the sync and the optimizer takes a gradient factor (set_grad_scale, as Sgd, Adam and
// AdamW do), the local groups' 1/world_size (and 1/N) is not a pass of the sync's: it goes into
// the optimizer's update kernel (GradientSync::defer_local_scale), with the same result to the last
// bit. Local gradients then hold the unscaled sums between synchronize() and apply();
// global_norm() and clip_grad_norm() account for the factor. fold_local_scale(false) restores the
// pass (a shared sync, Sync a reference, starts that way: its gradients may have other readers).
//
// This file holds the class; the optimizer interface's optional members are found in
// impl/optimizer_traits.hpp, the broadcasts' collectives live in impl/parameter_broadcast.hpp, and
// broadcast_set_parameter (for parameters the class does not hold) in broadcast_set_parameter.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "broadcast_set_parameter.hpp"
#include "config.hpp"
#include "error.hpp"
#include "global_norm.hpp"
#include "impl/demangle.hpp"
#include "impl/optimizer_traits.hpp"
#include "impl/parameter_broadcast.hpp"
#include "impl/profiling.hpp"
#include "impl/range_index.hpp"
#include "impl/sharded_params.hpp"
#include "impl/stall.hpp"
#include "impl/sync_access.hpp"
#include "process_set.hpp"
#include "tensor_traits.hpp"

namespace gradsync {
namespace impl {

struct CheckpointAccess;  // checkpoint.hpp: reads and writes the registered parameters and their state

}  // namespace impl

/// Horovod's optimizer workflow: a GradientSync and an optimizer (Sgd, Adam, AdamW or any type with
/// the interface of optimizers.hpp) driven together. Owns the optimizer, and the sync unless `Sync`
/// is a reference type. Each function says whether it is collective (over the sync's ranks) and in
/// which of the sync's states it is legal.
template <class Optimizer, class Sync>
class DistributedOptimizer {
 public:
  using optimizer_type = Optimizer;                             ///< The wrapped optimizer.
  using sync_type = std::remove_reference_t<Sync>;              ///< The GradientSync (owned or referred to).
  using backend_type = typename sync_type::backend_type;        ///< The sync's backend.
  using value_type = typename sync_type::value_type;            ///< float or double.
  using memory_space = typename sync_type::memory_space;        ///< Where parameters and gradients live.
  using execution_space = typename sync_type::execution_space;  ///< Where the update kernels run.

  static_assert(impl::has_step<Optimizer>::value,
                "gradsync::DistributedOptimizer<Optimizer, Sync>: Optimizer must provide add(param, grad) and step() "
                "(the optimizer interface at the top of gradsync/optimizers.hpp)");

  /// Takes the optimizer; takes the sync too, or refers to it when Sync is a reference type. Local;
  /// the sync may be in any state but moved-from; allocates nothing.
  DistributedOptimizer(Optimizer optimizer, Sync sync) : opt_(std::move(optimizer)), sync_(std::forward<Sync>(sync)) {}

  /// Registers a parameter and its gradient in `Group`: the gradient with the sync, the pair with
  /// the optimizer. Local groups may differ from rank to rank; data-parallel ones must agree. All or
  /// nothing: when any part refuses (this object's checks, the sync's, the optimizer's, an
  /// allocation), the sync, the optimizer and this object are left as they were. Local; between
  /// steps only (GradientSync::add).
  template <class Group, class P, class G>
  void add(const P& param, const G& grad, std::string name = {}) {
    using PT = TensorTraits<P>;
    using GT = TensorTraits<G>;
    static_assert(is_tensor_v<P>, "gradsync::DistributedOptimizer::add: the parameter is not a tensor gradsync knows");
    static_assert(std::is_same_v<typename PT::value_type, value_type>,
                  "gradsync::DistributedOptimizer::add: the parameter's value type differs from the sync's");
    static_assert(std::is_same_v<typename PT::memory_space, memory_space>,
                  "gradsync::DistributedOptimizer::add: the parameter lives in another memory space than the sync's");
    static_assert(PT::is_writable, "gradsync::DistributedOptimizer::add: a parameter must be writable (not const)");
    Entry e;
    e.param = PT::data(param);
    e.grad = GT::data(grad);
    e.size = PT::size(param);
    const std::string group = impl::type_name<Group>();
    if (name.empty()) name = impl::cat(group, "[", count_in_group(group), "]");
    e.name = name;
    e.group = group;
    const int rank = sync().backend().rank();
    const std::string what = impl::cat("DistributedOptimizer::add: parameter '", name, "' (group ", group, ")");
    if (GT::size(grad) != e.size)
      throw Error(impl::cat(what, " has ", e.size, " values but its gradient has ", GT::size(grad), " on rank ", rank));
    if (const std::size_t k = params_.first_overlap(e.param, e.size); k != Params::npos) {
      const Entry& o = entries_[k];
      throw Error(impl::cat(what, " overlaps parameter '", o.name, "' already registered on rank ", rank,
                            e.param == o.param ? " (the same parameter registered twice)" : ""));
    }
    if (!PT::is_contiguous(param)) throw Error(impl::cat(what, " is not contiguous"));
    // This object's bookkeeping first (undone below), the optimizer's slot last: an optimizer has
    // no way to forget one, the others do.
    remember(std::move(e));
    try {
      sync().template add<Group>(grad, name);
    } catch (...) {
      forget_last();
      throw;
    }
    try {
      const Entry& x = entries_.back();
      if (fold_) impl::SyncAccess::defer_local_scale(sync(), Span<value_type, memory_space>(x.grad, x.size));
      // Sharded, the optimizer's slots wait for the sync's slices (the first apply()).
      if (!sharded()) entries_.back().slot = opt_.add(param, grad);
    } catch (...) {
      impl::SyncAccess::withdraw_last<Group>(sync(), entries_.back().grad);
      forget_last();
      throw;
    }
    factors_valid_ = false;
  }

  /// Refused at compile time: the optimizer and the sync keep pointers into a container's values,
  /// so a temporary one would dangle. Views and Spans are handles and may be temporaries.
  template <class Group, class P, class G,
            class = std::enable_if_t<(!std::is_lvalue_reference_v<P> && impl::owns_values_v<std::remove_cv_t<P>>) ||
                                     (!std::is_lvalue_reference_v<G> && impl::owns_values_v<std::remove_cv_t<G>>)>>
  void add(P&&, G&&, std::string = {}) {
    static_assert(impl::dependent_false_v<P>,
                  "gradsync::DistributedOptimizer::add: a temporary std::vector would dangle: register lvalues that "
                  "outlive the optimizer");
  }

  /// Uneven data: this rank's samples in the current backward pass (GradientSync::set_samples, which
  /// documents the weights). The first call turns the fold of the local scale off (the weighted
  /// scale is the sync's own pass). Local; before the pass's first mark_ready() or synchronize().
  void set_samples(std::int64_t n) {
    impl::SyncAccess::check_samples(sync(), n);  // set_samples' own refusals, before the fold changes
    if (!sync().weighted() && fold_) fold_local_scale(false);
    sync().set_samples(n);
  }

  /// Whether the local groups' scale goes into the optimizer's update (true by default when this
  /// object owns the sync and the optimizer has set_grad_scale) or is the sync's own pass. Between
  /// steps only.
  void fold_local_scale(bool on) {
    if constexpr (!folds) {
      if (on)
        throw ConfigError(impl::cat("DistributedOptimizer::fold_local_scale: the optimizer ",
                                    impl::type_name<Optimizer>(), " has no set_grad_scale(slot, factor)"));
    }
    for (const Entry& e : entries_)
      impl::SyncAccess::defer_local_scale(sync(), Span<value_type, memory_space>(e.grad, e.size), on);
    fold_ = on;
    factors_valid_ = false;
  }
  /// Whether the local groups' scale goes into the optimizer's update (fold_local_scale()). Local;
  /// any state.
  bool folds_local_scale() const { return fold_; }

  /// Horovod parity: the parameter's gradient becomes local (never communicated; scaled by
  /// 1/world_size when Options::scale_local_gradients is set). The parameter keeps its own values
  /// in broadcast_parameters(). Local; between steps only.
  template <class P>
  void register_local_var(const P& param) {
    using PT = TensorTraits<P>;
    static_assert(is_tensor_v<P>, "gradsync::DistributedOptimizer::register_local_var: not a tensor gradsync knows");
    const Entry& e = find(PT::data(param), "register_local_var");
    sync().register_local_var(Span<value_type, memory_space>(e.grad, e.size));
  }

  /// Whether a registered parameter's gradient is local. Local; any state.
  template <class P>
  bool is_local(const P& param) const {
    const Entry& e = find(TensorTraits<P>::data(param), "is_local");
    return sync().is_local(Span<value_type, memory_space>(e.grad, e.size));
  }

  /// Synchronizes the gradients; true on the passes where they hold synchronized values (only
  /// then may apply() run: [[nodiscard]]). Collective: GradientSync::synchronize().
  [[nodiscard]] bool synchronize() { return sync().synchronize(); }

  /// Runs the wrapped optimizer on the current gradients (and their pending local factors). Local;
  /// after synchronize() returned true.
  /// Sharded (Options::shard), the optimizer updates this rank's slices, and the parameters are
  /// allgathered before it returns: collective then, under the sync's stall watchdog. With an
  /// optimizer that has step_slots() (gradsync's do), the slices are updated group of chunks by
  /// group, and each group's allgather starts as soon as its slices are updated.
  void apply() {
    impl::ProfileRegion region(impl::Region::optimizer_update);
    if (sharded()) make_shards();
    if constexpr (folds) hand_factors();
    if (sharded())
      if constexpr (impl::has_step_slots<Optimizer>::value) return apply_chunk_by_chunk();
    opt_.step();
    if (!sharded()) return;
    shards_.slices_to_gradients();
    impl::SyncAccess::gather_slices(sync());
    shards_.gradients_to_parameters();
  }

  /// Whether the optimizer state is sharded (the sync's Options::shard). Local; any state.
  bool sharded() const { return sync().options().shard != Shard::none; }

  /// The bytes of optimizer state this rank holds (state buffers of every slot: local parameters
  /// whole, data-parallel ones whole or, sharded, this rank's slices; step counters not counted).
  /// Sharded, the slices exist from the first apply(). Local; any state.
  std::size_t state_bytes() {
    std::size_t bytes = 0;
    if constexpr (impl::has_state_visitor<Optimizer>::value)
      for (std::size_t slot : slots())
        opt_.for_each_state(slot, [&](auto* data, std::size_t n) {
          if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, value_type>) bytes += n * sizeof(*data);
        });
    return bytes;
  }

  /// synchronize(), then apply() when it returned true. Returns whether the parameters changed
  /// ([[nodiscard]]: with backward_passes_per_step > 1 most calls change nothing).
  [[nodiscard]] bool step() {
    if (!synchronize()) return false;
    apply();
    return true;
  }

  /// Makes every replica of each parameter equal, with its optimizer state (buffers and step
  /// counts): data-parallel parameters are sent from `root` to every rank; parameters of a group
  /// reduced over a process set (ReduceOver<Tag>) from the first rank of their set (its lowest rank
  /// of the sync, whatever `root`) to the set's other members, over the set's communicator (made
  /// here if the sync has not made it yet); local parameters and their state keep this rank's
  /// values. Collective over the sync's ranks. Throws MismatchError on every rank when the ranks'
  /// data-parallel parameters differ from root's, or a set's members' parameters from its first
  /// rank's, in count or size, naming the first differing parameter and the ranks involved; then
  /// nothing was sent (and the sync is failed, like any error inside a collective). Every collective
  /// waits under the sync's stall watchdog; legal between steps (not while a step is open).
  void broadcast_parameters(int root) {
    const int size = sync().backend().size();
    if (root < 0 || root >= size)
      throw Error(
          impl::cat("broadcast_parameters: root ", root, " is not a rank of this ", size, "-rank communicator"));
    impl::ProfileRegion region(impl::Region::broadcast_parameters);
    Kokkos::fence();  // pending kernels may still write parameters or state
    // Every collective below waits under the sync's stall watchdog: a rank that skips the call is
    // named by the others, and a failure on one rank stops all of them (the sync is then failed).
    impl::SyncAccess::collective(sync(), "broadcast_parameters()", "broadcast of parameters", [&](const auto& b) {
      const std::vector<const Entry*> dp = data_parallel_entries();
      const std::vector<int> world = identity_ranks(size);
      const std::string dp_error = disagreement(dp, b, root, world, impl::cat("broadcast_parameters(root ", root, ")"),
                                                "data-parallel", "root's");
      if (!dp_error.empty()) throw impl::AgreedMismatch(dp_error);
      if constexpr (impl::has_split<backend_type>::value) {
        impl::SyncAccess::connect_process_sets(
            sync(), b);  // every rank: the sets' communicators, before the first synchronize()
        const auto& sets = impl::SyncAccess::process_sets(sync()).sets();
        for (const auto& s : sets)  // alike on every rank: a sync type that reduces no sets
          if (!s.backend)
            throw Error(impl::cat("broadcast_parameters: process set ", s.tag, " has no communicator: this sync (",
                                  impl::type_name<execution_space>(), ") does not reduce process sets"));
        const std::vector<std::vector<const Entry*>> by_set = set_entries();
        if (!sets.empty()) check_sets_agree(b, by_set);  // connect() agreed on the kinds: alike on every rank
        broadcast_entries(dp, b, root);
        // Kind by kind in binding order, as every rank binds them: no two sets wait on each other.
        for (std::size_t i = 0; i < sets.size(); ++i) broadcast_entries(by_set[i], b.over(*sets[i].backend), 0);
      } else {
        broadcast_entries(dp, b, root);
      }
    });
    Kokkos::fence();
  }

  /// The norm of the whole model's gradient as if it ran on one process (see global_norm.hpp):
  /// local gradients summed over ranks, data-parallel ones counted once; one allreduce of one value.
  /// Collective over the sync's ranks, under its stall watchdog; call it after synchronize()
  /// returned true (not while a step is open).
  double global_norm() { return norm_.norm(sync()); }

  /// Scales every gradient by min(1, max_norm / (global_norm + 1e-6)) as
  /// torch.nn.utils.clip_grad_norm_ does; returns the norm before clipping. Collective, like
  /// global_norm().
  double clip_grad_norm(double max_norm, bool error_if_nonfinite = false) {
    return norm_.clip(sync(), max_norm, error_if_nonfinite);
  }

  /// The wrapped optimizer (its options, its state). Local; any state.
  Optimizer& optimizer() { return opt_; }
  /// \copydoc optimizer()
  const Optimizer& optimizer() const { return opt_; }
  /// The sync (owned or referred to); its calls keep their own contracts. Local; any state.
  sync_type& sync() { return sync_; }
  /// \copydoc sync()
  const sync_type& sync() const { return sync_; }
  /// Parameters registered with add<Group>(). Local; any state.
  std::size_t num_params() const { return entries_.size(); }

 private:
  friend struct impl::CheckpointAccess;

  static constexpr std::size_t no_slot = std::size_t(-1);  // sharded data-parallel: slices have the slots

  struct Entry {
    value_type* param = nullptr;
    value_type* grad = nullptr;
    std::size_t size = 0;
    std::size_t slot = no_slot;
    std::string name, group;
    value_type deferred = 1;  // the factor its gradient needs while the sync's scale is pending
  };

  static constexpr bool folds = impl::has_grad_scale<Optimizer, value_type>::value;

  // Each slot's factor for this apply(): the deferred local scale while pending (1 after
  // clip_grad_norm applied it, or for data-parallel gradients). Looked up again only when the
  // sync rebuilt its plan (registrations changed); otherwise a loop over the slots.
  void hand_factors() {
    if (!fold_ && !factors_set_) return;
    const std::size_t builds = sync().stats().plan_builds;
    if (!factors_valid_ || builds != factors_plan_) {
      std::unordered_map<const value_type*, value_type> by_grad;
      impl::SyncAccess::for_each_gradient(
          sync(), [&](const value_type* d, std::size_t, bool, value_type deferred) { by_grad[d] = deferred; });
      for (Entry& e : entries_) e.deferred = fold_ ? by_grad.at(e.grad) : value_type(1);
      factors_plan_ = builds;
      factors_valid_ = true;
    }
    const bool pending = impl::SyncAccess::local_scale_pending(sync());
    for (const Entry& e : entries_)
      if (e.slot != no_slot) opt_.set_grad_scale(e.slot, pending ? e.deferred : value_type(1));
    factors_set_ = fold_;
  }

  // Sharded: at the first apply(), local parameters get a slot each and data-parallel ones a slot
  // per slice this rank owns (impl/sharded_params.hpp). The slots cannot move afterwards.
  void make_shards() {
    using Span_ = Span<value_type, memory_space>;
    if (shards_.built()) return shards_.require_same(sync().owned_slices(), sync().backend().rank());
    if constexpr (!impl::adds_spans<Optimizer, Span_>::value)
      throw ConfigError(impl::cat("DistributedOptimizer (shard = optimizer_state): the optimizer ",
                                  impl::type_name<Optimizer>(), " cannot add(Span, Span): its slots cannot be slices"));
    else
      make_shard_slots<Span_>(sync().owned_slices());
  }
  template <class Span_>
  void make_shard_slots(const std::vector<std::pair<value_type*, std::size_t>>& owned) {
    // Local parameters whole; data-parallel ones and those of process sets (sharded within their
    // set) by the slices the sync owns.
    std::unordered_map<const value_type*, bool> local;
    const auto& sets = impl::SyncAccess::process_sets(sync());
    impl::SyncAccess::for_each_gradient(
        sync(), [&](const value_type* d, std::size_t, bool l, value_type) { local[d] = l && !sets.set_holding(d); });
    std::vector<typename Shards::Whole> dp;
    for (Entry& e : entries_) {
      if (local.at(e.grad))
        e.slot = opt_.add(Span_(e.param, e.size), Span_(e.grad, e.size));
      else
        dp.push_back({e.param, e.grad, e.size});
    }
    shards_.build(owned, std::move(dp), [&](auto& piece) {
      piece.slot = opt_.add(Span_(piece.param, piece.count), Span_(piece.grad, piece.count));
    });
    factors_valid_ = false;
  }
  // Sharded, with an optimizer that steps a range of slots: the local parameters first (their
  // slots come first; a refused option throws here, before anything crosses), then the slices
  // group of chunks by group, each group's allgather started once its slices are updated and in
  // the gradients, while the next group's are updated. The slices of process sets are
  // allgathered last, over their sets.
  void apply_chunk_by_chunk() {
    const auto& pieces = shards_.pieces();
    opt_.step_slots(0, pieces.empty() ? std::size_t(-1) : pieces.front().slot);  // every slot before the slices'
    const auto& ends = impl::SyncAccess::owned_chunk_ends(sync());
    const auto end_of = [&](const auto& piece) {
      return piece.from < ends.size() ? ends[piece.from] : std::size_t(-1);  // -1: a process set's
    };
    impl::SyncAccess::gather_slices(sync(), "DistributedOptimizer::apply()", [&](auto&& through) {
      for (std::size_t i = 0, j = 0; i < pieces.size(); i = j) {
        const std::size_t end = end_of(pieces[i]);
        while (j < pieces.size() && end_of(pieces[j]) == end) ++j;
        opt_.step_slots(pieces[i].slot, pieces[j - 1].slot + 1);
        shards_.slices_to_gradients(i, j);
        through(end);
      }
    });
    shards_.gradients_to_parameters();
  }

  // Every slot of the optimizer: the entries' and, sharded, the slices'.
  std::vector<std::size_t> slots() const {
    std::vector<std::size_t> out;
    for (const Entry& e : entries_)
      if (e.slot != no_slot) out.push_back(e.slot);
    for (const auto& p : shards_.pieces()) out.push_back(p.slot);
    return out;
  }

  // This object's part of add() and its undoing (the last entry only).
  void remember(Entry e) {
    entries_.push_back(std::move(e));
    const Entry& x = entries_.back();
    try {
      params_.insert(x.param, x.size, entries_.size() - 1);
      ++per_group_[x.group];
    } catch (...) {
      params_.erase(x.param, x.size, entries_.size() - 1);
      entries_.pop_back();
      throw;
    }
  }
  void forget_last() {
    const Entry& x = entries_.back();
    params_.erase(x.param, x.size, entries_.size() - 1);
    if (const auto g = per_group_.find(x.group); g != per_group_.end() && --g->second == 0) per_group_.erase(g);
    entries_.pop_back();
  }
  std::size_t count_in_group(const std::string& group) const {
    const auto g = per_group_.find(group);
    return g == per_group_.end() ? 0 : g->second;
  }

  const Entry& find(const value_type* param, const char* who) const {
    if (const std::size_t k = params_.holding(param); k != Params::npos && entries_[k].param == param)
      return entries_[k];
    for (const Entry& e : entries_)  // an empty parameter (not in the index)
      if (e.param == param && e.size == 0) return e;
    throw Error(impl::cat("DistributedOptimizer::", who, ": the parameter is not registered with add<Group>() on rank ",
                          sync().backend().rank()));
  }

  std::vector<const Entry*> data_parallel_entries() const {
    std::unordered_map<const value_type*, bool> local;
    impl::SyncAccess::for_each_gradient(sync(),
                                        [&](const value_type* d, std::size_t, bool l, value_type) { local[d] = l; });
    std::vector<const Entry*> dp;
    for (const Entry& e : entries_)
      if (!local.at(e.grad)) dp.push_back(&e);
    return dp;
  }

  static std::vector<int> identity_ranks(int n) {
    std::vector<int> r(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) r[std::size_t(i)] = i;
    return r;
  }

  // The entries whose gradients are reduced over each of the sync's process sets, set by set in
  // binding order, each in its set's registration order (which the set's members agree on).
  std::vector<std::vector<const Entry*>> set_entries() const {
    std::unordered_map<const value_type*, const Entry*> by_grad;
    for (const Entry& e : entries_) by_grad[e.grad] = &e;
    std::vector<std::vector<const Entry*>> out;
    for (const auto& s : impl::SyncAccess::process_sets(sync()).sets()) {
      out.emplace_back();
      for (const auto& t : s.tensors) {
        const auto it = by_grad.find(t.data);
        if (it != by_grad.end()) out.back().push_back(it->second);
      }
    }
    return out;
  }

  // Every set's members compare their entries with the set's first rank's; then one allreduce_min
  // over the sync's ranks tells every rank which ranks' sets disagree, so all throw together.
  template <class W>
  void check_sets_agree(const W& b, const std::vector<std::vector<const Entry*>>& by_set) {
    const auto& sets = impl::SyncAccess::process_sets(sync()).sets();
    std::string mine;
    for (std::size_t i = 0; i < sets.size(); ++i) {  // every kind, even after a failure: the sets' peers wait
      std::string e = disagreement(
          by_set[i], b.over(*sets[i].backend), 0, sets[i].ranks,
          impl::cat("broadcast_parameters: process set ", sets[i].tag, " ", impl::rank_list(sets[i].ranks)),
          "set-reduced", impl::cat("its first rank's (rank ", sets[i].ranks.front(), ")"));
      if (mine.empty()) mine = std::move(e);
    }
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> bad(std::size_t(b.size()), none);
    if (!mine.empty()) bad[std::size_t(b.rank())] = 0;
    impl::allreduce_min_over<Kokkos::HostSpace, memory_space>(b, bad.data(), bad.size());
    std::string ranks;
    for (int r = 0; r < b.size(); ++r)
      if (bad[std::size_t(r)] != none) ranks += impl::cat(ranks.empty() ? "" : ", ", r);
    if (ranks.empty()) return;
    if (!mine.empty()) throw impl::AgreedMismatch(mine);
    throw impl::AgreedMismatch(
        impl::cat("broadcast_parameters: the set-reduced parameters differ between the members of the "
                  "process set(s) of rank(s) ",
                  ranks, " (their error names the parameter); rank ", b.rank(), "'s sets agree"));
  }

  // Sends the parameters of `es` and their optimizer state from `root` to every rank of `b`.
  template <class B>
  void broadcast_entries(const std::vector<const Entry*>& es, const B& b, int root) {
    std::vector<std::int64_t*> counters;
    for (const Entry* e : es) {
      impl::broadcast_over<memory_space, Kokkos::HostSpace>(b, e->param, e->size, root);
      if (e->slot == no_slot) continue;  // sharded: its state is this rank's slices, no replica's
      if constexpr (impl::has_state_visitor<Optimizer>::value)
        opt_.for_each_state(e->slot, [&](auto* data, std::size_t n) {
          using T = std::remove_pointer_t<decltype(data)>;
          if constexpr (std::is_same_v<T, value_type>)
            impl::broadcast_over<memory_space, Kokkos::HostSpace>(b, data, n, root);
          else {
            static_assert(std::is_same_v<T, std::int64_t>,
                          "optimizer for_each_state: state is value_type buffers or std::int64_t counters");
            for (std::size_t i = 0; i < n; ++i) counters.push_back(data + i);
          }
        });
    }
    if (counters.empty()) return;
    std::vector<std::int64_t> flat(counters.size());
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = *counters[i];
    impl::broadcast_over<Kokkos::HostSpace, memory_space>(b, flat.data(), flat.size(), root);
    for (std::size_t i = 0; i < flat.size(); ++i) *counters[i] = flat[i];
  }

  // Every member of `b` learns every member's first entry of `es` that differs from `root`'s (count
  // or size) with one broadcast of root's sizes and one allreduce_min: the message (empty when all
  // agree) is the same on every member: on a difference, root and the lowest differing rank each
  // broadcast their entry at the first difference (two more small broadcasts, on failure only).
  // `world[r]` is b's rank r as a rank of the sync, `head` what is broadcast, `kind` the
  // parameters, `from` the root.
  template <class B>
  std::string disagreement(const std::vector<const Entry*>& es, const B& b, int root, const std::vector<int>& world,
                           const std::string& head, const char* kind, const std::string& from) {
    const int n = b.size(), me = b.rank();
    std::vector<std::int64_t> sizes(es.size() + 1);
    sizes[0] = std::int64_t(es.size());
    for (std::size_t i = 0; i < es.size(); ++i) sizes[i + 1] = std::int64_t(es[i]->size);
    std::int64_t root_count = sizes[0];
    impl::broadcast_over<Kokkos::HostSpace, memory_space>(b, &root_count, 1, root);
    std::vector<std::int64_t> root_sizes(std::size_t(root_count) + 1);
    if (me == root) root_sizes = sizes;
    impl::broadcast_over<Kokkos::HostSpace, memory_space>(b, root_sizes.data(), root_sizes.size(), root);
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    std::int64_t first = none;
    const std::size_t common = std::min(es.size(), std::size_t(root_count));
    for (std::size_t i = 0; i < common && first == none; ++i)
      if (sizes[i + 1] != root_sizes[i + 1]) first = std::int64_t(i);
    if (first == none && es.size() != std::size_t(root_count)) first = std::int64_t(common);
    std::vector<std::int64_t> firsts(std::size_t(n), none);
    firsts[std::size_t(me)] = first;
    impl::allreduce_min_over<Kokkos::HostSpace, memory_space>(b, firsts.data(), firsts.size());
    std::string ranks;
    std::int64_t at = none;
    int culprit = -1;  // the lowest rank that differs at the first difference
    for (int r = 0; r < n; ++r)
      if (firsts[std::size_t(r)] != none) {
        ranks += impl::cat(ranks.empty() ? "" : ", ", world[std::size_t(r)]);
        if (firsts[std::size_t(r)] < at) at = firsts[std::size_t(r)], culprit = r;
      }
    if (ranks.empty()) return {};
    const std::size_t i = std::size_t(at);
    // A rank's entry #i and its count, as every rank then reads it.
    const auto entry_of = [&](int r) {
      std::int64_t cell[64] = {};  // 512 bytes of text
      if (me == r) {
        const std::string d = impl::cat(
            i < es.size() ? impl::cat("'", es[i]->name, "' (group ", es[i]->group, ", ", es[i]->size, " values)")
                          : std::string("none"),
            " of its ", es.size());
        std::memcpy(cell, d.data(), std::min(d.size(), sizeof cell - 1));
      }
      impl::broadcast_over<Kokkos::HostSpace, memory_space>(b, cell, 64, r);
      reinterpret_cast<char*>(cell)[sizeof cell - 1] = '\0';
      return std::string(reinterpret_cast<const char*>(cell));
    };
    const std::string there = entry_of(root), here = entry_of(culprit);
    return impl::cat(head, ": the ", kind, " parameters of rank(s) ", ranks, " differ from ", from, ", first at ", kind,
                     " parameter #", i, ": on rank ", world[std::size_t(culprit)], " ", here, ", on rank ",
                     world[std::size_t(root)], " ", there, " ", kind, " parameters");
  }

  Optimizer opt_;
  Sync sync_;
  bool fold_ = folds && !std::is_reference_v<Sync>;
  bool factors_valid_ = false, factors_set_ = false;
  std::size_t factors_plan_ = 0;
  GlobalNorm<sync_type> norm_;
  using Shards = impl::ShardedParams<value_type, memory_space>;
  Shards shards_;  // sharded: the slices' slots and the copies around the allgather
  std::vector<Entry> entries_;
  using Params = impl::RangeIndex<value_type>;
  Params params_;                                           // the non-empty parameters, by address
  std::unordered_map<std::string, std::size_t> per_group_;  // parameters in each group (default names)
};

}  // namespace gradsync
