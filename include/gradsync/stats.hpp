// gradsync: per-rank counters of what a GradientSync did.
#pragma once

#include <cstdint>

#include "topology.hpp"

namespace gradsync {

/// Per-rank counters of what a GradientSync did (GradientSync::stats(); DESIGN.md). Cumulative
/// since construction, except buffer_bytes and the plan's decisions (now).
struct Stats {
  std::uint64_t bytes_allreduced = 0;     ///< bytes this rank handed to the backend's allreduce (on the wire:
                                          ///< 2 per value of a compressed chunk)
  std::uint64_t bytes_uncompressed = 0;   ///< the same chunks' bytes of gradient (bytes_allreduced without compression)
  std::uint64_t allreduce_calls = 0;      ///< backend allreduce calls (one per fused chunk)
  std::uint64_t bytes_in_place = 0;       ///< of bytes_allreduced, those reduced in the gradients' own memory
  std::uint64_t passes = 0;               ///< synchronize() calls
  std::uint64_t steps = 0;                ///< synchronize() calls that returned true
  std::uint64_t samples = 0;              ///< set_samples(): the last step's samples over every rank and pass
  std::uint64_t empty_steps = 0;          ///< set_samples(): steps with no sample on any rank (zero gradients)
  std::uint64_t plan_builds = 0;          ///< times the fusion plan was (re)built
  std::uint64_t allocations = 0;          ///< buffer allocations (fusion, accumulators, tables)
  std::uint64_t buffer_bytes = 0;         ///< bytes held in fusion buffer and accumulators now
  std::uint64_t bytes_on_huge_pages = 0;  ///< registered gradient bytes moved onto huge pages at the last plan build
  std::uint64_t consistency_checks = 0;  ///< cross-rank checks of the registrations (Options::tuning.consistency_check)
  std::uint64_t row_sparse_bytes = 0;  ///< bytes this rank handed to the backend for data-parallel RowSparse gradients
  std::uint64_t row_sparse_collectives = 0;  ///< backend calls for them (allgathers, or allreduces when densified)
  std::uint64_t row_sparse_densified = 0;    ///< of those exchanges, the ones that densified the table (cheaper)
  std::uint64_t process_set_bytes = 0;       ///< bytes this rank handed to process sets' allreduces (ReduceOver groups)
  std::uint64_t process_set_calls = 0;       ///< those allreduce calls

  // What the plan decided (the same on every rank; while tuning, the candidate being timed).
  std::uint64_t nodes = 1;                ///< nodes the ranks are on (Topology)
  Algorithm algorithm = Algorithm::flat;  ///< how chunks cross the ranks
  std::uint64_t chunk_bytes = 0;          ///< fusion threshold in use (0: one call per tensor)
  std::uint64_t chunks_in_flight = 0;     ///< most chunks reduced at once (1 when blocking)
};

}  // namespace gradsync
