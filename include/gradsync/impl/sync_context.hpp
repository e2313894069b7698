// gradsync: impl::SyncContext, what the parts of a GradientSync share and none of them owns.
//
// GradientSync (the facade) owns the backend, the options, the execution space, the side channel,
// the timeline and the statistics. SyncPlan, SyncEngine and SyncChecks are handed them for one call
// as this bundle of references, never keep it: a GradientSync is moved (into a
// DistributedOptimizer, for one), and stored references would dangle.
#pragma once

#include "../options.hpp"
#include "../stats.hpp"
#include "stall.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

template <class Backend, class ExecutionSpace>
struct SyncContext {
  Backend& backend;
  const Options& opt;
  ExecutionSpace& exec;
  Control<Backend>& ctl;  // side channel: agreement rounds, stall reports, peer failures
  Timeline* timeline;     // Options::tuning.timeline; null when off
  Stats& stats;
};

}  // namespace gradsync::impl
