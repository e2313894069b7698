// gradsync: the options of a GradientSync.
#pragma once

#include <cstddef>

namespace gradsync {

/// The reduction applied to data-parallel gradients. Both map to the built-in MPI_SUM / ncclSum;
/// averaging is a scale folded into the unpack kernel.
enum class ReduceOp { sum, average };

inline const char* to_string(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "average"; }

/// Whether fused chunks are copied to host memory around the backend's reduction.
enum class HostStaging {
  automatic,  ///< only when the backend cannot access the gradients' memory space
  always,     ///< always (also on host memory: the path CI tests without a GPU)
  never,      ///< never; a ConfigError if the backend cannot access the memory space
};

struct Options {
  ReduceOp op = ReduceOp::average;
  double prescale_factor = 1.0;   ///< applied to data-parallel gradients before the reduction
  double postscale_factor = 1.0;  ///< applied after it
  /// Largest fused chunk handed to the backend in one call. 0 means no fusion (one call per tensor).
  std::size_t fusion_threshold_bytes = std::size_t(4) << 20;
  int backward_passes_per_step = 1;          ///< local gradient aggregation: N passes per sync
  bool average_aggregated_gradients = false; ///< divide aggregated gradients by N
  bool scale_local_gradients = true;         ///< 1/world_size for runtime-registered local vars
  HostStaging host_staging = HostStaging::automatic;
};

}  // namespace gradsync
