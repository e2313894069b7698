// gradsync: GradientSync, the fused synchronization of a model's gradients.
//
// Data-parallel groups are packed into a persistent fusion buffer in the tensors' own memory space,
// reduced chunk by chunk by the backend, and unpacked with every scale factor folded into one
// multiplication. Local groups never enter the buffer; their scale is applied in place.
//
// GradientSync is the user's API: registrations, the entry points of a step, and queries. The step
// itself is impl::StepPipeline (impl/step_pipeline.hpp: one ordered sequence of phases over a list
// of exchanges; read it first), which owns the parts: impl::SyncRegistry (the registered
// gradients), impl::SyncPlan (what to send, in which chunks, by which algorithm), the exchanges
// (impl/exchange.hpp), impl::SyncChecks (every cross-rank agreement) and impl::SyncStep (the
// step's state and data).
//
// Each public function's comment says whether it is collective (every rank of the backend's
// communicator calls it, in the same order) and in which states it is legal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
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
#include "impl/demangle.hpp"
#include "impl/mpi_traits.hpp"
#include "impl/one_thread.hpp"
#include "impl/profiling.hpp"
#include "impl/step_pipeline.hpp"
#include "impl/sync_access.hpp"
#include "impl/sync_registration.hpp"
#include "impl/sync_summary.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"
#include "process_set.hpp"
#include "registrations.hpp"
#include "row_sparse.hpp"
#include "stats.hpp"
#include "tensor_traits.hpp"
#include "topology.hpp"

namespace gradsync {

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
  // Each declared capability has its member, each optional member is declared (backend.hpp).
  static_assert(impl::check_capabilities<Backend, value_type, memory_space, execution_space>() &&
                impl::check_mpi_capabilities<Backend>() && impl::check_retire<Backend>());

  /// A sync over `backend`'s communicator; `exec` runs its packing and scaling kernels. Applies the
  /// GRADSYNC_* environment (unless Options::tuning.read_environment is off) and validates the
  /// options (ConfigError). Local: no communication (the ranks compare options at the first
  /// collective call); allocates only bookkeeping, the fusion buffer comes at the first
  /// synchronize() or prepare().
  explicit GradientSync(Backend backend, Options options = {}, execution_space exec = {})
      : pipe_(std::move(backend), options, exec) {}

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
  ~GradientSync() { pipe_.abandon(last_error_); }

