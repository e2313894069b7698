// gradsync: impl::SyncRegistry, the dense gradients a GradientSync was given, in registration order.
//
// Every other part reads it and none changes it: the plan lays the data-parallel tensors out in
// fused order, the checks compare the registrations across ranks and name tensors in errors, the
// facade answers questions about them. It changes only between steps (add, register_local_var,
// defer_local_scale), through the facade. Everything add() asks of it (overlap, lookup, the index
// in the group) is O(log n): models register 100,000 tensors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../compression.hpp"
#include "../error.hpp"
#include "../local_var_policy.hpp"
#include "../options.hpp"
#include "consistency.hpp"
#include "fusion_plan.hpp"
#include "range_index.hpp"
#include "sample_weights.hpp"

namespace gradsync::impl {

// One registered tensor.
template <class V>
struct Registration {
  V* data = nullptr;
  std::size_t size = 0;
  std::string group, name;
  std::size_t index_in_group = 0;
  bool policy_local = false;
  LocalScale policy_scale = LocalScale::none;
  bool runtime_local = false;
  bool defer_scale = false;                           // defer_local_scale: the caller applies the local factor
  SampleWeighting weighting = SampleWeighting::none;  // set_samples(): its policy's (sample_weighting_of)
  bool named = false;                                 // the name was given to add()
  int compression = -1;             // its group's wire format (int(Compression)); -1: Options::compression
  std::shared_ptr<void> keepalive;  // a copy of a registered View keeps its memory alive
  std::function<std::pair<V*, std::size_t>()> requery;  // vectors: current data and size
  bool local() const { return policy_local || runtime_local; }
};

template <class V>
class SyncRegistry {
 public:
  using Entry = Registration<V>;
  using FusedTensor = typename FusionPlan<V>::Tensor;

