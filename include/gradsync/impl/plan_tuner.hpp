// gradsync internals: choices the plan makes by measurement. The first steps try each candidate
// (a chunk size under fusion_threshold_auto; flat or hierarchical across nodes), the ranks agree
// on the timings (the slowest rank's, by an allreduce of the maxima) and the fastest candidate is
// kept for the rest of the run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "../topology.hpp"

namespace gradsync::impl {

/// Chunk sizes fusion_threshold_auto tries, largest first so the fusion buffer is allocated once,
/// at the first step.
inline const std::vector<std::size_t>& chunk_candidates() {
  static const std::vector<std::size_t> c = {std::size_t(8) << 20, std::size_t(4) << 20, std::size_t(2) << 20,
                                             std::size_t(1) << 20, std::size_t(512) << 10};
  return c;
}

/// Across nodes, the chunk size the plan picks for `ranks` ranks. Each of a ring's 2(p-1) steps moves
/// chunk/p bytes and pays the network's per-message latency once, so the chunk grows with p to keep
/// a step's message near 256 KiB: 1 MiB up to 4 ranks (the two-host bed's measured best,
/// docs/BENCHMARKS_HOSTS.md), 4 MiB at 16, 16 MiB at 64, at most 64 MiB (Horovod's fusion buffer)
/// from 256. A simulated sweep at 16-256 ranks is behind it (docs/SCALING.md).
inline std::size_t network_chunk_bytes(int ranks) {
  const std::size_t by_ranks = std::size_t(ranks > 0 ? ranks : 1) << 18;  // ranks x 256 KiB
  return std::clamp(by_ranks, std::size_t(1) << 20, std::size_t(64) << 20);
}

/// The rule's chunk for a model of `model_bytes` (data-parallel): no larger than its share of the
/// chunks in flight, so that a small model still has that many collectives to overlap (DLRM's MLP,
/// 1.9 MB, at 64 simulated ranks: 0.79 ms in 1 MiB chunks, 1.03 ms as one), and never under 1 MiB.
inline std::size_t network_chunk_for_model(std::size_t rule_bytes, std::size_t model_bytes, int in_flight) {
  const std::size_t share = model_bytes / std::size_t(in_flight > 1 ? in_flight : 1);
  return std::min(rule_bytes, std::max(share, std::size_t(1) << 20));
}

/// Across nodes, the nonblocking chunks in flight for `ranks` ranks: 2 on a short ring, 8 from 16
/// ranks, where each chunk's 2(p-1) dependent steps leave the link idle unless other chunks'
/// messages fill it (docs/SCALING.md; on the two-host bed more than 2 only contended for its 2 cores).
inline int network_chunks_in_flight(int ranks) { return ranks >= 16 ? 8 : 2; }

/// One way to run the sync's collectives: what the plan decides.
struct PlanChoice {
  std::size_t chunk_bytes = 0;  // fusion threshold (0: one call per tensor)
  int in_flight = 1;            // nonblocking chunks reduced at once
  Algorithm algorithm = Algorithm::flat;
  bool fill = false;  // chunk_bytes is the rule's across nodes: network_chunk_for_model caps it
};

class PlanTuner {
 public:
  /// Steps timed per candidate; the first (which rebuilds the plan) is discarded.
  static constexpr int steps_per_candidate = 4;

  /// Tunes when there is more than one candidate.
  explicit PlanTuner(std::size_t candidates = 1) : active_(candidates > 1), best_(candidates, 0) {}

  bool active() const { return active_; }
  /// The candidate to run now (while tuning) or the one kept.
  std::size_t current() const { return active_ ? cand_ : chosen_; }

  /// Records one step's seconds. Returns true when the plan must be rebuilt (next candidate, or the
  /// final choice). `agree_max(values, n)` must be an allreduce-max over all ranks.
  template <class AgreeMax>
  bool record(double seconds, AgreeMax&& agree_max) {
    if (!active_) return false;
    if (step_ > 0 && (step_ == 1 || seconds < best_[cand_])) best_[cand_] = seconds;
    if (++step_ < steps_per_candidate) return false;
    step_ = 0;
    if (++cand_ < best_.size()) return true;
    agree_max(best_.data(), best_.size());  // every rank then picks the same candidate
    std::size_t k = 0;
    for (std::size_t i = 1; i < best_.size(); ++i)
      if (best_[i] < best_[k]) k = i;
    chosen_ = k;
    active_ = false;
    return true;
  }

  /// Seconds of the best step of each candidate (agreed by the ranks once tuning ended).
  const std::vector<double>& timings() const { return best_; }

 private:
  bool active_;
  std::size_t cand_ = 0;
  int step_ = 0;
  std::vector<double> best_;
  std::size_t chosen_ = 0;
};

}  // namespace gradsync::impl
