// gradsync internals: which fused chunks have all their gradients final (mark_ready), so a chunk
// can be reduced while backward still computes the others.
//
// Chunks are launched strictly in fused order, whatever order ranks mark tensors in: every rank
// then issues the same sequence of collectives, which MPI and NCCL require.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace gradsync::impl {

class ReadyTracker {
 public:
  /// `data[i]` is data-parallel tensor i's address; `chunks[i]` its first and last chunk
  /// (first > last for an empty tensor). Allocates; called when the plan is built.
  void build(const std::vector<const void*>& data, const std::vector<std::pair<std::int64_t, std::int64_t>>& chunks,
             std::size_t nchunks) {
    ranges_ = chunks;
    total_.assign(nchunks, 0);
    for (const auto& r : ranges_)
      for (std::int64_t c = r.first; c <= r.second; ++c) ++total_[std::size_t(c)];
    left_ = total_;
    ready_.assign(data.size(), 0);
    by_address_.clear();
    for (std::size_t i = 0; i < data.size(); ++i)
      if (ranges_[i].first <= ranges_[i].second) by_address_.emplace_back(data[i], i);
    std::sort(by_address_.begin(), by_address_.end(), by_address);
    prefix_ = 0;
  }

  /// A new step: nothing is ready. No allocation.
  void reset() {
    std::copy(total_.begin(), total_.end(), left_.begin());
    std::fill(ready_.begin(), ready_.end(), char(0));
    prefix_ = 0;
  }

  /// The data-parallel tensor at `p` with chunks, or -1 (an unknown or empty tensor).
  std::int64_t find(const void* p) const {
    auto it = std::lower_bound(by_address_.begin(), by_address_.end(), std::make_pair(p, std::size_t(0)), by_address);
    return it != by_address_.end() && it->first == p ? std::int64_t(it->second) : -1;
  }

  /// Marks tensor i ready (again: no effect) and returns how many leading chunks are all ready.
  std::size_t mark(std::size_t i) {
    if (ready_[i]) return prefix_;
    ready_[i] = 1;
    for (std::int64_t c = ranges_[i].first; c <= ranges_[i].second; ++c) --left_[std::size_t(c)];
    while (prefix_ < left_.size() && left_[prefix_] == 0) ++prefix_;
    return prefix_;
  }

  std::size_t ready_prefix() const { return prefix_; }

 private:
  // Tensors are unrelated objects: only std::less orders their addresses (operator< need not).
  static bool by_address(const std::pair<const void*, std::size_t>& a, const std::pair<const void*, std::size_t>& b) {
    return std::less<const void*>()(a.first, b.first);
  }

  std::vector<std::pair<std::int64_t, std::int64_t>> ranges_;
  std::vector<int> total_, left_;  // tensors per chunk; those not ready yet
  std::vector<char> ready_;
  std::vector<std::pair<const void*, std::size_t>> by_address_;
  std::size_t prefix_ = 0;
};

}  // namespace gradsync::impl
