// gradsync: impl::SyncStep, the protocol of a GradientSync's steps, in one place.
//
// A GradientSync is always in one of these states:
//
//   idle          between steps. Everything is legal: registrations, scale deferral, prepare(),
//                 the collective helpers (global norm, broadcast of parameters).
//   accumulating  passes 1 .. N-1 of an aggregation cycle (backward_passes_per_step = N) are summed
//                 inside the sync. Nothing is in flight; registrations would no longer match the sums.
//   open          the exchange of the cycle's last pass has started: mark_ready() launched chunks,
//                 or synchronize() is running. Requests and buffers are in flight.
//   failed        a collective phase threw on this rank or on a peer. The peers were told (every
//                 peer throws the same error class, naming the rank that failed), and whatever the
//                 phase may still touch is parked, never freed. Every later call throws at once.
//   moved_from    the sync was moved into another object (a DistributedOptimizer); only
//                 destruction is legal.
//
//   idle --synchronize(), pass k < N--> accumulating --synchronize(), pass N--> open --> idle
//   idle, accumulating --mark_ready(), pass N--> open --synchronize() returns true--> idle
//   any --an exception inside a collective phase--> failed (for good)
//
// The failure path is one function (StepPipeline::fail): any exception that leaves a
// collective phase, whoever threw it (a local check, MPI, an allocation, a count limit, a peer's
// notice, the stall watchdog), tells the peers unless they told this rank, parks the step's
// requests, buffers and communicators, and records the reason. Errors that leave the sync usable
// are thrown outside the collective phases, before anything collective starts or after every rank
// completed the same exchange (misuse rejected by require(), fp16 overflow): docs/ERRORS.md lists them.
// Destroying a sync whose step is open is the same path (StepPipeline::abandon): an exception
// thrown by the user's own code during backward unwinds it with chunks in flight.
//
// SyncStep also holds every other datum that lives for one step: the call number the current
// collective phase belongs to, the samples counted for it (set_samples) and whether deferred local
// scales are pending. impl/step_pipeline.hpp drives it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "../error.hpp"
#include "../options.hpp"
#include "stall.hpp"

namespace gradsync::impl {

enum class StepState { idle, accumulating, open, failed, moved_from };

inline const char* to_string(StepState s) {
  switch (s) {
    case StepState::idle:
      return "idle";
    case StepState::accumulating:
      return "accumulating";
    case StepState::open:
      return "open";
    case StepState::failed:
      return "failed";
    case StepState::moved_from:
      return "moved from";
  }
  return "?";
}

class SyncStep {
 public:
  SyncStep() = default;
  SyncStep(const SyncStep&) = delete;
  SyncStep& operator=(const SyncStep&) = delete;
  // Moving hands the step to the new object; the old one only accepts destruction.
  SyncStep(SyncStep&& o) noexcept
      : samples(o.samples),
        pending(o.pending),
        state_(o.state_),
        pass_(o.pass_),
        call_(o.call_),
        failure_(std::move(o.failure_)),
        failure_kind_(o.failure_kind_) {
    o.state_ = StepState::moved_from;
  }
  SyncStep& operator=(SyncStep&&) = delete;

  StepState state() const { return state_; }
  bool open() const { return state_ == StepState::open; }
  bool failed() const { return state_ == StepState::failed; }
  // Backward passes of the current aggregation cycle already summed (0 .. N-1).
  int pass() const { return pass_; }
  // The synchronize() call (1-based) the current or next collective phase belongs to: errors and
  // reports name it.
  std::int64_t call() const { return call_; }
  void begin_call(std::uint64_t passes_done) { call_ = std::int64_t(passes_done) + 1; }

  // set_samples(): this pass's count, the cycle's earlier passes, every rank's sum for the step
  // (agreed on the reducing pass), and the N error-feedback residuals were kept for (0: none yet).
  struct Samples {
    std::int64_t pass = 0, cycle = 0, step = 0, residual = 0;
    bool counted = false;  // this pass's count was given
    bool agreed = false;   // the step's sum crossed (in the arrival round or its own round)
  } samples;
  bool pending = false;  // deferred local scales not yet applied (local_scale_pending)

  // The most samples one rank may count in one step: 2^40 (10^12), so that the sum over 2^23 ranks
  // fits 64 bits, and over 8192 ranks a double exactly (a backend without a side channel sums as
  // doubles). A larger count is an uninitialised or runaway counter, not a batch.
  static constexpr std::int64_t max_step_samples = std::int64_t(1) << 40;

