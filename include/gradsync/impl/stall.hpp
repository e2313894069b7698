// gradsync internals: the control channel and the stall watchdog.
//
// Every collective gradsync waits on goes through wait_until_done(): a test of the request first
// (the fast path: one MPI_Test of a request that has usually completed), then, only if it has not,
// a polling loop with a deadline. While polling, the rank listens on a side channel, a second
// duplicate of the backend's communicator, for notices from its peers:
//   - ARRIVED: "I am waiting in exchange k". A waiting rank posts it to every rank once half the
//     warning interval has passed, so that at the warning and at the deadline each waiting rank
//     knows which ranks arrived, hence which are missing. Nothing is sent on the fast path.
//   - FAILED: "I threw <error> before the exchange". A rank that fails a local check (NaN in a
//     gradient, a resized tensor) tells its peers first, so they throw the same error at once
//     instead of waiting for the deadline.
//   - GONE: "my GradientSync was destroyed after its k-th collective call". A peer waiting in a
//     later call throws at once, naming that rank and its last call (a rank that skipped a call
//     or left the loop early, or whose own error unwound its sync); a peer waiting in call k or
//     before stays silent, since the destroyed rank took part in it (a normal end).
// The consistency check's small fixed-size collectives run on the side channel too, nonblocking,
// under the same deadline. Options::stall_timeout = 0 removes the deadline (and the warning), not
// the listening: a rank waits forever for a missing peer, yet stops when a peer reports a failure,
// so a local failure on one rank ends every rank whatever its deadline (the ranks' deadlines need
// not agree).
//
// This file holds impl::Control, the waits and the notices' protocol; its parts live beside it:
// side_channel.hpp (the duplicate communicator), notices.hpp (the messages), stall_report.hpp
// (what a report says), graveyard.hpp (memory kept after a failed wait), wait_site.hpp and
// error_kind.hpp (how a wait and an error are named across ranks).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "control_fwd.hpp"
#include "error_kind.hpp"
#include "graveyard.hpp"
#include "hash.hpp"
#include "mpi_traits.hpp"
#include "notices.hpp"
#include "rank_text.hpp"
#include "side_channel.hpp"
#include "stall_report.hpp"
#include "test_hooks.hpp"
#include "wait_site.hpp"

namespace gradsync::impl {

// Whether `local_ranks` processes on this node outnumber its CPUs: the online ones, not this
// process's affinity (Open MPI binds each of 2 ranks on 2 cores to one core: no oversubscription).
// False when unknown.
inline bool node_oversubscribed(int local_ranks) {
  const unsigned cpus = std::thread::hardware_concurrency();
  return cpus > 0 && unsigned(local_ranks) > cpus;
}

/// The side channel of one GradientSync. Over an MPI backend it owns a duplicate of the backend's
/// communicator (created with MPI_Comm_idup, so building a GradientSync never blocks); over any
/// other backend it falls back to the backend's own blocking collectives and has no notices.
template <class Backend>
class Control {
  static constexpr bool mpi = has_mpi_comm<Backend>::value;

