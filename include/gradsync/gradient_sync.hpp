// gradsync: GradientSync, the fused synchronization of a model's gradients.
//
// Data-parallel groups are packed into a persistent fusion buffer in the tensors' own memory space,
// reduced chunk by chunk by the backend, and unpacked with every scale factor folded into one
// multiplication. Local groups never enter the buffer; their scale is applied in place.
//
// GradientSync is the facade: it keeps the public API and wires together the parts that do the
// work, each readable alone: impl::SyncStep (the step's states, which call is legal when, and the
// failure protocol: read it first), impl::SyncRegistry (the registered gradients), impl::SyncPlan
// (what to send, in which chunks, by which algorithm), impl::SyncEngine (running the plan on the
// backend) and impl::SyncChecks (every cross-rank agreement). It owns what they share
// (impl::SyncContext).
//
// Each public function's comment says whether it is collective (every rank of the backend's
// communicator calls it, in the same order) and in which states it is legal.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "backend_traits.hpp"
#include "compression.hpp"
#include "config.hpp"
#include "describe.hpp"
#include "env.hpp"
#include "error.hpp"
#include "impl/backend_order.hpp"
#include "impl/demangle.hpp"
#include "impl/fusion_kernels.hpp"
#include "impl/launcher.hpp"
#include "impl/one_thread.hpp"
#include "impl/profiling.hpp"
#include "impl/stall.hpp"
#include "impl/sync_access.hpp"
#include "impl/sync_checks.hpp"
#include "impl/sync_context.hpp"
#include "impl/sync_engine.hpp"
#include "impl/sync_plan.hpp"
#include "impl/sync_registry.hpp"
#include "impl/sync_step.hpp"
#include "impl/timeline.hpp"
#include "impl/watched.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"
#include "process_set.hpp"
#include "row_sparse.hpp"
#include "stats.hpp"
#include "tensor_traits.hpp"
#include "topology.hpp"

namespace gradsync {
namespace impl {

template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {};

}  // namespace impl

/// The fused synchronization of a model's gradients over one backend's communicator: register the
/// gradients once (add<Group>()), then call synchronize() after each backward pass, optionally
/// mark_ready() each gradient as backward produces it to overlap the exchange with backward.
/// `Backend`: MpiBackend, NcclBackend or SelfBackend. `Tensor`: the gradients' type (a Kokkos::View,
/// std::vector<T>, Span<T, MemorySpace>, or any type with a TensorTraits specialisation).
/// Steps go idle -> (accumulating ->) open -> idle; any exception inside a collective phase leaves
/// the sync failed on every rank for good (docs/ERRORS.md). Each function below says whether it is
/// collective (every rank of the backend's communicator calls it, in the same order) and in which
/// of these states it is legal.
template <class Backend, class Tensor>
class GradientSync {
  using traits = TensorTraits<Tensor>;
  static_assert(is_tensor_v<Tensor>,
                "gradsync::GradientSync<Backend, Tensor>: Tensor must be a Kokkos::View, std::vector<T> or "
                "gradsync::Span<T, MemorySpace>, or have a gradsync::TensorTraits specialisation");

 public:
  using backend_type = Backend;                              ///< The backend (MpiBackend, NcclBackend, ...).
  using tensor_type = Tensor;                                ///< The gradients' tensor type.
  using value_type = typename traits::value_type;            ///< float or double.
  using memory_space = typename traits::memory_space;        ///< Where the gradients live.
  using execution_space = typename traits::execution_space;  ///< Where packing and scaling run.

  static_assert(is_supported_value_v<value_type>,
                "gradsync::GradientSync: gradients must hold float or double (the types with a built-in "
                "MPI and NCCL sum)");
  static_assert(impl::reads_memory_space<Backend, memory_space>::value,
                "gradsync::GradientSync<Backend, Tensor>: the backend cannot read the tensors' memory space "
                "(NcclBackend reads device memory only: NCCL cannot read host memory; use MpiBackend for host "
                "tensors)");
  // Each member the sync calls, the first one missing named (backend.hpp lists them).
  static_assert(impl::check_backend<Backend, value_type, memory_space>());

  /// A sync over `backend`'s communicator; `exec` runs its packing and scaling kernels. Applies the
  /// GRADSYNC_* environment (unless Options::tuning.read_environment is off) and validates the
  /// options (ConfigError). Local: no communication (the ranks compare options at the first
  /// collective call); allocates only bookkeeping, the fusion buffer comes at the first
  /// synchronize() or prepare().
  explicit GradientSync(Backend backend, Options options = {}, execution_space exec = {})
      : backend_(impl::unfailed(std::move(backend))),
        opt_(prepare_options(options, backend_)),
        log_(opt_.tuning.read_environment ? impl::env_log_level() : impl::LogLevel::off),
        exec_(exec),
        plan_(backend_, opt_, impl::ordered_on(backend_, exec_)),
        checks_(backend_, plan_.collectives_block(), Plan::staging_wanted(backend_, opt_), plan_.candidates_hash()),
        ctl_(backend_, opt_) {
    plan_.apply_choice(stats_);
    timeline_ = impl::open_timeline(opt_.tuning.timeline, backend_.rank(), backend_.size(), ctl_);
    impl::region_names();  // built now: no step allocates them, tool or not
  }

  // One sync owns one communicator's exchange: copies would share it.
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  /// Moving (into a DistributedOptimizer) is legal in any state: requests and buffers in flight are
  /// handles to heap memory, which the new object takes over. The moved-from object only accepts
  /// destruction; its other calls throw. Local; allocates nothing.
  GradientSync(GradientSync&&) = default;
  GradientSync& operator=(GradientSync&&) = delete;

  /// Destroying a sync between steps frees its buffers and communicators (local). Destroying it while a
  /// step is open (an exception from the user's backward after mark_ready(), say) abandons the step:
  /// its peers are told (each throws an Error naming this rank) and everything its collectives in
  /// flight may still touch is parked, never freed, so later MPI calls of the program are safe.
  ~GradientSync() {
    if (step_.state() == impl::StepState::moved_from || step_.failed()) return;  // a failed one told its peers
    if (!step_.open()) {  // peers that wait in a call this rank never makes stop at once (GONE)
      ctl_.tell_gone(std::uncaught_exceptions() > 0, last_error_);
      return;
    }
    fail_step(impl::ErrorKind::error,
              impl::cat("rank ", backend_.rank(),
                        " abandoned its step with the exchange in flight: its GradientSync was "
                        "destroyed",
                        std::uncaught_exceptions() > 0 ? " while an exception unwound the stack" : "",
                        " before synchronize() returned"),
              "the GradientSync's destructor");
  }

  /// Registers a gradient in `Group`. Any contiguous tensor with this sync's value type and memory
  /// space is accepted (a View of any rank, a vector, a Span). `name` appears in error messages.
  /// Local (not collective); legal between steps only. The ranks compare the data-parallel
  /// registrations at the next collective call, which also rebuilds the plan (and its buffers).
  template <class Group, class U>
  void add(const U& tensor, std::string name = {}) {
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::add: argument is not a tensor gradsync knows");
    impl::OneThread::Scope one(one_thread_, "add()", backend_.rank());
    refusing([&] { add_dense<Group>(tensor, std::move(name)); });
  }

  /// Refused at compile time: a temporary container would dangle, since the sync refers to a
  /// std::vector's values (and re-reads its size) at every synchronize(). Views and Spans are
  /// handles and may be temporaries.
  template <class Group, class U,
            class = std::enable_if_t<!std::is_lvalue_reference_v<U> && impl::owns_values_v<std::remove_cv_t<U>>>>
  void add(U&&, std::string = {}) {
    static_assert(impl::dependent_false_v<U>,
                  "gradsync::GradientSync::add: a temporary std::vector would dangle: register an lvalue that "
                  "outlives the sync");
  }

