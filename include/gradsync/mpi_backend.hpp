// gradsync: the MPI backend. It works on a duplicate of the user's communicator (so gradsync's
// messages never match the user's) and never initializes or finalizes MPI itself.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "compression.hpp"
#include "config.hpp"
#include "error.hpp"
#include "impl/cuda_aware.hpp"
#include "impl/notice_comm.hpp"
#include "impl/pieces.hpp"
#include "impl/ring_allreduce.hpp"
#include "impl/test_hooks.hpp"
#include "topology.hpp"

namespace gradsync {
namespace impl {

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, int>)
    return MPI_INT;
  else if constexpr (std::is_same_v<T, char>)
    return MPI_CHAR;
  else if constexpr (std::is_same_v<T, unsigned char>)
    return MPI_UNSIGNED_CHAR;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else if constexpr (is_wire_v<T>)
    return MPI_UINT16_T;  // summed by mpi_wire_op<T>(), never MPI_SUM
  else
    static_assert(sizeof(T) == 0, "gradsync: no built-in MPI datatype for this type");
}

inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(cat(what, " failed: ", std::string(msg, std::size_t(len))));
}

// The sum of 16-bit wire values: each pair added in fp32 and rounded once to the format. MPI has no
// built-in 16-bit float sum; this user-defined op runs on the host (device buffers are staged).
template <class W>
void mpi_wire_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i) b[i] = wire_add<W>(a[i], b[i]);
}

// One op per format and process, created at first use and freed inside MPI_Finalize (an attribute of
// MPI_COMM_SELF, whose delete callback MPI runs first thing there).
template <class W>
struct MpiWireOp {
  MPI_Op op = MPI_OP_NULL;
  MpiWireOp() {
    mpi_check(MPI_Op_create(&mpi_wire_sum<W>, 1, &op), "MPI_Op_create (gradsync's 16-bit sum)");
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &release, &key, nullptr) == MPI_SUCCESS) {
      MPI_Comm_set_attr(MPI_COMM_SELF, key, this);
      MPI_Comm_free_keyval(&key);
    }
  }
  static int release(MPI_Comm, int, void* self, void*) {
    auto* h = static_cast<MpiWireOp*>(self);
    if (h->op != MPI_OP_NULL) MPI_Op_free(&h->op);
    return MPI_SUCCESS;
  }
};

template <class W>
MPI_Op mpi_wire_op() {
  static MpiWireOp<W> holder;
  return holder.op;
}

/// The sum of T's: MPI_SUM, or gradsync's op for 16-bit wire values.
template <class T>
MPI_Op mpi_sum_op() {
  if constexpr (is_wire_v<T>)
    return mpi_wire_op<T>();
  else
    return MPI_SUM;
}

}  // namespace impl

/// GradientSync's backend over an MPI communicator (host memory; device memory with a CUDA-aware
/// MPI). Copies share one duplicate of the user's communicator. The members below are the backend
/// interface a GradientSync and gradsync's helpers call; a program mostly builds one and reads
/// rank(), size() and topology(). Every collective member is collective over the backend's
/// communicator: each rank calls it in the same order. Errors become gradsync::Error (the
/// duplicate returns error codes instead of aborting).
class MpiBackend {
 public:
  /// A nonblocking collective in flight. Keep it alive (and the buffer) until wait() or test().
  /// Its fields are the backend's bookkeeping, public only for its own functions.
  struct Request {
    /// \cond GRADSYNC_INTERNAL
    MPI_Request req = MPI_REQUEST_NULL;
    std::shared_ptr<impl::RingAllreduce> ring;  // set when gradsync's own ring runs it
    // A hierarchical sum (ihierarchical_allreduce_sum): its stage in flight (1 reduce within the
    // node, 2 allreduce among the nodes' leaders, 3 broadcast within the node; 0: none) and its
    // values, which the next stage starts on when test() finds this one done.
    int stage = 0;
    void* buf = nullptr;
    int count = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    std::int64_t non_finite = -1;  // a completed compressed sum in place: its first non-finite value (fp16)
    /// \endcond

