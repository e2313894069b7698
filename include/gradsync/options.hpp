// gradsync: the options of a GradientSync.
#pragma once

#include <cstddef>

#include "topology.hpp"

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

/// When ranks compare their data-parallel registrations (see docs/ERRORS.md).
enum class CheckMode {
  off,         ///< registrations never compared (a mismatch then hangs until stall_timeout or gives
               ///< wrong numbers); the options still are, in the arrival check
  on_change,   ///< before the first exchange and after every change of the registrations
  every_step,  ///< on every synchronize() call (debugging: one small allreduce and a few heap
               ///< allocations per call; turns a registration changed on some ranks only into a
               ///< MismatchError instead of a stall)
};

/// What the ranks that arrived do when a collective has not completed within stall_timeout.
enum class StallAction {
  throw_error,  ///< throw gradsync::StallError on the ranks that arrived
  abort,        ///< print the report and call MPI_Abort (ends every rank of the job)
};

/// How fused chunks are handed to the backend.
enum class Collectives {
  automatic,    ///< what measures faster for the backend (gradsync::prefers_blocking_allreduce)
  blocking,     ///< one blocking allreduce per chunk, the chunk unpacked at once
  nonblocking,  ///< up to max_chunks_in_flight chunks in flight (two packed), packed and unpacked around
                ///< the reduction
};

/// The order of data-parallel gradients in the fused buffer, hence the order chunks are reduced in.
enum class FusionOrder {
  reverse,       ///< last registered first: backward produces gradients last layer first
  registration,  ///< as registered
};

/// The format data-parallel gradients take on the wire (compression.hpp, docs/COMPRESSION.md).
enum class Compression {
  none,  ///< the gradients' own type (float or double)
  fp16,  ///< IEEE half: 11-bit significand, largest finite 65504 (a larger sum is an Error)
  bf16,  ///< bfloat16: 8-bit significand, fp32's range
};

inline const char* to_string(Compression c) {
  return c == Compression::fp16 ? "fp16" : c == Compression::bf16 ? "bf16" : "none";
}

/// Options::fusion_threshold_bytes = fusion_threshold_auto times a few chunk sizes during the first
/// steps (all ranks agree on the timings) and keeps the fastest.
inline constexpr std::size_t fusion_threshold_auto = ~std::size_t(0);

/// Options::fusion_threshold_bytes = fusion_threshold_by_topology (the default) lets the plan pick
/// the chunk size from the topology: 4 MiB when every rank is on one node, 1 MiB across nodes
/// (docs/BENCHMARKS.md, "Across hosts").
inline constexpr std::size_t fusion_threshold_by_topology = ~std::size_t(0) - 1;

struct Options {
  ReduceOp op = ReduceOp::average;
  double prescale_factor = 1.0;   ///< applied to data-parallel gradients before the reduction
  double postscale_factor = 1.0;  ///< applied after it
  /// Largest fused chunk handed to the backend in one call. 0 means no fusion (one call per tensor);
  /// fusion_threshold_auto picks it by measurement; fusion_threshold_by_topology (the default) by
  /// where the ranks are (4 MiB on one node, 1 MiB across nodes: the sweeps in docs/BENCHMARKS.md).
  /// Environment: GRADSYNC_FUSION_THRESHOLD.
  std::size_t fusion_threshold_bytes = fusion_threshold_by_topology;
  int backward_passes_per_step = 1;           ///< local gradient aggregation: N passes per sync
  bool average_aggregated_gradients = false;  ///< divide aggregated gradients by N
  bool scale_local_gradients = true;          ///< 1/world_size for runtime-registered local vars
  HostStaging host_staging = HostStaging::automatic;

