// gradsync: the options of a GradientSync.
#pragma once

#include <cstddef>

#include "topology.hpp"

namespace gradsync {

/// The reduction applied to data-parallel gradients. Both map to the built-in MPI_SUM / ncclSum;
/// averaging is a scale folded into the unpack kernel.
enum class ReduceOp { sum, average };

/// "sum" or "average".
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

/// What a sharded step divides among the ranks (Options::shard, docs/SHARDING.md).
enum class Shard {
  none,             ///< every rank holds every data-parallel gradient sum and the whole optimizer state
  optimizer_state,  ///< reduce-scatter: each rank sums its slice; DistributedOptimizer keeps that slice's state
};

/// "none", "fp16" or "bf16".
inline const char* to_string(Compression c) {
  return c == Compression::fp16 ? "fp16" : c == Compression::bf16 ? "bf16" : "none";
}

/// Options::tuning.fusion_threshold_bytes = fusion_threshold_auto times a few chunk sizes during the first
/// steps (all ranks agree on the timings) and keeps the fastest.
inline constexpr std::size_t fusion_threshold_auto = ~std::size_t(0);

/// Options::tuning.fusion_threshold_bytes = fusion_threshold_by_topology (the default) lets the plan pick
/// the chunk size from the topology: 4 MiB when every rank is on one node; across nodes p x 256 KiB
/// for p ranks, within 1 MiB (docs/BENCHMARKS_HOSTS.md) and 64 MiB (docs/SCALING.md); 64 MiB when
/// the backend runs on the sync's own stream (NcclBackend there: its chunks cannot overlap one another).
inline constexpr std::size_t fusion_threshold_by_topology = ~std::size_t(0) - 1;

/// Options::tuning.spin_before_yield = spin_before_yield_auto (the default): no spinning where this
/// node runs more of the communicator's ranks than it has CPUs, else 50 microseconds.
inline constexpr double spin_before_yield_auto = -1.0;

/// The knobs a program rarely sets: how the plan fuses, orders and moves the gradients, and the
/// diagnostics. The defaults decide by topology and measurement (docs/TUNING.md); set one to
/// reproduce a measurement, to work around a machine, or to trace a run. Most have a GRADSYNC_*
/// variable, named in the field's comment; docs/TUNING.md lists them all.
struct Tuning {
  /// Largest fused chunk handed to the backend in one call. 0: no fusion (one call per tensor);
  /// fusion_threshold_auto: picked by timing candidates on the first steps; fusion_threshold_by_topology
  /// (the default): 4 MiB when every rank is on one node, p x 256 KiB within 1-64 MiB across nodes,
  /// 64 MiB for a backend on the sync's own stream. GRADSYNC_FUSION_THRESHOLD.
  std::size_t fusion_threshold_bytes = fusion_threshold_by_topology;
  /// How chunks cross the ranks: automatic is flat on one node and, across nodes with several ranks
  /// on a node, times flat and hierarchical on the first steps and keeps the faster. GRADSYNC_ALGORITHM.
  Algorithm algorithm = Algorithm::automatic;
  /// Blocking or nonblocking collectives (automatic: nonblocking where the backend has them).
  Collectives collectives = Collectives::automatic;
  /// Nonblocking path: most chunks reduced at once. 0: by topology (16 on one node; across nodes 2
  /// below 16 ranks, 8 from 16).
  int max_chunks_in_flight = 0;
  /// The order tensors are fused in: reverse registration order by default, the order backward
  /// produces gradients in.
  FusionOrder fusion_order = FusionOrder::reverse;
  /// Data-parallel tensors of at least in_place_min_bytes and in_place_min_fraction of a chunk are
  /// reduced in place, in chunks of their own, without the copies through the fusion buffer (only
  /// without aggregation and host staging); smaller ones are fused. Infinity: nothing in place.
  double in_place_min_fraction = 0;
  std::size_t in_place_min_bytes = std::size_t(64) << 10;  ///< see in_place_min_fraction
  /// Whether host buffers carry device gradients to a backend that cannot read device memory
  /// (automatic: only then; always; never: a ConfigError where it would be needed).
  HostStaging host_staging = HostStaging::automatic;
  /// Host gradients reduced in place are moved onto 2 MiB transparent huge pages at the first plan
  /// build (contents and addresses unchanged), and the fusion buffer is allocated on them: MPI's
  /// shared-memory copies then pin 512 times fewer pages. On by default because the copy is paid once
  /// and every step gains (docs/TUNING.md has the measurement and the cost); prepare() pays it before
  /// training. A no-op without THP, off Linux, before kernel 6.1 and for device memory. GRADSYNC_HUGE_PAGES.
  bool huge_pages = true;
  /// When the ranks compare their registrations: on_change (the default), every_step, or off.
  CheckMode consistency_check = CheckMode::on_change;
  /// Seconds after which a waiting rank prints a warning naming the missing ranks (once per wait);
  /// 0: no warning. GRADSYNC_STALL_WARNING_S.
  double stall_warning = 60.0;
  /// What a passed deadline does: throw a StallError on the waiting ranks (the default) or MPI_Abort.
  StallAction stall_action = StallAction::throw_error;
  /// Seconds a rank waiting for a collective polls MPI back to back before it yields the core
  /// between polls (sched_yield): spinning answers fastest on a core of its own, yielding lets the
  /// ranks of an oversubscribed node progress. spin_before_yield_auto (the default): 0 where the
  /// node runs more of the communicator's ranks than it has CPUs, else 50e-6. Only gradsync's own
  /// waits: MPI's blocking calls wait as the MPI does. GRADSYNC_SPIN_BEFORE_YIELD_S.
  double spin_before_yield = spin_before_yield_auto;
  /// A path: each rank writes a Chrome trace of every synchronize() there (".rank<r>" inserted before
  /// the extension with several ranks; docs/TIMELINE.md). Null or empty: nothing is recorded. Copied
  /// by the GradientSync constructor. A pointer so that Options stays trivially copyable. GRADSYNC_TIMELINE.
  const char* timeline = nullptr;
  /// Apply GRADSYNC_* environment variables over the Options given in code (they take precedence).
  bool read_environment = true;
};

/// What a GradientSync does: the reduction and its scales, aggregation, the local groups' scale,
/// compression and the checks and deadline. The plan's knobs and the diagnostics are in `tuning`.
struct Options {
  ReduceOp op = ReduceOp::average;            ///< average (the default) or sum over the ranks
  double prescale_factor = 1.0;               ///< applied to data-parallel gradients before the reduction
  double postscale_factor = 1.0;              ///< applied after it
  int backward_passes_per_step = 1;           ///< local gradient aggregation: N passes per synchronize
  bool average_aggregated_gradients = false;  ///< divide aggregated gradients by N
  bool scale_local_gradients = true;          ///< 1/world_size for runtime-registered local vars
  /// Data-parallel gradients travel as 16-bit floats, added in fp32 (docs/COMPRESSION.md): half the
  /// bytes on the wire. A group's policy may choose otherwise (CompressWith<>). GRADSYNC_COMPRESSION.
  Compression compression = Compression::none;
  /// Compressed groups: each rank keeps what rounding to the wire format dropped and adds it to its
  /// next step's gradient. GRADSYNC_ERROR_FEEDBACK.
  bool error_feedback = false;
  /// Scan data-parallel gradients for NaN/Inf before they leave the rank (one pass over them); every
  /// rank then throws an Error naming the tensor and the rank holding it.
  bool check_finite = false;
  /// Shard::optimizer_state: data-parallel gradients are reduce-scattered, so that each rank holds
  /// the average only on its slice of each chunk (GradientSync::owned_slices(); the other values are
  /// unspecified after synchronize()), and a DistributedOptimizer keeps optimizer state for that
  /// slice only, updates it, and allgathers the parameters (docs/SHARDING.md). A process set's dense
  /// gradients (ReduceOver groups) are sharded within their set. Needs a backend with
  /// Capability::shard_sums (MpiBackend on host memory, NcclBackend).
  Shard shard = Shard::none;
  /// Seconds a collective may wait for the other ranks before the stall is reported (a StallError
  /// naming the missing ranks, on every waiting rank). 0: no deadline; a rank then waits forever for
  /// a missing peer, but still stops when a peer reports a failure. May differ between ranks.
  /// GRADSYNC_STALL_TIMEOUT_S.
  double stall_timeout = 300.0;
  Tuning tuning;  ///< rarely needed: the plan's knobs and the diagnostics
};

}  // namespace gradsync