  /// Binds this rank's process set for the groups whose policy is ReduceOver<Tag>
  /// (process_set.hpp): the ranks it reduces those groups with, itself included. Local; legal
  /// between steps only; the communicator is created, collectively, at the next synchronize() or
  /// prepare().
  template <class Tag>
  void bind_process_set(std::vector<int> ranks) {
    static_assert(impl::has_split<Backend>::value,
                  "gradsync::GradientSync::bind_process_set: the backend cannot split its communicator "
                  "(MpiBackend and SelfBackend can)");
    impl::OneThread::Scope one(one_thread_, "bind_process_set()", backend_.rank());
    refusing([&] {
      step_.require_between_steps("bind_process_set()", opt_.backward_passes_per_step);
      begin_change();
      sets_.bind(impl::type_name<Tag>(), std::move(ranks), backend_.rank(), backend_.size());
    });
  }

  /// Registers a row-sparse gradient (row_sparse.hpp): only its rows are scaled (local group) or
  /// exchanged (data-parallel group), after the dense chunks. Needs backward_passes_per_step == 1
  /// (ConfigError). Local; legal between steps only.
  template <class Group, class V, class I>
  void add(const RowSparse<V, I>& rows, std::string name = {}) {
    static_assert(std::is_same_v<typename RowSparse<V, I>::value_type, value_type>,
                  "gradsync::GradientSync::add: the RowSparse values' type differs from the sync's");
    static_assert(std::is_same_v<typename RowSparse<V, I>::memory_space, memory_space>,
                  "gradsync::GradientSync::add: the RowSparse lives in another memory space than the sync's");
    impl::OneThread::Scope one(one_thread_, "add()", backend_.rank());
    refusing([&] { add_sparse<Group>(rows, std::move(name)); });
  }

 private:
  // add<Group>(rows)'s body.
  template <class Group, class V, class I>
  void add_sparse(const RowSparse<V, I>& rows, std::string name) {
    step_.require_between_steps("add()", opt_.backward_passes_per_step);
    const std::string group = impl::type_name<Group>();
    const std::size_t index = registry_.count_in_group(group) + sparse_.count_in_group(group);
    const std::string shown = name.empty() ? impl::cat(group, "[", index, "]") : name;
    if (rows.capacity() == 0)
      throw Error(impl::cat("row-sparse gradient '", shown, "' (group ", group, ") on rank ", backend_.rank(),
                            " is an empty RowSparse handle (default-constructed): register one built from values and "
                            "indices"));
    if (opt_.backward_passes_per_step != 1)
      throw ConfigError(impl::cat("row-sparse gradient '", shown, "' (group ", group,
                                  "): backward_passes_per_step must be 1 for RowSparse gradients (got ",
                                  opt_.backward_passes_per_step, ")"));
    const value_type* p = rows.values().data();
    const std::size_t n = std::size_t(rows.capacity() * rows.row_width());
    if (const Entry* o = registry_.find_overlap(p, n))
      throw Error(impl::cat("row-sparse gradient '", shown, "' (group ", group, ") overlaps tensor '", o->name,
                            "' (group ", o->group, ") already registered"));
    if constexpr (is_set_reduced_v<Group>)
      if (weighted() && LocalVarPolicy<Group>::set_scale == SetScale::set_size)
        unsupported_with_samples(
            impl::cat("row-sparse gradient '", shown, "' (group ", group, ", SetScale::set_size)"));
    if constexpr (is_set_reduced_v<Group>)
      sets_.set_of(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), shown, group, backend_.rank())
          .sparse.push_back(rows.table_rows() * rows.row_width());
    begin_change();
    if constexpr (impl::needs_samples<Group>())
      note_needs_samples(impl::cat("row-sparse gradient '", shown, "' (group ", group, ")"));
    sparse_.template add<Group>(rows, std::move(name), index, backend_.size(), backend_.rank());
  }

 public:
  /// Horovod parity: at run time, makes a registered gradient local (never communicated). It is
  /// scaled by 1/world_size when Options::scale_local_gradients is set. Local; legal between steps
  /// only (the ranks compare the change at the next collective call).
  template <class U>
  void register_local_var(const U& tensor) {
    using UT = TensorTraits<U>;
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::register_local_var: argument is not a tensor");
    impl::OneThread::Scope one(one_thread_, "register_local_var()", backend_.rank());
    refusing([&] {
      step_.require_between_steps("register_local_var()", opt_.backward_passes_per_step);
      Entry* e = registry_.find(UT::data(tensor), UT::size(tensor));
      if (!e)
        throw Error(impl::cat("register_local_var: the tensor (", UT::size(tensor),
                              " elements) is not registered with add<Group>() on rank ", backend_.rank()));
      if (e->runtime_local) return;
      begin_change();
      e->runtime_local = true;
    });
  }

  /// Uneven data: this rank's number of samples in the current backward pass, `n >= 0` (0: the
  /// rank joins the step and weighs nothing). From the first call on the sync is weighted, and every
  /// rank gives a count on every pass: after the Nth pass of a step, with N = the sum of every
  /// rank's counts over the step's passes, a data-parallel average is sum_r sum_k n_rk g_rk / N (the
  /// gradient of the mean loss over every sample), `op = sum` gives sum_r sum_k n_rk g_rk, and a
  /// local tensor scaled by the world size holds sum_k n_rk g_rk / N on rank r (LocalScale::none:
  /// unweighted; LocalScale::samples: sum_k g_rk / N, for gradients that already sum every
  /// sample's contribution), ReduceOver sets sum the weighted gradients and divide by N
  /// (SetScale::samples: unweighted, / N), RowSparse rows likewise. N = 0 on every rank: zero
  /// gradients, counted in stats().empty_steps. The factors go into the pack, unpack and local
  /// kernels; N crosses in the arrival round. A ConfigError with average_aggregated_gradients,
  /// SetScale::set_size or a deferred local scale. Local; call it before the pass's first
  /// mark_ready() or synchronize(); the first call is legal between steps only.
  void set_samples(std::int64_t n) {
    impl::OneThread::Scope one(one_thread_, "set_samples()", backend_.rank());
    refusing([&] { count_samples(n); });
  }

  /// Call after each backward pass. Returns true when the gradients hold synchronized values
  /// (every Nth call, N = backward_passes_per_step); otherwise they are accumulated internally.
  /// Collective; legal in every state but failed. An exception from it leaves the sync failed on
  /// every rank (each names the rank that failed first), except the fp16 overflow, after which the
  /// sync goes on (docs/ERRORS.md). [[nodiscard]]: applying the optimizer after a false return
  /// applies a partial sum (GRADSYNC_BACKWARD_PASSES_PER_STEP changes N without changing the code).
  /// Allocates the plan's buffers at the first call and after registrations change; a steady step
  /// allocates nothing.
  [[nodiscard]] bool synchronize() {
    impl::OneThread::Scope one(one_thread_, "synchronize()", backend_.rank());
    step_.require_usable("synchronize()");
    impl::ProfileRegion region(impl::Region::synchronize);
    call_ = std::int64_t(stats_.passes) + 1;
    const value_type* overflow = nullptr;
    const bool done = collective("synchronize()", [&] { return sync_pass(overflow); });
    ctl_.call_done();
    if (overflow) {  // every rank holds the same sums, so every rank throws this; the sync goes on
      Context cx = ctx();
      Checks::throw_wire_overflow(cx, registry_, overflow);
    }
    return done;
  }

