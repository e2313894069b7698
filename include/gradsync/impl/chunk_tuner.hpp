// gradsync internals: Options::fusion_threshold_auto. The first steps try a few chunk sizes, the
// ranks agree on the timings (the slowest rank's, by an allreduce of the maxima) and the fastest
// size is kept for the rest of the run.
#pragma once

#include <cstddef>
#include <vector>

namespace gradsync::impl {

class ChunkTuner {
 public:
  /// Candidate sizes, largest first so the fusion buffer is allocated once, at the first step.
  static const std::vector<std::size_t>& candidates() {
    static const std::vector<std::size_t> c = {std::size_t(8) << 20, std::size_t(4) << 20, std::size_t(2) << 20,
                                               std::size_t(1) << 20, std::size_t(512) << 10};
    return c;
  }
  /// Steps timed per candidate; the first (which rebuilds the plan) is discarded.
  static constexpr int steps_per_candidate = 4;

  explicit ChunkTuner(bool enabled) : active_(enabled), best_(candidates().size(), 0) {}

  bool active() const { return active_; }
  std::size_t chosen() const { return chosen_; }
  /// The threshold to build the plan with now.
  std::size_t current() const { return active_ ? candidates()[cand_] : chosen_; }

  /// Records one step's seconds. Returns true when the plan must be rebuilt (next candidate, or the
  /// final choice). `agree_max(values, n)` must be an allreduce-max over all ranks.
  template <class AgreeMax>
  bool record(double seconds, AgreeMax&& agree_max) {
    if (!active_) return false;
    if (step_ > 0 && (step_ == 1 || seconds < best_[cand_])) best_[cand_] = seconds;
    if (++step_ < steps_per_candidate) return false;
    step_ = 0;
    if (++cand_ < candidates().size()) return true;
    agree_max(best_.data(), best_.size());  // every rank then picks the same size
    std::size_t k = 0;
    for (std::size_t i = 1; i < best_.size(); ++i)
      if (best_[i] < best_[k]) k = i;
    chosen_ = candidates()[k];
    active_ = false;
    cand_ = 0;
    return true;
  }

  /// Seconds of the best step of each candidate (after agreement), for reports.
  const std::vector<double>& timings() const { return best_; }

 private:
  bool active_;
  std::size_t cand_ = 0;
  int step_ = 0;
  std::vector<double> best_;
  std::size_t chosen_ = 0;
};

}  // namespace gradsync::impl