  /// Registers a gradient in `Group`. Any contiguous tensor with this sync's value type and memory
  /// space is accepted (a View of any rank, a vector, a Span). `name` appears in error messages.
  /// Local (not collective); legal between steps only. The ranks compare the data-parallel
  /// registrations at the next collective call, which also rebuilds the plan (and its buffers).
  template <class Group, class U>
  void add(const U& tensor, std::string name = {}) {
    using UT = TensorTraits<U>;
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::add: argument is not a tensor gradsync knows");
    static_assert(std::is_same_v<typename UT::value_type, value_type>,
                  "gradsync::GradientSync::add: the tensor's value type differs from the sync's");
    static_assert(std::is_same_v<typename UT::memory_space, memory_space>,
                  "gradsync::GradientSync::add: the tensor lives in another memory space than the sync's");
    static_assert(UT::is_writable, "gradsync::GradientSync::add: a gradient must be writable (not const)");
    local("add()", [&] { impl::register_dense<Group>(pipe_, tensor, std::move(name)); });
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
    local("bind_process_set()", [&] {
      pipe_.step().require_between_steps("bind_process_set()", options().backward_passes_per_step);
      pipe_.begin_change();
      pipe_.sets().bind(impl::type_name<Tag>(), std::move(ranks), rank(), backend().size());
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
    local("add()", [&] { impl::register_row_sparse<Group>(pipe_, rows, std::move(name)); });
  }

  /// Horovod parity: at run time, makes a registered gradient local (never communicated). It is
  /// scaled by 1/world_size when Options::scale_local_gradients is set. Local; legal between steps
  /// only (the ranks compare the change at the next collective call).
  template <class U>
  void register_local_var(const U& tensor) {
    static_assert(is_tensor_v<U>, "gradsync::GradientSync::register_local_var: argument is not a tensor");
    local("register_local_var()", [&] {
      pipe_.step().require_between_steps("register_local_var()", options().backward_passes_per_step);
      auto* e = pipe_.registry().find(TensorTraits<U>::data(tensor), TensorTraits<U>::size(tensor));
      if (!e)
        throw Error(impl::cat("register_local_var: the tensor (", TensorTraits<U>::size(tensor),
                              " elements) is not registered with add<Group>() on rank ", rank()));
      if (e->runtime_local) return;
      pipe_.begin_change();
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
    local("set_samples()", [&] { impl::count_samples(pipe_, n); });
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
    impl::OneThread::Scope one(pipe_.one_thread(), "synchronize()", rank());
    pipe_.step().require_usable("synchronize()");
    impl::ProfileRegion region(impl::Region::synchronize);
    const value_type* overflow = nullptr;
    const bool done = pipe_.synchronize(overflow);
    if (overflow) {  // every rank holds the same sums, so every rank throws this; the sync goes on
      auto cx = pipe_.ctx();
      decltype(pipe_)::Checks::throw_wire_overflow(cx, pipe_.registry(), overflow);
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
    impl::OneThread::Scope one(pipe_.one_thread(), "prepare()", rank());
    pipe_.step().require_between_steps("prepare()", options().backward_passes_per_step);
    impl::ProfileRegion region(impl::Region::prepare);
    pipe_.prepare();
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
    impl::OneThread::Scope one(pipe_.one_thread(), "mark_ready()", rank());
    pipe_.step().require_usable("mark_ready()");
    const value_type* p = TensorTraits<U>::data(tensor);
    const std::int64_t slot = pipe_.sync_plan().dirty() ? -1 : pipe_.dense().find_ready_slot(p);
    if (slot < 0) {  // not in the built plan: misuse is rejected (the step goes on), local tensors need no mark
      const auto* e = pipe_.registry().find(p, TensorTraits<U>::size(tensor));
      if (!e)
        throw Error(impl::cat("mark_ready: the tensor (", TensorTraits<U>::size(tensor),
                              " elements) is not registered with add<Group>() on rank ", rank()));
      if (e->local()) return;
    }
    impl::ProfileRegion region(impl::Region::mark_ready);
    pipe_.mark_ready(p, slot);
  }

  /// Lets chunks launched by mark_ready advance and launches those that became possible. Call it
  /// while waiting during backward (e.g. while polling device events): MPI's nonblocking
  /// collectives progress only inside MPI calls. Never blocks; local (it only tests this rank's
  /// requests and launches chunks every rank launches in the same order); legal in every state but
  /// failed; allocates nothing.
  void progress() {
    impl::OneThread::Scope one(pipe_.one_thread(), "progress()", rank());
    pipe_.step().require_usable("progress()");
    impl::ProfileRegion region(impl::Region::progress);
    pipe_.progress();
  }

  // --- Queries. Everything below that is const is local and legal in every state, failed included
  // (a failed sync still tells what it held). ---

  /// The chunk size the sync uses now (fusion_threshold_auto: the candidate being timed, then the
  /// chosen one).
  std::size_t fusion_threshold_bytes() const { return pipe_.sync_plan().fusion_threshold_bytes(); }
  /// Where the backend's ranks are (one node of this many ranks for a backend that cannot tell).
  const Topology& topology() const { return pipe_.sync_plan().topology(); }
  /// The algorithm chunks are summed with now (while tuning: the candidate being timed).
  Algorithm algorithm() const { return pipe_.sync_plan().algorithm(); }
  /// Nonblocking chunks reduced at once now (Options::tuning.max_chunks_in_flight, or the plan's choice).
  int chunks_in_flight() const { return pipe_.sync_plan().chunks_in_flight(); }
  /// Whether the first steps are still timing the plan's candidates.
  bool tuning() const { return pipe_.sync_plan().tuner().active(); }
  /// This rank's counters: bytes and calls reduced, steps, plan builds, buffer bytes.
  const Stats& stats() const { return pipe_.stats(); }
  /// The options in effect: the constructor's, after the GRADSYNC_* environment was applied.
  const Options& options() const { return pipe_.options(); }
  /// Options::shard: this rank's slices of the data-parallel gradients (pieces of them, in fused
  /// order; the gradsync::shard_slice of each chunk or group), then of its process sets' dense
  /// gradients (sharded within each set, in binding order), where a sharded synchronize() leaves
  /// the sums; the other values are unspecified. Built with the plan (empty before it, and when
  /// not sharded). Local; any state.
  const std::vector<std::pair<value_type*, std::size_t>>& owned_slices() const { return pipe_.owned(); }
  /// The backend the sync reduces over (its rank(), size(), communicator).
  const Backend& backend() const { return pipe_.backend(); }
  /// Dense tensors registered with add<Group>() (row-sparse gradients not counted).
  std::size_t num_tensors() const { return pipe_.registry().size(); }
  /// Whether set_samples() made this sync weighted.
  bool weighted() const { return pipe_.weighted(); }
  /// Bytes of data-parallel gradient one synchronize() hands to the backend.
  std::size_t data_parallel_bytes() const { return pipe_.registry().data_parallel_elements() * sizeof(value_type); }
  /// This rank's registrations, plan and options, for describe(sync) (describe.hpp). Allocates the
  /// returned summary.
  SyncSummary summary() const { return impl::summarize(pipe_); }
  /// This rank's registrations, read-only (registrations.hpp): each one's name, group, kind
  /// (data-parallel, local or over a process set) and size, dense ones first, then row-sparse. A
  /// handle on this sync (not to be kept across a move); local, legal in every state, allocates
  /// nothing.
  Registrations<impl::StepPipeline<Backend, value_type, memory_space, execution_space>> registrations() const {
    return Registrations<impl::StepPipeline<Backend, value_type, memory_space, execution_space>>(pipe_);
  }
  /// The backward passes accumulated in the open aggregation cycle (0 .. backward_passes_per_step - 1;
  /// 0 between cycles): synchronize() returned false this many times since it last returned true.
  /// Checkpoints refuse a cycle's middle by it. Local, legal in every state, allocates nothing.
  int passes_into_cycle() const { return pipe_.step().pass(); }

  /// Whether the registered `tensor` is local (by its group's policy or at run time); an Error when
  /// it is not registered.
  template <class U>
  bool is_local(const U& tensor) const {
    const value_type* p = TensorTraits<U>::data(tensor);
    for (const auto& e : pipe_.registry())
      if (e.data == p) return e.local();
    throw Error("is_local: the tensor is not registered");
  }

 private:
  // gradsync's own helpers (DistributedOptimizer, GlobalNorm, the checkpoints) reach the pipeline
  // through impl::SyncAccess: the deferred local scale and the watched collectives are an agreement
  // between them and the sync, not a user's API.
  friend struct impl::SyncAccess;

  int rank() const { return pipe_.backend().rank(); }

  // A local call (add, bind_process_set, register_local_var, set_samples): one thread at a time;
  // its refusal leaves the sync usable and is remembered: if the sync is then destroyed by the
  // unwinding, its peers are told this error instead of waiting for the deadline.
  template <class F>
  void local(const char* call, F&& f) {
    impl::OneThread::Scope one(pipe_.one_thread(), call, rank());
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

  impl::StepPipeline<Backend, value_type, memory_space, execution_space> pipe_;
  std::string last_error_;  // the last refusal of a local call, told if the sync is destroyed
};

}  // namespace gradsync
