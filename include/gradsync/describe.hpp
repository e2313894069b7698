// gradsync: describe(sync), one readable summary of a GradientSync's registrations, plan and options.
//
// GradientSync::summary() fills a SyncSummary (plain values, this rank's view: local groups may
// differ per rank); describe() and operator<< print it. GRADSYNC_LOG=info prints it on stderr from
// rank 0 at the first plan build (prepare() or the first synchronize()), info_all from every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "impl/demangle.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"
#include "topology.hpp"

namespace gradsync {

/// \cond GRADSYNC_FORWARD
template <class Backend, class Tensor>
class GradientSync;
template <class Optimizer, class Sync>
class DistributedOptimizer;
/// \endcond

/// What a GradientSync holds and how it exchanges it, on this rank. Bytes are bytes of gradient.
struct SyncSummary {
  /// One parameter group (a Group type of add<Group>()), with what this rank registered in it.
  struct Group {
    std::string name;                             ///< the group type's name
    bool policy_local = false;                    ///< LocalVarPolicy<Group> keeps it local
    LocalScale scale = LocalScale::none;          ///< its policy's scale (when policy_local)
    std::size_t tensors = 0;                      ///< tensors registered in it
    std::size_t bytes = 0;                        ///< their bytes
    std::size_t runtime_local_tensors = 0;        ///< of which made local by register_local_var
    std::size_t runtime_local_bytes = 0;          ///< their bytes
    Compression compression = Compression::none;  ///< its wire format (its policy's, else the options')
  };
  std::string backend;                    ///< Backend::name()
  int rank = 0;                           ///< this rank in the backend's communicator
  int ranks = 1;                          ///< the communicator's size
  std::string value_type;                 ///< the gradients' value type (float, double)
  std::string memory_space;               ///< the gradients' memory space
  Options options;                        ///< as applied (environment included)
  std::vector<Group> groups;              ///< in the order of their first registration
  std::size_t data_parallel_tensors = 0;  ///< tensors handed to the backend per step
  std::size_t data_parallel_bytes = 0;    ///< their bytes
  std::size_t local_tensors = 0;          ///< tensors never sent
  std::size_t local_bytes = 0;            ///< their bytes
  bool weighted = false;                  ///< set_samples() weighs the gradients by samples

  /// The plan is built: by prepare() or the first synchronize() (and rebuilt after registrations
  /// change). The plan's fields below are meaningful only then.
  bool planned = false;
  std::size_t fusion_threshold_bytes = 0;  ///< in use (fusion_threshold_auto: the candidate timed now)
  bool tuning = false;                     ///< fusion_threshold_auto is still timing candidates
  bool blocking = false;                   ///< one blocking allreduce per chunk (else nonblocking, pipelined)
  bool staged = false;                     ///< chunks pass through host memory around the backend
  std::size_t chunks = 0;                  ///< backend calls per step
  std::size_t chunks_in_place = 0;         ///< of which reduced in the gradients' own memory
  std::size_t chunks_folded = 0;           ///< of which the backend's sum applies the scale (MpiBackend: its ring)
  std::size_t chunks_compressed = 0;       ///< of which travel as 16-bit values (Options::compression, policies)
  std::size_t largest_chunk_bytes = 0;     ///< the largest chunk's bytes on the wire
  std::size_t buffer_bytes = 0;            ///< fusion buffer, accumulators and staging held now
  std::size_t bytes_on_huge_pages = 0;     ///< gradient bytes moved onto 2 MiB pages at the last build

