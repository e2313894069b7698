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
// The failure path is one function (GradientSync::fail_step): any exception that leaves a
// collective phase, whoever threw it (a local check, MPI, an allocation, a count limit, a peer's
// notice, the stall watchdog), tells the peers unless they told this rank, parks the step's
// requests, buffers and communicators, and records the reason. Errors that leave the sync usable
// are thrown outside the collective phases, before anything collective starts or after every rank
// completed the same exchange (misuse rejected by require(), fp16 overflow): docs/ERRORS.md lists them.
// Destroying a sync whose step is open is the same path (GradientSync::~GradientSync): an exception
// thrown by the user's own code during backward unwinds it with chunks in flight.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"
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
      : state_(o.state_), pass_(o.pass_), failure_(std::move(o.failure_)), failure_kind_(o.failure_kind_) {
    o.state_ = StepState::moved_from;
  }
  SyncStep& operator=(SyncStep&&) = delete;

  StepState state() const { return state_; }
  bool open() const { return state_ == StepState::open; }
  bool failed() const { return state_ == StepState::failed; }
  // Backward passes of the current aggregation cycle already summed (0 .. N-1).
  int pass() const { return pass_; }

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
  std::string failure_;
  ErrorKind failure_kind_ = ErrorKind::error;
};

}  // namespace gradsync::impl