 public:
  // Collective over the backend's ranks, like building the backend: the duplicate is created
  // nonblocking and waited for here with the stall deadline, so a rank that never builds its
  // GradientSync is reported instead of hanging the others. (Open MPI needs the MPI_Comm_idup to
  // complete before other collectives are issued on the parent communicator: it runs further
  // rounds of its context-id agreement during progress.)
  Control(const Backend& b, const Options& o) : rank_(b.rank()), size_(b.size()) {
    if constexpr (has_topology<Backend>::value) oversubscribed_ = node_oversubscribed(b.topology().local_size);
    // Sized once here: the waits of synchronize() allocate nothing, even slow ones.
    peers_.resize(size_);
    gone_after_.assign(std::size_t(size_), -1);
    if constexpr (mpi) {
      state_ = std::make_shared<SideChannelComm>();
      if (size_ == 1) return;
      id_ = next_side_channel_id(b.comm());
      if constexpr (has_notice_comm<Backend>::value) notices_ = b.notice_comm();
      check(MPI_Comm_idup(b.comm(), state_->comm, &state_->dup_req), "MPI_Comm_idup");
      try {
        ready(o, WaitSite{"creation of the side channel (MPI_Comm_idup) in the GradientSync constructor", 0, -1, 0});
      } catch (...) {
        // The pending duplication still refers to the backend's communicator: keep it alive.
        graveyard().push_back(std::make_shared<Backend>(b));
        throw;
      }
    }
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // --- The ledger of this sync's collective calls (synchronize(), prepare(), the helpers). Every
  // rank makes the same sequence of them, so their count compares the ranks' progress: a GONE
  // notice carries it, and reports name the call a wait belongs to. A few stores per call. ---

  /// Entering collective call `name` (a string literal: kept by address).
  void enter_call(const char* name) { call_name_ = name; }
  /// The call entered last.
  const char* call_name() const { return call_name_; }

  /// wait_until_done() for a program's own exchange (gradsync::wait_all): a peer whose sync ended
  /// normally may still take part in it, so only a GONE notice of an error ends this wait.
  template <class Test>
  void wait_for_program(Test&& request_done, const Options& o, const WaitSite& site) {
    program_wait_ = true;
    try {
      wait_until_done(request_done, o, site);
    } catch (...) {
      program_wait_ = false;
      throw;
    }
    program_wait_ = false;
  }
  /// The call entered last completed on this rank.
  void call_done() {
    ++calls_done_;
    last_call_ = call_name_;
  }
  /// Collective calls completed on this rank.
  std::int64_t calls_done() const { return calls_done_; }

  /// The sync is destroyed between steps: peers waiting in a later call than the ones this rank
  /// completed learn it at once (GONE). `unwinding`: an exception unwinds this rank's stack;
  /// `last_error`: the last error this sync threw on this rank outside a collective (or empty).
  /// Costs n-1 small eager sends. Never throws.
  void tell_gone(bool unwinding, const std::string& last_error) noexcept {
    if constexpr (mpi) {
      try {
        if (size_ == 1 || notices_ == MPI_COMM_NULL || !comm_ready() || told_ || heard_) return;
        told_ = true;
        Notice n;
        n.kind = unwinding || !last_error.empty() ? kGoneError : kGone;
        n.step = calls_done_;
        n.sync = id_;
        std::string why = cat("its GradientSync was destroyed after ", calls_done_, " collective call",
                              calls_done_ == 1 ? "" : "s", calls_done_ ? cat(" (the last: ", last_call_, ")") : "",
                              unwinding ? " while an exception unwound its stack" : "");
        if (!last_error.empty()) why += cat("; its last error: ", last_error);
        std::strncpy(n.text, why.c_str(), sizeof(n.text) - 1);
        send_notice(n, notices_, rank_, size_, -1);
      } catch (...) {  // out of memory at destruction: the peers meet the deadline instead
      }
    }
  }

  /// MIN over ranks of n int64 values, in place.
  void allreduce_min(const Backend& b, std::int64_t* buf, int n, const Options& o, const WaitSite& site) {
    if (size_ == 1) return;
    if constexpr (mpi) {
      watched_allreduce(buf, std::size_t(n), n, MPI_INT64_T, MPI_MIN, o, site);
    } else {
      b.allreduce_min(buf, std::size_t(n));
    }
  }

  /// In place over ranks: MIN of buf[0, Min), SUM of buf[Min, Min + Sum) (sample counts: each
  /// rank's below 2^53, so that a backend without a side channel may sum them as doubles). One
  /// collective for both (a user-defined MPI op on one Min + Sum word element).
  template <int Min, int Sum>
  void allreduce_min_sum(const Backend& b, std::int64_t* buf, const Options& o, const WaitSite& site) {
    if (size_ == 1) return;
    if constexpr (mpi) {
      static const MinSumOp<Min, Sum> op;  // created at first use, kept for the process's lifetime
      watched_allreduce(buf, std::size_t(Min + Sum), 1, op.type, op.op, o, site);
    } else {
      if constexpr (Min > 0) b.allreduce_min(buf, std::size_t(Min));
      double sums[Sum];
      for (int i = 0; i < Sum; ++i) sums[i] = double(buf[Min + i]);
      b.allreduce_sum(sums, std::size_t(Sum));
      for (int i = 0; i < Sum; ++i) buf[Min + i] = std::int64_t(sums[i]);
    }
  }

  /// recv holds size() * bytes: rank r's bytes at recv + r * bytes.
  void allgather(const Backend& b, const unsigned char* send, unsigned char* recv, int bytes, const Options& o,
                 const WaitSite& site) {
    if (size_ == 1) {
      std::memcpy(recv, send, std::size_t(bytes));
      return;
    }
    if constexpr (mpi) {
      ready(o, site);
      auto* s = scratch(std::size_t(size_ + 1) * std::size_t(bytes));  // [recv | send], see watched_allreduce
      unsigned char* own = s + std::size_t(size_) * std::size_t(bytes);
      std::memcpy(own, send, std::size_t(bytes));
      MPI_Request r = MPI_REQUEST_NULL;
      check(MPI_Iallgather(own, bytes, MPI_BYTE, s, bytes, MPI_BYTE, *state_->comm, &r), "MPI_Iallgather");
      wait_request(r, o, site);
      std::memcpy(recv, s, std::size_t(size_) * std::size_t(bytes));
    } else {
      b.allgather(send, recv, std::size_t(bytes));
    }
  }

  /// Polls `test` until it returns true. Past Options::stall_timeout, reports the missing ranks
  /// and throws StallError or calls MPI_Abort (Options::tuning.stall_action). Throws the peer's error if a
  /// peer reports that it failed before this exchange.
  template <class Test>
  void wait_until_done(Test&& request_done, const Options& o, const WaitSite& site) {
    using clock = std::chrono::steady_clock;
    const double hold = completed_wait_delay_s();  // a test hook, 0 in programs
    const auto held_since = hold > 0 ? clock::now() : clock::time_point();
    bool done = false;
    const auto test = [&] {
      done = done || request_done();
      return done && (hold <= 0 || std::chrono::duration<double>(clock::now() - held_since).count() >= hold);
    };
    if (test()) return done_with(site);  // the fast path
    const auto t0 = clock::now();
    const double warn = o.stall_timeout > 0 && o.tuning.stall_warning > 0 && o.tuning.stall_warning < o.stall_timeout
                            ? o.tuning.stall_warning
                            : 0.0;
    // Without a deadline of its own a rank still announces its arrival, on the clock of its
    // (silent) warning interval, so that peers with a deadline do not report it missing.
    const double first = warn > 0 ? warn : o.stall_timeout > 0 ? o.stall_timeout : o.tuning.stall_warning;
    // Early enough that the grace wait at the deadline (below) stays within 10% of it.
    const double notify_at = first > 0 ? 0.05 * first : -1.0;
    bool notified = false, warned = false;
    double polled = 0;
    const double spin = spin_before_yield(o);
    if constexpr (mpi) peers_.reset(site.step, rank_);
    for (;;) {
      if (test()) return done_with(site);
      const double waited = std::chrono::duration<double>(clock::now() - t0).count();
      if constexpr (mpi)
        if (waited - polled >= 0.001) {  // the side channel, once a millisecond
          polled = waited;
          poll_notices(site);
        }
      if (notify_at >= 0 && !notified && waited >= notify_at) {
        notified = true;
        if constexpr (mpi) post_arrived(site.step, where_in_call(site, call_name_));
      }
      if (warn > 0 && !warned && waited >= warn) {
        warned = true;
        const std::string r = report(site, waited, false);
        std::fprintf(stderr, "gradsync: warning: %s\n", r.c_str());
        std::fflush(stderr);
        if (observer_) observer_(observer_ctx_, ErrorKind::stall, false, r);
      }
      if (o.stall_timeout > 0 && waited >= o.stall_timeout) {
        if constexpr (mpi) {
          if (!notified) post_arrived(site.step, where_in_call(site, call_name_));
          // A rank that arrived just before this deadline posts its notice up to notify_at later:
          // wait that long (at most) so that it is not reported missing, but never past 1.09x the
          // deadline (the promise is 1.1x).
          const double grace = std::min(1.2 * notify_at + 0.05, 0.09 * o.stall_timeout);
          const auto grace_end = clock::now() + std::chrono::duration<double>(grace);
          while (!peers_.all_arrived() && clock::now() < grace_end) {
            if (test()) return done_with(site);
            poll_notices(site);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        fail(ErrorKind::stall, report(site, std::chrono::duration<double>(clock::now() - t0).count(), true), o);
      }
      // Like MPI_Wait: keep polling, since without an asynchronous progress thread the transfer
      // advances only inside MPI_Test (sleeping here measurably slowed large reductions). Past the
      // spin, yield between polls: a peer that shares this core then runs at once instead of at
      // the end of this rank's time slice (MPICH's MPI_Test never yields; Open MPI's only with
      // mpi_yield_when_idle).
      if (waited >= spin) std::this_thread::yield();
    }
  }

  /// A rank that fails a local check before an exchange calls this before throwing, so that its
  /// peers waiting in that exchange throw at once. Costs n-1 small eager sends, only on failure.
  void tell_peers(ErrorKind k, const std::string& msg) {
    if constexpr (mpi) {
      if (size_ == 1 || !comm_ready() || told_) return;
      told_ = true;
      Notice n;
      n.kind = std::int64_t(k) + kFailedBase;
      n.sync = id_;
      std::strncpy(n.text, msg.c_str(), sizeof(n.text) - 1);
      send_notice(n, *state_->comm, rank_, size_, -1);
    }
  }

  /// Views (or anything) that an incomplete collective may still write into; see graveyard().
  void keep_on_failure(std::vector<std::shared_ptr<void>> keep) { keep_ = std::move(keep); }

  /// The failure path's end (StepPipeline::fail): tells the peers (`tell`: false for an
  /// AgreedMismatch), unless one of them told this rank or this rank told them already, then parks everything an
  /// incomplete collective may still touch (`more`: the step's requests). Never throws.
  void abandon(ErrorKind k, const std::string& msg, std::vector<std::shared_ptr<void>> more, bool tell) noexcept {
    try {
      if (tell && !heard_) tell_peers(k, msg);
      for (auto& m : more) keep_.push_back(std::move(m));
      bury();
    } catch (...) {  // out of memory while failing: nothing better to do than to leak
    }
  }
  /// Whether a peer's failure notice ended a wait of this side channel.
  bool heard_failure() const { return heard_; }

  /// Called with each stall warning (final = false) and each report this rank throws or aborts
  /// with (final = true): Options::tuning.timeline records them (impl/timeline.hpp).
  using Observer = void (*)(void* ctx, ErrorKind kind, bool final_report, const std::string& msg);
  void observe(Observer f, void* ctx) {
    observer_ = f;
    observer_ctx_ = ctx;
  }

  /// Throws (or aborts) after telling nothing to anyone: the report is complete.
  [[noreturn]] void fail(ErrorKind k, const std::string& msg, const Options& o) {
    if (observer_) observer_(observer_ctx_, k, true, msg);  // before MPI_Abort: the trace is flushed
    bury();
    if (k == ErrorKind::stall && o.tuning.stall_action == StallAction::abort) {
      std::fprintf(stderr, "gradsync: %s\ngradsync: calling MPI_Abort (stall_action = abort)\n", msg.c_str());
      std::fflush(stderr);
      // MPI_COMM_WORLD, not the sync's communicator: MPI_Abort on a communicator other than the
      // world may end only its own processes, and MPICH ends only the calling one there (the
      // others ran on into the deadline); the job is what abort promises to end.
      if constexpr (mpi) MPI_Abort(MPI_COMM_WORLD, 1);
      std::abort();
    }
    if (k == ErrorKind::mismatch) throw AgreedMismatch(msg.rfind("gradsync: ", 0) == 0 ? msg.substr(10) : msg);
    throw_kind(k, msg);
  }

 private:
  static constexpr int kTag = kNoticeTag;
  // GONE: destroyed between steps after a normal return (kGone) or by an error (kGoneError).
  static constexpr std::int64_t kArrived = 1, kGone = 2, kGoneError = 3, kFailedBase = 100;

  // Tuning::spin_before_yield resolved: auto spins 50 us (a yield after every poll measured
  // +2.4 us per synchronize() of 4 KiB on 2 ranks with a core each, none with 50 us) unless the
  // ranks outnumber the CPUs (then every spin costs the peer that waits for the core:
  // docs/COMPATIBILITY.md, MPICH).
  double spin_before_yield(const Options& o) const {
    if (o.tuning.spin_before_yield != spin_before_yield_auto) return o.tuning.spin_before_yield;
    return oversubscribed_ ? 0.0 : 50e-6;
  }

  static void check(int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw Error(cat(what, " on the side channel failed (code ", rc, ")"));
  }

  // Whether the duplicate exists; progresses its creation without blocking.
  bool comm_ready() {
    if (!state_ || size_ == 1) return false;
    if (!state_->dup_done) {
      int flag = 0;
      MPI_Test(&state_->dup_req, &flag, MPI_STATUS_IGNORE);
      state_->dup_done = flag != 0;
    }
    return state_->dup_done;
  }

  // The duplicate must exist before the side channel is used; waiting for it has a deadline too
  // (a rank that never built its GradientSync), without missing-rank names.
  void ready(const Options& o, WaitSite site) {
    if (comm_ready()) return;
    wait_request(state_->dup_req, o, site);
    state_->dup_done = true;
  }

  // Polled even without a deadline (stall_timeout = 0): a peer's failure notice must get through.
  void wait_request(MPI_Request& r, const Options& o, const WaitSite& site) {
    wait_until_done(
        [&] {
          int flag = 0;
          check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
          return flag != 0;
        },
        o, site);
  }

  // After giving up on a collective: what it may still touch is never freed. That includes the
  // communicators: freeing one with an operation pending lets MPI reuse its context id, and the
  // stale operation then matches the messages of a new communicator.
  void bury() {
    for (auto& p : keep_) graveyard().push_back(std::move(p));
    keep_.clear();
    if (state_) graveyard().push_back(state_);
    if (scratch_) graveyard().push_back(std::move(scratch_));
  }

  // An allreduce of `words` int64 values (`count` elements of `type`) on the side channel, waited
  // under the deadline. MPI works in a buffer of the Control's own, not the caller's (often on the
  // stack): a peer that arrives after this rank gave up still writes its contribution there.
  void watched_allreduce(std::int64_t* buf, std::size_t words, int count, MPI_Datatype type, MPI_Op op,
                         const Options& o, const WaitSite& site) {
    ready(o, site);
    auto* s = scratch(words * sizeof(std::int64_t));
    std::memcpy(s, buf, words * sizeof(std::int64_t));
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, s, count, type, op, *state_->comm, &r), "MPI_Iallreduce");
    wait_request(r, o, site);
    std::memcpy(buf, s, words * sizeof(std::int64_t));
  }

  // The side channel's own buffer: allocated once (grown by the consistency check only), so the
  // arrival check of every step allocates nothing.
  unsigned char* scratch(std::size_t bytes) {
    if (!scratch_ || scratch_->size() < bytes)
      scratch_ = std::make_shared<std::vector<unsigned char>>(std::max<std::size_t>(bytes, 256));
    return scratch_->data();
  }

  // `to`: one rank, or -1 for every peer.
  void post_arrived(std::int64_t step, const std::string& where, int to = -1) {
    if (size_ == 1 || !comm_ready()) return;
    Notice n;
    n.kind = kArrived;
    n.step = step;
    n.sync = id_;
    std::strncpy(n.text, where.c_str(), sizeof(n.text) - 1);
    send_notice(n, *state_->comm, rank_, size_, to);
  }

  // The wait of `site` completed: it is the last collective every rank took part in with this one
  // (what a stall report says the missing ranks were last seen in).
  void done_with(const WaitSite& site) {
    last_wait_ = site;
    last_wait_call_ = call_name_;
  }

  // Not while the constructor waits for the duplicate (dup_done is set when that wait ends): a
  // notice on this side channel is from a peer that finished constructing and failed in a later
  // call, which must reach this rank there (the call then fails alike), not in the constructor
  // (MPICH completes the duplicate at different times on different ranks).
  void poll_notices(const WaitSite& site) {
    if (size_ == 1 || !state_ || !state_->dup_done) return;
    const bool gone_too = notices_ != MPI_COMM_NULL;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Comm from = *state_->comm;
      MPI_Iprobe(MPI_ANY_SOURCE, kTag, from, &flag, &st);
      if (!flag && gone_too) {
        from = notices_;
        MPI_Iprobe(MPI_ANY_SOURCE, kTag, from, &flag, &st);
      }
      if (!flag) break;
      Notice n;
      MPI_Recv(&n, int(sizeof(Notice)), MPI_BYTE, st.MPI_SOURCE, kTag, from, MPI_STATUS_IGNORE);
      n.text[sizeof(n.text) - 1] = '\0';
      if (n.sync != id_) continue;  // an earlier side channel's, on a context MPI reused: drained
      const auto src = std::size_t(st.MPI_SOURCE);
      if (n.kind == kArrived) {
        auto& s = peers_.seen_step[src];
        s = std::max(s, n.step);
        if (n.step >= peers_.step) {
          peers_.arrived[src] = 1;
          peers_.where[src] = n.text;
          // A peer waits for this rank in a later call: say where this rank is, once per wait,
          // so that its report names it (the reply's earlier step asks for no reply).
          if (n.step > peers_.step && !peers_.replied) {
            peers_.replied = true;
            post_arrived(peers_.step, where_in_call(site, call_name_), int(src));
          }
        } else {
          peers_.elsewhere[src] = n.text;  // waits in an earlier call: named if it is reported missing
        }
      } else if (n.kind == kGone || n.kind == kGoneError) {
        gone_after_[src] = n.step;
        gone_why_.resize(std::size_t(size_));
        gone_why_[src] = cat(n.kind == kGoneError ? 'E' : 'M', n.text);
      } else if (n.kind >= kFailedBase) {
        std::string msg = n.text;
        if (msg.rfind("gradsync: ", 0) == 0) msg = msg.substr(10);
        heard_ = true;
        bury();
        const std::string m = cat("rank ", st.MPI_SOURCE, " failed before the ", site.what, " of synchronize() call ",
                                  site.step, ", so rank ", rank_, " stops too: ", msg);
        if (observer_) observer_(observer_ctx_, ErrorKind(n.kind - kFailedBase), true, m);
        throw_kind(ErrorKind(n.kind - kFailedBase), m);
      }
    }
    if (!gone_why_.empty()) check_gone(site);
  }