  auto begin() const { return entries_.cbegin(); }
  auto end() const { return entries_.cend(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  std::size_t size() const { return entries_.size(); }
  const Entry& back() const { return entries_.back(); }

  // Appends a tensor that overlaps none registered (find_overlap first). All or nothing.
  void push_back(Entry e) {
    const std::size_t id = entries_.size();
    entries_.push_back(std::move(e));
    const Entry& x = entries_.back();
    try {
      if (x.requery) requeried_.push_back(id);
      if (x.size == 0)
        empty_.emplace(x.data, id);  // keeps the first of the empty tensors at this address
      else
        ranges_.insert(x.data, x.size, id);
      ++per_group_[x.group];
    } catch (...) {
      forget(id);
      entries_.pop_back();
      throw;
    }
  }

  // Undoes the last push_back (DistributedOptimizer::add's rollback when its optimizer refuses).
  void pop_back() {
    const std::size_t id = entries_.size() - 1;
    forget(id);
    if (!requeried_.empty() && requeried_.back() == id) requeried_.pop_back();
    if (const auto g = per_group_.find(entries_.back().group); g != per_group_.end() && --g->second == 0)
      per_group_.erase(g);
    entries_.pop_back();
  }

  std::size_t count_in_group(const std::string& group) const {
    const auto g = per_group_.find(group);
    return g == per_group_.end() ? 0 : g->second;
  }

  // The tensors registered by reference (std::vector), whose data and size are re-read at every
  // call: the check walks these only, nothing for Views and Spans.
  template <class F>
  void for_each_requeried(F&& f) const {
    for (std::size_t id : requeried_) f(entries_[id]);
  }

  // The first registered tensor sharing an element with [p, p + n), or null. Empty tensors
  // overlap nothing.
  const Entry* find_overlap(const V* p, std::size_t n) const {
    const std::size_t id = ranges_.first_overlap(p, n);
    return id == Ranges::npos ? nullptr : &entries_[id];
  }

  // The entry of the tensor at (p, n), or null (the first one, for empty tensors at one address).
  const Entry* find(const V* p, std::size_t n) const {
    if (n == 0) {
      const auto it = empty_.find(p);
      return it == empty_.end() ? nullptr : &entries_[it->second];
    }
    const std::size_t id = ranges_.find(p, n);
    return id == Ranges::npos ? nullptr : &entries_[id];
  }
  Entry* find(const V* p, std::size_t n) {
    return const_cast<Entry*>(static_cast<const SyncRegistry*>(this)->find(p, n));
  }

  // As find, or an Error naming `who` and the rank.
  const Entry& at(const V* p, std::size_t n, const char* who, int rank) const {
    if (const Entry* e = find(p, n)) return *e;
    throw Error(cat(who, ": the tensor (", n, " elements) is not registered with add<Group>() on rank ", rank));
  }
  Entry& at(const V* p, std::size_t n, const char* who, int rank) {
    return const_cast<Entry&>(static_cast<const SyncRegistry*>(this)->at(p, n, who, rank));
  }

  // A data-parallel tensor's wire format: its group's choice, else the options'.
  static Compression wire_of(const Entry& e, Compression by_options) {
    return e.compression < 0 ? by_options : Compression(e.compression);
  }

  // What the plan is built from: the data-parallel tensors in fused order.
  std::vector<FusedTensor> data_parallel_in_fused_order(const Options& opt) const {
    std::vector<FusedTensor> dp;
    for (const Entry& e : entries_)
      if (!e.local()) dp.push_back({e.data, e.size, int(wire_of(e, opt.compression))});
    if (opt.tuning.fusion_order == FusionOrder::reverse) std::reverse(dp.begin(), dp.end());
    return dp;
  }

  // Their names, in the same order.
  std::vector<std::string> data_parallel_names_in_fused_order(const Options& opt) const {
    std::vector<std::string> names;
    for (const Entry& e : entries_)
      if (!e.local()) names.push_back(e.name);
    if (opt.tuning.fusion_order == FusionOrder::reverse) std::reverse(names.begin(), names.end());
    return names;
  }

  // What the ranks compare (impl/consistency.hpp), in registration order.
  std::vector<RegDesc> describe(const Options& opt) const {
    std::vector<RegDesc> regs;
    regs.reserve(entries_.size());
    for (const Entry& e : entries_)
      regs.push_back({e.group, e.name, e.size, e.index_in_group, e.policy_local, e.runtime_local, e.named,
                      int(wire_of(e, opt.compression))});
    return regs;
  }

  // The data-parallel tensor holding the value at p, or null.
  const Entry* data_parallel_holding(const V* p) const {
    const std::size_t id = ranges_.holding(p);
    return id != Ranges::npos && !entries_[id].local() ? &entries_[id] : nullptr;
  }

  std::size_t data_parallel_elements() const {
    std::size_t n = 0;
    for (const Entry& e : entries_)
      if (!e.local()) n += e.size;
    return n;
  }

  // A local tensor's factor: 1/n by its policy (or scale_local_gradients), 1/N when averaging passes.
  static V local_factor(const Entry& e, const Options& opt, int ranks) {
    if (!e.local()) return V(1);
    const int N = opt.backward_passes_per_step;
    const V inv_agg = opt.average_aggregated_gradients ? V(1) / V(N) : V(1);
    return (scales_by_world(e, opt) ? V(1) / V(ranks) : V(1)) * inv_agg;
  }
  // A local tensor divided by the world size (its policy's LocalScale::world_size, or a runtime
  // local var with scale_local_gradients); with set_samples(), weighted by samples instead.
  static bool scales_by_world(const Entry& e, const Options& opt) {
    return e.local() && (e.policy_local ? e.policy_scale == LocalScale::world_size : opt.scale_local_gradients);
  }
  // set_samples()' weighting of a local tensor: its policy's, or a runtime local var's.
  static SampleWeighting weighting(const Entry& e, const Options& opt) {
    if (!e.local()) return SampleWeighting::none;
    if (e.policy_local) return e.weighting;
    return opt.scale_local_gradients ? SampleWeighting::own_total : SampleWeighting::none;
  }
  static V deferred_factor(const Entry& e, const Options& opt, int ranks) {
    return e.defer_scale && e.local() ? local_factor(e, opt, ranks) : V(1);
  }

 private:
  using Ranges = RangeIndex<V>;

  void forget(std::size_t id) {
    const Entry& x = entries_[id];
    ranges_.erase(x.data, x.size, id);
    if (const auto it = empty_.find(x.data); it != empty_.end() && it->second == id) empty_.erase(it);
  }

  std::vector<Entry> entries_;
  std::vector<std::size_t> requeried_;  // entries with a requery (vectors), in registration order
  Ranges ranges_;                       // the non-empty tensors, by address
  std::map<const V*, std::size_t, std::less<const V*>> empty_;  // the first empty tensor at each address
  std::unordered_map<std::string, std::size_t> per_group_;      // tensors in each group
};

}  // namespace gradsync::impl
