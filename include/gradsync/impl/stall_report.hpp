// gradsync internals: what a waiting rank knows of its peers, and the stall report made of it.
//
// A rank that waits too long cannot ask the missing ranks where they are; it can only say what their
// notices told it (impl/stall.hpp): who arrived in this wait, where each waits, where the others were
// last seen. PeerWaits is that record, sized once so that a slow wait allocates nothing, and the
// functions below turn it into the report's text, which names the missing ranks and where they are.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "rank_text.hpp"
#include "wait_site.hpp"

namespace gradsync::impl {

// The peers' ARRIVED notices, as they bear on the current wait.
struct PeerWaits {
  std::vector<char> arrived;            // arrived in this wait's call, or later (this rank too)
  std::vector<std::int64_t> seen_step;  // the latest call each peer announced (-1: none)
  std::vector<std::string> where;       // where each arrived peer waits
  std::vector<std::string> elsewhere;   // peers waiting in an earlier call (their notices)
  std::int64_t step = 0;                // the call of the current wait
  bool replied = false;                 // this wait told a peer waiting further on where it is

  // Sized once, at the sync's construction: the waits of synchronize() allocate nothing.
  void resize(int ranks) {
    arrived.assign(std::size_t(ranks), 0);
    where.assign(std::size_t(ranks), std::string());
    seen_step.assign(std::size_t(ranks), -1);
    elsewhere.assign(std::size_t(ranks), std::string());
  }

  // A new wait in call `at`: a peer that announced this call or a later one already is here.
  void reset(std::int64_t at, int self) {
    std::fill(arrived.begin(), arrived.end(), 0);
    for (auto& w : where) w.clear();
    for (auto& w : elsewhere) w.clear();
    arrived[std::size_t(self)] = 1;
    step = at;
    replied = false;
    for (std::size_t r = 0; r < seen_step.size(); ++r)
      if (seen_step[r] >= at) arrived[r] = 1;
  }

  bool all_arrived() const { return std::find(arrived.begin(), arrived.end(), 0) == arrived.end(); }
};

// Where the missing ranks were last seen: the last collective they completed with this rank, and
// where each is now (a wait it reported, or none: computing, in the program's own MPI, stopped).
// `last_wait_call`: the call of `last_wait`, null when none completed yet.
inline std::string last_seen(const PeerWaits& peers, int rank, const std::vector<int>& missing,
                             const WaitSite& last_wait, const char* last_wait_call) {
  std::string s = last_wait_call ? cat("; last seen with rank ", rank, " in the ",
                                       where_in_call(last_wait, last_wait_call), ", which they completed")
                                 : cat("; no collective of this sync completed with them yet");
  std::vector<std::string> now;
  for (int r : missing) {
    const std::string& e = peers.elsewhere[std::size_t(r)];
    now.push_back(e.empty() ? "in no wait of this sync (computing, in the program's own MPI, or stopped)"
                            : cat("waiting in the ", e));
  }
  return cat(s, "; ", by_rank(missing, now, " now "));
}

// The report's middle, from the peers' notices: the missing ranks, or, if none is missing, why the
// collective may still not complete. `where`: this rank's wait (where_in_call); `program_wait`: a
// program's own exchange, which needs some peers only.
inline std::string peers_report(const PeerWaits& peers, int rank, const std::string& where, bool program_wait,
                                const WaitSite& last_wait, const char* last_wait_call) {
  const int size = int(peers.arrived.size());
  std::string s;
  std::vector<int> missing, present;
  for (int r = 0; r < size; ++r) (peers.arrived[std::size_t(r)] ? present : missing).push_back(r);
  if (missing.empty())
    s += "every rank arrived, yet the collective has not completed (a rank gave up on an earlier one, or "
         "the ranks' collectives do not match)";
  else if (program_wait)  // a point-to-point exchange needs some peers only: say what is known
    s += cat("ranks not waiting in it: ", rank_list(missing), " (waiting: ", rank_list(present),
             "); the peer this rank waits for is among them, unless it completed its part already") +
         last_seen(peers, rank, missing, last_wait, last_wait_call);
  else
    s += cat("missing ranks: ", rank_list(missing), " (arrived: ", rank_list(present), ")") +
         last_seen(peers, rank, missing, last_wait, last_wait_call);
  // Arrived ranks waiting in different collectives: typically registrations changed on some
  // ranks only (they run the consistency check, the others the allreduce).
  bool differ = false;
  for (int r = 0; r < size; ++r)
    differ |= peers.arrived[std::size_t(r)] && r != rank && peers.where[std::size_t(r)] != where;
  if (differ && missing.empty()) {
    std::vector<std::string> full(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) full[std::size_t(r)] = r == rank ? where : peers.where[std::size_t(r)];
    s += cat("; the ranks wait in different collectives: ", by_rank(full),
             " (the ranks run different protocols: something that docs/ERRORS.md lists as undetectable "
             "differs between them)");
  }
  return s;
}

// The report's end: a warning waits on, a final report says what a missing rank may be doing.
inline std::string stall_report_end(bool final_report) {
  if (!final_report) return "; still waiting";
  return ". A missing rank skipped synchronize(), took another code path, died, or is slower than "
         "Options::stall_timeout (GRADSYNC_STALL_TIMEOUT_S) allows";
}

}  // namespace gradsync::impl