  // A peer whose sync was destroyed before this call will never join it: stop now, naming it. One
  // that completed this call took part in it and ended normally: nothing to say.
  void check_gone(const WaitSite& site) {
    for (int r = 0; r < size_; ++r) {
      const std::int64_t after = gone_after_[std::size_t(r)];
      if (after < 0 || after > calls_done_) continue;
      const std::string& why = gone_why_[std::size_t(r)];
      const ErrorKind k = why[0] == 'E' ? ErrorKind::error : ErrorKind::mismatch;
      if (program_wait_ && k == ErrorKind::mismatch) continue;
      const std::string m =
          cat("rank ", r, " will not join the ", where_in_call(site, call_name_), " (this sync's collective call ",
              calls_done_ + 1, " on rank ", rank_, "): ", why.substr(1),
              k == ErrorKind::mismatch
                  ? ". The ranks made different numbers of collective calls: a rank skipped one (synchronize() "
                    "on a pass without samples: call set_samples(0) and synchronize() instead) or left the loop early"
                  : "");
      heard_ = true;
      bury();
      if (observer_) observer_(observer_ctx_, k, true, m);
      throw_kind(k, m);
    }
  }

  // "rank r has waited t s for the <where>; <what the peers' notices tell>" (impl/stall_report.hpp).
  std::string report(const WaitSite& site, double waited, bool final_report) {
    const std::string where = where_in_call(site, call_name_);
    std::string s = cat("rank ", rank_, " has waited ", waited, " s for the ", where, "; ");
    if constexpr (mpi) {
      if (comm_ready())
        s += peers_report(peers_, rank_, where, program_wait_, last_wait_, last_wait_call_);
      else
        s += "missing ranks unknown (the side channel is not established yet)";
    } else {
      s += cat("missing ranks unknown (backend '", Backend::name(), "' has no side channel)");
    }
    return s + stall_report_end(final_report);
  }

