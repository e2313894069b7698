// gradsync: impl::RangeIndex, registered memory ranges ordered by address.
//
// The registrations (GradientSync, DistributedOptimizer, the optimizers) refuse a tensor that
// shares an element with one already registered. Comparing with every registered tensor made
// registering n tensors quadratic (100,000 of them took minutes); this index answers the same
// questions in O(log n): the ranges it holds never overlap (each was checked before insertion), so
// those that can overlap [p, p + n) are the ones starting before p + n, walked down from there
// until one ends at or before p.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <map>

namespace gradsync::impl {

template <class T>
class RangeIndex {
 public:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  /// The smallest id of the ranges sharing an element with [p, p + n), or npos: the first
  /// registered, as a scan in registration order would have found. Empty ranges overlap nothing.
  std::size_t first_overlap(const T* p, std::size_t n) const {
    if (n == 0) return npos;
    std::size_t first = npos;
    const std::less<const T*> before;
    for (auto it = by_start_.lower_bound(p + n); it != by_start_.begin();) {
      --it;  // starts before p + n; the ends decrease too, as the ranges are disjoint
      if (!before(p, it->first + it->second.size)) break;
      if (it->second.id < first) first = it->second.id;
    }
    return first;
  }

  /// The id of the range [p, p + n) itself, or npos.
  std::size_t find(const T* p, std::size_t n) const {
    const auto it = by_start_.find(p);
    return it != by_start_.end() && it->second.size == n ? it->second.id : npos;
  }

  /// The id of the range holding the element at p, or npos.
  std::size_t holding(const T* p) const {
    auto it = by_start_.upper_bound(p);
    if (it == by_start_.begin()) return npos;
    --it;
    return std::less<const T*>()(p, it->first + it->second.size) ? it->second.id : npos;
  }

  /// Adds a non-empty range that overlaps none held (check first_overlap); an empty one is ignored.
  void insert(const T* p, std::size_t n, std::size_t id) {
    if (n > 0) by_start_.emplace(p, Range{n, id});
  }

  /// Removes the range [p, p + n) of this id (nothing when it is not held).
  void erase(const T* p, std::size_t n, std::size_t id) {
    const auto it = by_start_.find(p);
    if (it != by_start_.end() && it->second.size == n && it->second.id == id) by_start_.erase(it);
  }

  std::size_t size() const { return by_start_.size(); }

 private:
  struct Range {
    std::size_t size, id;
  };
  std::map<const T*, Range, std::less<const T*>> by_start_;
};

}  // namespace gradsync::impl