  /// Pays the first call's one-time costs before training starts: the ranks compare their
  /// registrations (the consistency check), the plan is built, host gradients reduced in place move
  /// onto huge pages and the buffers are allocated. Collective: every rank calls it, at the same
  /// point (over MpiBackend, a rank that calls synchronize() instead is a MismatchError everywhere);
  /// legal between steps only.
  /// Gradient values are not touched; the next synchronize() builds nothing unless registrations
  /// change in between. fusion_threshold_auto still times its candidates on the first steps.
  /// Allocates what the first synchronize() would (the fusion buffer, staging, process sets'
  /// communicators).
  void prepare() {
    impl::OneThread::Scope one(one_thread_, "prepare()", backend_.rank());
    step_.require_between_steps("prepare()", opt_.backward_passes_per_step);
    impl::ProfileRegion region(impl::Region::prepare);
    call_ = std::int64_t(stats_.passes) + 1;
    collective("prepare()", [&] {
      checks_before_pass(true);
      if (plan_.dirty()) build_plan();
    });
    ctl_.call_done();
  }

  /// Overlap with backward: tells the sync that this gradient is final for the current pass. A
  /// chunk is reduced as soon as it and every chunk before it in fused order hold only ready
  /// gradients (so all ranks issue the same collectives whatever order they mark tensors in);
  /// synchronize() reduces the rest. The default fused order is reversed registration order, the
  /// order backward produces gradients in. Marking is optional, repeated marks have no effect,
  /// local tensors need none. With backward_passes_per_step = N > 1 only the Nth pass of a cycle
  /// reduces: marks on passes 1 .. N-1 have no effect (synchronize() accumulates them), marks on
  /// the Nth pass launch chunks of the accumulated sums. A gradient must not change after its mark
  /// until synchronize() returns. Collective when it opens the step (the ranks' arrival check runs
  /// then), and with Options::check_finite each chunk is scanned before it is launched; legal in
  /// every state but failed. Builds the plan (allocates its buffers) when registrations changed;
  /// otherwise allocates nothing.
  template <class U>
  void mark_ready(const U& tensor) {
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::mark_ready: argument is not a tensor");
    impl::OneThread::Scope one(one_thread_, "mark_ready()", backend_.rank());
    step_.require_usable("mark_ready()");
    const value_type* p = TensorTraits<U>::data(tensor);
    std::int64_t i = plan_.dirty() ? -1 : engine_.find_ready_slot(p);
    if (i < 0 && !registry_.find(p, TensorTraits<U>::size(tensor)))  // misuse: rejected, the step goes on
      throw Error(impl::cat("mark_ready: the tensor (", TensorTraits<U>::size(tensor),
                            " elements) is not registered with add<Group>() on rank ", backend_.rank()));
    call_ = std::int64_t(stats_.passes) + 1;
    impl::ProfileRegion region(impl::Region::mark_ready);
    collective("mark_ready()", [&] {
      if (plan_.dirty() && !step_.open()) {
        build_plan();
        i = engine_.find_ready_slot(p);
      }
      if (i < 0) return;  // local or empty
      if (timeline_) timeline_->mark(i);
      // Blocking collectives are never started here: a rank blocked in chunk k while another is
      // still in backward (or in the model's own collectives) would hang both.
      if (plan_.blocking() || step_.pass() + 1 < opt_.backward_passes_per_step) return;  // not a reducing pass
      if (!step_.open()) checks_before_pass();  // the ranks agree before the step's first collective
      begin_step();
      engine_.mark_ready(std::size_t(i));
      advance();
    });
  }

  /// Lets chunks launched by mark_ready advance and launches those that became possible. Call it
  /// while waiting during backward (e.g. while polling device events): MPI's nonblocking
  /// collectives progress only inside MPI calls. Never blocks; local (it only tests this rank's
  /// requests and launches chunks every rank launches in the same order); legal in every state but
  /// failed; allocates nothing.
  void progress() {
    impl::OneThread::Scope one(one_thread_, "progress()", backend_.rank());
    step_.require_usable("progress()");
    if (!step_.open() || plan_.blocking()) return;
    impl::ProfileRegion region(impl::Region::progress);
    collective("progress()", [&] { advance(); });
  }

  // --- Queries. Everything below that is const is local and legal in every state, failed included
  // (a failed sync still tells what it held). ---

  /// The chunk size the sync uses now (fusion_threshold_auto: the candidate being timed, then the
  /// chosen one).
  std::size_t fusion_threshold_bytes() const { return plan_.fusion_threshold_bytes(); }

  /// Where the backend's ranks are (one node of this many ranks for a backend that cannot tell).
  const Topology& topology() const { return plan_.topology(); }
  /// The algorithm chunks are summed with now (while tuning: the candidate being timed).
  Algorithm algorithm() const { return plan_.algorithm(); }
  /// Nonblocking chunks reduced at once now (Options::tuning.max_chunks_in_flight, or the plan's choice).
  int chunks_in_flight() const { return plan_.chunks_in_flight(); }
  /// Whether the first steps are still timing the plan's candidates.
  bool tuning() const { return plan_.tuner().active(); }

  /// This rank's counters: bytes and calls reduced, steps, plan builds, buffer bytes.
  const Stats& stats() const { return stats_; }
  /// The options in effect: the constructor's, after the GRADSYNC_* environment was applied.
  const Options& options() const { return opt_; }
  /// The backend the sync reduces over (its rank(), size(), communicator).
  const Backend& backend() const { return backend_; }
  /// Dense tensors registered with add<Group>() (row-sparse gradients not counted).
  std::size_t num_tensors() const { return registry_.size(); }
  /// Whether set_samples() made this sync weighted.
  bool weighted() const { return plan_.weighted(); }

  /// Bytes of data-parallel gradient one synchronize() hands to the backend.
  std::size_t data_parallel_bytes() const { return registry_.data_parallel_elements() * sizeof(value_type); }

  /// This rank's registrations, plan and options, for describe(sync) (describe.hpp). Allocates the
  /// returned summary.
  SyncSummary summary() const {
    SyncSummary s;
    s.backend = Backend::name();
    s.rank = backend_.rank();
    s.ranks = backend_.size();
    s.value_type = impl::type_name<value_type>();
    s.memory_space = memory_space::name();
    s.options = opt_;
    s.weighted = weighted();
    for (const Entry& e : registry_) {
      auto g = std::find_if(s.groups.begin(), s.groups.end(),
                            [&](const SyncSummary::Group& x) { return x.name == e.group; });
      if (g == s.groups.end()) {
        s.groups.push_back({e.group, e.policy_local, e.policy_scale});
        s.groups.back().compression = e.policy_local ? Compression::none : Registry::wire_of(e, opt_.compression);
        g = s.groups.end() - 1;
      }
      const std::size_t bytes = e.size * sizeof(value_type);
      ++g->tensors;
      g->bytes += bytes;
      if (e.runtime_local && !e.policy_local) ++g->runtime_local_tensors, g->runtime_local_bytes += bytes;
      (e.local() ? s.local_tensors : s.data_parallel_tensors) += 1;
      (e.local() ? s.local_bytes : s.data_parallel_bytes) += bytes;
    }
    s.planned = !plan_.dirty();
    s.fusion_threshold_bytes = fusion_threshold_bytes();
    s.tuning = tuning();
    s.blocking = plan_.blocking();
    s.topology = topology();
    s.algorithm = algorithm();
    s.chunks_in_flight = chunks_in_flight();
    const auto& choices = plan_.choices();
    s.plan_candidates = choices.size();
    for (std::size_t k = 0; k < choices.size() && !tuning() && choices.size() > 1; ++k)
      s.candidate_seconds.push_back({choices[k].chunk_bytes, choices[k].algorithm, plan_.tuner().timings()[k]});
    if (!s.planned) return s;
    s.staged = plan_.staged();
    s.chunks = plan_.num_chunks();
    for (std::size_t c = 0; c < plan_.num_chunks(); ++c) {
      const std::size_t bytes = plan_.wire_bytes(c);
      s.largest_chunk_bytes = std::max(s.largest_chunk_bytes, bytes);
      s.chunks_in_place += plan_.reduced_in_place(c);
      s.chunks_folded += plan_.reduced_in_place(c) && !plan_.blocking() && !plan_.hierarchical() &&
                         impl::folds_factor(backend_, bytes);
      s.chunks_compressed += plan_.chunk(c).kind != 0;
    }
    s.buffer_bytes = stats_.buffer_bytes;
    s.bytes_on_huge_pages = stats_.bytes_on_huge_pages;
    return s;
  }

