// gradsync: GradientSync, the fused synchronization of a model's gradients.
//
// Data-parallel groups are packed into a persistent fusion buffer in the tensors' own memory space,
// reduced chunk by chunk by the backend, and unpacked with every scale factor folded into one
// multiplication. Local groups never enter the buffer; their scale is applied in place.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend_traits.hpp"
#include "compression.hpp"
#include "config.hpp"
#include "describe.hpp"
#include "env.hpp"
#include "error.hpp"
#include "impl/backend_order.hpp"
#include "impl/consistency.hpp"
#include "impl/demangle.hpp"
#include "impl/finite.hpp"
#include "impl/fusion_kernels.hpp"
#include "impl/fusion_plan.hpp"
#include "impl/huge_pages.hpp"
#include "impl/plan_tuner.hpp"
#include "impl/ready_tracker.hpp"
#include "impl/segment_table.hpp"
#include "impl/stall.hpp"
#include "impl/timeline.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"
#include "process_set.hpp"
#include "row_sparse.hpp"
#include "stats.hpp"
#include "tensor_traits.hpp"
#include "topology.hpp"

namespace gradsync {
namespace impl {

// Largest element count of one fused chunk, whatever the threshold: one backend call must fit an
// int count. A variable so tests can exercise the split on small tensors.
inline std::size_t& max_chunk_elements() {
  static std::size_t n = std::size_t(INT_MAX);
  return n;
}

// A backend that knows which of its ranks share a node (MpiBackend), and one that can sum in three
// stages over them (Algorithm::hierarchical).
template <class B, class = void>
struct has_topology : std::false_type {};
template <class B>
struct has_topology<B, std::enable_if_t<std::is_same_v<std::decay_t<decltype(std::declval<const B&>().topology())>, Topology>>>
    : std::true_type {};
template <class B, class = void>
struct has_hierarchical_sum : std::false_type {};
template <class B>
struct has_hierarchical_sum<
    B, std::void_t<decltype(std::declval<const B&>().hierarchical_allreduce_sum(static_cast<float*>(nullptr), std::size_t()))>>
    : std::true_type {};

template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {};

}  // namespace impl

template <class Backend, class Tensor>
class GradientSync {
  using traits = TensorTraits<Tensor>;
  static_assert(is_tensor_v<Tensor>,
                "gradsync::GradientSync<Backend, Tensor>: Tensor must be a Kokkos::View, std::vector<T> or "
                "gradsync::Span<T, MemorySpace>, or have a gradsync::TensorTraits specialisation");

 public:
  using backend_type = Backend;
  using tensor_type = Tensor;
  using value_type = typename traits::value_type;
  using memory_space = typename traits::memory_space;
  using execution_space = typename traits::execution_space;

  static_assert(is_supported_value_v<value_type>,
                "gradsync::GradientSync: gradients must hold float or double (the types with a built-in "
                "MPI and NCCL sum)");

  explicit GradientSync(Backend backend, Options options = {}, execution_space exec = {})
      : backend_(std::move(backend)),
        opt_(prepare_options(options)),
        log_(opt_.read_environment ? impl::env_log_level() : impl::LogLevel::off),
        exec_(exec),
        topology_(find_topology(backend_)),
        choices_(plan_candidates(opt_, topology_)),
        tuner_(choices_.size()),
        collectives_block_(opt_.collectives == Collectives::blocking ||
                           (opt_.collectives == Collectives::automatic && impl::prefers_blocking(backend_))),
        agreed_(impl::has_mpi_comm<Backend>::value),
        ctl_(backend_, opt_) {
    facts_.blocking = collectives_block_;
    facts_.staged = staging_wanted();
    if constexpr (impl::has_cuda_aware<Backend>::value) facts_.cuda_aware = backend_.cuda_aware();
    std::uint64_t h = impl::fnv1a(&topology_.nodes, sizeof(int));
    h = impl::fnv1a(&topology_.max_local_size, sizeof(int), h);
    for (const impl::PlanChoice& c : choices_) {  // chunks in flight may differ: they change no collective
      const std::int64_t w[2] = {std::int64_t(c.chunk_bytes), std::int64_t(c.algorithm)};
      h = impl::fnv1a(w, sizeof w, h);
    }
    facts_.plan = std::int64_t(h >> 1);
    apply_choice();
    timeline_ = impl::open_timeline(opt_.timeline, backend_.rank(), backend_.size(), ctl_);
  }

  /// Registers a gradient in `Group`. Any contiguous tensor with this sync's value type and memory
  /// space is accepted (a View of any rank, a vector, a Span). `name` appears in error messages.
  template <class Group, class U>
  void add(const U& tensor, std::string name = {}) {
    using UT = TensorTraits<U>;
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::add: argument is not a tensor gradsync knows");
    static_assert(std::is_same_v<typename UT::value_type, value_type>,
                  "gradsync::GradientSync::add: the tensor's value type differs from the sync's");
    static_assert(std::is_same_v<typename UT::memory_space, memory_space>,
                  "gradsync::GradientSync::add: the tensor lives in another memory space than the sync's");
    static_assert(UT::is_writable, "gradsync::GradientSync::add: a gradient must be writable (not const)");
    Entry e;
    e.data = UT::data(tensor);
    e.size = UT::size(tensor);
    e.group = impl::type_name<Group>();
    e.index_in_group = std::size_t(std::count_if(entries_.begin(), entries_.end(),
                                                 [&](const Entry& o) { return o.group == e.group; }));
    e.named = !name.empty();
    e.name = name.empty() ? impl::cat(e.group, "[", e.index_in_group, "]") : std::move(name);
    e.policy_local = is_local_v<Group>;
    e.policy_scale = local_scale_v<Group>;
    e.compression = impl::group_compression<Group>();
    if (!UT::is_contiguous(tensor))
      throw Error(impl::cat("tensor '", e.name, "' (group ", e.group,
                            ") is not contiguous: register a contiguous View or copy it into one"));
    if constexpr (Kokkos::is_view<U>::value) e.keepalive = std::make_shared<U>(tensor);
    // A vector is registered by reference: synchronize() re-reads its data and size and throws if
    // it was resized or reallocated since. (A View is held by value: reassigning or
    // Kokkos::resize-ing the caller's View cannot be seen; re-register it instead.)
    if constexpr (impl::is_std_vector<U>::value)
      e.requery = [&tensor] { return std::make_pair(UT::data(tensor), UT::size(tensor)); };
    for (const Entry& o : entries_)
      if (impl::overlaps(e.data, e.size, o.data, o.size))
        throw Error(impl::cat("tensor '", e.name, "' (group ", e.group, ") overlaps tensor '", o.name,
                              "' (group ", o.group, ") already registered",
                              e.data == o.data ? " (the same tensor registered twice)" : ""));
    sparse_.for_each_values([&](const value_type* p, std::size_t n, const std::string& on, const std::string& og) {
      if (impl::overlaps(e.data, e.size, p, n))
        throw Error(impl::cat("tensor '", e.name, "' (group ", e.group, ") overlaps row-sparse gradient '", on,
                              "' (group ", og, ") already registered"));
    });
    if constexpr (is_set_reduced_v<Group>)
      sets_.add(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), e.data, e.size, e.name, e.group,
                LocalVarPolicy<Group>::set_scale, backend_.rank());
    begin_change();
    entries_.push_back(std::move(e));
  }

  /// Binds this rank's process set for the groups whose policy is ReduceOver<Tag>
  /// (process_set.hpp): the ranks it reduces those groups with, itself included. Between steps;
  /// the communicator is created, collectively, at the next synchronize() or prepare().
  template <class Tag>
  void bind_process_set(std::vector<int> ranks) {
    static_assert(impl::has_split<Backend>::value,
                  "gradsync::GradientSync::bind_process_set: the backend cannot split its communicator "
                  "(MpiBackend and SelfBackend can)");
    begin_change();
    sets_.bind(impl::type_name<Tag>(), std::move(ranks), backend_.rank(), backend_.size());
  }