  int rank_ = 0, size_ = 1;
  std::uint64_t id_ = 0;              // this side channel's, in every notice (next_side_channel_id)
  MPI_Comm notices_ = MPI_COMM_NULL;  // the group's notice communicator (GONE; impl/notice_comm.hpp)
  std::shared_ptr<SideChannelComm> state_;
  PeerWaits peers_;                       // what the peers' ARRIVED notices told of the current wait
  std::vector<std::int64_t> gone_after_;  // peers whose sync was destroyed: the calls they completed (-1: not gone)
  std::vector<std::string> gone_why_;     // their reasons (first letter: E error, M mismatch); empty if none
  bool program_wait_ = false;             // the wait is a program's own exchange (wait_for_program)
  const char* call_name_ = "the GradientSync constructor";  // the collective call this rank is in (enter_call)
  const char* last_call_ = nullptr;                         // the last one completed
  std::int64_t calls_done_ = 0;                             // collective calls completed (call_done)
  WaitSite last_wait_;                                      // the last wait completed ...
  const char* last_wait_call_ = nullptr;                    // ... and its call
  std::vector<std::shared_ptr<void>> keep_;
  std::shared_ptr<std::vector<unsigned char>> scratch_;
  bool told_ = false;            // this rank sent its failure notice (once per sync)
  bool oversubscribed_ = false;  // more of the backend's ranks on this node than CPUs
  bool heard_ = false;           // a peer's failure notice was received
  Observer observer_ = nullptr;
  void* observer_ctx_ = nullptr;
};

/// A rank whose GradientSync constructor refuses its options (a ConfigError) while its peers build
/// theirs: it joins the side channel's creation (the peers' constructors complete) and tells them,
/// so that their first collective call fails at once, naming this rank's error. Never throws.
template <class Backend>
void tell_peers_at_construction(const Backend& b, const Options& given, ErrorKind k, const std::string& msg) noexcept {
  try {
    Options o;  // the defaults, but the caller's deadline when it is valid
    if (given.stall_timeout >= 0 && given.stall_timeout < 1e9) o.stall_timeout = given.stall_timeout;
    Control<Backend> c(b, o);
    c.tell_peers(k, msg);
  } catch (...) {  // the peers meet the deadline instead
  }
}

/// Waits for a backend request with the deadline of Options::stall_timeout (0: none). Over an MPI
/// communicator it polls even without a deadline, listening for the peers' failure notices;
/// without a side channel there is nothing to listen for (backend.wait()).
template <class Backend>
void wait_for(const Backend& backend, typename Backend::Request& request, Control<Backend>& ctl, const Options& o,
              const WaitSite& site) {
  if (o.stall_timeout <= 0 && !has_mpi_comm<Backend>::value) {
    backend.wait(request);
    return;
  }
  ctl.wait_until_done([&] { return backend.test(request); }, o, site);
}

}  // namespace gradsync::impl