  /// Whether the registered `tensor` is local (by its group's policy or at run time); an Error when
  /// it is not registered.
  template <class U>
  bool is_local(const U& tensor) const {
    const value_type* p = TensorTraits<U>::data(tensor);
    for (const Entry& e : registry_)
      if (e.data == p) return e.local();
    throw Error("is_local: the tensor is not registered");
  }

 private:
  // add<Group>(tensor)'s body (refusing() records what it throws).
  template <class Group, class U>
  void add_dense(const U& tensor, std::string name) {
    using UT = TensorTraits<U>;
    step_.require_between_steps("add()", opt_.backward_passes_per_step);
    static_assert(std::is_same_v<typename UT::value_type, value_type>,
                  "gradsync::GradientSync::add: the tensor's value type differs from the sync's");
    static_assert(std::is_same_v<typename UT::memory_space, memory_space>,
                  "gradsync::GradientSync::add: the tensor lives in another memory space than the sync's");
    static_assert(UT::is_writable, "gradsync::GradientSync::add: a gradient must be writable (not const)");
    Entry e;
    e.data = UT::data(tensor);
    e.size = UT::size(tensor);
    e.group = impl::type_name<Group>();
    // The group's row-sparse gradients count too: default names stay unique within it.
    e.index_in_group = registry_.count_in_group(e.group) + sparse_.count_in_group(e.group);
    e.named = !name.empty();
    e.name = name.empty() ? impl::cat(e.group, "[", e.index_in_group, "]") : std::move(name);
    e.policy_local = is_local_v<Group>;
    e.policy_scale = local_scale_v<Group>;
    e.weighting = impl::sample_weighting_of<Group>();
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
    if (const Entry* o = registry_.find_overlap(e.data, e.size))  // O(log n): 100,000 tensors register
      throw Error(impl::cat("tensor '", e.name, "' (group ", e.group, ") overlaps tensor '", o->name, "' (group ",
                            o->group, ") already registered",
                            e.data == o->data ? " (the same tensor registered twice)" : ""));
    sparse_.for_each_values([&](const value_type* p, std::size_t n, const std::string& on, const std::string& og) {
      if (impl::overlaps(e.data, e.size, p, n))
        throw Error(impl::cat("tensor '", e.name, "' (group ", e.group, ") overlaps row-sparse gradient '", on,
                              "' (group ", og, ") already registered"));
    });
    if constexpr (is_set_reduced_v<Group>)
      if (weighted() && LocalVarPolicy<Group>::set_scale == SetScale::set_size)
        unsupported_with_samples(impl::cat("tensor '", e.name, "' (group ", e.group, ", SetScale::set_size)"));
    begin_change();
    if constexpr (impl::needs_samples<Group>())
      note_needs_samples(impl::cat("tensor '", e.name, "' (group ", e.group, ")"));
    if constexpr (is_set_reduced_v<Group>)
      sets_.add(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), e.data, e.size, e.name, e.group,
                LocalVarPolicy<Group>::set_scale, backend_.rank());
    const value_type* data = e.data;
    try {
      registry_.push_back(std::move(e));
    } catch (...) {  // all or nothing: the set forgets it too
      if constexpr (is_set_reduced_v<Group>)
        sets_.withdraw(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), data);
      throw;
    }
  }

  // gradsync's own helpers (DistributedOptimizer, GlobalNorm, broadcast_set_parameter) reach what
  // follows through impl::SyncAccess: the deferred local scale and the watched collectives are an
  // agreement between them and the sync, not a user's API.
  friend struct impl::SyncAccess;

  // ---- The deferred local scale: a local tensor's scale (1/world_size, 1/N) left to the caller ----

  /// Leaves the local scale of this tensor (1/world_size and 1/N, see local_scale_of) to the caller
  /// instead of a pass of its own: after synchronize() returns true the tensor holds the unscaled
  /// sum, and pending_scale(tensor) is the factor the caller must apply (DistributedOptimizer folds
  /// it into the optimizer's update). Takes effect only while the tensor is local; rank-local (the
  /// ranks need not agree). Local; legal between steps only (a change inside an aggregation cycle or
  /// an open step is refused).
  template <class U>
  void defer_local_scale(const U& tensor, bool defer = true) {
    Entry& e = registry_.at(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "defer_local_scale",
                            backend_.rank());
    if (e.defer_scale == defer) return;
    step_.require_between_steps(impl::cat("defer_local_scale('", e.name, "', group ", e.group, ")"),
                                opt_.backward_passes_per_step);
    e.defer_scale = defer;
    plan_.invalidate();  // the local segments change; nothing the ranks compare does
  }

  /// The factor synchronize() applies to a local tensor (or leaves to the caller when deferred):
  /// 1/world_size by its policy (or scale_local_gradients), times 1/N with
  /// average_aggregated_gradients; 1 for a data-parallel tensor, whose factors go into the unpack.
  template <class U>
  value_type local_scale_of(const U& tensor) const {
    return Registry::local_factor(
        registry_.at(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "local_scale_of", backend_.rank()),
        opt_, backend_.size());
  }

  /// The factor the tensor's values still need: local_scale_of(tensor) for a deferred local tensor
  /// after synchronize() returned true (until apply_local_scale()), 1 otherwise.
  template <class U>
  value_type pending_scale(const U& tensor) const {
    const Entry& e =
        registry_.at(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor), "pending_scale", backend_.rank());
    return pending_ ? Registry::deferred_factor(e, opt_, backend_.size()) : value_type(1);
  }

  /// Whether deferred local scales are pending (synchronize() returned true, apply_local_scale() not
  /// called since).
  bool local_scale_pending() const { return pending_; }

  /// Applies the pending deferred scales in place (one pass over the deferred tensors, the values
  /// synchronize() would have left without deferral), after which nothing is pending. Local; legal
  /// in every state but failed.
  void apply_local_scale() {
    impl::OneThread::Scope one(one_thread_, "apply_local_scale()", backend_.rank());
    step_.require_usable("apply_local_scale()");
    if (!pending_) return;
    Context cx = ctx();
    engine_.apply_deferred(cx);
    impl::fence(exec_, impl::label_fence_sync());
    pending_ = false;
  }

  /// Calls f(data, size, is_local, deferred) for every registered gradient in registration order;
  /// `deferred` is the factor its values need while local_scale_pending() (1 when not deferred).
  template <class F>
  void for_each_gradient(F&& f) const {
    for (const Entry& e : registry_) f(e.data, e.size, e.local(), Registry::deferred_factor(e, opt_, backend_.size()));
  }

  /// For gradsync's own collective helpers (GlobalNorm, DistributedOptimizer): runs `run(watched)`, where `watched`
  /// (impl::Watched) has the backend's collectives, each waited under the stall watchdog and listening for the peers'
  /// failures; `what` names them in reports. An exception fails the sync like any collective phase.
  /// Collective; legal in every state but open and failed.
  // `world`: false for a call over a process set (its members only), which the ledger of calls over
  // every rank does not count.
  template <class F>
  decltype(auto) helper_collective(const char* call, const char* what, F&& run, bool world = true) {
    impl::OneThread::Scope one(one_thread_, call, backend_.rank());
    step_.require_usable(call);
    if (step_.open())
      throw Error(impl::cat(call,
                            " called while a step is open (mark_ready() started its exchange); call it after "
                            "synchronize() returned"));
    const CallDone done{ctl_, world};
    return collective(call, [&]() -> decltype(auto) {
      return run(impl::Watched<Backend>(backend_, ctl_, opt_, std::int64_t(stats_.passes), what));
    });
  }
  // gradsync::wait_all (watch.hpp): the program's own requests waited under this sync's watchdog, in
  // any state but failed. Not a call of the ledger (the program's exchange may involve some ranks
  // only); a peer whose sync ended normally may still take part, so only an error ends the wait.
  template <class Done>
  void watch_program(const char* what, Done&& done) {
    impl::OneThread::Scope one(one_thread_, "gradsync::wait_all()", backend_.rank());
    step_.require_usable("gradsync::wait_all()");
    const char* outer = ctl_.call_name();
    collective("gradsync::wait_all()", [&] {
      ctl_.wait_for_program(done, opt_, impl::WaitSite{what, std::int64_t(stats_.passes), -1, 0});
    });
    ctl_.enter_call(outer);
  }

  // Counts a helper's collective call in the ledger when it returns (not when it throws).
  struct CallDone {
    impl::Control<Backend>& ctl;
    bool counted = true;
    int unwinding = std::uncaught_exceptions();
    ~CallDone() {
      if (counted && std::uncaught_exceptions() == unwinding) ctl.call_done();
    }
  };

  // For helpers that call MPI themselves (save_checkpoint, load_checkpoint): the state check of
  // helper_collective() without its failure path, so that a refused checkpoint leaves the sync usable.
  void require_between_steps(const char* call) const {
    step_.require_usable(call);
    if (step_.open())
      throw Error(impl::cat(call,
                            " called while a step is open (mark_ready() started its exchange); call it after "
                            "synchronize() returned"));
  }

  // For checkpoints: f(name, group, kind, dense values) for every registration, dense ones first,
  // then the row-sparse ones, each in registration order; and the passes of the open aggregation
  // cycle (0 between cycles).
  template <class F>
  void for_each_registration(F&& f) const {
    for (const Entry& e : registry_) {
      bool in_set = false;
      if constexpr (sets_supported) in_set = sets_.set_holding(e.data) != nullptr;
      f(e.name, e.group,
        in_set      ? impl::RegistrationKind::process_set
        : e.local() ? impl::RegistrationKind::local
                    : impl::RegistrationKind::data_parallel,
        e.size);
    }
    sparse_.for_each_registration(
        [&](const std::string& name, const std::string& group, bool local, bool in_set, std::size_t n) {
          f(name, group,
            in_set  ? impl::RegistrationKind::process_set
            : local ? impl::RegistrationKind::local
                    : impl::RegistrationKind::data_parallel,
            n);
        });
  }
  int passes_into_cycle() const { return step_.pass(); }
  // For checkpoints: this rank's error-feedback residuals (the plan's fused index space; empty
  // without compression and error_feedback, or before the plan), a signature of that space (the
  // data-parallel tensors in fused order, the chunks' ranges and formats), and the samples they
  // were kept for. Builds the plan if it is due: collective, as prepare().
  struct ResidualState {
    value_type* data = nullptr;
    std::size_t size = 0;
    std::uint64_t layout = 0;
    std::int64_t* samples = nullptr;
  };
  ResidualState residual_state() {
    if (opt_.error_feedback) prepare();
    ResidualState r;
    r.data = engine_.residual_data();
    r.size = r.data ? engine_.residual_size() : 0;
    std::uint64_t h = impl::fnv1a("residuals", 9);
    for (const std::string& n : registry_.data_parallel_names_in_fused_order(opt_))
      h = impl::fnv1a(n.data(), n.size() + 1, h);
    for (const auto& c : plan_.chunks()) {
      const std::int64_t v[3] = {c.begin, c.end, c.kind};
      h = impl::fnv1a(v, sizeof v, h);
    }
    r.layout = h;
    r.samples = &residual_samples_;
    return r;
  }

  // For global_norm and DistributedOptimizer: the
  // process sets with their dense tensors, the row-sparse gradients, and the sets' communicators
  // made now (collective over the sync's ranks, as at the next synchronize(); validates the sets).
  const auto& process_sets() const { return sets_; }
  const auto& row_sparse() const { return sparse_; }
  template <class Watched>
  void connect_process_sets(const Watched& world) {
    if constexpr (sets_supported) sets_.connect(world);
  }

  // DistributedOptimizer::add's rollback when its optimizer refuses the parameter: forgets the
  // tensor at `data` that add<Group>() registered last. The plan and the checks stay marked changed
  // (at worst a redundant rebuild and comparison).
  template <class Group>
  void withdraw_last(const value_type* data) {
    if (registry_.size() == 0 || registry_.back().data != data) return;
    if constexpr (is_set_reduced_v<Group>)
      sets_.withdraw(impl::type_name<typename LocalVarPolicy<Group>::set_tag>(), data);
    registry_.pop_back();
  }

  using Registry = impl::SyncRegistry<value_type>;
  using Entry = typename Registry::Entry;
  using Plan = impl::SyncPlan<Backend, value_type, memory_space>;
  using Engine = impl::SyncEngine<Backend, value_type, memory_space, execution_space>;
  using Checks = impl::SyncChecks<Backend, value_type, memory_space, execution_space>;
  using Context = impl::SyncContext<Backend, execution_space>;

  // What the parts share for one call (never stored: this object moves).
  Context ctx() { return Context{backend_, opt_, exec_, ctl_, timeline_.get(), stats_}; }

  static constexpr bool sets_supported =
      impl::has_split<Backend>::value && Kokkos::is_execution_space<execution_space>::value;
  using set_backend_type = typename impl::split_result<Backend>::type;

  // RowSparse gradients, after the dense exchange: world, then process sets in binding order.
  void finish_row_sparse() {
    // Weighted, the rows carry this rank's samples before the sum (pre_factor's share) and 1/N after.
    const impl::SampleWeights<value_type>& w = plan_.weights();
    const value_type dp_factor =
        weighted() ? value_type(opt_.prescale_factor) * plan_.post_factor() : plan_.pre_factor() * plan_.post_factor();
    sparse_.finish(
        backend_, exec_, dp_factor, stats_, sets_.sets(),
        [&](const std::string& tag, SetScale scale) -> std::pair<const set_backend_type*, value_type> {
          if constexpr (sets_supported)
            return {&sets_.backend_of(tag),
                    sets_.factor(scale, opt_, backend_.size(), sets_.set_size(tag), weighted(), w.total)};
          else
            return {nullptr, value_type(1)};  // never asked: no sets without split()
        },
        [&](const auto& b) -> decltype(auto) {  // the sync's own backend type: watched
          if constexpr (std::is_same_v<std::decay_t<decltype(b)>, Backend>)
            return impl::Watched<Backend>(b, ctl_, opt_, std::int64_t(stats_.passes), "row-sparse exchange");
          else
            return (b);
        },
        w);
  }

  // Environment overrides applied, then validated, before anything collective starts. A rank whose
  // options are refused still joins the side channel's creation, to tell its peers (which have built
  // their syncs) before it throws: their first collective call then fails at once, naming it.
  static Options prepare_options(const Options& given, const Backend& backend) {
    try {
      Options o = given.tuning.read_environment ? apply_env(given) : given;
      o.tuning.timeline = impl::keep_timeline_path(o.tuning.timeline);
      validate_options(o);
      return o;
    } catch (const std::exception& e) {
      impl::tell_peers_at_construction(
          backend, given, impl::kind_of(e),
          impl::cat(e.what(), " (in the GradientSync constructor on rank ", backend.rank(), ")"));
      throw;
    }
  }

  static void validate_options(const Options& o) {
    if (o.backward_passes_per_step < 1)
      throw ConfigError(impl::cat("backward_passes_per_step must be >= 1, got ", o.backward_passes_per_step));
    auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
    if (bad(o.prescale_factor))
      throw ConfigError(impl::cat("prescale_factor must be finite and >= 0, got ", o.prescale_factor));
    if (o.tuning.max_chunks_in_flight < 0)
      throw ConfigError(
          impl::cat("max_chunks_in_flight must be >= 0 (0: by topology), got ", o.tuning.max_chunks_in_flight));
    if (std::isnan(o.tuning.in_place_min_fraction) || o.tuning.in_place_min_fraction < 0)
      throw ConfigError(impl::cat("in_place_min_fraction must be >= 0, got ", o.tuning.in_place_min_fraction));
    if (bad(o.postscale_factor))
      throw ConfigError(impl::cat("postscale_factor must be finite and >= 0, got ", o.postscale_factor));
    if (bad(o.stall_timeout))
      throw ConfigError(
          impl::cat("stall_timeout must be finite and >= 0 seconds (0 waits forever), got ", o.stall_timeout));
    if (bad(o.tuning.stall_warning))
      throw ConfigError(
          impl::cat("stall_warning must be finite and >= 0 seconds (0: no warning), got ", o.tuning.stall_warning));
    if (bad(o.tuning.spin_before_yield) && o.tuning.spin_before_yield != spin_before_yield_auto)
      throw ConfigError(impl::cat("spin_before_yield must be finite and >= 0 seconds, or spin_before_yield_auto, got ",
                                  o.tuning.spin_before_yield));
  }

  // Local checks, then the agreement before the exchange (agree_before_exchange; on the blocking
  // path synchronize() runs it after check_finite instead, prepare() here). A rank that fails a
  // local check tells its peers before throwing, so none of them waits for it.
  void checks_before_pass(bool preparing = false) {
    if (!preparing) require_counted();
    Context cx = ctx();
    checks_.check_not_resized(cx, registry_);
    if (checks_.agrees_each_call() && plan_.blocking() && !preparing) return;
    if (checks_.agrees_each_call() || !checks_.agreed_once())
      agree_before_exchange(false, preparing);  // before the step's first collective, which is watched itself
    else
      check_consistency(checks_.registrations_pending(),
                        false);  // no side channel: the first call agreed on the options
  }

  // The arrival round (SyncChecks::arrive), the registrations' comparison when due, and on the
  // blocking path (`commit`) the round that commits every rank to the chunks that follow.
  void agree_before_exchange(bool commit, bool preparing = false) {
    const std::int64_t call = std::int64_t(stats_.passes) + 1;
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::call, "arrival check", call);
    impl::ProfileRegion region(impl::Region::arrival_check);
    Context cx = ctx();
    typename Checks::Samples samples;
    if (!preparing) samples = {false, weighted(), cycle_samples_ + pass_samples_};
    const typename Checks::Arrival a = checks_.arrive(cx, preparing, samples);
    if (weighted() && !preparing) {
      step_samples_ = a.samples;
      samples_agreed_ = true;
    }
    check_consistency(a.registrations_changed, a.options_differ);  // names the option when they differ
    if (commit) checks_.commit(cx);
  }

  // The cross-rank comparison of registrations, when a rank needs it, or when the options differ
  // (`force`); process sets are connected first (every rank: `needed` is agreed). The plan then
  // merges neighbours in memory only if every rank has the same.
  void check_consistency(bool needed, bool force) {
    const std::int64_t call = std::int64_t(stats_.passes) + 1;
    if constexpr (sets_supported)
      if (needed) sets_.connect(impl::Watched<Backend>(backend_, ctl_, opt_, call, "process sets' setup"));
    if (!checks_.comparison_due(opt_, needed, force)) return;
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::call, "consistency check", call);
    impl::ProfileRegion region(impl::Region::consistency_check);
    Context cx = ctx();
    std::vector<impl::RegDesc> regs = registry_.describe(opt_);
    sparse_.describe(regs);
    checks_.compare_registrations(cx, regs, call);
    plan_.set_merge_neighbours(checks_.neighbours_agree(cx, registry_.data_parallel_in_fused_order(opt_), call),
                               opt_.backward_passes_per_step);
    ++stats_.consistency_checks;
    checks_.registrations_compared();
  }

  // The most samples one rank may count in one step: 2^40 (10^12), so that the sum over 2^23 ranks
  // fits 64 bits, and over 8192 ranks a double exactly (a backend without a side channel sums as
  // doubles). A larger count is an uninitialised or runaway counter, not a batch.
  static constexpr std::int64_t max_step_samples = std::int64_t(1) << 40;

  // set_samples()' rules, checked before anything changes (DistributedOptimizer::set_samples runs
  // them before it turns its fold off: its errors name set_samples, never an internal call).
  void check_samples(std::int64_t n) const {
    step_.require_usable("set_samples()");
    const int r = backend_.rank();
    if (n < 0 || n > max_step_samples - cycle_samples_)
      throw Error(impl::cat("set_samples(", n, ") on rank ", r,
                            ": a sample count is 0 or more, and a rank's counts in one step ", "at most 2^40 (",
                            max_step_samples, "; this step's earlier passes counted ", cycle_samples_,
                            "), so that the ranks' sum fits 64 bits: an uninitialised counter?"));
    if (step_.open())
      throw Error(impl::cat("set_samples() called while a step is open on rank ", r,
                            " (mark_ready() started its exchange): give the pass's count before its first "
                            "mark_ready()"));
    if (counted_)
      throw Error(impl::cat("set_samples(", n, ") called twice for pass ", step_.pass() + 1, " of synchronize() call ",
                            stats_.passes + 1, " on rank ", r,
                            ": give one count per pass, before the pass's synchronize() (a count given after "
                            "synchronize() would weigh the next pass)"));
    if (!weighted() && stats_.passes > 0)
      throw Error(impl::cat("set_samples(", n, ") on rank ", r, " after ", stats_.passes,
                            " synchronize() call(s) without counts: a sync is weighted from its first pass, and a "
                            "pass's count comes before its synchronize() (given after it, it would weigh the next "
                            "pass); call set_samples() before every synchronize() from the first one on"));
  }

  // set_samples()' body: its rules, then the count.
  void count_samples(std::int64_t n) {
    check_samples(n);
    if (!weighted()) become_weighted();
    pass_samples_ = n;
    counted_ = true;
  }

  // A local call's refusal (the sync stays usable) is remembered: if the sync is then destroyed by
  // the unwinding, its peers are told this error instead of waiting for the deadline.
  template <class F>
  void refusing(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      try {
        last_error_ = e.what();
      } catch (...) {  // out of memory: the peers are told less
      }
      throw;
    }
  }

  // set_samples()' first call: the combinations it cannot weight yet are refused here, before
  // anything changed.
  void become_weighted() {
    step_.require_between_steps("set_samples() (its first call makes the sync weighted)",
                                opt_.backward_passes_per_step);
    if (opt_.average_aggregated_gradients)
      throw ConfigError(
          "set_samples(): average_aggregated_gradients has nothing left to do in a weighted sync "
          "(the weights average over every sample of the step's passes); turn it off");
    for (const std::string& t : {sets_.set_size_tensor(), sparse_.set_size_tensor()})
      if (!t.empty()) unsupported_with_samples(impl::cat(t, ", SetScale::set_size"));
    for (const Entry& e : registry_)
      if (e.defer_scale)
        unsupported_with_samples(impl::cat("a deferred local scale (tensor '", e.name, "', group ", e.group,
                                           "; DistributedOptimizer::set_samples turns its fold off)"));
    plan_.set_weighted();
  }
  [[noreturn]] void unsupported_with_samples(const std::string& what) const {
    throw ConfigError(impl::cat("set_samples() and ", what, " on rank ", backend_.rank(),
                                ": the weighted form would need each set's own samples, which nothing exchanges; "
                                "use SetScale::world_size (the weighted sum over the set / N) or SetScale::samples"));
  }
  // A group whose policy divides by the step's samples (LocalScale::samples, SetScale::samples).
  void note_needs_samples(std::string what) {
    if (needs_samples_.empty()) needs_samples_ = std::move(what);
  }

  // The next pass needs a count of its own; a step's end also starts a new cycle.
  void end_counted_pass(bool step_closed) {
    if (!weighted()) return;
    cycle_samples_ = step_closed ? 0 : cycle_samples_ + pass_samples_;
    if (step_closed) {
      stats_.samples = std::uint64_t(step_samples_);
      stats_.empty_steps += step_samples_ == 0;
    }
    pass_samples_ = 0;
    counted_ = samples_agreed_ = false;
  }

  // A weighted sync's pass: its count was given (set_samples), on every rank.
  void require_counted() const {
    if (!weighted() && !needs_samples_.empty())
      throw ConfigError(impl::cat(needs_samples_, " on rank ", backend_.rank(),
                                  " is divided by the step's samples (LocalScale::samples or SetScale::samples), "
                                  "which set_samples() gives: call it on every rank before every pass"));
    if (weighted() && !counted_)
      throw Error(impl::cat("set_samples() was not called for pass ", step_.pass() + 1, " of synchronize() call ",
                            stats_.passes + 1, " on rank ", backend_.rank(),
                            ": a weighted sync needs a count from every rank on every pass (0 for none)"));
  }

  // A weighted sync's factors for this pass (SyncPlan::set_step_factors): this rank's samples go
  // before the sum; on the reducing pass the step's samples over every rank divide the average.
  void apply_weights(bool reducing) {
    if (!weighted()) return;
    const double n = double(pass_samples_);
    double post = opt_.postscale_factor, mult = 1;
    if (reducing) {
      if (!samples_agreed_) agree_on_samples();
      mult = step_samples_ > 0 ? 1.0 / double(step_samples_) : 0.0;
      if (opt_.op == ReduceOp::average) post *= mult;
      // Error feedback averaged: a residual is an error of the weighted sum, which 1/N scales.
      if (opt_.error_feedback && opt_.op == ReduceOp::average && step_samples_ > 0) {
        if (residual_samples_ > 0 && residual_samples_ != step_samples_) {
          Context cx = ctx();
          engine_.rescale_residuals(cx, value_type(double(step_samples_) / double(residual_samples_)));
        }
        residual_samples_ = step_samples_;
      }
    }
    plan_.set_step_factors(value_type(opt_.prescale_factor * n), value_type(post),
                           impl::SampleWeights<value_type>{true, value_type(n), value_type(mult)});
  }

  // The step's samples where no arrival round carried them (a backend without a side channel
  // after its first call): one small collective.
  void agree_on_samples() {
    const std::int64_t call = std::int64_t(stats_.passes);
    std::int64_t v[1] = {cycle_samples_ + pass_samples_};
    ctl_.template allreduce_min_sum<0, 1>(backend_, v, opt_, impl::WaitSite{"agreement on samples", call, -1, 0});
    step_samples_ = v[0];
    samples_agreed_ = true;
  }

  // Registrations change between steps only (SyncStep::require_between_steps, checked by the
  // caller before anything changed).
  void begin_change() {
    plan_.registrations_changed();
    checks_.registrations_changed();
  }

  // The plan's layout from the registrations, then the engine's buffers for it.
  void build_plan() {
    impl::TimelineScope span(timeline_.get(), impl::Timeline::Kind::plan, "plan build");
    impl::ProfileRegion region(impl::Region::plan_build);
    Context cx = ctx();
    checks_.require_staging_possible(cx);
    const auto layout = plan_.build(registry_, opt_, backend_.size(), Plan::staging_wanted(backend_, opt_), backend_);
    std::vector<std::shared_ptr<void>> keep;
    for (const Entry& e : registry_)
      if (!e.local() && e.keepalive) keep.push_back(e.keepalive);
    engine_.provision(cx, plan_, layout, keep);
    if (timeline_) note_plan_in_timeline(layout.tensor_chunks);
    ++stats_.plan_builds;
    plan_.built();
    if (!announced_) announce();
  }

  // Once per sync, at its first plan build: the environment's typos and a launcher that started
  // more processes than MPI_COMM_WORLD holds (each once per process) and, with GRADSYNC_LOG, the
  // summary.
  void announce() {
    announced_ = true;
    if (opt_.tuning.read_environment) impl::warn_unknown_env_once();
    impl::warn_launcher_size_once();
    if (log_ == impl::LogLevel::info_all || (log_ == impl::LogLevel::info && backend_.rank() == 0)) {
      std::fprintf(stderr, "%s\n", impl::describe_summary(summary()).c_str());
      std::fflush(stderr);
    }
  }

  // Options::tuning.timeline: names the plan's tensors and chunks (fused order).
  void note_plan_in_timeline(const std::vector<std::pair<std::int64_t, std::int64_t>>& tensor_chunks) {
    timeline_->plan(
        registry_.data_parallel_names_in_fused_order(opt_), tensor_chunks, plan_.num_chunks(),
        [&](std::size_t c) {  // the bytes on the wire, as stats().bytes_allreduced counts them
          return std::make_pair(plan_.wire_bytes(c), plan_.reduced_in_place(c));
        },
        to_string(algorithm()), plan_.blocking() ? 1 : plan_.in_flight());
  }

  // The first reducing call of a step (mark_ready or synchronize): nothing is ready or in flight.
  // Anything every rank must agree on before the step's first collective belongs here.
  void begin_step() {
    if (step_.open()) return;
    if (plan_.dirty()) build_plan();
    engine_.open_step();
    apply_weights(true);
    step_.opened();
  }

  // One pass of synchronize(), its collective phase. `overflow`: the fp16 sum found not finite, which
  // synchronize() throws after the phase (every rank holds the same sums: the sync stays usable).
  bool sync_pass(const value_type*& overflow) {
    const std::int64_t t_begin =
        timeline_ ? impl::Timeline::now() : 0;  // no RAII here: keeps the inlining of the timeline-off path
    pending_ = false;                           // the tensors are about to hold this pass's values
    const bool step_open = step_.open();
    if (!step_open) checks_before_pass();  // else mark_ready ran them when it opened the step
    const auto t0 = std::chrono::steady_clock::now();
    if (plan_.dirty() && !step_open) build_plan();
    Context cx = ctx();
    // check_finite: everything before the first byte leaves; after mark_ready opened the step, the
    // chunks it launched were scanned at their launch and the rest are scanned at theirs (reduce).
    if (opt_.check_finite && !step_open)
      checks_.check_finite(cx, registry_, engine_.data_parallel_segments(), engine_.num_data_parallel_segments());
    if (checks_.agrees_each_call() && plan_.blocking())
      agree_before_exchange(true);  // after every local check: the collectives follow
    ++stats_.passes;
    const int n_passes = opt_.backward_passes_per_step;
    if (step_.pass() + 1 < n_passes) {
      apply_weights(false);
      engine_.accumulate(cx, plan_, step_.pass() == 0);
      impl::fence(exec_, impl::label_fence_sync());
      step_.pass_accumulated();
      end_counted_pass(false);
      if (timeline_) timeline_->step_span(t_begin, stats_.passes);
      return false;
    }
    begin_step();
    if (opt_.check_finite && step_open)
      engine_.reduce(cx, plan_, n_passes > 1, finite_scan());
    else
      engine_.reduce(cx, plan_, n_passes > 1);
    engine_.finish_local(cx, plan_, n_passes > 1);
    if constexpr (sets_supported) {
      if (sets_.has_tensors())
        sets_.reduce(exec_, opt_, ctl_, backend_.size(), std::int64_t(stats_.passes), stats_, weighted(),
                     plan_.weights().total);
    }
    if (!sparse_.empty()) finish_row_sparse();
    impl::fence(exec_, impl::label_fence_sync());
    pending_ = engine_.has_deferred();
    ++stats_.steps;
    if (engine_.watches_overflow()) overflow = engine_.take_overflow(cx);
    if (plan_.tuner().active()) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      plan_.tune(
          seconds, [&](double* v, std::size_t n) { allreduce_max_watched(v, n); }, stats_, timeline_.get());
    }
    step_.closed();
    end_counted_pass(true);
    if (timeline_) timeline_->step_span(t_begin, stats_.passes);
    return true;
  }

  // The tuner's agreement on timings, on the side channel under the watchdog: the MAX of
  // non-negative doubles is the MIN of their negated bit patterns, which order like the values.
  void allreduce_max_watched(double* v, std::size_t n) {
    std::vector<std::int64_t> bits(n);
    for (std::size_t k = 0; k < n; ++k) {
      std::int64_t b = 0;
      std::memcpy(&b, &v[k], sizeof b);
      bits[k] = -std::max<std::int64_t>(b, 0);
    }
    ctl_.allreduce_min(backend_, bits.data(), int(n), opt_,
                       impl::WaitSite{"plan tuner's agreement", std::int64_t(stats_.passes), -1, 0});
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t b = -bits[k];
      std::memcpy(&v[k], &b, sizeof b);
    }
  }

  // Chunks launched by mark_ready and progress: each scanned first with check_finite.
  void advance() {
    Context cx = ctx();
    if (opt_.check_finite)
      engine_.progress(cx, plan_, opt_.backward_passes_per_step > 1, finite_scan());
    else
      engine_.progress(cx, plan_, opt_.backward_passes_per_step > 1);
  }
  auto finite_scan() {
    return [this](std::int64_t seg_begin, std::int64_t seg_end) {
      Context cx = ctx();
      checks_.check_finite(cx, registry_, engine_.data_parallel_segments(), seg_end - seg_begin, seg_begin);
    };
  }

  // Every collective phase runs through here: an exception leaving it fails the sync (fail_step).
  template <class F>
  decltype(auto) collective(const char* call, F&& f) {
    ctl_.enter_call(call);
    try {
      return f();
    } catch (const std::exception& e) {
      fail_step(impl::kind_of(e), e.what(), call, dynamic_cast<const impl::AgreedMismatch*>(&e) == nullptr);
      throw;
    } catch (...) {
      fail_step(impl::ErrorKind::error, "an exception not derived from std::exception", call);
      throw;
    }
  }

  // The one failure path (impl/sync_step.hpp): the peers are told unless they told this rank, the
  // step's requests are parked with every buffer and communicator they may touch, the sync is failed.
  // `tell`: false where every rank found the failure itself (impl::AgreedMismatch).
  void fail_step(impl::ErrorKind kind, const std::string& what, const char* call, bool tell = true) noexcept {
    try {
      std::string reason = what.rfind("gradsync: ", 0) == 0 ? what.substr(10) : what;
      if (reason.find("rank") == std::string::npos)
        reason = impl::cat(reason, " (in ", call, " on rank ", backend_.rank(), ")");
      step_.fail(kind, call, call_, backend_.rank(), reason);
      impl::abort_collectives(backend_);  // NCCL: ncclCommAbort releases the user's stream; MPI: nothing
      // Collectives of this sync may still be pending on the backend's communicator, in different
      // numbers on different ranks: a new sync over it would pair its own with them. (Not after an
      // agreed mismatch: every rank found it in a completed collective, nothing is pending.)
      if (tell) impl::retire_backend(backend_, reason);
      // What collectives in flight may still write into: the chunks' requests (with the buffers
      // ctl_ keeps), the row-sparse exchange's buffers, the process sets' communicators and staging.
      ctl_.abandon(kind, reason,
                   {engine_.park(), std::make_shared<decltype(sparse_)>(std::move(sparse_)),
                    std::make_shared<decltype(sets_)>(std::move(sets_))},
                   tell);
    } catch (...) {  // failing while failing (out of memory): the sync is unusable either way
    }
  }

  // What every part uses and none owns (handed to them as a Context).
  Backend backend_;
  Options opt_;
  impl::LogLevel log_ = impl::LogLevel::off;  // GRADSYNC_LOG
  bool announced_ = false;                    // announce() ran (first plan build)
  execution_space exec_;
  Stats stats_;

  Registry registry_;  // the dense gradients
  Plan plan_;          // what to send, in which chunks, by which algorithm
  Checks checks_;      // the cross-rank agreements
  Engine engine_;      // the buffers and the step in progress

  impl::SyncStep step_;          // the step's state: idle, accumulating, open, failed (impl/sync_step.hpp)
  bool counted_ = false;         // this pass's count was given
  bool samples_agreed_ = false;  // this pass's arrival round carried the samples
  std::int64_t pass_samples_ = 0, cycle_samples_ = 0, step_samples_ = 0;  // this pass, earlier passes, every rank
  std::int64_t residual_samples_ = 0;  // error feedback: the N the residuals were kept for (0: none yet)
  std::string needs_samples_;          // a tensor whose policy needs set_samples(), or empty
  std::int64_t call_ = 1;              // the synchronize() call the current (or next) collective phase belongs to
  bool pending_ = false;               // deferred local scales not yet applied (local_scale_pending)
  impl::Control<Backend> ctl_;         // side channel: consistency check, stall reports, peer failures
  std::string last_error_;             // the last refusal of a local call (refusing), told if the sync is destroyed
  impl::OneThread one_thread_;         // one thread at a time
  std::unique_ptr<impl::Timeline> timeline_;                                  // Options::tuning.timeline; null when off
  impl::row_sparse_set_t<value_type, memory_space, execution_space> sparse_;  // RowSparse gradients
  impl::ProcessSets<Backend, value_type, execution_space> sets_;              // ReduceOver groups' sets
};

}  // namespace gradsync
