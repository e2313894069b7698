// gradsync internals: impl::summarize, a sync's registrations, plan and options as data
// (GradientSync::summary(), describe(), GRADSYNC_LOG). Read-only: legal in every state.
#pragma once

#include <algorithm>
#include <cstddef>

#include "../describe.hpp"
#include "demangle.hpp"

namespace gradsync::impl {

template <class Pipeline>
SyncSummary summarize(const Pipeline& p) {
  using V = typename Pipeline::value_type;
  using Registry = typename Pipeline::Registry;
  const auto& plan = p.sync_plan();
  const Options& opt = p.options();
  const Stats& stats = p.stats();
  SyncSummary s;
  s.backend = Pipeline::backend_type::name();
  s.rank = p.backend().rank();
  s.ranks = p.backend().size();
  s.value_type = type_name<V>();
  s.memory_space = Pipeline::memory_space::name();
  s.options = opt;
  s.weighted = p.weighted();
  for (const auto& e : p.registry()) {
    auto g =
        std::find_if(s.groups.begin(), s.groups.end(), [&](const SyncSummary::Group& x) { return x.name == e.group; });
    if (g == s.groups.end()) {
      s.groups.push_back({e.group, e.policy_local, e.policy_scale});
      s.groups.back().compression = e.policy_local ? Compression::none : Registry::wire_of(e, opt.compression);
      g = s.groups.end() - 1;
    }
    const std::size_t bytes = e.size * sizeof(V);
    ++g->tensors;
    g->bytes += bytes;
    if (e.runtime_local && !e.policy_local) ++g->runtime_local_tensors, g->runtime_local_bytes += bytes;
    (e.local() ? s.local_tensors : s.data_parallel_tensors) += 1;
    (e.local() ? s.local_bytes : s.data_parallel_bytes) += bytes;
  }
  s.planned = !plan.dirty();
  s.fusion_threshold_bytes = plan.fusion_threshold_bytes();
  s.tuning = plan.tuner().active();
  s.blocking = plan.blocking();
  s.topology = plan.topology();
  s.algorithm = plan.algorithm();
  s.chunks_in_flight = plan.chunks_in_flight();
  const auto& choices = plan.choices();
  s.plan_candidates = choices.size();
  for (std::size_t k = 0; k < choices.size() && !s.tuning && choices.size() > 1; ++k)
    s.candidate_seconds.push_back({choices[k].chunk_bytes, choices[k].algorithm, plan.tuner().timings()[k]});
  if (!s.planned) return s;
  s.staged = plan.staged();
  s.chunks = plan.num_chunks();
  for (std::size_t c = 0; c < plan.num_chunks(); ++c) {
    const std::size_t bytes = plan.wire_bytes(c);
    s.largest_chunk_bytes = std::max(s.largest_chunk_bytes, bytes);
    s.chunks_in_place += plan.reduced_in_place(c);
    s.chunks_folded +=
        plan.reduced_in_place(c) && !plan.blocking() && !plan.hierarchical() && folds_factor(p.backend(), bytes);
    s.chunks_compressed += plan.chunk(c).kind != 0;
  }
  s.buffer_bytes = stats.buffer_bytes;
  s.bytes_on_huge_pages = stats.bytes_on_huge_pages;
  return s;
}

}  // namespace gradsync::impl