  // set_samples(n)'s rules, checked before anything changes (`passes_done`: synchronize() calls so
  // far; `weighted`: an earlier call made the sync weighted).
  void check_samples(std::int64_t n, int rank, std::uint64_t passes_done, bool weighted) const {
    require_usable("set_samples()");
    if (n < 0 || n > max_step_samples - samples.cycle)
      throw Error(cat("set_samples(", n, ") on rank ", rank,
                      ": a sample count is 0 or more, and a rank's counts in one step at most 2^40 (", max_step_samples,
                      "; this step's earlier passes counted ", samples.cycle,
                      "), so that the ranks' sum fits 64 bits: an uninitialised counter?"));
    if (open())
      throw Error(cat("set_samples() called while a step is open on rank ", rank,
                      " (mark_ready() started its exchange): give the pass's count before its first mark_ready()"));
    if (samples.counted)
      throw Error(cat("set_samples(", n, ") called twice for pass ", pass_ + 1, " of synchronize() call ",
                      passes_done + 1, " on rank ", rank,
                      ": give one count per pass, before the pass's synchronize() (a count given after "
                      "synchronize() would weigh the next pass)"));
    if (!weighted && passes_done > 0)
      throw Error(cat("set_samples(", n, ") on rank ", rank, " after ", passes_done,
                      " synchronize() call(s) without counts: a sync is weighted from its first pass, and a "
                      "pass's count comes before its synchronize() (given after it, it would weigh the next "
                      "pass); call set_samples() before every synchronize() from the first one on"));
  }
  void count_samples(std::int64_t n) {
    samples.pass = n;
    samples.counted = true;
  }
  // The pass's count was given, on this rank (`needs`: a tensor whose policy divides by the
  // samples, in a sync not weighted).
  void require_counted(int rank, std::uint64_t passes_done, bool weighted, const std::string& needs) const {
    if (!weighted && !needs.empty())
      throw ConfigError(cat(needs, " on rank ", rank,
                            " is divided by the step's samples (LocalScale::samples or SetScale::samples), "
                            "which set_samples() gives: call it on every rank before every pass"));
    if (weighted && !samples.counted)
      throw Error(cat("set_samples() was not called for pass ", pass_ + 1, " of synchronize() call ", passes_done + 1,
                      " on rank ", rank, ": a weighted sync needs a count from every rank on every pass (0 for none)"));
  }
  // A weighted pass's factors (SyncPlan::set_step_factors): this rank's samples go before the sum;
  // on the reducing pass the step's samples over every rank (agreed) divide the average.
  // `rescale`: error feedback's residuals are errors of the weighted sum, which 1/N scales: kept for
  // another N, they are rescaled by N / N_prev (1: nothing to do).
  struct Factors {
    double pre = 1, post = 1, mult = 1, rescale = 1;
  };
  Factors factors(const Options& o, bool reducing) {
    Factors f;
    f.pre = o.prescale_factor * double(samples.pass);
    f.post = o.postscale_factor;
    if (!reducing) return f;
    f.mult = samples.step > 0 ? 1.0 / double(samples.step) : 0.0;
    if (o.op == ReduceOp::average) f.post *= f.mult;
    if (o.error_feedback && o.op == ReduceOp::average && samples.step > 0) {
      if (samples.residual > 0 && samples.residual != samples.step)
        f.rescale = double(samples.step) / double(samples.residual);
      samples.residual = samples.step;
    }
    return f;
  }

  // The next pass needs a count of its own; a step's end also starts a new cycle.
  void end_counted_pass(bool step_closed) {
    samples.cycle = step_closed ? 0 : samples.cycle + samples.pass;
    samples.pass = 0;
    samples.counted = samples.agreed = false;
  }

  // Any call but the read-only ones: throws when the sync can no longer be used.
  void require_usable(std::string_view call) const {
    if (state_ == StepState::failed) throw_kind(failure_kind_, cat(call, ": ", failure_));
    if (state_ == StepState::moved_from)
      throw Error(cat(call,
                      ": this GradientSync was moved from (into a DistributedOptimizer or another "
                      "GradientSync); use the object it was moved into"));
  }

  // Calls that change what the ranks exchange or how it is scaled (add, register_local_var,
  // bind_process_set, defer_local_scale, prepare, the collective helpers): between steps only.
  // Rejected on the calling rank, before anything changes; the step goes on intact.
  void require_between_steps(std::string_view call, int passes_per_step) const {
    require_usable(call);
    if (state_ == StepState::accumulating)
      throw Error(cat(call, " called after pass ", pass_, " of ", passes_per_step,
                      " of an aggregation cycle; call it only between steps (after synchronize() returned true): "
                      "the sums held for the cycle would no longer match"));
    if (state_ == StepState::open)
      throw Error(cat(call,
                      " called while a step is open (mark_ready() started its exchange); call it only "
                      "between steps (after synchronize() returned true)"));
  }

  // --- Transitions (GradientSync drives them) ---
  void pass_accumulated() {
    ++pass_;
    state_ = StepState::accumulating;
  }
  void opened() { state_ = StepState::open; }
  void closed() {
    pass_ = 0;
    state_ = StepState::idle;
  }
  // The sync failed in `call`'s collective phase on `rank` (this rank or the peer that told it).
  void fail(ErrorKind kind, const std::string& call, std::int64_t number, int rank, const std::string& reason) {
    if (state_ == StepState::failed) return;  // the first failure is the one reported
    failure_kind_ = kind;
    std::string r = reason.rfind("gradsync: ", 0) == 0 ? reason.substr(10) : reason;
    failure_ = cat("this GradientSync failed in ", call, " (synchronize() call ", number, ") on rank ", rank, ": ", r,
                   ". It cannot be used again (its collectives may still be pending inside MPI): "
                   "build a new one on every rank");
    state_ = StepState::failed;
  }

 private:
  StepState state_ = StepState::idle;
  int pass_ = 0;
  std::int64_t call_ = 1;
  std::string failure_;
  ErrorKind failure_kind_ = ErrorKind::error;
};

}  // namespace gradsync::impl