  /// Registers a row-sparse gradient (row_sparse.hpp): only its rows are scaled (local group) or
  /// exchanged (data-parallel group), after the dense chunks. Needs backward_passes_per_step == 1.
  template <class Group, class V, class I>
  void add(const RowSparse<V, I>& rows, std::string name = {}) {
    static_assert(std::is_same_v<typename RowSparse<V, I>::value_type, value_type>,
                  "gradsync::GradientSync::add: the RowSparse values' type differs from the sync's");
    static_assert(std::is_same_v<typename RowSparse<V, I>::memory_space, memory_space>,
                  "gradsync::GradientSync::add: the RowSparse lives in another memory space than the sync's");
    const std::string group = impl::type_name<Group>();
    const std::size_t index = std::size_t(std::count_if(entries_.begin(), entries_.end(),
                                                        [&](const Entry& o) { return o.group == group; })) +
                              sparse_.count_in_group(group);
    const std::string shown = name.empty() ? impl::cat(group, "[", index, "]") : name;
    if (opt_.backward_passes_per_step != 1)
      throw ConfigError(impl::cat("row-sparse gradient '", shown, "' (group ", group,
                                  "): backward_passes_per_step must be 1 for RowSparse gradients (got ",
                                  opt_.backward_passes_per_step, ")"));
    const value_type* p = rows.values().data();
    const std::size_t n = std::size_t(rows.capacity() * rows.row_width());
    for (const Entry& o : entries_)
      if (impl::overlaps(p, n, o.data, o.size))
        throw Error(impl::cat("row-sparse gradient '", shown, "' (group ", group, ") overlaps tensor '", o.name,
                              "' (group ", o.group, ") already registered"));
    if constexpr (is_set_reduced_v<Group>)
      sets_.set_of(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), shown, group, backend_.rank())
          .sparse.push_back(rows.table_rows() * rows.row_width());
    begin_change();
    sparse_.template add<Group>(rows, std::move(name), index, backend_.size(), backend_.rank());
  }

  /// Horovod parity: at run time, makes a registered gradient local (never communicated). It is
  /// scaled by 1/world_size when Options::scale_local_gradients is set.
  template <class U>
  void register_local_var(const U& tensor) {
    using UT = TensorTraits<U>;
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::register_local_var: argument is not a tensor");
    const value_type* p = UT::data(tensor);
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry& e) { return e.data == p && e.size == UT::size(tensor); });
    if (it == entries_.end())
      throw Error(impl::cat("register_local_var: the tensor (", UT::size(tensor),
                            " elements) is not registered with add<Group>() on rank ", backend_.rank()));
    if (it->runtime_local) return;
    begin_change();
    it->runtime_local = true;
  }

  /// Call after each backward pass. Returns true when the gradients hold synchronized values
  /// (every Nth call, N = backward_passes_per_step); otherwise they are accumulated internally.
  bool synchronize() {
    const std::int64_t t_begin = timeline_ ? impl::Timeline::now() : 0;  // no RAII here: keeps the inlining of the timeline-off path
    pending_ = false;  // the tensors are about to hold this pass's values
    if (!step_open_) checks_before_pass();  // else mark_ready ran them when it opened the step
    const auto t0 = std::chrono::steady_clock::now();
    if (dirty_ && !step_open_) build_plan();
    if (opt_.check_finite) check_finite();
    if (agreed_ && blocking_) agree_before_exchange(true);  // after every local check: the collectives follow
    ++stats_.passes;
    ++pass_;
    const int n_passes = opt_.backward_passes_per_step;
    if (pass_ < n_passes) {
      accumulate(pass_ == 1);
      impl::fence(exec_, impl::label_fence_sync());
      if (timeline_) timeline_->step_span(t_begin, stats_.passes);
      return false;
    }
    pass_ = 0;
    reduce_data_parallel(n_passes > 1);
    finish_local(n_passes > 1);
    if constexpr (sets_supported) {
      if (sets_.has_tensors())
        sets_.reduce(exec_, opt_, ctl_, backend_.size(), std::int64_t(stats_.passes), stats_);
    }
    if (!sparse_.empty()) finish_row_sparse();
    impl::fence(exec_, impl::label_fence_sync());
    pending_ = n_deferred_segs_ > 0;
    ++stats_.steps;
    if (overflow_.extent(0) > 0) check_wire_overflow();
    if (tuner_.active()) tune(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (timeline_) timeline_->step_span(t_begin, stats_.passes);
    return true;
  }

  /// Pays the first call's one-time costs before training starts: the ranks compare their
  /// registrations (the consistency check), the plan is built, host gradients reduced in place move
  /// onto huge pages and the buffers are allocated. Collective: every rank calls it, at the same
  /// point (over MpiBackend, a rank that calls synchronize() instead is a MismatchError everywhere).
  /// Gradient values are not touched; the next synchronize() builds nothing unless registrations
  /// change in between. fusion_threshold_auto still times its candidates on the first steps.
  void prepare() {
    if (pass_ != 0 || step_open_)
      throw Error(impl::cat("prepare() called inside a step (after pass ", pass_, " of ",
                            opt_.backward_passes_per_step, ", or after mark_ready); call it between steps"));
    checks_before_pass(true);
    if (dirty_) build_plan();
  }

  /// Overlap with backward: tells the sync that this gradient is final for the current pass. A
  /// chunk is reduced as soon as it and every chunk before it in fused order hold only ready
  /// gradients (so all ranks issue the same collectives whatever order they mark tensors in);
  /// synchronize() reduces the rest. The default fused order is reversed registration order, the
  /// order backward produces gradients in. Marking is optional, repeated marks have no effect,
  /// local tensors need none. With backward_passes_per_step = N > 1 only the Nth pass of a cycle
  /// reduces: marks on passes 1 .. N-1 have no effect (synchronize() accumulates them), marks on
  /// the Nth pass launch chunks of the accumulated sums. A gradient must not change after its mark
  /// until synchronize() returns.
  template <class U>
  void mark_ready(const U& tensor) {
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::mark_ready: argument is not a tensor");
    if (dirty_ && !step_open_) build_plan();
    const value_type* p = TensorTraits<U>::data(tensor);
    const std::int64_t i = ready_.find(p);
    if (i < 0) {
      for (const Entry& e : entries_)
        if (e.data == p && e.size == TensorTraits<U>::size(tensor)) return;  // local or empty
      throw Error(impl::cat("mark_ready: the tensor (", TensorTraits<U>::size(tensor),
                            " elements) is not registered with add<Group>() on rank ", backend_.rank()));
    }
    if (timeline_) timeline_->mark(i);
    // Blocking collectives are never started here: a rank blocked in chunk k while another is
    // still in backward (or in the model's own collectives) would hang both.
    if (blocking_ || pass_ + 1 < opt_.backward_passes_per_step) return;  // not a reducing pass
    if (!step_open_) checks_before_pass();  // the ranks agree before the step's first collective
    begin_step();
    ready_.mark(std::size_t(i));
    progress();
  }

  /// Lets chunks launched by mark_ready advance and launches those that became possible. Call it
  /// while waiting during backward (e.g. while polling device events): MPI's nonblocking
  /// collectives progress only inside MPI calls. Never blocks.
  void progress() {
    if (!step_open_ || blocking_) return;
    while (completed_ < launched_ && backend_.test(requests_[completed_])) complete_chunk(completed_++);
    launch_through(ready_.ready_prefix(), opt_.backward_passes_per_step > 1, false);
  }

  /// The chunk size the sync uses now (fusion_threshold_auto: the candidate being timed, then the
  /// chosen one).
  std::size_t fusion_threshold_bytes() const { return choices_[tuner_.current()].chunk_bytes; }

  /// Where the backend's ranks are (one node of this many ranks for a backend that cannot tell).
  const Topology& topology() const { return topology_; }
  /// The algorithm chunks are summed with now (while tuning: the candidate being timed).
  Algorithm algorithm() const { return choices_[tuner_.current()].algorithm; }
  /// Nonblocking chunks reduced at once now (Options::max_chunks_in_flight, or the plan's choice).
  int chunks_in_flight() const { return choices_[tuner_.current()].in_flight; }
  /// Whether the first steps are still timing the plan's candidates.
  bool tuning() const { return tuner_.active(); }

  const Stats& stats() const { return stats_; }
  const Options& options() const { return opt_; }
  const Backend& backend() const { return backend_; }
  std::size_t num_tensors() const { return entries_.size(); }

  /// This rank's registrations, plan and options, for describe(sync) (describe.hpp).
  SyncSummary summary() const {
    SyncSummary s;
    s.backend = Backend::name();
    s.rank = backend_.rank();
    s.ranks = backend_.size();
    s.value_type = impl::type_name<value_type>();
    s.memory_space = memory_space::name();
    s.options = opt_;
    for (const Entry& e : entries_) {
      auto g = std::find_if(s.groups.begin(), s.groups.end(), [&](const SyncSummary::Group& x) { return x.name == e.group; });
      if (g == s.groups.end()) {
        s.groups.push_back({e.group, e.policy_local, e.policy_scale});
        s.groups.back().compression = e.policy_local ? Compression::none : wire_of(e);
        g = s.groups.end() - 1;
      }
      const std::size_t bytes = e.size * sizeof(value_type);
      ++g->tensors;
      g->bytes += bytes;
      if (e.runtime_local && !e.policy_local) ++g->runtime_local_tensors, g->runtime_local_bytes += bytes;
      (e.local() ? s.local_tensors : s.data_parallel_tensors) += 1;
      (e.local() ? s.local_bytes : s.data_parallel_bytes) += bytes;
    }
    s.planned = !dirty_;
    s.fusion_threshold_bytes = fusion_threshold_bytes();
    s.tuning = tuner_.active();
    s.blocking = blocking_;
    s.topology = topology_;
    s.algorithm = algorithm();
    s.chunks_in_flight = chunks_in_flight();
    s.plan_candidates = choices_.size();
    for (std::size_t k = 0; k < choices_.size() && !tuner_.active() && choices_.size() > 1; ++k)
      s.candidate_seconds.push_back({choices_[k].chunk_bytes, choices_[k].algorithm, tuner_.timings()[k]});
    if (!s.planned) return s;
    s.staged = staged_;
    s.chunks = chunks_.size();
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::size_t bytes =
          std::size_t(chunks_[c].size()) * (chunks_[c].kind != 0 ? sizeof(std::uint16_t) : sizeof(value_type));
      s.largest_chunk_bytes = std::max(s.largest_chunk_bytes, bytes);
      s.chunks_in_place += reduced_in_place(c);
      s.chunks_folded += reduced_in_place(c) && !blocking_ && impl::folds_factor(backend_, bytes);
      s.chunks_compressed += chunks_[c].kind != 0;
    }
    s.buffer_bytes = stats_.buffer_bytes;
    s.bytes_on_huge_pages = stats_.bytes_on_huge_pages;
    return s;
  }

  /// Whether the tensor registered at `data` is local (by its group's policy or at run time).
  template <class U>
  bool is_local(const U& tensor) const {
    const value_type* p = TensorTraits<U>::data(tensor);
    for (const Entry& e : entries_)
      if (e.data == p) return e.local();
    throw Error("is_local: the tensor is not registered");
  }

  /// Calls f(data, size, is_local) for every registered gradient, in registration order (used by
  /// global_norm and DistributedOptimizer to tell local from data-parallel tensors).
  template <class F>
  void for_each_tensor(F&& f) const {
    for (const Entry& e : entries_) f(e.data, e.size, e.local());
  }

  /// Leaves the local scale of this tensor (1/world_size and 1/N, see local_scale_of) to the caller
  /// instead of a pass of its own: after synchronize() returns true the tensor holds the unscaled
  /// sum, and pending_scale(tensor) is the factor the caller must apply (DistributedOptimizer folds
  /// it into the optimizer's update). Takes effect only while the tensor is local; rank-local (the
  /// ranks need not agree). Not inside an aggregation cycle.
  template <class U>
  void defer_local_scale(const U& tensor, bool defer = true) {
    Entry& e = entry_of(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "defer_local_scale");
    if (e.defer_scale == defer) return;
    if (pass_ != 0)
      throw Error(impl::cat("defer_local_scale('", e.name, "', group ", e.group, ") called after pass ", pass_, " of ",
                            opt_.backward_passes_per_step, " of an aggregation cycle; call it between steps"));
    e.defer_scale = defer;
    dirty_ = true;  // the local segments change; nothing the ranks compare does
  }

  /// The factor synchronize() applies to a local tensor (or leaves to the caller when deferred):
  /// 1/world_size by its policy (or scale_local_gradients), times 1/N with
  /// average_aggregated_gradients; 1 for a data-parallel tensor, whose factors go into the unpack.
  template <class U>
  value_type local_scale_of(const U& tensor) const {
    return local_factor(entry_of(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "local_scale_of"));
  }

  /// The factor the tensor's values still need: local_scale_of(tensor) for a deferred local tensor
  /// after synchronize() returned true (until apply_local_scale()), 1 otherwise.
  template <class U>
  value_type pending_scale(const U& tensor) const {
    const Entry& e = entry_of(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "pending_scale");
    return pending_ ? deferred_factor(e) : value_type(1);
  }

  /// Whether deferred local scales are pending (synchronize() returned true, apply_local_scale() not
  /// called since).
  bool local_scale_pending() const { return pending_; }

  /// Applies the pending deferred scales in place (one pass over the deferred tensors, the values
  /// synchronize() would have left without deferral), after which nothing is pending.
  void apply_local_scale() {
    if (!pending_) return;
    impl::launch_segments(impl::label_local(), exec_, n_deferred_segs_,
                          impl::LocalKernel<value_type, execution_space, memory_space>{deferred_segs_, local_acc_,
                                                                                       impl::LocalMode::scale});
    impl::fence(exec_, impl::label_fence_sync());
    pending_ = false;
  }

  /// Calls f(data, size, is_local, deferred) for every registered gradient in registration order;
  /// `deferred` is the factor its values need while local_scale_pending() (1 when not deferred).
  template <class F>
  void for_each_gradient(F&& f) const {
    for (const Entry& e : entries_) f(e.data, e.size, e.local(), deferred_factor(e));
  }

  /// Bytes of data-parallel gradient one synchronize() hands to the backend.
  std::size_t data_parallel_bytes() const {
    std::size_t n = 0;
    for (const Entry& e : entries_)
      if (!e.local()) n += e.size;
    return n * sizeof(value_type);
  }

 private:
  struct Entry {
    value_type* data = nullptr;
    std::size_t size = 0;
    std::string group, name;
    std::size_t index_in_group = 0;
    bool policy_local = false;
    LocalScale policy_scale = LocalScale::none;
    bool runtime_local = false;
    bool defer_scale = false;  // defer_local_scale: the caller applies the local factor
    bool named = false;  // the name was given to add()
    int compression = -1;  // its group's wire format (int(Compression)); -1: Options::compression
    std::shared_ptr<void> keepalive;  // a copy of a registered View keeps its memory alive
    std::function<std::pair<value_type*, std::size_t>()> requery;  // vectors: current data and size
    bool local() const { return policy_local || runtime_local; }
  };

  using Seg = impl::Segment<value_type>;
  using SegView = impl::SegmentView<value_type, memory_space>;
  using Buffer = impl::BufferView<value_type, memory_space>;
  using WireBuffer = impl::BufferView<std::uint16_t, memory_space>;

  // A data-parallel tensor's wire format: its group's choice, else the options'.
  Compression wire_of(const Entry& e) const {
    return e.compression < 0 ? opt_.compression : Compression(e.compression);
  }

  Entry& entry_of(const value_type* p, std::size_t n, const char* who) {
    return const_cast<Entry&>(static_cast<const GradientSync*>(this)->entry_of(p, n, who));
  }
  const Entry& entry_of(const value_type* p, std::size_t n, const char* who) const {
    for (const Entry& e : entries_)
      if (e.data == p && e.size == n) return e;
    throw Error(impl::cat(who, ": the tensor (", n, " elements) is not registered with add<Group>() on rank ",
                          backend_.rank()));
  }

  // A local tensor's factor: 1/n by its policy (or scale_local_gradients), 1/N when averaging passes.
  value_type local_factor(const Entry& e) const {
    if (!e.local()) return value_type(1);
    const int N = opt_.backward_passes_per_step;
    const value_type inv_agg = opt_.average_aggregated_gradients ? value_type(1) / value_type(N) : value_type(1);
    const bool by_world = e.policy_local ? e.policy_scale == LocalScale::world_size : opt_.scale_local_gradients;
    return (by_world ? value_type(1) / value_type(backend_.size()) : value_type(1)) * inv_agg;
  }
  value_type deferred_factor(const Entry& e) const {
    return e.defer_scale && e.local() ? local_factor(e) : value_type(1);
  }

  static constexpr bool sets_supported =
      impl::has_split<Backend>::value && Kokkos::is_execution_space<execution_space>::value;
  using set_backend_type = typename impl::split_result<Backend>::type;

  // RowSparse gradients, after the dense exchange: world, then process sets in binding order.
  void finish_row_sparse() {
    std::vector<std::string> tags;
    if constexpr (sets_supported) tags = sets_.tags_in_order();
    sparse_.finish(backend_, exec_, value_type(pre_factor_ * post_factor_), stats_, tags,
                   [&](const std::string& tag, SetScale scale) -> std::pair<const set_backend_type*, value_type> {
                     if constexpr (sets_supported)
                       return {&sets_.backend_of(tag),
                               sets_.factor(scale, opt_, backend_.size(), sets_.set_size(tag))};
                     else
                       return {nullptr, value_type(1)};  // never asked: no sets without split()
                   });
  }

  // Environment overrides applied, then validated, before anything collective starts.
  static Options prepare_options(const Options& given) {
    Options o = given.read_environment ? apply_env(given) : given;
    o.timeline = impl::keep_timeline_path(o.timeline);
    validate_options(o);
    return o;
  }

  static void validate_options(const Options& o) {
    if (o.backward_passes_per_step < 1)
      throw ConfigError(impl::cat("backward_passes_per_step must be >= 1, got ", o.backward_passes_per_step));
    auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
    if (bad(o.prescale_factor))
      throw ConfigError(impl::cat("prescale_factor must be finite and >= 0, got ", o.prescale_factor));
    if (o.max_chunks_in_flight < 0)
      throw ConfigError(impl::cat("max_chunks_in_flight must be >= 0 (0: by topology), got ", o.max_chunks_in_flight));
    if (std::isnan(o.in_place_min_fraction) || o.in_place_min_fraction < 0)
      throw ConfigError(impl::cat("in_place_min_fraction must be >= 0, got ", o.in_place_min_fraction));
    if (bad(o.postscale_factor))
      throw ConfigError(impl::cat("postscale_factor must be finite and >= 0, got ", o.postscale_factor));
    if (bad(o.stall_timeout))
      throw ConfigError(impl::cat("stall_timeout must be finite and >= 0 seconds (0 waits forever), got ",
                                  o.stall_timeout));
    if (bad(o.stall_warning))
      throw ConfigError(impl::cat("stall_warning must be finite and >= 0 seconds (0: no warning), got ",
                                  o.stall_warning));
  }

  // Local checks, then the agreement before the exchange (agree_before_exchange; on the blocking
  // path synchronize() runs it after check_finite instead, prepare() here). A rank that fails a
  // local check tells its peers before throwing, so none of them waits for it.
  void checks_before_pass(bool preparing = false) {
    for (Entry& e : entries_) {
      if (!e.requery) continue;
      const auto now = e.requery();
      if (now.first != e.data || now.second != e.size)
        fail_here(impl::ErrorKind::error,
                  impl::cat("tensor '", e.name, "' (group ", e.group, ") was resized or reallocated after it was "
                            "registered (", e.size, " -> ", now.second, " elements) on rank ", backend_.rank(),
                            "; build a new GradientSync and register it again after resizing"));
    }
    if (agreed_ && blocking_ && !preparing) return;
    if (agreed_ || !agreed_once_)
      agree_before_exchange(false, preparing);  // before the step's first collective, which is watched itself
    else
      check_consistency(need_check_, false);  // no side channel: the first call agreed on the options
  }

  // The cross-rank comparison of registrations (impl/consistency.hpp), when a rank needs it, or
  // when the options differ (`force`: every rank knows it, whatever its check mode says).
  void check_consistency(bool needed, bool force) {
    const std::int64_t call = std::int64_t(stats_.passes) + 1;
    if constexpr (sets_supported)
      if (needed) sets_.connect(backend_);  // every rank: `needed` is agreed (any rank changed)
    if (force || (needed && opt_.consistency_check != CheckMode::off) ||
        opt_.consistency_check == CheckMode::every_step) {
      impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::call, "consistency check", call);
      std::vector<impl::RegDesc> regs;
      regs.reserve(entries_.size());
      for (const Entry& e : entries_)
        regs.push_back({e.group, e.name, e.size, e.index_in_group, e.policy_local, e.runtime_local, e.named,
                        int(wire_of(e))});
      sparse_.describe(regs);
      impl::check_consistency(backend_, ctl_, opt_, regs, int(sizeof(value_type)), call,
                              impl::max_chunk_elements(), facts_);
      agree_on_neighbours(call);
      ++stats_.consistency_checks;
      need_check_ = false;
    }
  }

  // Options::check_finite: one reduction over the data-parallel gradients before they are packed.
  // Kokkos execution spaces only; the raw CUDA path (CudaDeviceSpace spans) has no scan kernel yet.
  void check_finite() {
    if constexpr (!Kokkos::is_execution_space<execution_space>::value) {
      throw ConfigError(impl::cat("check_finite is not supported yet for gradients in ", memory_space::name(),
                                  " (no NaN/Inf scan kernel on this path); turn it off"));
    } else {
      const std::int64_t s =
          impl::first_non_finite_segment<value_type, memory_space>(exec_, dp_segs_, n_dp_segs_, finite_);
      if (s == impl::FirstNonFiniteKernel<value_type, execution_space, memory_space>::none) return;
      auto seg = Kokkos::create_mirror_view_and_copy(
          Kokkos::HostSpace(), Kokkos::subview(dp_segs_, std::make_pair(std::size_t(s), std::size_t(s + 1))));
      const value_type* p = seg(0).ptr;
      for (const Entry& e : entries_)
        if (!e.local() && p >= e.data && p < e.data + e.size)
          fail_here(impl::ErrorKind::error,
                    impl::cat("gradient '", e.name, "' (group ", e.group, ", ", e.size, " values) holds NaN or Inf "
                              "on rank ", backend_.rank(), " before the exchange of synchronize() call ",
                              stats_.passes + 1, " (Options::check_finite)"));
      fail_here(impl::ErrorKind::error, "a data-parallel gradient holds NaN or Inf (Options::check_finite)");
    }
  }

  [[noreturn]] void fail_here(impl::ErrorKind k, const std::string& msg) {
    if (timeline_) timeline_->report(k, true, msg);
    ctl_.tell_peers(k, msg);
    impl::throw_kind(k, msg);
  }

  // What the plan is built from: the data-parallel tensors in fused order.
  std::vector<typename impl::FusionPlan<value_type>::Tensor> data_parallel_in_fused_order() const {
    std::vector<typename impl::FusionPlan<value_type>::Tensor> dp;
    for (const Entry& e : entries_)
      if (!e.local()) dp.push_back({e.data, e.size, int(wire_of(e))});
    if (opt_.fusion_order == FusionOrder::reverse) std::reverse(dp.begin(), dp.end());
    return dp;
  }

  // Gradients that are neighbours in memory merge into one in-place region (impl::FusionPlan), but
  // memory is each rank's own: the plan, hence the collectives, may depend on it only where every
  // rank has the same neighbours. A hash of the neighbour relations in fused order is compared
  // with the consistency check (one more small allreduce, only when a check runs); until the ranks
  // agree, nothing merges.
  void agree_on_neighbours(std::int64_t call) {
    std::uint64_t h = impl::fnv1a(nullptr, 0);
    bool any = false;
    const typename impl::FusionPlan<value_type>::Tensor* prev = nullptr;
    for (const auto& t : data_parallel_in_fused_order()) {
      if (t.size == 0) continue;  // no memory: never anyone's neighbour
      if (prev) {
        const std::int8_t d = std::int8_t(impl::FusionPlan<value_type>::neighbour(*prev, t));
        any = any || d != 0;
        h = impl::fnv1a(&d, 1, h);
      }
      prev = &t;
    }
    std::int64_t v[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};  // MIN of both: min and max
    ctl_.allreduce_min(backend_, v, 2, opt_, impl::WaitSite{"consistency check (neighbours)", call, -1, 0});
    const bool agreed = any && v[0] == -v[1];
    // Rebuilt before the step's first collective (only N == 1 reduces in place: no rebuild mid-cycle).
    if (agreed != merge_neighbours_ && opt_.backward_passes_per_step == 1) dirty_ = true;
    merge_neighbours_ = agreed;
  }

  // Registrations may change between steps, never inside an aggregation cycle: the internal sums
  // would no longer match the tensors.
  void begin_change() {
    if (pass_ != 0)
      throw Error(impl::cat("registrations changed after pass ", pass_, " of ", opt_.backward_passes_per_step,
                            " of an aggregation cycle; change them only after synchronize() returned true"));
    dirty_ = need_check_ = true;
    merge_neighbours_ = false;  // until the ranks agree again
  }

  // Elements per chunk: the threshold in values (at least one), never more than one call can take.
  // A threshold of 0 means no fusion: chunks then follow tensor boundaries instead.
  // Compressed chunks (value_bytes 2) hold twice as many values: the threshold counts bytes handed to
  // the backend.
  std::size_t chunk_limit(std::size_t value_bytes = sizeof(value_type)) const {
    const std::size_t threshold = fusion_threshold_bytes();
    if (threshold == 0) return impl::max_chunk_elements();
    const std::size_t by_bytes = threshold / value_bytes;
    return std::max<std::size_t>(1, std::min(by_bytes, impl::max_chunk_elements()));
  }

  template <class V>
  void ensure(V& v, std::size_t n, const char* label) {
    if (v.extent(0) >= n) return;
    v = impl::allocate_buffer<V>(label, n);
    ++stats_.allocations;
  }

  void build_plan() {
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::plan, "plan build");
    const int n = backend_.size();
    const int N = opt_.backward_passes_per_step;
    const value_type inv_agg = opt_.average_aggregated_gradients ? value_type(1) / value_type(N) : value_type(1);

    // Data-parallel tensors in fused order: offsets, chunks, segments split at chunk boundaries.
    const auto dp = data_parallel_in_fused_order();
    // Large tensors are reduced where they are, in chunks of their own, skipping both copies
    // through the fusion buffer: not when staged or when the buffer holds aggregated sums.
    windowed_ = N == 1;
    staged_ = use_host_staging();
    in_place_ = windowed_ && !staged_;
    const double own = std::max(std::ceil(opt_.in_place_min_fraction * double(chunk_limit())),
                                double(opt_.in_place_min_bytes / sizeof(value_type)));
    const std::int64_t own_min = in_place_ && own < 9e18 ? std::max<std::int64_t>(1, std::int64_t(own))
                                                         : std::numeric_limits<std::int64_t>::max();
    auto plan =
        impl::FusionPlan<value_type>::build(dp, std::int64_t(chunk_limit()), fusion_threshold_bytes() == 0, own_min,
                                            merge_neighbours_, std::int64_t(chunk_limit(sizeof(std::uint16_t))));
    chunks_ = std::move(plan.chunks);
    for (impl::Chunk& ch : chunks_)  // compressed chunks in place: the ring converts as it goes
      ch.wire_ring = in_place_ && !blocking_ && ch.contiguous && impl::wire_ring_fits(backend_, ch.kind, ch.size());
    const std::vector<Seg>& segs = plan.segments;
    std::vector<const void*> dp_data;
    for (const auto& t : dp) dp_data.push_back(t.data);
    ready_.build(dp_data, plan.tensor_chunks, chunks_.size());
    // Without aggregation the buffer is chunk-sized slots that chunks cycle through (one when each
    // chunk is reduced before the next is packed); with it the buffer holds every data-parallel
    // sum between passes.
    slots_ = blocking_ ? 1 : pipeline_depth;
    // Packed chunks take the buffer's slots in turn; a chunk waits for the previous user of its slot.
    requests_.assign(chunks_.size(), typename Backend::Request{});
    slot_of_.assign(chunks_.size(), -1);
    prev_in_slot_.assign(chunks_.size(), -1);
    {
      std::vector<std::int64_t> last(std::size_t(slots_), -1);
      std::int64_t packed = 0;
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        if (reduced_in_place(c)) continue;
        const std::int64_t slot = packed++ % slots_;
        slot_of_[c] = slot;
        prev_in_slot_[c] = last[std::size_t(slot)];
        last[std::size_t(slot)] = std::int64_t(c);
      }
    }
    slot_size_ = windowed_ ? plan.widest : 0;
    const std::int64_t capacity =
        windowed_ ? plan.widest * std::min<std::int64_t>(slots_, std::int64_t(chunks_.size())) : plan.total;
    ensure_fusion_buffer(std::size_t(capacity));
    move_to_huge_pages(dp);
    if (staged_) ensure(staging_, std::size_t(capacity), "gradsync::host_staging");
    plan_wire(std::size_t(capacity), plan.total, segs);
    upload(segs, dp_segs_, "gradsync::segments");
    plan_first_ptr_.assign(chunks_.size(), nullptr);
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (chunks_[c].seg_end > chunks_[c].seg_begin) plan_first_ptr_[c] = segs[std::size_t(chunks_[c].seg_begin)].ptr;

    // Local tensors: scaled in place, accumulated beside the buffer when N > 1.
    // Deferred tensors (defer_local_scale) keep their sums; their factor goes to dsegs, which
    // apply_local_scale() runs when the caller wants the pass after all.
    std::vector<Seg> lsegs, dsegs;
    std::int64_t local_total = 0;
    for (const Entry& e : entries_) {
      if (!e.local() || e.size == 0) continue;
      const value_type s = local_factor(e);
      if (e.defer_scale && s != value_type(1))
        impl::for_each_segment(e.size, [&](std::int64_t off, std::int64_t len) {
          dsegs.push_back(Seg{e.data + off, 0, len, s});
        });
      const value_type applied = e.defer_scale ? value_type(1) : s;
      if (N == 1 && applied == value_type(1)) continue;  // nothing to do for this tensor
      impl::for_each_segment(e.size, [&](std::int64_t off, std::int64_t len) {
        lsegs.push_back(Seg{e.data + off, local_total + off, len, applied});
      });
      local_total += std::int64_t(e.size);
    }
    if (N > 1) ensure(local_acc_, std::size_t(local_total), "gradsync::local_accumulator");
    upload(lsegs, local_segs_, "gradsync::local_segments");
    upload(dsegs, deferred_segs_, "gradsync::deferred_segments");
    n_deferred_segs_ = std::int64_t(dsegs.size());

    double post = opt_.postscale_factor * double(inv_agg);
    if (opt_.op == ReduceOp::average) post /= double(n);
    post_factor_ = value_type(post);
    pre_factor_ = value_type(opt_.prescale_factor);
    n_dp_segs_ = std::int64_t(segs.size());
    n_local_segs_ = std::int64_t(lsegs.size());
    stats_.buffer_bytes = (buffer_.extent(0) + local_acc_.extent(0) + staging_.extent(0) + residual_.extent(0)) *
                              sizeof(value_type) +
                          (wire_.extent(0) + wire_staging_.extent(0)) * sizeof(std::uint16_t);
    // What a collective left incomplete by a stall may still write into.
    // After a stall MPI may still write into the buffers and, for chunks reduced in place, into the
    // gradients themselves: a failure keeps all of them alive (registered Views hold a keepalive copy).
    std::vector<std::shared_ptr<void>> keep{std::make_shared<Buffer>(buffer_),
                                            std::make_shared<decltype(staging_)>(staging_),
                                            std::make_shared<WireBuffer>(wire_),
                                            std::make_shared<decltype(wire_staging_)>(wire_staging_),
                                            std::make_shared<Backend>(backend_)};
    for (const Entry& e : entries_)
      if (!e.local() && e.keepalive) keep.push_back(e.keepalive);
    ctl_.keep_on_failure(std::move(keep));
    if (timeline_) note_plan_in_timeline(plan.tensor_chunks);
    ++stats_.plan_builds;
    dirty_ = false;
    if (!announced_) announce();
  }

  // Once per sync, at its first plan build: the environment's typos (once per process) and, with
  // GRADSYNC_LOG, the summary.
  void announce() {
    announced_ = true;
    if (opt_.read_environment) impl::warn_unknown_env_once();
    if (log_ == impl::LogLevel::info_all || (log_ == impl::LogLevel::info && backend_.rank() == 0)) {
      std::fprintf(stderr, "%s\n", describe(summary()).c_str());
      std::fflush(stderr);
    }
  }

  // Options::timeline: names the plan's tensors and chunks (fused order, as data_parallel_in_fused_order()).
  void note_plan_in_timeline(const std::vector<std::pair<std::int64_t, std::int64_t>>& tensor_chunks) {
    std::vector<std::string> names;
    for (const Entry& e : entries_)
      if (!e.local()) names.push_back(e.name);
    if (opt_.fusion_order == FusionOrder::reverse) std::reverse(names.begin(), names.end());
    timeline_->plan(
        names, tensor_chunks, chunks_.size(),
        [&](std::size_t c) {  // the bytes on the wire, as stats().bytes_allreduced counts them
          const std::size_t b = chunks_[c].kind != 0 ? sizeof(std::uint16_t) : sizeof(value_type);
          return std::make_pair(std::size_t(chunks_[c].size()) * b, reduced_in_place(c));
        },
        to_string(algorithm()), blocking_ ? 1 : in_flight_);
  }

  // Host memory MPI copies from (impl/huge_pages.hpp): the fusion buffer starts on huge pages,
  // and gradients reduced where they are move onto them.
  void ensure_fusion_buffer(std::size_t n) { ensure_on_huge_pages(buffer_, n, "gradsync::fusion_buffer"); }
  template <class V>
  void ensure_on_huge_pages(V& v, std::size_t n, const char* label) {
    if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace>) {
      if (opt_.huge_pages && v.extent(0) < n && n * sizeof(typename V::value_type) >= impl::huge_page_bytes) {
        v = impl::allocate_on_huge_pages<V>(label, n);
        ++stats_.allocations;
        return;
      }
    }
    ensure(v, n, label);
  }
  template <class Tensors>
  void move_to_huge_pages(const Tensors& dp) {
    stats_.bytes_on_huge_pages = 0;
    if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace>) {
      const bool any = std::any_of(chunks_.begin(), chunks_.end(), [](const impl::Chunk& c) { return c.contiguous; });
      if (!opt_.huge_pages || !in_place_ || !any) return;
      std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
      for (const auto& t : dp)
        ranges.emplace_back(reinterpret_cast<std::uintptr_t>(t.data), reinterpret_cast<std::uintptr_t>(t.data + t.size));
      stats_.bytes_on_huge_pages = impl::collapse_to_huge_pages(std::move(ranges));
    }
  }

  void upload(const std::vector<Seg>& host, SegView& dev, const char* label) {
    ensure(dev, host.size(), label);
    if (host.empty()) return;
    if (impl::upload_buffer(dev, host.data(), host.size())) ++stats_.allocations;  // a host mirror, at plan time
  }

  // Passes 1 .. N-1: sum gradients into the buffer (data-parallel) and the accumulator (local).
  void accumulate(bool first) {
    impl::launch_segments(
        impl::label_pack(), exec_, n_dp_segs_,
        impl::PackKernel<value_type, execution_space, memory_space>{dp_segs_, buffer_, 0, 0, pre_factor_, !first});
    impl::launch_segments(impl::label_local(), exec_, n_local_segs_,
                          impl::LocalKernel<value_type, execution_space, memory_space>{
                              local_segs_, local_acc_, first ? impl::LocalMode::store : impl::LocalMode::accumulate});
  }

  // Where chunk c lives in the buffer: its slot when windowed, its own place otherwise.
  std::int64_t buffer_pos(std::size_t c) const { return windowed_ ? slot_of_[c] * slot_size_ : chunks_[c].begin; }

  // Compressed chunks only where the backend's ring converts as it goes; others need their 16-bit copy.
  bool reduced_in_place(std::size_t c) const {
    return chunks_[c].kind == 0 ? in_place_ && chunks_[c].contiguous : chunks_[c].wire_ring;
  }

  void scale_in_place(std::size_t c, value_type factor) {
    if (factor == value_type(1)) return;
    const impl::Chunk& ch = chunks_[c];
    impl::launch_segments(
        impl::label_unpack(), exec_, ch.seg_end - ch.seg_begin,
        impl::InPlaceScaleKernel<value_type, execution_space, memory_space>{dp_segs_, ch.seg_begin, factor});
  }

  // Packs chunk c into its place (the kernels index the buffer by segment offset - base).
  void pack_chunk(std::size_t c, bool aggregated) {
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::pack, "pack", std::int64_t(c));
    const impl::Chunk& ch = chunks_[c];
    impl::launch_segments(impl::label_pack(), exec_, ch.seg_end - ch.seg_begin,
                          impl::PackKernel<value_type, execution_space, memory_space>{
                              dp_segs_, buffer_, ch.seg_begin, ch.begin - buffer_pos(c), pre_factor_, aggregated,
                              wire_, residual_, Compression(ch.kind)});
  }

  void unpack_chunk(std::size_t c) {
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::unpack, "unpack", std::int64_t(c));
    const impl::Chunk& ch = chunks_[c];
    impl::launch_segments(impl::label_unpack(), exec_, ch.seg_end - ch.seg_begin,
                          impl::UnpackKernel<value_type, execution_space, memory_space>{
                              dp_segs_, buffer_, ch.seg_begin, ch.begin - buffer_pos(c), post_factor_, wire_,
                              Compression(ch.kind),
                              ch.kind == int(Compression::fp16) ? overflow_ : impl::BufferView<std::int64_t, memory_space>{}});
  }

  // Packs chunk c and hands it to the backend without waiting for the reduction.
  void launch_chunk(std::size_t c, bool aggregated) {
    if (chunks_[c].kind != 0) return launch_compressed(c, aggregated);
    const std::int64_t pos = buffer_pos(c), len = chunks_[c].size();
    const std::size_t bytes = std::size_t(len) * sizeof(value_type);
    // In place, the factors go into the backend's reduction where it can take them (one pass over
    // 1/p of the bytes, in cache); otherwise they are applied before the reduction, a pass that
    // leaves the piece in cache for the backend to read instead of one over memory it has just
    // written. Packed chunks take them in the unpack.
    const bool fold = reduced_in_place(c) && !blocking_ && impl::folds_factor(backend_, bytes);
    value_type* data = nullptr;
    if (reduced_in_place(c)) {
      if (!fold) scale_in_place(c, pre_factor_ * post_factor_);
      data = chunk_data(c);
      stats_.bytes_in_place += bytes;
    } else {
      pack_chunk(c, aggregated);
      if (staged_) impl::copy_buffer(exec_, staging_, std::size_t(pos), buffer_, std::size_t(pos), std::size_t(len));
      data = (staged_ ? staging_.data() : buffer_.data()) + pos;
    }
    // The backend reads the buffer outside Kokkos, unless it is ordered on exec_'s own stream.
    if (staged_ || !impl::ordered_on(backend_, exec_)) impl::fence(exec_, impl::label_fence_pack());
    if (timeline_) timeline_->reduce_begin(c);
    if (blocking_ && hierarchical_) {
      if constexpr (impl::has_hierarchical_sum<Backend>::value) backend_.hierarchical_allreduce_sum(data, std::size_t(len));
    } else if (blocking_) {
      backend_.allreduce_sum(data, std::size_t(len));
    } else
      requests_[c] = start_sum(data, std::size_t(len), fold);
    ++stats_.allreduce_calls;
    stats_.bytes_allreduced += bytes;
    stats_.bytes_uncompressed += bytes;
  }

  // A compressed chunk: packed into 16-bit values by the pack kernel, summed by the backend in its
  // wire format (staged through host memory when the backend cannot sum it where it lives).
  void launch_compressed(std::size_t c, bool aggregated) {
    if (chunks_[c].wire_ring) return launch_wire_ring(c);
    const std::int64_t pos = buffer_pos(c), len = chunks_[c].size();
    pack_chunk(c, aggregated);
    if (wire_staged_)
      impl::copy_buffer(exec_, wire_staging_, std::size_t(pos), wire_, std::size_t(pos), std::size_t(len));
    std::uint16_t* data = (wire_staged_ ? wire_staging_.data() : wire_.data()) + pos;
    if (wire_staged_ || !impl::ordered_on(backend_, exec_)) impl::fence(exec_, impl::label_fence_pack());
    if (timeline_) timeline_->reduce_begin(c);
    if (chunks_[c].kind == int(Compression::fp16))
      sum_wire(c, reinterpret_cast<WireFp16*>(data), std::size_t(len));
    else
      sum_wire(c, reinterpret_cast<WireBf16*>(data), std::size_t(len));
    ++stats_.allreduce_calls;
    stats_.bytes_allreduced += std::size_t(len) * sizeof(std::uint16_t);
    stats_.bytes_uncompressed += std::size_t(len) * sizeof(value_type);
  }
  // A compressed chunk summed in place by the backend's ring (impl/wire_ring.hpp): both factors and
  // the residuals go with it; nothing is packed or unpacked.
  void launch_wire_ring(std::size_t c) {
    const std::int64_t len = chunks_[c].size();
    if (!impl::ordered_on(backend_, exec_)) impl::fence(exec_, impl::label_fence_pack());
    if (timeline_) timeline_->reduce_begin(c);
    value_type* res = residual_.extent(0) > 0 ? residual_.data() + chunks_[c].begin : nullptr;
    requests_[c] = impl::start_wire_ring(backend_, chunks_[c].kind, chunk_data(c), len, pre_factor_, post_factor_, res);
    ++stats_.allreduce_calls;
    stats_.bytes_allreduced += std::size_t(len) * sizeof(std::uint16_t);
    stats_.bytes_in_place += std::size_t(len) * sizeof(std::uint16_t);
    stats_.bytes_uncompressed += std::size_t(len) * sizeof(value_type);
  }
  template <class W>
  void sum_wire([[maybe_unused]] std::size_t c, [[maybe_unused]] W* data, [[maybe_unused]] std::size_t n) {
    if constexpr (impl::sums_wire<Backend>::value) {  // else plan_wire refused the plan
      if (blocking_ && hierarchical_) {
        if constexpr (impl::has_hierarchical_sum<Backend>::value) backend_.hierarchical_allreduce_sum(data, n);
      } else if (blocking_) {
        backend_.allreduce_sum(data, n);
      } else {
        requests_[c] = backend_.iallreduce_sum(data, n);
      }
    }
  }

  typename Backend::Request start_sum(value_type* data, std::size_t n, bool fold) {
    if constexpr (impl::has_folds_factor<Backend>::value)
      if (fold) return backend_.iallreduce_sum(data, n, value_type(pre_factor_ * post_factor_));
    return backend_.iallreduce_sum(data, n);
  }

  // Waits for chunk c's reduction and unpacks it into the gradients.
  void complete_chunk(std::size_t c) {
    const std::int64_t waited_from = timeline_ && !blocking_ ? impl::Timeline::now() : 0;
    // Nonblocking collectives are waited under the stall watchdog (blocking ones cannot be).
    if (!blocking_)
      impl::wait_for(backend_, requests_[c], ctl_, opt_,
                     impl::WaitSite{"allreduce", std::int64_t(stats_.passes), std::int64_t(c), std::int64_t(chunks_.size())});
    if (timeline_) timeline_->reduce_end(c, waited_from);
    if (reduced_in_place(c)) {  // scaled before or in the reduction
      if (chunks_[c].wire_ring && impl::wire_ring_non_finite<Backend>(requests_[c]) >= 0)
        wire_non_finite_ = chunk_data(c) + impl::wire_ring_non_finite<Backend>(requests_[c]);  // fp16 only
      return;
    }
    const std::int64_t pos = buffer_pos(c), len = chunks_[c].size();
    if (chunks_[c].kind != 0) {
      if (wire_staged_)
        impl::copy_buffer(exec_, wire_, std::size_t(pos), wire_staging_, std::size_t(pos), std::size_t(len));
    } else if (staged_) {
      impl::copy_buffer(exec_, buffer_, std::size_t(pos), staging_, std::size_t(pos), std::size_t(len));
    }
    unpack_chunk(c);
  }

  // Where an in-place chunk starts in the gradients' memory.
  value_type* chunk_data(std::size_t c) const { return plan_first_ptr_[c]; }

  // The first reducing call of a step (mark_ready or synchronize): nothing is ready or in flight.
  // Anything every rank must agree on before the step's first collective belongs here.
  void begin_step() {
    if (step_open_) return;
    if (dirty_) build_plan();
    ready_.reset();
    wire_non_finite_ = nullptr;
    launched_ = completed_ = 0;
    step_open_ = true;
  }

  // Launches chunks [launched_, end) in fused order. Nonblocking: chunk k is reduced while chunk
  // k+1 is packed and chunk k-1 unpacked, up to max_chunks_in_flight chunks in flight, packed ones each in
  // a slot of the buffer; without `may_block` it stops where it would have to wait. Blocking:
  // each chunk is packed, reduced and unpacked before the next (one slot, which stays hot).
  void launch_through(std::size_t end, bool aggregated, bool may_block = true) {
    for (; launched_ < end; ++launched_) {
      if (blocking_) {
        launch_chunk(launched_, aggregated);
        complete_chunk(completed_++);
        continue;
      }
      while (launched_ - completed_ >= std::size_t(in_flight_) ||
             (prev_in_slot_[launched_] >= 0 && std::size_t(prev_in_slot_[launched_]) >= completed_)) {
        if (!may_block) return;
        complete_chunk(completed_++);
      }
      launch_chunk(launched_, aggregated);
    }
  }

  // Before each exchange the ranks agree, on the side channel and under the stall deadline, that
  // all of them have arrived at this synchronize() call (on every call, whatever the local
  // settings say, so that this round is the one collective every rank always runs: it cannot
  // itself mismatch). It carries a hash of everything that shapes the plan or the protocol
  // (the options, the resolved collectives, staging and CUDA-awareness: impl::OptionWords), so
  // ranks whose settings differ all throw a MismatchError naming the setting before any other
  // collective, whatever their check modes, deadlines or check_finite say. The round also tells
  // every rank whether any rank's registrations changed, so all of them run the consistency
  // check, and a change on one rank only is a MismatchError, not a stall; a rank that called
  // synchronize() more often is one too. Blocking collectives cannot be given a deadline, so on
  // the blocking path a second round commits (`commit`): a rank that gives up in round 1 never
  // posts round 2, so a rank that arrives late and completes round 1 waits in round 2 and stops
  // too, instead of blocking in a collective its peers have left. Once round 2 completes every rank
  // is committed: the chunks follow with no user code in between. Nonblocking chunks are watched
  // themselves and need no commit. One or two small allreduces of latency per call. Backends
  // without a side channel run round 1 on the first call only (their collectives block).
  // prepare() sends its call number negated, so a rank in prepare() never matches one in synchronize().
  void agree_before_exchange(bool commit, bool preparing = false) {
    const std::int64_t call = std::int64_t(stats_.passes) + 1;
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::call, "arrival check", call);
    const std::int64_t sent = preparing ? -call : call;
    const std::uint64_t h = option_hash();
    const std::int64_t hi = std::int64_t(h >> 32), lo = std::int64_t(h & 0xffffffffu);
    std::int64_t v[7] = {-std::int64_t(need_check_), sent, -sent, hi, -hi, lo, -lo};
    try {
      ctl_.allreduce_min(backend_, v, 7, opt_, impl::WaitSite{"arrival check", call, -1, 0});
    } catch (const StallError& e) {
      ctl_.tell_peers(impl::ErrorKind::stall, e.what());  // late ranks stop at their next wait (round 2, a chunk)
      throw;
    }
    agreed_once_ = true;
    if (v[1] < 0 && -v[2] > 0)
      ctl_.fail(impl::ErrorKind::mismatch,
                "some ranks called prepare() while others called synchronize() or mark_ready(): prepare() is "
                "collective, call it on every rank",
                opt_);
    if (v[1] != -v[2])  // (all in prepare(): the calls are the negated values)
      ctl_.fail(impl::ErrorKind::mismatch,
                impl::cat("the ranks reached the exchange in different synchronize() calls (", v[1] < 0 ? v[2] : v[1],
                          " to ", v[1] < 0 ? -v[1] : -v[2],
                          "): a rank called synchronize() more often than the others"),
                opt_);
    const bool options_differ = v[3] != -v[4] || v[5] != -v[6];
    check_consistency(v[0] < 0, options_differ);  // names the option when they differ
    if (!commit || !agreed_) return;
    std::int64_t go = 0;
    ctl_.allreduce_min(backend_, &go, 1, opt_, impl::WaitSite{"arrival confirmation", call, -1, 0});
  }

  // The hash of this rank's option words, kept while max_chunk_elements() (a test override) holds.
  std::uint64_t option_hash() {
    const std::size_t max_chunk = impl::max_chunk_elements();
    if (!option_hash_valid_ || hashed_max_chunk_ != max_chunk) {
      option_hash_ = impl::OptionWords(opt_, int(sizeof(value_type)), 0, max_chunk, facts_).hash_without_calls();
      hashed_max_chunk_ = max_chunk;
      option_hash_valid_ = true;
    }
    return option_hash_;
  }

  void reduce_data_parallel(bool aggregated) {
    begin_step();
    launch_through(chunks_.size(), aggregated);
    while (completed_ < launched_) complete_chunk(completed_++);
    step_open_ = false;
  }

  // fusion_threshold_auto: time this step, move to the next candidate or settle.
  void tune(double seconds) {
    if (tuner_.record(seconds, [&](double* v, std::size_t n) { backend_.allreduce_max(v, n); })) {
      dirty_ = true;
      apply_choice();
    }
    if (timeline_) timeline_->tuned(seconds, fusion_threshold_bytes(), to_string(algorithm()), !tuner_.active());
  }

  // The candidate to run now. The same on every rank: the topology is, the options are compared,
  // and the tuner moves on after the same number of steps and picks from agreed timings.
  void apply_choice() {
    const impl::PlanChoice& c = choices_[tuner_.current()];
    hierarchical_ = c.algorithm == Algorithm::hierarchical;
    blocking_ = collectives_block_ || hierarchical_;  // the three stages are blocking calls
    in_flight_ = c.in_flight;
    stats_.nodes = std::uint64_t(topology_.nodes);
    stats_.algorithm = c.algorithm;
    stats_.chunk_bytes = c.chunk_bytes;
    stats_.chunks_in_flight = std::uint64_t(blocking_ ? 1 : c.in_flight);
  }

  static Topology find_topology(const Backend& b) {
    if constexpr (impl::has_topology<Backend>::value) {
      return b.topology();
    } else {
      Topology t;  // cannot tell: one node
      t.local_size = t.min_local_size = t.max_local_size = b.size();
      t.local_rank = b.rank();
      return t;
    }
  }

  // What the plan may run: the options' values, and where they leave the choice to the plan, the
  // topology's. Across nodes (the network between some ranks) chunks are smaller and fewer are in
  // flight (docs/BENCHMARKS.md, "Across hosts"); Algorithm::automatic there times flat against
  // hierarchical when some node holds several ranks. Each further chunk size of
  // fusion_threshold_auto is a candidate too.
  static std::vector<impl::PlanChoice> plan_candidates(const Options& o, const Topology& t) {
    const bool network = t.spans_nodes();
    std::vector<std::size_t> sizes;
    if (o.fusion_threshold_bytes == fusion_threshold_auto)
      sizes = impl::chunk_candidates();
    else if (o.fusion_threshold_bytes == fusion_threshold_by_topology)
      sizes = {network ? std::size_t(1) << 20 : std::size_t(4) << 20};
    else
      sizes = {o.fusion_threshold_bytes};
    const int in_flight = o.max_chunks_in_flight > 0 ? o.max_chunks_in_flight : network ? 2 : 16;
    std::vector<Algorithm> algorithms;
    if (o.algorithm == Algorithm::hierarchical) {
      if constexpr (!impl::has_hierarchical_sum<Backend>::value)
        throw ConfigError(impl::cat("algorithm = hierarchical, but backend '", Backend::name(),
                                    "' has no hierarchical sum (MpiBackend has); use flat or automatic"));
      algorithms = {Algorithm::hierarchical};
    } else if (o.algorithm == Algorithm::automatic && t.hierarchical_helps() &&
               impl::has_hierarchical_sum<Backend>::value) {
      algorithms = {Algorithm::flat, Algorithm::hierarchical};
    } else {
      algorithms = {Algorithm::flat};
    }
    std::vector<impl::PlanChoice> c;
    for (Algorithm a : algorithms)
      for (std::size_t b : sizes) c.push_back({b, in_flight, a});
    return c;
  }

  // Host staging: when the backend cannot read the buffer's memory space, or when asked to.
  bool staging_wanted() const {
    return opt_.host_staging == HostStaging::always || !backend_.template can_access<memory_space>();
  }
  bool use_host_staging() {
    if (opt_.host_staging == HostStaging::never && !backend_.template can_access<memory_space>())
      fail_here(impl::ErrorKind::config,  // its peers may wait in the agreement already (blocking path)
                impl::cat("host_staging = never, but backend '", Backend::name(),
                          "' cannot access the gradients' memory space ", memory_space::name()));
    return staging_wanted();
  }

  // Buffers of compressed chunks, when the plan has any: the 16-bit copy (the fusion buffer's
  // layout), its host staging when the backend cannot sum 16-bit values where they live
  // (MpiBackend on device memory: its op runs on the CPU), the residuals (zero at every plan build:
  // fused positions may have moved) and, for fp16, the overflow flag.
  void plan_wire(std::size_t capacity, std::int64_t total, const std::vector<Seg>& segs) {
    bool any = false, fp16 = false;
    for (const impl::Chunk& ch : chunks_) {
      any = any || ch.kind != 0;
      fp16 = fp16 || ch.kind == int(Compression::fp16);
    }
    wire_staged_ = false;
    host_segs_.clear();
    if (!any) {
      wire_ = WireBuffer();
      wire_staging_ = {};
      residual_ = Buffer();
      overflow_ = {};
      return;
    }
    if (!impl::sums_wire<Backend>::value)  // every rank has the same backend type: all throw here
      throw ConfigError(impl::cat("compression (Options::compression or a group's CompressWith) needs a backend that "
                                  "sums 16-bit values; backend '", Backend::name(), "' does not declare "
                                  "sums_wire_values (backend_traits.hpp): use Compression::none with it"));
    wire_staged_ = staged_ || !impl::reduces_wire_in<memory_space>(backend_);
    ensure_on_huge_pages(wire_, capacity, "gradsync::wire_buffer");  // MPI copies from it (huge_pages.hpp)
    if (wire_staged_) ensure(wire_staging_, capacity, "gradsync::wire_staging");
    if (opt_.error_feedback) {
      ensure(residual_, std::size_t(total), "gradsync::residual");
      const std::vector<value_type> zeros(residual_.extent(0), value_type(0));
      impl::upload_buffer(residual_, zeros.data(), zeros.size());
    }
    if (fp16) {
      ensure(overflow_, 1, "gradsync::overflow");
      ensure(overflow_host_, 1, "gradsync::overflow_host");
      const std::int64_t zero = 0;
      impl::upload_buffer(overflow_, &zero, 1);
      host_segs_ = segs;
    }
  }

  // fp16: a sum that is not finite fails the step on every rank (each holds the same sums, so each
  // finds the same flag: no message is needed), naming a tensor; the sync stays usable.
  void check_wire_overflow() {
    impl::copy_buffer(exec_, overflow_host_, 0, overflow_, 0, 1);
    impl::fence(exec_, impl::label_fence_sync());
    const std::int64_t k = overflow_host_.data()[0];
    if (k == 0 && !wire_non_finite_) return;
    const std::int64_t zero = 0;
    if (k != 0) impl::upload_buffer(overflow_, &zero, 1);
    const value_type* p = k != 0 ? host_segs_[std::size_t(k - 1)].ptr : wire_non_finite_;  // the same on every rank
    wire_non_finite_ = nullptr;
    std::string which = "a data-parallel gradient";
    for (const Entry& e : entries_)
      if (!e.local() && p >= e.data && p < e.data + e.size)
        which = impl::cat("gradient '", e.name, "' (group ", e.group, ", ", e.size, " values)");
    throw Error(impl::cat(
        "the fp16 sum of ", which, " is not finite in synchronize() call ", stats_.passes,
        " (on every rank): a value or a partial sum beyond fp16's largest, 65504, or a NaN/Inf gradient. "
        "The gradients of this step are not usable; skip it, or use Compression::bf16 (fp32's range), a smaller "
        "prescale_factor, or keep this group in full precision (CompressWith<Compression::none>); "
        "see docs/COMPRESSION.md"));
  }

  void finish_local(bool aggregated) {
    impl::TimelineScope span(n_local_segs_ ? timeline_.get() : nullptr, impl::Timeline::Kind::local, "local scaling",
                             n_local_segs_);
    impl::launch_segments(impl::label_local(), exec_, n_local_segs_,
                          impl::LocalKernel<value_type, execution_space, memory_space>{
                              local_segs_, local_acc_, aggregated ? impl::LocalMode::finish : impl::LocalMode::scale});
  }

  Backend backend_;
  Options opt_;
  impl::LogLevel log_ = impl::LogLevel::off;  // GRADSYNC_LOG
  bool announced_ = false;                    // announce() ran (first plan build)
  execution_space exec_;
  std::vector<Entry> entries_;
  Stats stats_;

  // The plan, rebuilt when registrations change.
  bool dirty_ = true;
  bool windowed_ = true;
  int pass_ = 0;
  static constexpr std::int64_t pipeline_depth = 2;  // buffer slots for nonblocking packed chunks
  std::vector<impl::Chunk> chunks_;
  std::vector<value_type*> plan_first_ptr_;  // per chunk, its first value in the gradients
  std::int64_t slot_size_ = 0;
  std::int64_t slots_ = pipeline_depth;
  bool staged_ = false;
  bool in_place_ = false;  // contiguous chunks are reduced in the gradients' memory
  // The step in progress: chunks launched and completed so far, and which are ready.
  bool step_open_ = false;
  std::size_t launched_ = 0, completed_ = 0;
  impl::ReadyTracker ready_;
  Topology topology_;
  std::vector<impl::PlanChoice> choices_;  // what the plan may run (plan_candidates)
  impl::PlanTuner tuner_;                  // which of them runs now
  bool collectives_block_ = false;  // Options::collectives as resolved for this backend
  bool blocking_ = false;           // one blocking allreduce per chunk (collectives_block_, or hierarchical)
  bool hierarchical_ = false;       // chunks summed in three stages (Algorithm::hierarchical)
  int in_flight_ = 1;               // nonblocking chunks reduced at once
  bool agreed_ = false;    // side channel: the ranks agree before each exchange (agree_before_exchange)
  bool agreed_once_ = false;  // the first agreement ran (all a backend without a side channel runs)
  impl::ProtocolFacts facts_;  // what this rank resolved beyond Options; agreed with the options
  std::uint64_t option_hash_ = 0;
  std::size_t hashed_max_chunk_ = 0;
  bool option_hash_valid_ = false;
  std::vector<typename Backend::Request> requests_;   // per chunk
  std::vector<std::int64_t> slot_of_, prev_in_slot_;  // per chunk: its slot (-1: in place), the slot's previous chunk
  impl::BufferView<value_type, impl::staging_space_t<memory_space>> staging_;
  SegView dp_segs_, local_segs_, deferred_segs_;
  std::int64_t n_deferred_segs_ = 0;
  bool pending_ = false;  // deferred local scales not yet applied (local_scale_pending)
  // Options::check_finite's per-segment flags (Kokkos execution spaces only).
  std::conditional_t<Kokkos::is_execution_space<execution_space>::value, impl::FiniteScratch<memory_space>,
                     impl::NoFiniteScratch>
      finite_;
  std::int64_t n_dp_segs_ = 0, n_local_segs_ = 0;
  Buffer buffer_, local_acc_;
  // Compression (plan_wire): the 16-bit chunks, their host staging, this rank's rounding residuals
  // (error feedback, by fused position), the fp16 overflow flag and the segments, to name a tensor.
  WireBuffer wire_;
  impl::BufferView<std::uint16_t, impl::staging_space_t<memory_space>> wire_staging_;
  bool wire_staged_ = false;
  const value_type* wire_non_finite_ = nullptr;  // fp16 in place: a sum the ring found not finite this step
  Buffer residual_;
  impl::BufferView<std::int64_t, memory_space> overflow_;
  impl::BufferView<std::int64_t, impl::staging_space_t<memory_space>> overflow_host_;
  std::vector<Seg> host_segs_;
  value_type pre_factor_ = 1, post_factor_ = 1;
  bool need_check_ = true;  // registrations changed since the ranks last compared them
  bool merge_neighbours_ = false;  // every rank has the same neighbours in memory (agree_on_neighbours)
  impl::Control<Backend> ctl_;  // side channel: consistency check, stall reports, peer failures
  std::unique_ptr<impl::Timeline> timeline_;  // Options::timeline; null when off
  impl::row_sparse_set_t<value_type, memory_space, execution_space> sparse_;  // RowSparse gradients
  impl::ProcessSets<Backend, value_type, execution_space> sets_;  // ReduceOver groups' sets
};

}  // namespace gradsync
