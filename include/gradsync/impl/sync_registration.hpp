// gradsync internals: what a user declares between steps: gradients (dense and row-sparse), local
// variables at run time, and sample counts. Each change is checked whole before anything changes,
// then marks the plan and the ranks' comparison due (StepPipeline::begin_change); the ranks compare
// registrations at the next collective call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../local_var_policy.hpp"
#include "../process_set.hpp"
#include "../row_sparse.hpp"
#include "../tensor_traits.hpp"
#include "demangle.hpp"
#include "sample_weights.hpp"

namespace gradsync::impl {

template <class T>
struct is_std_vector : std::false_type {};
template <class T, class A>
struct is_std_vector<std::vector<T, A>> : std::true_type {};

template <class Pipeline>
[[noreturn]] void unsupported_with_samples(const Pipeline& p, const std::string& what) {
  throw ConfigError(cat("set_samples() and ", what, " on rank ", p.backend().rank(),
                        ": the weighted form would need each set's own samples, which nothing exchanges; "
                        "use SetScale::world_size (the weighted sum over the set / N) or SetScale::samples"));
}

// What every registration checks and records for its group: SetScale::set_size cannot be weighted,
// a policy dividing by the samples needs set_samples().
template <class Group, class Pipeline>
void note_group(Pipeline& p, const std::string& shown, const std::string& group) {
  if constexpr (is_set_reduced_v<Group>)
    if (p.weighted() && LocalVarPolicy<Group>::set_scale == SetScale::set_size)
      unsupported_with_samples(p, cat("tensor '", shown, "' (group ", group, ", SetScale::set_size)"));
  p.begin_change();
  if constexpr (needs_samples<Group>()) p.note_needs_samples(cat("tensor '", shown, "' (group ", group, ")"));
}

// add<Group>(tensor): a dense gradient.
template <class Group, class Pipeline, class U>
void register_dense(Pipeline& p, const U& tensor, std::string name) {
  using UT = TensorTraits<U>;
  using Entry = typename Pipeline::Registry::Entry;
  auto& registry = p.registry();
  const int rank = p.backend().rank();
  p.step().require_between_steps("add()", p.options().backward_passes_per_step);
  Entry e;
  e.data = UT::data(tensor);
  e.size = UT::size(tensor);
  e.group = type_name<Group>();
  // The group's row-sparse gradients count too: default names stay unique within it.
  e.index_in_group = registry.count_in_group(e.group) + p.rows().count_in_group(e.group);
  e.named = !name.empty();
  e.name = name.empty() ? cat(e.group, "[", e.index_in_group, "]") : std::move(name);
  e.policy_local = is_local_v<Group>;
  e.policy_scale = local_scale_v<Group>;
  e.weighting = sample_weighting_of<Group>();
  e.compression = group_compression<Group>();
  if (!UT::is_contiguous(tensor))
    throw Error(cat("tensor '", e.name, "' (group ", e.group,
                    ") is not contiguous: register a contiguous View or copy it into one"));
  if constexpr (Kokkos::is_view<U>::value) e.keepalive = std::make_shared<U>(tensor);
  // A vector is registered by reference: synchronize() re-reads its data and size and throws if
  // it was resized or reallocated since. (A View is held by value: reassigning or
  // Kokkos::resize-ing the caller's View cannot be seen; re-register it instead.)
  if constexpr (is_std_vector<U>::value)
    e.requery = [&tensor] { return std::make_pair(UT::data(tensor), UT::size(tensor)); };
  if (const Entry* o = registry.find_overlap(e.data, e.size))  // O(log n): 100,000 tensors register
    throw Error(cat("tensor '", e.name, "' (group ", e.group, ") overlaps tensor '", o->name, "' (group ", o->group,
                    ") already registered", e.data == o->data ? " (the same tensor registered twice)" : ""));
  p.rows().for_each_values([&](const auto* q, std::size_t n, const std::string& on, const std::string& og) {
    if (overlaps(e.data, e.size, q, n))
      throw Error(cat("tensor '", e.name, "' (group ", e.group, ") overlaps row-sparse gradient '", on, "' (group ", og,
                      ") already registered"));
  });
  note_group<Group>(p, e.name, e.group);
  if constexpr (is_set_reduced_v<Group>)
    p.sets().add(type_name<typename LocalVarPolicy<Group>::set_tag>(), e.data, e.size, e.name, e.group,
                 LocalVarPolicy<Group>::set_scale, rank);
  const auto* data = e.data;
  try {
    registry.push_back(std::move(e));
  } catch (...) {  // all or nothing: the set forgets it too
    if constexpr (is_set_reduced_v<Group>)
      p.sets().withdraw(type_name<typename LocalVarPolicy<Group>::set_tag>(), data);
    throw;
  }
}

// add<Group>(rows): a row-sparse gradient.
template <class Group, class Pipeline, class V, class I>
void register_row_sparse(Pipeline& p, const RowSparse<V, I>& rows, std::string name) {
  const int rank = p.backend().rank();
  const int passes = p.options().backward_passes_per_step;
  p.step().require_between_steps("add()", passes);
  const std::string group = type_name<Group>();
  const std::size_t index = p.registry().count_in_group(group) + p.rows().count_in_group(group);
  const std::string shown = name.empty() ? cat(group, "[", index, "]") : name;
  if (rows.capacity() == 0)
    throw Error(cat("row-sparse gradient '", shown, "' (group ", group, ") on rank ", rank,
                    " is an empty RowSparse handle (default-constructed): register one built from values and "
                    "indices"));
  if (passes != 1)
    throw ConfigError(cat("row-sparse gradient '", shown, "' (group ", group,
                          "): backward_passes_per_step must be 1 for RowSparse gradients (got ", passes, ")"));
  const std::size_t n = std::size_t(rows.capacity() * rows.row_width());
  if (const auto* o = p.registry().find_overlap(rows.values().data(), n))
    throw Error(cat("row-sparse gradient '", shown, "' (group ", group, ") overlaps tensor '", o->name, "' (group ",
                    o->group, ") already registered"));
  if constexpr (is_set_reduced_v<Group>)
    if (p.weighted() && LocalVarPolicy<Group>::set_scale == SetScale::set_size)
      unsupported_with_samples(p, cat("row-sparse gradient '", shown, "' (group ", group, ", SetScale::set_size)"));
  if constexpr (is_set_reduced_v<Group>)
    p.sets()
        .set_of(type_name<typename LocalVarPolicy<Group>::set_tag>(), shown, group, rank)
        .sparse.push_back(rows.table_rows() * rows.row_width());
  p.begin_change();
  if constexpr (needs_samples<Group>())
    p.note_needs_samples(cat("row-sparse gradient '", shown, "' (group ", group, ")"));
  p.rows().template add<Group>(rows, std::move(name), index, p.backend().size(), rank);
}

// set_samples(n): its rules (SyncStep::check_samples), the first call's refusals, then the count.
template <class Pipeline>
void count_samples(Pipeline& p, std::int64_t n) {
  const Options& opt = p.options();
  p.step().check_samples(n, p.backend().rank(), p.stats().passes, p.weighted());
  if (!p.weighted()) {  // the first call: what cannot be weighted yet is refused before anything changed
    p.step().require_between_steps("set_samples() (its first call makes the sync weighted)",
                                   opt.backward_passes_per_step);
    if (opt.average_aggregated_gradients)
      throw ConfigError(
          "set_samples(): average_aggregated_gradients has nothing left to do in a weighted sync "
          "(the weights average over every sample of the step's passes); turn it off");
    for (const std::string& t : {p.sets().set_size_tensor(), p.rows().set_size_tensor()})
      if (!t.empty()) unsupported_with_samples(p, cat(t, ", SetScale::set_size"));
    for (const auto& e : p.registry())
      if (e.defer_scale)
        unsupported_with_samples(p, cat("a deferred local scale (tensor '", e.name, "', group ", e.group,
                                        "; DistributedOptimizer::set_samples turns its fold off)"));
    p.sync_plan().set_weighted();
  }
  p.step().count_samples(n);
}

}  // namespace gradsync::impl
