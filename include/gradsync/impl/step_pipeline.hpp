// gradsync internals: impl::StepPipeline, a GradientSync's step from its first call to its last.
//
// Note [The step]. Every entry point runs a prefix of one ordered sequence, so no entry point can
// order the checks differently:
//
//   admit   this rank's own checks: the call is legal now (SyncStep), the pass's count was given,
//           no registered vector was resized. Nothing has crossed: a refusal tells the peers.
//   agree   the arrival round: every rank is here, in the same call, with the same options; the
//           samples' sum crosses with it; registrations are compared when a rank changed them and
//           the process sets connected. (On the blocking path this comes after `check`, as a
//           commit: once a rank is inside a blocking collective, nothing can call it back.)
//   plan    the fused layout, rebuilt when registrations changed; every exchange provisioned.
//   check   Options::check_finite scans what is about to leave (before the first byte does).
//   open    the step's factors fixed (samples, error feedback), the exchanges' step begun.
//   launch  chunks whose gradients are all ready go out (mark_ready, progress); never blocks.
//   finish  every exchange completes, in list order: dense chunks, process sets, row-sparse rows.
//   close   the state back to idle, the pass's counts reset, the plan's tuner fed.
//   fail    any exception in a collective phase, whoever threw it: the peers are told, every
//           exchange is parked the same way, the sync is failed for good (impl/sync_step.hpp).
//
//   prepare()      admit, agree, plan
//   mark_ready()   admit, agree, plan, open (once per step), launch    (on the reducing pass)
//   progress()     launch
//   synchronize()  admit, agree, plan, check, then on passes 1..N-1 a local sum, on the Nth
//                  open, finish, close (after mark_ready opened the step: finish, close)
//
// The pipeline is the sync's parts (impl/sync_parts.hpp: the registrations, the plan, the checks,
// the exchanges, and SyncStep with every step-scoped datum) with the step run over them; GradientSync
// keeps the user's API: registrations, entry points and queries.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "exchange.hpp"
#include "sync_parts.hpp"
#include "watched.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class StepPipeline : public SyncParts<Backend, V, MemorySpace, ExecutionSpace> {
  using Parts = SyncParts<Backend, V, MemorySpace, ExecutionSpace>;
  using Parts::announce, Parts::announced_, Parts::backend_, Parts::checks_, Parts::ctl_, Parts::exchanges_,
      Parts::exec_, Parts::needs_samples_, Parts::opt_, Parts::plan_, Parts::registry_, Parts::stats_, Parts::step_,
      Parts::timeline_;

 public:
  using Parts::ctx, Parts::dense, Parts::sets, Parts::sets_exchange, Parts::weighted;
  using Parts::Parts;
  using typename Parts::Checks, typename Parts::Context, typename Parts::Dense, typename Parts::Frame,
      typename Parts::Plan;
  StepPipeline(StepPipeline&&) = default;

  // ---- The entry points: each a prefix of Note [The step] ----

  void prepare() {
    step_.begin_call(stats_.passes);
    collective("prepare()", [&] {
      admit(true);
      agree(true);
      plan();
    });
    ctl_.call_done();
  }

  // `slot`: the tensor's index in fused order when the plan is built (-1: local, empty, or not known yet).
  void mark_ready(const void* p, std::int64_t slot) {
    step_.begin_call(stats_.passes);
    collective("mark_ready()", [&] {
      // Blocking collectives are never started here: a rank blocked in chunk k while another is
      // still in backward (or in the model's own collectives) would hang both.
      if (plan_.blocking() || !reducing_pass()) return;
      if (!step_.open()) {
        admit(false);
        agree();  // before the step's first collective
        plan();
        open();
        if (slot < 0) slot = dense().find_ready_slot(p);
      }
      if (slot < 0) return;  // an empty tensor, or a process set's
      if (timeline_) timeline_->mark(slot);
      dense().mark_ready(std::size_t(slot));
      launch();
    });
  }

  void progress() {
    if (!step_.open() || plan_.blocking()) return;
    collective("progress()", [&] { launch(); });
  }

  // Returns true when the step closed (the Nth pass). `overflow`: the fp16 sum found not finite,
  // thrown by the caller after the phase (every rank holds the same sums: the sync goes on).
  bool synchronize(const V*& overflow) {
    step_.begin_call(stats_.passes);
    const bool done = collective("synchronize()", [&] {
      const std::int64_t t_begin = timeline_ ? Timeline::now() : 0;  // no RAII: keeps the timeline-off path inlined
      step_.pending = false;                                         // the tensors are about to hold this pass's values
      const bool was_open = step_.open();
      if (!was_open) {
        admit(false);
        if (!agrees_late()) agree();
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (!was_open) {
        plan();
        check();
        if (agrees_late()) agree(false, true);
      }
      ++stats_.passes;
      if (!reducing_pass()) {
        sum_locally();
        if (timeline_) timeline_->step_span(t_begin, stats_.passes);
        return false;
      }
      open();
      finish(was_open);
      close(t0, overflow);
      if (timeline_) timeline_->step_span(t_begin, stats_.passes);
      return true;
    });
    ctl_.call_done();
    return done;
  }

  // ---- Failure ----

  // fail: the one failure path (impl/sync_step.hpp). The peers are told unless they told this rank
  // (`tell`: false where every rank found the failure itself, impl::AgreedMismatch); every exchange
  // is parked with what its collectives in flight may touch; the sync is failed.
  void fail(ErrorKind kind, const std::string& what, const char* call, bool tell = true) noexcept {
    try {
      std::string reason = what.rfind("gradsync: ", 0) == 0 ? what.substr(10) : what;
      if (reason.find("rank") == std::string::npos)
        reason = cat(reason, " (in ", call, " on rank ", backend_.rank(), ")");
      step_.fail(kind, call, step_.call(), backend_.rank(), reason);
      abort_collectives(backend_);  // NCCL: ncclCommAbort releases the user's stream; MPI: nothing
      // Collectives of this sync may still be pending on the backend's communicator, in different
      // numbers on different ranks: a new sync over it would pair its own with them. (Not after an
      // agreed mismatch: every rank found it in a completed collective, nothing is pending.)
      if (tell) retire_backend(backend_, reason);
      std::vector<std::shared_ptr<void>> parked;
      for_each_exchange(exchanges_, [&](auto& x) { parked.push_back(x.park()); });
      ctl_.abandon(kind, reason, std::move(parked), tell);
    } catch (...) {  // failing while failing (out of memory): the sync is unusable either way
    }
  }

  // Destruction: between steps, peers waiting in a call this rank never makes stop at once (GONE);
  // with the step open, the step is abandoned (fail).
  void abandon(const std::string& last_error) {
    if (step_.state() == StepState::moved_from || step_.failed()) return;  // a failed one told its peers
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (!step_.open()) return ctl_.tell_gone(unwinding, last_error);
    fail(
        ErrorKind::error,
        cat("rank ", backend_.rank(), " abandoned its step with the exchange in flight: its GradientSync was destroyed",
            unwinding ? " while an exception unwound the stack" : "", " before synchronize() returned"),
        "the GradientSync's destructor");
  }

  // Every collective phase runs through here: an exception leaving it fails the sync.
  template <class F>
  decltype(auto) collective(const char* call, F&& f) {
    ctl_.enter_call(call);
    try {
      return f();
    } catch (const std::exception& e) {
      fail(kind_of(e), e.what(), call, dynamic_cast<const AgreedMismatch*>(&e) == nullptr);
      throw;
    } catch (...) {
      fail(ErrorKind::error, "an exception not derived from std::exception", call);
      throw;
    }
  }

 private:
  // ---- The phases, in their order ----

  // admit: this rank's own checks, before anything crosses (`preparing`: prepare() has no counts).
  void admit(bool preparing) {
    if (!preparing) require_counted();
    Context cx = ctx();
    checks_.check_not_resized(cx, registry_);
  }

  // agree: Note [Agreement] in impl/sync_checks.hpp. A backend without a side channel agrees once
  // (its first call), then compares registrations only when they change. `commit`: the blocking
  // path's round that commits every rank to the chunks that follow.
  void agree(bool preparing = false, bool commit = false) {
    if (!checks_.agrees_each_call() && checks_.agreed_once()) {
      compare_registrations(checks_.registrations_pending(), false);
      return;
    }
    TimelineScope span(timeline_.get(), Timeline::Kind::call, "arrival check", step_.call());
    ProfileRegion region(Region::arrival_check);
    Context cx = ctx();
    typename Checks::Samples samples;
    auto& s = step_.samples;
    if (!preparing) samples = {false, weighted(), s.cycle + s.pass};
    const typename Checks::Arrival a = checks_.arrive(cx, preparing, samples);
    if (weighted() && !preparing) s.step = a.samples, s.agreed = true;
    compare_registrations(a.registrations_changed, a.options_differ);  // names the option when they differ
    if (commit) checks_.commit(cx);
  }
  // On the blocking path with a side channel, the round comes after every local check.
  bool agrees_late() const { return checks_.agrees_each_call() && plan_.blocking(); }

  // The registrations' comparison when a rank needs it, or when the options differ (`force`); the
  // process sets are connected first (every rank: `needed` is agreed). The plan merges neighbours
  // in memory only if every rank has the same.
  void compare_registrations(bool needed, bool force) {
    const std::int64_t call = step_.call();
    if (needed) {
      sets_exchange().connect(Watched<Backend>(backend_, ctl_, opt_, call, "process sets' setup"));
      this->refresh_owned();
    }
    if (!checks_.comparison_due(opt_, needed, force)) return;
    TimelineScope span(timeline_.get(), Timeline::Kind::call, "consistency check", call);
    ProfileRegion region(Region::consistency_check);
    Context cx = ctx();
    std::vector<RegDesc> regs = registry_.describe(opt_);
    for_each_exchange(exchanges_, [&](auto& x) { x.describe(regs); });
    checks_.compare_registrations(cx, regs, call);
    plan_.set_merge_neighbours(checks_.neighbours_agree(cx, registry_.data_parallel_in_fused_order(opt_), call),
                               opt_.backward_passes_per_step);
    ++stats_.consistency_checks;
    checks_.registrations_compared();
  }

  // plan: the layout from the registrations, then every exchange's buffers for it.
  void plan() {
    if (!plan_.dirty()) return;
    TimelineScope span(timeline_.get(), Timeline::Kind::plan, "plan build");
    ProfileRegion region(Region::plan_build);
    Context cx = ctx();
    checks_.require_staging_possible(cx);
    if (opt_.shard != Shard::none) refuse_unshardable();
    const auto layout = plan_.build(registry_, opt_, backend_.size(), Plan::staging_wanted(backend_, opt_), backend_);
    stats_.chunk_bytes = plan_.fusion_threshold_bytes();  // the rule's chunk across nodes fits the model
    if constexpr (!has_wire_shard<Backend>::value)
      if (opt_.shard != Shard::none && backend_.size() > 1)
        for (const Chunk& c : plan_.chunks())
          if (c.kind != 0)
            throw ConfigError(
                cat("shard = optimizer_state: compressed gradients need a backend with "
                    "Capability::wire_shard (a compressed reduce-scatter); backend '",
                    Backend::name(), "' does not declare it"));
    Frame f = frame(cx);
    for_each_exchange(exchanges_, [&](auto& x) { x.provision(f, layout); });
    if (timeline_) plan_.note_in(*timeline_, registry_.data_parallel_names_in_fused_order(opt_), layout.tensor_chunks);
    ++stats_.plan_builds;
    plan_.built();
    this->refresh_owned();
    if (!announced_) announce();
  }

  // Options::shard: what a sharded step cannot do yet, named (the same on every rank: the
  // registrations were compared, the backend's reach agreed).
  void refuse_unshardable() {
    if (Plan::staging_wanted(backend_, opt_))
      throw ConfigError(
          "shard = optimizer_state: the backend cannot read the gradients where they are (host "
          "staging): not supported sharded yet");
    if constexpr (has_cuda_aware<Backend>::value)
      if (backend_.cuda_aware())  // MpiBackend's halves run gradsync's ring, whose additions are host loops
        throw ConfigError(
            "shard = optimizer_state with CUDA-aware MPI: the reduce-scatter runs on host memory; "
            "not supported sharded yet");
    this->rows().for_each_registration(
        [](const std::string& name, const std::string& group, bool local, bool, std::size_t) {
          if (!local)
            throw ConfigError(cat("shard = optimizer_state: row-sparse data-parallel gradient '", name, "' (group ",
                                  group, "): not supported sharded yet (local row-sparse tables are)"));
        });
    using SetBackend = typename std::decay_t<decltype(this->sets())>::SetBackend;
    if constexpr (!has_shard_sums<SetBackend>::value)
      for (const auto& s : this->sets().sets())
        if (!s.tensors.empty())
          throw ConfigError(cat("shard = optimizer_state: process set ", s.tag, " reduces '", s.tensors.front().name,
                                "' (group ", s.tensors.front().group,
                                ") over a backend without Capability::shard_sums"));
  }

  // check: with check_finite, everything that leaves in this step, before the first byte does.
  // (After mark_ready opened the step, each chunk is scanned at its launch instead.)
  void check() {
    if (!opt_.check_finite) return;
    Context cx = ctx();
    checks_.check_finite(cx, registry_, dense().data_parallel_segments(), dense().num_data_parallel_segments());
  }

  // Passes 1 .. N-1 of an aggregation cycle: a local sum, nothing crosses.
  void sum_locally() {
    apply_weights(false);
    Context cx = ctx();
    dense().accumulate(cx, plan_, step_.pass() == 0);
    fence(exec_, label_fence_sync());
    step_.pass_accumulated();
    end_counted_pass(false);
  }

  // open: once per step, at its first reducing call (mark_ready or synchronize).
  void open() {
    if (step_.open()) return;
    dense().open_step();
    apply_weights(true);
    step_.opened();
  }

  // launch: chunks that became possible, each scanned first with check_finite.
  void launch() {
    Context cx = ctx();
    Frame f = frame(cx);
    for_each_exchange(exchanges_,
                      [&](auto& x) { with_scan(x, opt_.check_finite, [&](auto&& scan) { x.advance(f, scan); }); });
  }

  // finish: every exchange, in list order (`scan`: chunks launched now, when mark_ready opened the
  // step and check() did not run).
  void finish(bool was_open) {
    Context cx = ctx();
    Frame f = frame(cx);
    const bool scan = opt_.check_finite && was_open;
    for_each_exchange(exchanges_, [&](auto& x) { with_scan(x, scan, [&](auto&& s) { x.finish(f, s); }); });
    fence(exec_, label_fence_sync());
  }

  void close(std::chrono::steady_clock::time_point t0, const V*& overflow) {
    step_.pending = dense().has_deferred();
    ++stats_.steps;
    if (dense().watches_overflow()) {
      Context cx = ctx();
      overflow = dense().take_overflow(cx, plan_);
    }
    if (plan_.tuner().active()) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      Context cx = ctx();
      plan_.tune(
          seconds, [&](double* v, std::size_t n) { Checks::agree_on_max(cx, v, n); }, stats_, timeline_.get());
    }
    step_.closed();
    end_counted_pass(true);
  }

  Frame frame(Context& cx) { return Frame{cx, plan_, registry_, sets(), opt_.backward_passes_per_step > 1}; }
  bool reducing_pass() const { return step_.pass() + 1 >= opt_.backward_passes_per_step; }

  // run(scan) with check_finite's scan where `scan` is set and the exchange sends scanned values
  // (ExchangeBase::scanned), else with none: each exchange's operation is instantiated only with the
  // scans it can be given.
  template <class X, class Run>
  void with_scan(X&, bool scan, Run&& run) {
    if constexpr (X::scanned) {
      if (scan)
        return run([this](std::int64_t seg_begin, std::int64_t seg_end) {
          Context cx = ctx();
          checks_.check_finite(cx, registry_, dense().data_parallel_segments(), seg_end - seg_begin, seg_begin);
        });
    }
    run(NoScan{});
  }

  void require_counted() const { step_.require_counted(backend_.rank(), stats_.passes, weighted(), needs_samples_); }
  void end_counted_pass(bool step_closed) {
    if (!weighted()) return;
    if (step_closed) {
      stats_.samples = std::uint64_t(step_.samples.step);
      stats_.empty_steps += step_.samples.step == 0;
    }
    step_.end_counted_pass(step_closed);
  }

  // A weighted sync's factors for this pass (SyncStep::factors). The step's samples cross in the
  // arrival round, or in a round of their own where none ran (no side channel after the first call).
  void apply_weights(bool reducing) {
    if (!weighted()) return;
    auto& s = step_.samples;
    if (reducing && !s.agreed) {
      std::int64_t v[1] = {s.cycle + s.pass};
      ctl_.template allreduce_min_sum<0, 1>(backend_, v, opt_,
                                            WaitSite{"agreement on samples", std::int64_t(stats_.passes), -1, 0});
      s.step = v[0], s.agreed = true;
    }
    const SyncStep::Factors f = step_.factors(opt_, reducing);
    if (f.rescale != 1) {
      Context cx = ctx();
      dense().rescale_residuals(cx, V(f.rescale));
    }
    plan_.set_step_factors(V(f.pre), V(f.post), SampleWeights<V>{true, V(double(s.pass)), V(f.mult)});
  }
};

}  // namespace gradsync::impl