  // ---- never hang, never silently wrong (docs/ERRORS.md) ----
  CheckMode consistency_check = CheckMode::on_change;  ///< cross-rank check of the registrations
  /// Seconds a collective may wait for the other ranks before the stall is reported and acted on
  /// (stall_action). 0: no deadline and no warning; a rank then waits forever for a missing peer,
  /// but still stops when a peer reports a failure. May differ between ranks.
  /// Environment: GRADSYNC_STALL_TIMEOUT_S.
  double stall_timeout = 300.0;
  /// Seconds after which a waiting rank prints a warning naming the missing ranks (once per wait).
  /// 0 disables the warning. Environment: GRADSYNC_STALL_WARNING_S.
  double stall_warning = 60.0;
  StallAction stall_action = StallAction::throw_error;
  /// Scan data-parallel gradients for NaN/Inf before each exchange (one extra pass over them);
  /// every rank then throws an Error naming the tensor and the rank. Off by default.
  bool check_finite = false;
  /// Apply GRADSYNC_* environment variables over these values (they take precedence over code).
  bool read_environment = true;
  Collectives collectives = Collectives::automatic;
  /// Data-parallel tensors of at least in_place_min_bytes and at least in_place_min_fraction of a
  /// fused chunk (fusion_threshold_bytes) are reduced in place, in chunks of their own, without the
  /// two copies through the fusion buffer (only without aggregation and host staging); smaller ones
  /// are fused into full chunks. Below 64 KiB a copy costs less than a call of its own; above it the
  /// copies cost more than the extra calls (MobileNetV2 and ResNet-50 on 2 ranks, docs/BENCHMARKS.md),
  /// the more so since MpiBackend's ring folds the average into in-place sums. A fraction of 0.5
  /// keeps messages near chunk size; infinity reduces nothing in place.
  double in_place_min_fraction = 0;
  std::size_t in_place_min_bytes = std::size_t(64) << 10;
  FusionOrder fusion_order = FusionOrder::reverse;
  /// Nonblocking path: most chunks reduced at once. 0 (the default): by topology, 16 on one node
  /// (many small in-place messages in flight hide each one's handshake over shared memory) and 2
  /// across nodes (over TCP, messages in flight share one connection and each finishes later;
  /// docs/BENCHMARKS.md). MpiBackend's ring sums share 4 host receive buffers of 1/world_size of a
  /// chunk, however many are in flight.
  int max_chunks_in_flight = 0;
  /// How chunks cross the ranks (Algorithm): automatic (the default) is flat on one node and,
  /// across nodes with several ranks on a node, times flat and hierarchical on the first steps and
  /// keeps the faster. Environment: GRADSYNC_ALGORITHM (auto, flat, hierarchical).
  Algorithm algorithm = Algorithm::automatic;
  /// Host gradients reduced in place are moved onto 2 MiB transparent huge pages when the plan is
  /// built (Linux 6.1+ MADV_COLLAPSE, contents unchanged; only pages that hold gradients), and the
  /// fusion buffer is allocated on them. MPI's shared-memory copies then walk and pin 512 times fewer
  /// pages: ResNet-50's gradients, one allocation each, synchronized 22 to 32% faster on 2 ranks
  /// (docs/BENCHMARKS.md). The move is a one-time copy at the first plan build (in this project's
  /// virtual machines up to 1 s for 100 MiB and 3 s for 330 MiB, most of it the host backing fresh
  /// memory); later builds find the pages moved. A no-op without THP ("never"), off Linux, on kernels
  /// before 6.1 and for device memory.
  /// Environment: GRADSYNC_HUGE_PAGES.
  bool huge_pages = true;
  /// A path: each rank writes a Chrome trace (JSON for Perfetto or chrome://tracing) of every
  /// synchronize() there, with ".rank<r>" inserted before the extension when there are several
  /// ranks (docs/TIMELINE.md). Null or empty (the default): nothing is recorded. The GradientSync
  /// constructor copies the string (it need not outlive it; options().timeline points to the copy).
  /// A pointer, not a std::string, so that Options stays trivially copyable. May differ between
  /// ranks. Environment: GRADSYNC_TIMELINE.
  const char* timeline = nullptr;
  /// Data-parallel gradients travel as 16-bit floats, added in fp32 (docs/COMPRESSION.md): half the
  /// bytes on the wire. A group's policy may choose otherwise (CompressWith<>). Environment:
  /// GRADSYNC_COMPRESSION.
  Compression compression = Compression::none;
  /// Compressed groups: each rank keeps what rounding to the wire format dropped and adds it to its
  /// next step's gradient. Environment: GRADSYNC_ERROR_FEEDBACK.
  bool error_feedback = false;
};

}  // namespace gradsync