  Topology topology;                      ///< where the ranks are (the plan chooses from it)
  Algorithm algorithm = Algorithm::flat;  ///< in use (while tuning: the candidate timed now)
  int chunks_in_flight = 0;               ///< nonblocking: most chunks reduced at once
  std::size_t plan_candidates = 1;        ///< ways the first steps time (1: decided by rule)
  /// One of the plan's candidates, as the first steps timed it.
  struct Timed {
    std::size_t chunk_bytes;  ///< its fusion threshold
    Algorithm algorithm;      ///< its algorithm
    double seconds;           ///< best step, the slowest rank's
  };
  std::vector<Timed> candidate_seconds;  ///< after tuning: each candidate's agreed time
};

namespace impl {

// 1234567 -> "1,234,567": exact, and readable at a glance.
// Built by appending: inserting into the digits raised g++ 12's -Wrestrict in C++20 (a false
// positive inside std::string, an error under -Werror).
inline std::string grouped(std::size_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  s.reserve(digits.size() + digits.size() / 3);
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

inline std::string bytes_text(std::size_t b) {
  std::ostringstream os;
  os << grouped(b) << " bytes";
  if (b >= (std::size_t(1) << 20)) {
    os.precision(1);
    os << std::fixed << " (" << double(b) / double(std::size_t(1) << 20) << " MiB)";
  }
  return os.str();
}

inline std::string plural(std::size_t n, const char* one, const char* many) {
  return grouped(n) + " " + (n == 1 ? one : many);
}

inline const char* to_text(CheckMode m) {
  return m == CheckMode::off ? "off" : m == CheckMode::on_change ? "on_change" : "every_step";
}
inline const char* to_text(HostStaging h) {
  return h == HostStaging::automatic ? "auto" : h == HostStaging::always ? "always" : "never";
}
inline const char* to_text(bool b) { return b ? "true" : "false"; }

/// The summary as text, one fact per line (no trailing newline): describe(sync) prints it.
inline std::string describe_summary(const SyncSummary& s) {
  const Options& o = s.options;
  std::ostringstream os;
  os << "gradsync: GradientSync on rank " << s.rank << " of " << s.ranks << ", backend " << s.backend << ", "
     << s.value_type << " gradients in memory space " << s.memory_space << "\n";
  os << "  groups (this rank):";
  if (s.groups.empty()) os << " none registered";
  for (const SyncSummary::Group& g : s.groups) {
    os << "\n    " << g.name << ": " << plural(g.tensors, "tensor", "tensors") << ", " << bytes_text(g.bytes) << ", ";
    // How a local group is scaled: by the world size, or weighted (set_samples) by samples.
    const auto scaled = [&](bool by_world) -> std::string {
      if (!by_world) return "not scaled";
      return s.weighted ? "weighted by this rank's samples / the step's" : "scaled by 1/" + std::to_string(s.ranks);
    };
    if (g.policy_local) {
      os << "local, "
         << (g.scale == LocalScale::samples ? std::string("divided by the step's samples")
                                            : scaled(g.scale == LocalScale::world_size));
    } else {
      os << "data-parallel";
      if (g.compression != Compression::none) os << ", " << to_string(g.compression) << " on the wire";
      if (g.runtime_local_tensors > 0)
        os << " (" << plural(g.runtime_local_tensors, "tensor", "tensors") << ", " << bytes_text(g.runtime_local_bytes)
           << " local by register_local_var, " << scaled(o.scale_local_gradients) << ")";
    }
  }
  os << "\n  data-parallel: " << plural(s.data_parallel_tensors, "tensor", "tensors") << ", "
     << bytes_text(s.data_parallel_bytes)
     << " handed to the backend per step; local: " << plural(s.local_tensors, "tensor", "tensors") << ", "
     << bytes_text(s.local_bytes) << " never sent\n";
  const std::string threshold =
      "fusion_threshold_bytes " +
      (o.tuning.fusion_threshold_bytes == fusion_threshold_auto
           ? std::string(s.tuning ? "auto, timing " : "auto, chose ") + bytes_text(s.fusion_threshold_bytes)
       : o.tuning.fusion_threshold_bytes == fusion_threshold_by_topology
           ? "by topology, " + bytes_text(s.fusion_threshold_bytes)
       : s.fusion_threshold_bytes == 0 ? std::string("0 (one call per tensor)")
                                       : bytes_text(s.fusion_threshold_bytes));
  os << "  topology: " << describe_topology(s.topology) << "; algorithm " << to_string(s.algorithm);
  if (o.tuning.algorithm == Algorithm::automatic)
    os << " (automatic";
  else
    os << " (set";
  if (s.plan_candidates > 1 && s.tuning) os << ", timing " << s.plan_candidates << " candidates on the first steps";
  for (std::size_t k = 0; k < s.candidate_seconds.size(); ++k)
    os << (k ? ", " : "; timed: ") << to_string(s.candidate_seconds[k].algorithm) << " "
       << impl::bytes_text(s.candidate_seconds[k].chunk_bytes) << " " << s.candidate_seconds[k].seconds * 1e3 << " ms";
  os << ")\n";
  if (!s.planned) {
    os << "  plan: not built yet (prepare() or the first synchronize() builds it); " << threshold;
  } else {
    os << "  plan: " << plural(s.chunks, "chunk", "chunks") << " per step (" << s.chunks_in_place
       << " reduced in place, " << s.chunks - s.chunks_in_place << " packed through the fusion buffer); " << threshold
       << ", largest chunk " << bytes_text(s.largest_chunk_bytes) << "\n";
    os << "  collectives: ";
    if (s.blocking && s.algorithm == Algorithm::hierarchical)
      os << "per chunk, a blocking reduce within each node, allreduce among nodes and broadcast";
    else if (s.blocking)
      os << "one blocking allreduce per chunk";
    else if (s.algorithm == Algorithm::hierarchical)
      os << "nonblocking, up to " << s.chunks_in_flight
         << " chunks in flight, each a reduce within each node, allreduce among nodes and broadcast";
    else
      os << "nonblocking, up to " << s.chunks_in_flight << " chunks in flight, " << s.chunks_folded
         << " with the scale folded into the backend's sum";
    if (s.chunks_compressed > 0)
      os << "; " << s.chunks_compressed << " compressed (16 bits on the wire, added in fp32)";
    os << "; " << (s.staged ? "staged through host memory" : "no host staging") << "; buffers "
       << bytes_text(s.buffer_bytes) << "; " << bytes_text(s.bytes_on_huge_pages) << " of gradients on huge pages";
  }
  os << "\n  options: op " << to_string(o.op) << ", prescale " << o.prescale_factor << ", postscale "
     << o.postscale_factor << ", backward_passes_per_step " << o.backward_passes_per_step
     << ", average_aggregated_gradients " << impl::to_text(o.average_aggregated_gradients) << ", scale_local_gradients "
     << impl::to_text(o.scale_local_gradients) << ", in_place_min_bytes " << impl::grouped(o.tuning.in_place_min_bytes)
     << ", host_staging " << impl::to_text(o.tuning.host_staging) << ", huge_pages "
     << impl::to_text(o.tuning.huge_pages) << ", consistency_check " << impl::to_text(o.tuning.consistency_check)
     << ", check_finite " << impl::to_text(o.check_finite) << ", stall_timeout " << o.stall_timeout
     << " s, stall_warning " << o.tuning.stall_warning << " s, stall_action "
     << (o.tuning.stall_action == StallAction::abort ? "abort" : "throw") << ", spin_before_yield ";
  if (o.tuning.spin_before_yield == spin_before_yield_auto)
    os << "auto";
  else
    os << o.tuning.spin_before_yield << " s";
  os << ", compression " << to_string(o.compression) << ", error_feedback " << impl::to_text(o.error_feedback)
     << ", shard " << (o.shard == Shard::optimizer_state ? "optimizer_state" : "none");
  return os.str();
}

}  // namespace impl

/// This rank's registrations, plan and options as text, one fact per line (no trailing newline):
/// the one way to print a sync's summary (sync.summary() holds the same facts as data). Local;
/// legal in every state, failed included; allocates the returned string.
template <class Backend, class Tensor>
std::string describe(const GradientSync<Backend, Tensor>& sync) {
  return impl::describe_summary(sync.summary());
}

/// describe() of the optimizer's sync, and a line for the optimizer: its type, the bytes of state
/// this rank holds (DistributedOptimizer::state_bytes()) and whether they are sharded. Local.
template <class Optimizer, class Sync>
std::string describe(DistributedOptimizer<Optimizer, Sync>& dopt) {
  std::ostringstream os;
  os << describe(dopt.sync()) << "\n  optimizer: " << impl::type_name<Optimizer>() << ", " << dopt.num_params()
     << " parameters, state " << dopt.state_bytes() << " bytes on this rank"
     << (dopt.sharded() ? " (data-parallel state sharded: this rank's slices)" : "");
  return os.str();
}

}  // namespace gradsync
