// hybrid_dlrm: a generator of Criteo-shaped samples, labelled by a hidden teacher.
//
// Sample g of the stream (g = step * batch + position in the global batch) is a pure function of
// (seed, g): 13 dense features that look like log-transformed counts, one categorical id per table
// drawn with a per-table power-law skew (a few hot rows, a long tail), and a click label drawn from
// a fixed "teacher" model. A rank generates only the samples of its share of the global batch, and
// every rank count sees the very same global batch.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "config.hpp"
#include "kernels.hpp"

namespace dlrm {

/// The teacher's seed is fixed, whatever --seed says: the task to learn never changes.
inline constexpr std::uint64_t teacher_seed = 0x7eac4e5ull;

class Generator {
 public:
  explicit Generator(const Config& c) : cfg_(c), table_w_(2.0 / std::sqrt(double(c.num_tables()))) {
    const int T = c.num_tables(), F = c.dense_features();
    for (int t = 0; t < T; ++t)  // exponents 1.5 .. 4: the larger, the more skewed
      skew_.push_back(1.5 + 2.5 * double((t * 7) % T) / double(T > 1 ? T - 1 : 1));
    for (int j = 0; j < F; ++j) {
      mean_count_.push_back(double(1 << (j % 6)));
      dense_w_.push_back(1.6 * normal(teacher_seed, 1, std::uint64_t(j)) / std::sqrt(double(F)) * 2.0);
    }
  }

  /// Fills `count` samples starting at global position `first` of batch `step`:
  /// dense [count][F], ids [count][T], label [count]. Returns the sum over these samples of the
  /// teacher's own expected loss (the entropy of its click probability): the floor of the loss.
  template <class HostMatrix, class HostIds, class HostLabels>
  double fill(std::uint64_t step, Index first, Index count, const HostMatrix& dense, const HostIds& ids,
              const HostLabels& label) const {
    const int T = cfg_.num_tables(), F = cfg_.dense_features();
    std::vector<int> row(std::size_t(T), 0);
    double floor = 0;
    for (Index s = 0; s < count; ++s) {
      const std::uint64_t g = step * std::uint64_t(cfg_.batch) + std::uint64_t(first + s);
      double logit = -1.0;  // fewer clicks than not (about 42% with the terms below)
      for (int j = 0; j < F; ++j) {
        const double u = uniform(hash(cfg_.seed, 0xd0, g, std::uint64_t(j)));
        const double x = std::log1p(std::floor(-mean_count_[std::size_t(j)] * std::log(u)));
        dense(s, j) = x;
        logit += dense_w_[std::size_t(j)] * (x - std::log1p(mean_count_[std::size_t(j)]));
      }
      for (int t = 0; t < T; ++t) {
        const double u = uniform(hash(cfg_.seed, 0xca, g, std::uint64_t(t)));
        const std::int64_t rows = cfg_.rows(t);
        const std::int64_t r =
            std::min<std::int64_t>(rows - 1, std::int64_t(double(rows) * std::pow(u, skew_[std::size_t(t)])));
        row[std::size_t(t)] = int(r);
        ids(s, t) = int(r);
        logit += table_w_ * normal(teacher_seed, 2 + std::uint64_t(t), std::uint64_t(r));
      }
      // One interaction the model can only learn through a dot product of two embeddings.
      if (T >= 2)
        logit +=
            1.5 * normal(teacher_seed, 100, std::uint64_t(row[0])) * normal(teacher_seed, 101, std::uint64_t(row[1]));
      const double p = 1.0 / (1.0 + std::exp(-logit));
      label(s) = uniform(hash(cfg_.seed, 0x1a, g, 0)) < p ? 1.0 : 0.0;
      if (p > 0 && p < 1) floor -= p * std::log(p) + (1 - p) * std::log1p(-p);
    }
    return floor;
  }

 private:
  // Roughly standard normal: a sum of four uniforms, centred and scaled to unit variance.
  static double normal(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
    double s = 0;
    for (std::uint64_t k = 0; k < 4; ++k) s += uniform(hash(seed, a, b, k));
    return (s - 2.0) * std::sqrt(3.0);
  }

  Config cfg_;
  std::vector<double> skew_, mean_count_, dense_w_;
  double table_w_;  // the teacher's weight of every table's term
};

}  // namespace dlrm