    /// A complete request. Requests are handles: moving one hands the collective over (the source
    /// is then complete); none is copied, so no collective is waited twice or through a stale copy
    /// of its MPI_Request.
    Request() = default;
    /// Takes o's collective; o is complete afterwards.
    Request(Request&& o) noexcept { *this = std::move(o); }
    /// Takes o's collective (this one must be complete); o is complete afterwards.
    Request& operator=(Request&& o) noexcept {
      req = std::exchange(o.req, MPI_REQUEST_NULL);
      ring = std::move(o.ring);
      stage = std::exchange(o.stage, 0);
      buf = o.buf;
      count = o.count;
      type = o.type;
      op = o.op;
      non_finite = o.non_finite;
      return *this;
    }
    Request(const Request&) = delete;             ///< Move-only.
    Request& operator=(const Request&) = delete;  ///< Move-only.
  };

  /// Works on a duplicate of `comm`; MPI must already be initialized by the caller. `cuda_aware`
  /// says whether device memory may be handed to MPI (detect: see impl/cuda_aware.hpp). Collective
  /// over `comm`: duplicates it and splits it by node (Topology); allocates those communicators.
  explicit MpiBackend(MPI_Comm comm, CudaAwareMpi cuda_aware = CudaAwareMpi::detect) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw Error("MpiBackend needs MPI to be initialized (call MPI_Init before building it)");
    if (comm == MPI_COMM_NULL) throw Error("MpiBackend was given MPI_COMM_NULL");
    comm_ = std::make_shared<Comm>(comm);
    MPI_Comm_rank(comm_->comm, &rank_);
    MPI_Comm_size(comm_->comm, &size_);
    cuda_aware_ = impl::detect_cuda_aware_mpi(cuda_aware);
  }

  /// "mpi", in summaries and messages.
  static constexpr const char* name() { return "mpi"; }
  /// What MpiBackend offers beyond the required members (backend.hpp). Its sums take WireFp16 /
  /// WireBf16 arrays (a user-defined MPI_Op that adds in fp32) on host memory.
  using capabilities =
      Capabilities<Capability::split, Capability::max_count, Capability::comm, Capability::notice_comm,
                   Capability::ibroadcast, Capability::iallreduce_min, Capability::iallgather, Capability::topology,
                   Capability::hierarchical_sum, Capability::nonblocking_hierarchical_sum, Capability::folds_factor,
                   Capability::weighted_fold, Capability::region_sums, Capability::shard_sums, Capability::cuda_aware,
                   Capability::blocking_preference, Capability::wire_sums, Capability::can_reduce_wire,
                   Capability::wire_ring, Capability::wire_shard, Capability::retire>;
  /// This rank in the backend's communicator. Local.
  int rank() const { return rank_; }
  /// The communicator's size. Local.
  int size() const { return size_; }
  /// gradsync's duplicate of the user's communicator (never the user's own). Local.
  MPI_Comm comm() const { return comm_->comm; }
  /// The notice communicator of this backend's group of processes (impl/notice_comm.hpp): where a
  /// GradientSync that ends tells its peers. Made by the group's first backend, kept until exit.
  MPI_Comm notice_comm() const { return comm_->notices; }

  /// Host memory always; CUDA device memory only when the MPI library is CUDA-aware.
  template <class MemorySpace>
  bool can_access() const {
    return impl::host_accessible_v<MemorySpace> || (cuda_aware_.aware && impl::is_cuda_memory_v<MemorySpace>);
  }
  /// Which ranks share a node (found when the backend was built).
  const Topology& topology() const { return comm_->topology; }

  /// Whether device memory is handed to MPI, and what decided it.
  bool cuda_aware() const { return cuda_aware_.aware; }
  /// What decided cuda_aware() (the argument, GRADSYNC_CUDA_AWARE_MPI, the MPI library's answer).
  const char* cuda_aware_source() const { return cuda_aware_.source; }

  /// The most elements one MPI call takes (impl::mpi_max_count(): INT_MAX unless a test lowers it);
  /// callers of the nonblocking sums split larger buffers into pieces of this many.
  static std::size_t max_count() { return impl::mpi_max_count(); }

  /// Blocking in-place sum of n values over the ranks (MPI_Allreduce, split into pieces of
  /// max_count()). Collective; allocates nothing.
  template <class T>
  void allreduce_sum(T* buf, std::size_t n) const {
    impl::for_pieces(n, impl::mpi_max_count(), [&](std::size_t off, int cnt) {
      impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, impl::mpi_type<T>(), impl::mpi_sum_op<T>(), comm()),
                      "MPI_Allreduce");
    });
  }

  /// Blocking in-place sum in three stages (Algorithm::hierarchical): MPI_Reduce to each node's
  /// first rank over shared memory, MPI_Allreduce among those leaders over the network, MPI_Bcast
  /// back within each node. A sum of n values crosses the network once per node instead of
  /// 2(p-1)/p times per rank, at the price of two shared-memory stages that do not overlap it.
  template <class T>
  void hierarchical_allreduce_sum(T* buf, std::size_t n) const {
    const Comm& c = *comm_;
    const MPI_Datatype type = impl::mpi_type<T>();
    impl::for_pieces(n, impl::mpi_max_count(), [&](std::size_t off, int cnt) {
      T* p = buf + off;
      if (c.topology.local_size > 1)
        impl::mpi_check(
            MPI_Reduce(c.topology.local_rank == 0 ? MPI_IN_PLACE : p, c.topology.local_rank == 0 ? p : nullptr, cnt,
                       type, impl::mpi_sum_op<T>(), 0, c.node),
            "MPI_Reduce (within the node)");
      if (c.leaders != MPI_COMM_NULL && c.topology.nodes > 1)
        impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, p, cnt, type, impl::mpi_sum_op<T>(), c.leaders),
                        "MPI_Allreduce (among nodes)");
      if (c.topology.local_size > 1) impl::mpi_check(MPI_Bcast(p, cnt, type, 0, c.node), "MPI_Bcast (within the node)");
    });
  }

  /// Nonblocking form of hierarchical_allreduce_sum: MPI_Ireduce within the node, MPI_Iallreduce
  /// among the leaders, MPI_Ibcast within the node, each stage started by test() (or wait()) once
  /// the one before it is done, so the sum overlaps backward like a flat one. n must fit one MPI
  /// call. Each stage has a communicator of its own, and test() advances a rank's sums in the
  /// order they were started (the sync tests its chunks in order), so every rank starts the
  /// collectives of each communicator in the same order, whenever its stages finish.
  template <class T>
  Request ihierarchical_allreduce_sum(T* buf, std::size_t n) const {
    Request r;
    r.buf = buf;
    r.count = checked_count(n);
    r.type = impl::mpi_type<T>();
    r.op = impl::mpi_sum_op<T>();
    start_stage(r, 1);
    return r;
  }

  /// Nonblocking in-place sum, times `factor` when given; n must fit one MPI call (the fusion
  /// layer splits chunks). Host buffers of at least ring_min_bytes go through gradsync's own ring
  /// (impl/ring_allreduce.hpp), which folds the factor into the reduction; the rest go to
  /// MPI_Iallreduce and take no factor (folds_factor() says which).
  /// 16-bit wire values (WireFp16, WireBf16) are summed the same way, added in fp32 and never scaled.
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n) const {
    return start_sum(buf, n, 1.0);
  }
  /// iallreduce_sum() times `factor`, folded into the ring's reduction where folds_factor() says so.
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n, T factor) const {
    return start_sum(buf, n, double(factor));
  }
  /// The same with each rank's values multiplied by its own `pre` first (set_samples' weights),
  /// inside the ring's reduce-scatter: buf = factor * sum over ranks of pre * buf. Ring sums only;
  /// every rank calls this form for the same sums (each sends its weight to its neighbour).
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n, T factor, T pre) const {
    return start_sum(buf, n, double(factor), true, double(pre));
  }
  /// Whether a sum of this many bytes in all can run over several regions (iallreduce_sum_regions):
  /// where the ring runs (folds_factor).
  bool sums_regions(std::size_t bytes) const { return folds_factor(bytes); }
  /// One ring sum over k host regions as if they were one buffer: each region = factor * its sum
  /// over ranks. Every rank passes regions of the same sizes (a segment that spans regions goes as
  /// one message per piece, matched in order); their total must fit one MPI call. Where
  /// sums_regions(total bytes) only.
  template <class T>
  Request iallreduce_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < k; ++i) n += regions[i].count;
    checked_count(n);
    if (!sums_regions(n * sizeof(T)))
      throw Error(impl::cat("MpiBackend::iallreduce_sum_regions: ", n * sizeof(T),
                            " bytes do not run the ring (see sums_regions)"));
    Request r;
    r.ring = comm_->rings.template start_regions<T>(regions, k, double(factor), impl::mpi_type<T>(),
                                                    impl::mpi_sum_op<T>(), comm(), rank_, size_);
    return r;
  }
  /// The reduce-scatter half of a sharded step over k host regions taken as one buffer: this rank's
  /// slice (gradsync::shard_slice) ends holding factor * the sum over ranks; the rest is
  /// unspecified. Always gradsync's ring (any size), every rank passing regions of the same sizes;
  /// one rank multiplies in place.
  template <class T>
  Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor) const {
    return start_half(regions, k, factor, false, T(1), impl::RingAllreduce::Half::reduce_scatter);
  }
  /// The same with each rank's values multiplied by its own `pre` first (set_samples' weights);
  /// every rank calls this form for the same sums.
  template <class T>
  Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor, T pre) const {
    return start_half(regions, k, factor, true, pre, impl::RingAllreduce::Half::reduce_scatter);
  }
  /// The allgather half: every rank's slice of the regions (taken as one buffer) to every rank.
  template <class T>
  Request iallgather_regions(const SumRegion<T>* regions, std::size_t k) const {
    return start_half(regions, k, T(1), false, T(1), impl::RingAllreduce::Half::allgather);
  }
  /// The sync's automatic choice (gradsync::prefers_blocking_allreduce): nonblocking, so that
  /// chunks pipeline and overlap backward, unless MPI is CUDA-aware. Then sums go to libnbc, whose
  /// MPI_Iallreduce reduces to a root and broadcasts back for fewer than 4 ranks or in place.
  bool prefers_blocking_allreduce() const { return cuda_aware_.aware && size_ > 1; }

  /// Whether a nonblocking sum of this many bytes runs the ring and so takes a factor. Device
  /// buffers stay with MPI (MPI_Reduce_local works on host memory), as do small sums.
  bool folds_factor(std::size_t bytes) const { return size_ > 1 && !cuda_aware_.aware && bytes >= ring_min_bytes; }
  /// Where 16-bit wire values can be summed: host memory (the op runs on the CPU); device chunks
  /// are staged through host memory for it.
  template <class MemorySpace>
  bool can_reduce_wire() const {
    return impl::host_accessible_v<MemorySpace>;
  }
  /// Compressed sums in place (impl/wire_ring.hpp): whether a sum of this many bytes on the wire
  /// runs the ring, which converts the gradients to 16 bits as it sends them and adds what it
  /// receives in fp32, so that no 16-bit copy of them is packed and unpacked.
  bool sums_wire_in_place(std::size_t wire_bytes) const { return folds_factor(wire_bytes); }
  /// buf[0, n) = post * sum over ranks of (pre * buf + residual), the values crossing as 16-bit W
  /// (WireFp16, WireBf16), added in fp32 and rounded once by each rank; every rank ends with the same
  /// bits. `residual` (or null) keeps what this rank's roundings dropped (error feedback). Host memory,
  /// where sums_wire_in_place() says so; the Request's `non_finite` tells, once complete, the first
  /// value that is not finite (fp16 only).
  template <class W, class T>
  Request iallreduce_wire_in_place(T* buf, std::size_t n, T pre, T post, T* residual) const {
    static_assert(impl::is_wire_v<W> && std::is_floating_point_v<T>,
                  "gradsync: iallreduce_wire_in_place<W>(T*, ...) takes a wire format and float or double values");
    Request r;
    r.ring = comm_->rings.template start_wire<W>(buf, checked_count(n), pre, post, residual, comm(), rank_, size_);
    return r;
  }
  /// The reduce-scatter half of iallreduce_wire_in_place (a sharded step, Options::shard with
  /// compression): this rank's slice (gradsync::shard_slice) of buf ends holding post * the sum over
  /// ranks of (pre * buf + residual), 16 bits on the wire and added in fp32; the rest is unspecified.
  /// Always gradsync's ring (any size); `non_finite` covers this rank's slice only. One rank rounds
  /// its values through the wire format as a sum of one would.
  template <class W, class T>
  Request ireduce_scatter_wire_in_place(T* buf, std::size_t n, T pre, T post, T* residual) const {
    static_assert(impl::is_wire_v<W> && std::is_floating_point_v<T>,
                  "gradsync: ireduce_scatter_wire_in_place<W>(T*, ...) takes a wire format and float or double values");
    Request r;
    if (size_ == 1) {
      r.non_finite = impl::round_through_wire<W>(buf, checked_count(n), pre, post, residual);
      return r;
    }
    r.ring = comm_->rings.template start_wire<W>(buf, checked_count(n), pre, post, residual, comm(), rank_, size_,
                                                 impl::RingAllreduce::Half::reduce_scatter);
    return r;
  }
  /// Blocks until `r` completes (polling a ring or hierarchical sum, which advance only when
  /// tested). Local to this rank's request; allocates nothing.
  void wait(Request& r) const {
    if (r.ring || r.stage != 0) {
      while (!test(r)) {
      }  // polls, as MPI_Wait does: the ring advances only when tested
      return;
    }
    impl::mpi_check(MPI_Wait(&r.req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  /// Whether `r` completed; advances every ring sum in flight and starts a hierarchical sum's next
  /// stage. Never blocks; allocates nothing.
  bool test(Request& r) const {
    if (r.ring) {
      comm_->rings.progress();
      if (r.ring->busy()) return false;
      r.non_finite = r.ring->non_finite();
      r.ring.reset();
      return true;
    }
    int done = 0;
    impl::mpi_check(MPI_Test(&r.req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    while (done && r.stage != 0 && start_stage(r, r.stage + 1))  // the next stage of a hierarchical sum
      impl::mpi_check(MPI_Test(&r.req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  /// Smallest nonblocking sum sent through the ring: below it MPI's own few-message schedule wins
  /// on latency (libnbc's threshold for its binomial schedule, too).
  static constexpr std::size_t ring_min_bytes = std::size_t(64) << 10;

  /// Blocking in-place minimum over the ranks. Collective; allocates nothing.
  template <class T>
  void allreduce_min(T* buf, std::size_t n) const {
    reduce_op(buf, n, MPI_MIN);
  }
  /// Blocking in-place maximum over the ranks. Collective; allocates nothing.
  template <class T>
  void allreduce_max(T* buf, std::size_t n) const {
    reduce_op(buf, n, MPI_MAX);
  }

  /// Blocking broadcast of n values from `root` (an Error when root is not a rank). Collective;
  /// allocates nothing.
  template <class T>
  void broadcast(T* buf, std::size_t n, int root) const {
    if (root < 0 || root >= size_)
      throw Error(impl::cat("broadcast root ", root, " is not a rank of this ", size_, "-rank communicator"));
    impl::for_pieces(n, impl::mpi_max_count(), [&](std::size_t off, int cnt) {
      impl::mpi_check(MPI_Bcast(buf + off, cnt, impl::mpi_type<T>(), root, comm()), "MPI_Bcast");
    });
  }

  /// Nonblocking forms (n must fit one MPI call): gradsync's helpers wait for them under the stall
  /// watchdog (impl/watched.hpp).
  template <class T>
  Request ibroadcast(T* buf, std::size_t n, int root) const {
    if (root < 0 || root >= size_)
      throw Error(impl::cat("broadcast root ", root, " is not a rank of this ", size_, "-rank communicator"));
    Request r;
    impl::mpi_check(MPI_Ibcast(buf, checked_count(n), impl::mpi_type<T>(), root, comm(), &r.req), "MPI_Ibcast");
    return r;
  }
  /// Nonblocking in-place minimum (see ibroadcast()).
  template <class T>
  Request iallreduce_min(T* buf, std::size_t n) const {
    Request r;
    impl::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(n), impl::mpi_type<T>(), MPI_MIN, comm(), &r.req),
                    "MPI_Iallreduce (MIN)");
    return r;
  }
  /// Nonblocking allgather: recv holds size()*n values (see allgather(), ibroadcast()).
  template <class T>
  Request iallgather(const T* send, T* recv, std::size_t n) const {
    Request r;
    impl::mpi_check(MPI_Iallgather(send, checked_count(n), impl::mpi_type<T>(), recv, checked_count(n),
                                   impl::mpi_type<T>(), comm(), &r.req),
                    "MPI_Iallgather");
    return r;
  }

  /// recv holds size()*n values: rank r's `n` values at recv + r*n.
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    impl::mpi_check(
        MPI_Allgather(send, checked_count(n), impl::mpi_type<T>(), recv, checked_count(n), impl::mpi_type<T>(), comm()),
        "MPI_Allgather");
  }

  /// Each rank sends n values to every rank: send and recv hold size()*n values.
  template <class T>
  void alltoall(const T* send, T* recv, std::size_t n) const {
    impl::mpi_check(
        MPI_Alltoall(send, checked_count(n), impl::mpi_type<T>(), recv, checked_count(n), impl::mpi_type<T>(), comm()),
        "MPI_Alltoall");
  }

  /// Variable all-to-all: counts and displacements in elements, one per rank.
  template <class T>
  void alltoallv(const T* send, const int* send_counts, const int* send_displs, T* recv, const int* recv_counts,
                 const int* recv_displs) const {
    impl::mpi_check(MPI_Alltoallv(send, send_counts, send_displs, impl::mpi_type<T>(), recv, recv_counts, recv_displs,
                                  impl::mpi_type<T>(), comm()),
                    "MPI_Alltoallv");
  }

  /// MPI_Barrier on the backend's communicator. Collective.
  void barrier() const { impl::mpi_check(MPI_Barrier(comm()), "MPI_Barrier"); }

  /// Called by a GradientSync that failed with collectives possibly pending on this communicator:
  /// every copy of this backend then refuses to serve a new GradientSync (impl::unfailed). Local.
  void retire(const std::string& why) const noexcept {
    comm_->retired_flag = true;
    try {
      comm_->retired = why;
    } catch (...) {  // out of memory: retired() still says so
    }
  }
  /// Why a failed GradientSync retired this communicator; empty when none did. Local.
  std::string retired() const {
    if (!comm_->retired_flag) return {};
    return comm_->retired.empty() ? std::string("a GradientSync failed on it") : comm_->retired;
  }

  /// A backend over the ranks that give the same `color` (MPI_Comm_split; collective over this
  /// backend's ranks), ordered by `key`: the communicator of a process set.
  MpiBackend split(int color, int key) const {
    MPI_Comm sub = MPI_COMM_NULL;
    impl::mpi_check(MPI_Comm_split(comm(), color, key, &sub), "MPI_Comm_split");
    MpiBackend b(sub, cuda_aware_.aware ? CudaAwareMpi::yes : CudaAwareMpi::no);  // works on a duplicate
    MPI_Comm_free(&sub);
    return b;
  }

 private:
  // Owns the duplicate; shared so that copies of the backend use one communicator.
  struct Comm {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm node = MPI_COMM_NULL;        // the ranks of this rank's node
    MPI_Comm leaders = MPI_COMM_NULL;     // each node's first rank (MPI_COMM_NULL on the others)
    MPI_Comm node_bcast = MPI_COMM_NULL;  // node's duplicate: the broadcasts of hierarchical sums
    Topology topology;
    impl::RingPool rings;       // shared by copies of the backend, like the communicator
    bool retired_flag = false;  // retire(): a failed sync may have left collectives pending
    std::string retired;
    MPI_Comm notices = MPI_COMM_NULL;  // the group's, not owned (impl::group_notice_comm)
    explicit Comm(MPI_Comm user) {
      impl::mpi_check(MPI_Comm_dup(user, &comm), "MPI_Comm_dup");
      // Errors come back as codes and become gradsync::Error instead of aborting the job.
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      find_topology();
      notices = impl::group_notice_comm(comm);  // collective too, at the group's first backend
    }
    ~Comm() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      // A failed sync's peers may still send to this rank on these communicators (chunks it never
      // launched). Freed, their context ids return to Open MPI, and a message arriving later waits
      // for the next communicator given the same id: at its creation ob1 matched it there, from a
      // rank outside it, and crashed (test_step, 1 run in 25 under load). Kept, for the process's life.
      if (retired_flag) return;
      for (MPI_Comm* c : {&leaders, &node_bcast, &node, &comm})
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
    // Collective, like the duplicate: the node and leader communicators and their sizes.
    void find_topology() {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      const int k = impl::mpi_ranks_per_node_override();
      if (k > 0)
        impl::mpi_check(MPI_Comm_split(comm, rank / std::max(k, 1), rank, &node), "MPI_Comm_split (nodes)");
      else
        impl::mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                        "MPI_Comm_split_type (nodes)");
      MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
      impl::mpi_check(MPI_Comm_dup(node, &node_bcast), "MPI_Comm_dup (nodes)");
      Topology& t = topology;
      MPI_Comm_rank(node, &t.local_rank);
      MPI_Comm_size(node, &t.local_size);
      impl::mpi_check(MPI_Comm_split(comm, t.local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders),
                      "MPI_Comm_split (node leaders)");
      if (leaders != MPI_COMM_NULL) {
        MPI_Comm_set_errhandler(leaders, MPI_ERRORS_RETURN);
        MPI_Comm_size(leaders, &t.nodes);
        MPI_Comm_rank(leaders, &t.node);
      }
      int v[4] = {t.nodes, t.node, t.local_size, -t.local_size};  // leaders' values, sent to their node
      impl::mpi_check(MPI_Bcast(v, 2, MPI_INT, 0, node), "MPI_Bcast (topology)");
      impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, v + 2, 2, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (topology)");
      t.nodes = v[0];
      t.node = v[1];
      t.min_local_size = v[2];
      t.max_local_size = -v[3];
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
  };

  static int checked_count(std::size_t n) {
    if (n > impl::mpi_max_count())
      throw Error(impl::cat("a single MPI call of ", n, " elements exceeds the limit of ", impl::mpi_max_count()));
    return int(n);
  }

  // Starts the first stage of a hierarchical sum from `s` on that this rank takes part in;
  // false (and stage 0) when none is left.
  bool start_stage(Request& r, int s) const {
    const Comm& c = *comm_;
    const bool in_node = c.topology.local_size > 1, root = c.topology.local_rank == 0;
    for (; s <= 3; ++s) {
      if (s == 1 && in_node) {
        impl::mpi_check(
            MPI_Ireduce(root ? MPI_IN_PLACE : r.buf, root ? r.buf : nullptr, r.count, r.type, r.op, 0, c.node, &r.req),
            "MPI_Ireduce (within the node)");
        break;
      }
      if (s == 2 && c.leaders != MPI_COMM_NULL && c.topology.nodes > 1) {
        impl::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, r.buf, r.count, r.type, r.op, c.leaders, &r.req),
                        "MPI_Iallreduce (among nodes)");
        break;
      }
      if (s == 3 && in_node) {
        impl::mpi_check(MPI_Ibcast(r.buf, r.count, r.type, 0, c.node_bcast, &r.req), "MPI_Ibcast (within the node)");
        break;
      }
    }
    r.stage = s <= 3 ? s : 0;
    return r.stage != 0;
  }

  template <class T>
  Request start_sum(T* buf, std::size_t n, double factor, bool weighted = false, double pre = 1.0) const {
    Request r;
    const int count = checked_count(n);
    if (folds_factor(n * sizeof(T))) {
      r.ring = comm_->rings.start(buf, count, factor, impl::mpi_type<T>(), impl::mpi_sum_op<T>(), comm(), rank_, size_,
                                  weighted, pre);
      return r;
    }
    if (factor != 1.0 || weighted)
      throw Error(impl::cat("MpiBackend::iallreduce_sum: a factor is folded only into ring sums (", n * sizeof(T),
                            " bytes given; see folds_factor)"));
    impl::mpi_check(
        MPI_Iallreduce(MPI_IN_PLACE, buf, count, impl::mpi_type<T>(), impl::mpi_sum_op<T>(), comm(), &r.req),
        "MPI_Iallreduce");
    return r;
  }

  template <class T>
  Request start_half(const SumRegion<T>* regions, std::size_t k, T factor, bool weighted, T pre,
                     impl::RingAllreduce::Half half) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < k; ++i) n += regions[i].count;
    checked_count(n);
    Request r;
    if (size_ == 1) {  // the slice is everything: the factor, and nothing to send
      if (half == impl::RingAllreduce::Half::reduce_scatter) impl::scale_regions(regions, k, factor, pre);
      return r;
    }
    if (cuda_aware_.aware)
      throw Error(
          "MpiBackend: a sharded step (Options::shard) runs gradsync's ring on host memory; this MPI is "
          "CUDA-aware and the sync's buffers may be device memory");
    r.ring =
        comm_->rings.template start_regions<T>(regions, k, double(factor), impl::mpi_type<T>(), impl::mpi_sum_op<T>(),
                                               comm(), rank_, size_, half, weighted, double(pre));
    return r;
  }

  template <class T>
  void reduce_op(T* buf, std::size_t n, MPI_Op op) const {
    impl::for_pieces(n, impl::mpi_max_count(), [&](std::size_t off, int cnt) {
      impl::mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, impl::mpi_type<T>(), op, comm()), "MPI_Allreduce");
    });
  }

  std::shared_ptr<Comm> comm_;
  int rank_ = 0;
  int size_ = 1;
  impl::CudaAwareDecision cuda_aware_;
};

}  // namespace gradsync
