// gradsync internals: impl::SyncParts, everything one GradientSync owns.
//
// The backend, the options in effect, the execution space, the statistics, the registrations, the
// plan, the cross-rank checks, the exchanges (impl/exchange.hpp), the step's state and data
// (impl/sync_step.hpp), the side channel and the timeline. impl::StepPipeline runs the step over
// them; GradientSync's registrations and queries and impl::SyncAccess read and change them through
// the accessors below. Parts hand each other a SyncContext for one call, never a stored reference:
// a sync moves (into a DistributedOptimizer, for one).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "../backend_traits.hpp"
#include "../env.hpp"
#include "../options.hpp"
#include "../stats.hpp"
#include "backend_order.hpp"
#include "exchange.hpp"
#include "exchange_dense.hpp"
#include "exchange_row_sparse.hpp"
#include "exchange_sets.hpp"
#include "launcher.hpp"
#include "one_thread.hpp"
#include "profiling.hpp"
#include "stall.hpp"
#include "sync_checks.hpp"
#include "sync_context.hpp"
#include "sync_options.hpp"
#include "sync_plan.hpp"
#include "sync_registry.hpp"
#include "sync_step.hpp"
#include "sync_summary.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class SyncParts {
 public:
  using backend_type = Backend;
  using value_type = V;
  using memory_space = MemorySpace;
  using Registry = SyncRegistry<V>;
  using Plan = SyncPlan<Backend, V, MemorySpace>;
  using Checks = SyncChecks<Backend, V, MemorySpace, ExecutionSpace>;
  using Context = SyncContext<Backend, ExecutionSpace>;
  using Dense = DenseExchange<Backend, V, MemorySpace, ExecutionSpace>;
  using SetsExchange = SetExchange<Backend, V, ExecutionSpace>;
  using RowsExchange = RowSparseExchange<Backend, V, MemorySpace, ExecutionSpace>;
  // The exchanges, in the order they finish (impl/exchange.hpp).
  using Exchanges = std::tuple<Dense, SetsExchange, RowsExchange>;
  using Frame = StepFrame<Context, Plan, Registry, typename SetsExchange::Sets>;

  SyncParts(Backend backend, const Options& options, ExecutionSpace exec)
      : backend_(unfailed(std::move(backend))),
        opt_(prepare_options(options, backend_)),
        log_(opt_.tuning.read_environment ? env_log_level() : LogLevel::off),
        exec_(exec),
        plan_(backend_, opt_, ordered_on(backend_, exec_)),
        checks_(backend_, plan_.collectives_block(), Plan::staging_wanted(backend_, opt_), plan_.candidates_hash()),
        ctl_(backend_, opt_) {
    plan_.apply_choice(stats_);
    timeline_ = open_timeline(opt_.tuning.timeline, backend_.rank(), backend_.size(), ctl_);
    region_names();  // built now: no step allocates them, tool or not
  }
  SyncParts(SyncParts&&) = default;

  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }
  const Options& options() const { return opt_; }
  ExecutionSpace& exec() { return exec_; }
  Stats& stats() { return stats_; }
  const Stats& stats() const { return stats_; }
  Registry& registry() { return registry_; }
  const Registry& registry() const { return registry_; }
  Plan& sync_plan() { return plan_; }
  const Plan& sync_plan() const { return plan_; }
  Dense& dense() { return std::get<Dense>(exchanges_); }
  SetsExchange& sets_exchange() { return std::get<SetsExchange>(exchanges_); }
  auto& sets() { return sets_exchange().sets(); }
  const auto& sets() const { return std::get<SetsExchange>(exchanges_).sets(); }
  auto& rows() { return std::get<RowsExchange>(exchanges_).rows(); }
  const auto& rows() const { return std::get<RowsExchange>(exchanges_).rows(); }
  SyncStep& step() { return step_; }
  const SyncStep& step() const { return step_; }
  Control<Backend>& ctl() { return ctl_; }
  OneThread& one_thread() { return one_thread_; }
  LogLevel log_level() const { return log_; }
  bool weighted() const { return plan_.weighted(); }
  Context ctx() { return Context{backend_, opt_, exec_, ctl_, timeline_.get(), stats_}; }

  // Options::shard: this rank's slices, the data-parallel ones (the plan's, fused order) then its
  // process sets' (binding order); rebuilt after a plan build and after the sets connected.
  const std::vector<std::pair<V*, std::size_t>>& owned() const { return owned_; }
  void refresh_owned() {
    if (opt_.shard == Shard::none) return;
    owned_ = plan_.owned();
    sets().append_owned(owned_);
  }

  // Registrations change between steps only (checked by the caller before anything changed).
  void begin_change() {
    plan_.registrations_changed();
    checks_.registrations_changed();
  }
  // A group whose policy divides by the step's samples (LocalScale::samples, SetScale::samples).
  void note_needs_samples(std::string what) {
    if (needs_samples_.empty()) needs_samples_ = std::move(what);
  }

 protected:
  // Once per sync, at its first plan build: the environment's typos and a launcher that started
  // more processes than MPI_COMM_WORLD holds (each once per process) and, with GRADSYNC_LOG, the
  // summary.
  void announce() {
    announced_ = true;
    if (opt_.tuning.read_environment) warn_unknown_env_once();
    warn_launcher_size_once();
    if (log_ == LogLevel::info_all || (log_ == LogLevel::info && backend_.rank() == 0)) {
      std::fprintf(stderr, "%s\n", describe_summary(summarize(*this)).c_str());
      std::fflush(stderr);
    }
  }

  Backend backend_;
  Options opt_;
  LogLevel log_ = LogLevel::off;  // GRADSYNC_LOG
  bool announced_ = false;        // announce() ran (first plan build)
  ExecutionSpace exec_;
  Stats stats_;
  Registry registry_;                              // the dense gradients
  Plan plan_;                                      // what to send, in which chunks, by which algorithm
  Checks checks_;                                  // the cross-rank agreements
  Exchanges exchanges_;                            // what crosses, in finishing order
  SyncStep step_;                                  // state, pass, call, samples, pending (impl/sync_step.hpp)
  std::string needs_samples_;                      // a tensor whose policy needs set_samples(), or empty
  Control<Backend> ctl_;                           // side channel: agreement, stall reports, peer failures
  OneThread one_thread_;                           // one thread at a time
  std::unique_ptr<Timeline> timeline_;             // Options::tuning.timeline; null when off
  std::vector<std::pair<V*, std::size_t>> owned_;  // sharded: owned()
};

}  // namespace gradsync::impl
