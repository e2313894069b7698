// gradsync: the NCCL backend. Collectives on CUDA device memory, ordered on one CUDA stream.
//
// Built from the user's MPI communicator: rank 0 creates the NCCL unique id, MPI broadcasts it, every
// rank joins with ncclCommInitRank on its current CUDA device (select it before, e.g. by local rank;
// Kokkos::initialize does). Every NCCL and CUDA error becomes a gradsync::Error naming the call.
//
// Stream semantics: the nonblocking forms (iallreduce_*, ibroadcast, iallgather) enqueue on the
// backend's stream and record an event; wait() blocks the host until that event, test() polls it.
// The blocking collectives enqueue and then synchronize the stream, so on return the result is
// visible to the host and every stream.
//
// Failure: abort() (ncclCommAbort) terminates what the backend enqueued and never finished, so the
// stream, the user's, is not left holding a kernel that waits for a peer which stalled or failed.
// GradientSync's failure path calls it (impl::abort_collectives, backend_traits.hpp).
// Use the same stream as the gradients' producer (Kokkos' CUDA execution space instance, or the
// CudaStream of a GradientSync over Span<T, CudaDeviceSpace>) so no extra synchronization is needed.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "compression.hpp"
#include "config.hpp"
#include "cuda_space.hpp"
#include "error.hpp"
#include "impl/cuda_aware.hpp"
#include "mpi_backend.hpp"

namespace gradsync {
namespace impl {

template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, int>)
    return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return ncclUint64;
  else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char>)
    return ncclInt8;
  else if constexpr (std::is_same_v<T, unsigned char>)
    return ncclUint8;
  // 16-bit wire values (compression.hpp): NCCL sums them itself, each addition rounded once.
  else if constexpr (std::is_same_v<T, WireFp16>)
    return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  else if constexpr (std::is_same_v<T, WireBf16>)
    return ncclBfloat16;
#endif
  else
    static_assert(sizeof(T) == 0, "gradsync: no NCCL datatype for this type");
}

inline void nccl_check(ncclResult_t rc, const char* what, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  std::string detail;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(comm); last && *last) detail = cat(" (", last, ")");
#else
  (void)comm;
#endif
  throw Error(cat(what, " failed: ", ncclGetErrorString(rc), detail));
}

}  // namespace impl

/// GradientSync's backend over NCCL, for gradients in CUDA device memory (GPU builds: needs
/// GradSync::nccl, which defines GRADSYNC_HAVE_NCCL). Built from an MPI communicator; copies share
/// one NCCL communicator and stream. The members below are the backend interface a GradientSync
/// calls; every collective member is collective over the backend's ranks, each calling it in the
/// same order, and enqueues on the backend's stream. Blocking collectives synchronize the stream.
class NcclBackend {
 public:
  /// A collective in flight: an event recorded on the backend's stream after it. Every request in
  /// flight has its own event, from a pool owned by the backend that grows to the most requests
  /// ever in flight at once (then requests allocate nothing): waiting for one never waits for a
  /// later collective. The event returns to the pool when wait() or test() sees it done; a request
  /// abandoned before that keeps its event out of the pool. Wait each request once (copies share
  /// the event).
  struct Request {
    /// The recorded event (null once complete).
    cudaEvent_t event = nullptr;
  };

  /// ncclAvg (NCCL 2.10+): the backend can average in the reduction itself.
  static constexpr bool reduces_average = NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0);

  /// Joins every rank of `comm` (collective over it) on the current CUDA device; collectives are
  /// enqueued on `stream`, which the caller keeps alive as long as the backend.
  NcclBackend(MPI_Comm comm, cudaStream_t stream) : state_(std::make_shared<State>(comm, stream)) {}
  /// On a CudaStream's stream (the one a GradientSync over Span<T, CudaDeviceSpace> uses).
  NcclBackend(MPI_Comm comm, CudaStream stream) : NcclBackend(comm, stream.stream()) {}
#if defined(KOKKOS_ENABLE_CUDA)
  /// On the stream of a Kokkos CUDA execution space instance: by default the default instance, the
  /// one a GradientSync over Kokkos::CudaSpace views uses unless given another. (Without Kokkos'
  /// CUDA backend this is NcclBackend(comm), on the legacy default stream.) Collective over `comm`.
  explicit NcclBackend(MPI_Comm comm, const Kokkos::Cuda& exec = Kokkos::Cuda())
      : NcclBackend(comm, exec.cuda_stream()) {}
#else
  /// On the legacy default stream.
  explicit NcclBackend(MPI_Comm comm) : NcclBackend(comm, CudaStream{}) {}
#endif

  /// "nccl", in summaries and messages.
  static constexpr const char* name() { return "nccl"; }
  /// What NcclBackend offers beyond the required members (backend.hpp). Its sums take WireFp16 /
  /// WireBf16 arrays as ncclFloat16 / ncclBfloat16 (bf16 needs NCCL 2.10+).
  using capabilities =
      Capabilities<Capability::comm, Capability::ordered_on, Capability::reads_memory_space, Capability::ibroadcast,
                   Capability::iallreduce_min, Capability::iallgather, Capability::wire_sums,
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
                   Capability::shard_sums,
#endif
                   Capability::abort>;
  /// This rank in the communicator. Local.
  int rank() const { return state_->rank; }
  /// The communicator's size. Local.
  int size() const { return state_->size; }
  /// The stream every collective is enqueued on. Local.
  cudaStream_t stream() const { return state_->stream; }
  /// The NCCL communicator (null after abort()).
  ncclComm_t nccl_comm() const { return state_->nccl; }
  /// The duplicate of the user's communicator used for bootstrap and barrier.
  MPI_Comm comm() const { return state_->mpi; }

  /// True when `exec` enqueues on this backend's stream: a GradientSync then skips the fence between
  /// packing a chunk and reducing it (impl/backend_order.hpp).
  bool ordered_on(const CudaStream& exec) const { return exec.stream() == stream(); }
#if defined(KOKKOS_ENABLE_CUDA)
  /// True when the Kokkos instance `exec` enqueues on this backend's stream.
  bool ordered_on(const Kokkos::Cuda& exec) const { return exec.cuda_stream() == stream(); }
#endif

  /// Memory a CUDA device can address; host memory never (staging through host cannot help NCCL).
  /// Known at compile time: GradientSync<NcclBackend, host tensor> is a static_assert
  /// (impl::reads_memory_space in backend.hpp).
  template <class MemorySpace>
  static constexpr bool reads_memory_space = impl::is_cuda_memory_v<MemorySpace>;
  /// reads_memory_space<MemorySpace>, at run time.
  template <class MemorySpace>
  bool can_access() const {
    return reads_memory_space<MemorySpace>;
  }

  /// Blocking in-place sum of n values (ncclAllReduce, then the stream is synchronized).
  /// Collective; allocates nothing.
  template <class T>
  void allreduce_sum(T* buf, std::size_t n) const {
    allreduce(buf, n, ncclSum);
    sync();
  }
  /// Blocking in-place average (ncclAvg, NCCL 2.10+). Collective; allocates nothing.
  template <class T>
  void allreduce_average(T* buf, std::size_t n) const {
    static_assert(reduces_average, "gradsync: ncclAvg needs NCCL 2.10 or newer");
    allreduce(buf, n, avg_op());
    sync();
  }
  /// Blocking in-place minimum. Collective; allocates nothing.
  template <class T>
  void allreduce_min(T* buf, std::size_t n) const {
    allreduce(buf, n, ncclMin);
    sync();
  }
  /// Blocking in-place maximum. Collective; allocates nothing.
  template <class T>
  void allreduce_max(T* buf, std::size_t n) const {
    allreduce(buf, n, ncclMax);
    sync();
  }

  /// Enqueues an in-place sum on the stream; wait() or test() the request before reading `buf`.
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n) const {
    allreduce(buf, n, ncclSum);
    return record();
  }
  /// Enqueues an in-place average (ncclAvg, NCCL 2.10+); wait() or test() before reading `buf`.
  template <class T>
  Request iallreduce_average(T* buf, std::size_t n) const {
    static_assert(reduces_average, "gradsync: ncclAvg needs NCCL 2.10 or newer");
    allreduce(buf, n, avg_op());
    return record();
  }

  /// Blocks until the request's collective is done. Polls, so that an NCCL failure elsewhere (a
  /// rank that died, a network error) surfaces as an Error instead of a hang.
  void wait(Request& r) const {
    while (!test(r)) std::this_thread::yield();
  }
  /// Whether the request's collective is done (its event returns to the pool); surfaces an NCCL
  /// failure as an Error. Never blocks; allocates nothing.
  bool test(Request& r) const {
    if (r.event == nullptr) return true;
    const cudaError_t rc = cudaEventQuery(r.event);
    if (rc == cudaSuccess) {
      state_->free_events.push_back(r.event);  // within its capacity: allocates nothing
      r.event = nullptr;
      return true;
    }
    if (rc != cudaErrorNotReady) impl::cuda_check(rc, "cudaEventQuery (gradsync NCCL request)");
    check_async();
    return false;
  }

  /// Blocking broadcast of n values from `root` (an Error when root is not a rank). Collective;
  /// allocates nothing.
  template <class T>
  void broadcast(T* buf, std::size_t n, int root) const {
    enqueue_broadcast(buf, n, root);
    sync();
  }
  /// Blocking gather: recv holds size()*n values, rank r's `n` values at recv + r*n.
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    enqueue_allgather(send, recv, n);
    sync();
  }

  // The nonblocking forms of the collectives gradsync's helpers use (broadcast_parameters, the
  // norm's and the optimizer's agreements, the row-sparse exchange): with them impl::Watched waits
  // under the stall watchdog, so a rank that never joins is named at the deadline and the failure
  // path's abort() releases the stream, where the blocking forms would wait in
  // cudaStreamSynchronize forever.

  /// Enqueues an in-place minimum; wait() or test() the request before reading `buf`.
  template <class T>
  Request iallreduce_min(T* buf, std::size_t n) const {
    allreduce(buf, n, ncclMin);
    return record();
  }
  /// Enqueues a broadcast of n values from `root` (an Error when root is not a rank).
  template <class T>
  Request ibroadcast(T* buf, std::size_t n, int root) const {
    enqueue_broadcast(buf, n, root);
    return record();
  }
  /// Enqueues allgather(send, recv, n).
  template <class T>
  Request iallgather(const T* send, T* recv, std::size_t n) const {
    enqueue_allgather(send, recv, n);
    return record();
  }

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
  // The two halves of a sharded step (Options::shard, Capability::shard_sums) over k device regions
  // taken as one buffer of n values, rank r's slice gradsync::shard_slice(n, size, r). The slices
  // differ by up to one value, and ncclReduceScatter / ncclAllGather take equal counts (padding
  // would move the slices off the rule every backend shares), so each rank's slice is one
  // ncclReduce rooted at it (the allgather: one ncclBroadcast from it), a piece per region it spans,
  // all in one NCCL group: one launch, the same bytes on each link as a reduce-scatter ring.

  /// The reduce-scatter half: this rank's slice ends holding factor * the sum over ranks (each
  /// rank's values multiplied by factor as they enter: ncclRedOpCreatePreMulSum); the rest is
  /// unspecified. Enqueued on the stream; every rank passes regions of the same sizes.
  template <class T>
  Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor) const {
    return slices(regions, k, factor, true);
  }
  /// The same with each rank's values multiplied by its own `pre` first (set_samples' weights).
  template <class T>
  Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor, T pre) const {
    return slices(regions, k, T(factor * pre), true);
  }
  /// The allgather half: every rank's slice of the regions (taken as one buffer) to every rank.
  template <class T>
  Request iallgather_regions(const SumRegion<T>* regions, std::size_t k) const {
    return slices(regions, k, T(1), false);
  }
#endif

  /// Each rank sends n values to every rank (send and recv hold size()*n values): grouped
  /// point-to-point, which every NCCL since 2.7 has.
  template <class T>
  void alltoall(const T* send, T* recv, std::size_t n) const {
    (void)live_comm();  // before the group opens
    impl::nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      const std::size_t off = std::size_t(r) * n;
      impl::nccl_check(ncclSend(send + off, n, impl::nccl_type<T>(), r, nccl_comm(), stream()), "ncclSend",
                       nccl_comm());
      impl::nccl_check(ncclRecv(recv + off, n, impl::nccl_type<T>(), r, nccl_comm(), stream()), "ncclRecv",
                       nccl_comm());
    }
    impl::nccl_check(ncclGroupEnd(), "ncclGroupEnd (alltoall)", nccl_comm());
    sync();
  }

  /// Variable all-to-all, as MpiBackend::alltoallv: counts and displacements in elements, one per rank.
  template <class T>
  void alltoallv(const T* send, const int* send_counts, const int* send_displs, T* recv, const int* recv_counts,
                 const int* recv_displs) const {
    (void)live_comm();  // before the group opens
    impl::nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      if (send_counts[r] > 0)
        impl::nccl_check(ncclSend(send + send_displs[r], std::size_t(send_counts[r]), impl::nccl_type<T>(), r,
                                  nccl_comm(), stream()),
                         "ncclSend", nccl_comm());
      if (recv_counts[r] > 0)
        impl::nccl_check(ncclRecv(recv + recv_displs[r], std::size_t(recv_counts[r]), impl::nccl_type<T>(), r,
                                  nccl_comm(), stream()),
                         "ncclRecv", nccl_comm());
    }
    impl::nccl_check(ncclGroupEnd(), "ncclGroupEnd (alltoallv)", nccl_comm());
    sync();
  }

  /// Every rank's stream work issued so far is done, then an MPI barrier.
  void barrier() const {
    sync();
    impl::mpi_check(MPI_Barrier(comm()), "MPI_Barrier");
  }

  /// For the failure path (a stall, a peer's failure): aborts the NCCL communicator
  /// (ncclCommAbort), which terminates the collectives it enqueued and never finished, so that the
  /// stream is released instead of waiting forever for a peer. Local, not collective; idempotent;
  /// never throws. The backend and every copy of it are unusable afterwards: each collective
  /// throws an Error saying so (requests in flight complete, their values undefined).
  void abort() const noexcept {
    State& s = *state_;
    if (s.nccl == nullptr) return;
    (void)ncclCommAbort(s.nccl);  // its failure leaves nothing more to do: the communicator is gone either way
    s.nccl = nullptr;
    s.aborted = true;
  }
  /// Whether abort() was called (on this backend or a copy).
  bool aborted() const { return state_->aborted; }

 private:
  // Events created up front: as many as a sync keeps chunks in flight by default (SyncPlan: 16 on
  // one node). More are created when more requests are in flight at once.
  static constexpr int initial_events = 16;

  struct State {
    MPI_Comm mpi = MPI_COMM_NULL;
    ncclComm_t nccl = nullptr;
    cudaStream_t stream = nullptr;
    int rank = 0, size = 1;
    bool aborted = false;
    std::vector<cudaEvent_t> events;       // every event created, destroyed with the backend
    std::vector<cudaEvent_t> free_events;  // those no request in flight holds (capacity: all of them)

    State(MPI_Comm user, cudaStream_t s) : stream(s) {
      int initialized = 0, finalized = 0;
      MPI_Initialized(&initialized);
      MPI_Finalized(&finalized);
      if (!initialized || finalized)
        throw Error("NcclBackend needs MPI to be initialized (call MPI_Init before building it)");
      if (user == MPI_COMM_NULL) throw Error("NcclBackend was given MPI_COMM_NULL");
      impl::mpi_check(MPI_Comm_dup(user, &mpi), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
      MPI_Comm_rank(mpi, &rank);
      MPI_Comm_size(mpi, &size);
      try {
        init();
      } catch (...) {
        release();
        throw;
      }
    }
    ~State() { release(); }
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    // Every step that can fail on one rank only is agreed over MPI first, so that all ranks throw
    // together instead of some waiting forever in the next collective.
    void init() {
      int device = -1, count = 0;
      std::string local_error;
      if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess)
        local_error = impl::cat("cudaGetDeviceCount failed: ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc));
      else if (count == 0)
        local_error = "cudaGetDeviceCount found no device";
      else if (const cudaError_t rc2 = cudaGetDevice(&device); rc2 != cudaSuccess)
        local_error = impl::cat("cudaGetDevice failed: ", cudaGetErrorName(rc2), ": ", cudaGetErrorString(rc2));
      agree(local_error, "no usable CUDA device");

      struct Boot {
        int rc = int(ncclSuccess);
        ncclUniqueId id{};
      } boot;
      if (rank == 0) boot.rc = int(ncclGetUniqueId(&boot.id));
      impl::mpi_check(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, mpi), "MPI_Bcast (NCCL unique id)");
      impl::nccl_check(ncclResult_t(boot.rc), "ncclGetUniqueId on rank 0");

      const ncclResult_t rc = ncclCommInitRank(&nccl, size, boot.id, rank);
      if (rc != ncclSuccess) {
        local_error = impl::cat("ncclCommInitRank on CUDA device ", device, " failed: ", ncclGetErrorString(rc));
        nccl = nullptr;
      }
      for (int k = 0; k < initial_events && local_error.empty(); ++k)
        if (const cudaError_t erc = add_event(); erc != cudaSuccess)
          local_error = impl::cat("cudaEventCreate failed: ", cudaGetErrorString(erc));
      agree(local_error, "could not join the NCCL communicator");
    }

    // One more event in the pool (free); the pool's capacity covers every event, so returning
    // one to it never allocates.
    cudaError_t add_event() {
      cudaEvent_t e = nullptr;
      if (const cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); rc != cudaSuccess) return rc;
      try {
        events.push_back(e);
        free_events.reserve(events.size());
      } catch (...) {
        if (events.empty() || events.back() != e) cudaEventDestroy(e);
        throw;
      }
      free_events.push_back(e);
      return cudaSuccess;
    }

    // Throws on every rank when `local_error` is set on any, naming the failing ranks.
    void agree(const std::string& local_error, const char* what) {
      int bad = local_error.empty() ? 0 : 1;
      std::vector<int> all(std::size_t(size), 0);
      impl::mpi_check(MPI_Allgather(&bad, 1, MPI_INT, all.data(), 1, MPI_INT, mpi), "MPI_Allgather");
      std::string ranks;
      for (int r = 0; r < size; ++r)
        if (all[std::size_t(r)]) ranks += impl::cat(ranks.empty() ? "" : ", ", r);
      if (ranks.empty()) return;
      throw Error(impl::cat("NcclBackend: ", what, " on rank(s) ", ranks,
                            local_error.empty() ? std::string() : impl::cat("; on rank ", rank, ": ", local_error)));
    }

    void release() {
      if (nccl) {
        cudaStreamSynchronize(stream);
        ncclCommDestroy(nccl);
        nccl = nullptr;
      }
      for (cudaEvent_t e : events) cudaEventDestroy(e);
      events.clear();
      free_events.clear();
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&mpi);
      mpi = MPI_COMM_NULL;
    }
  };

  static constexpr ncclRedOp_t avg_op() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    return ncclAvg;
#else
    return ncclSum;
#endif
  }

  template <class T>
  void allreduce(T* buf, std::size_t n, ncclRedOp_t op) const {
    impl::nccl_check(ncclAllReduce(buf, buf, n, impl::nccl_type<T>(), op, live_comm(), stream()), "ncclAllReduce",
                     nccl_comm());
  }
  template <class T>
  void enqueue_broadcast(T* buf, std::size_t n, int root) const {
    if (root < 0 || root >= size())
      throw Error(impl::cat("broadcast root ", root, " is not a rank of this ", size(), "-rank NCCL communicator"));
    impl::nccl_check(ncclBroadcast(buf, buf, n, impl::nccl_type<T>(), root, live_comm(), stream()), "ncclBroadcast",
                     nccl_comm());
  }
  template <class T>
  void enqueue_allgather(const T* send, T* recv, std::size_t n) const {
    impl::nccl_check(ncclAllGather(send, recv, n, impl::nccl_type<T>(), live_comm(), stream()), "ncclAllGather",
                     nccl_comm());
  }

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 11, 0)
  // Each rank's slice of the regions: reduced into it (`reduce`, pre-multiplied by `factor`) or
  // broadcast from it, one grouped launch.
  template <class T>
  Request slices(const SumRegion<T>* regions, std::size_t k, T factor, bool reduce) const {
    ncclComm_t comm = live_comm();  // before the group opens
    std::size_t n = 0;
    for (std::size_t i = 0; i < k; ++i) n += regions[i].count;
    ncclRedOp_t op = ncclSum;
    if (reduce)
      impl::nccl_check(ncclRedOpCreatePreMulSum(&op, &factor, impl::nccl_type<T>(), ncclScalarHostImmediate, comm),
                       "ncclRedOpCreatePreMulSum", comm);
    impl::nccl_check(ncclGroupStart(), "ncclGroupStart");
    std::size_t at = 0;  // where region i starts in the buffer the regions make
    for (std::size_t i = 0; i < k; ++i) {
      for (int q = 0; q < size(); ++q) {
        const auto [lo, hi] = shard_slice(n, size(), q);
        const std::size_t a = std::max(lo, at), b = std::min(hi, at + regions[i].count);
        if (a >= b) continue;
        T* piece = regions[i].data + (a - at);
        if (reduce)
          impl::nccl_check(ncclReduce(piece, piece, b - a, impl::nccl_type<T>(), op, q, comm, stream()), "ncclReduce",
                           comm);
        else
          impl::nccl_check(ncclBroadcast(piece, piece, b - a, impl::nccl_type<T>(), q, comm, stream()), "ncclBroadcast",
                           comm);
      }
      at += regions[i].count;
    }
    const ncclResult_t rc = ncclGroupEnd();
    if (reduce) ncclRedOpDestroy(op, comm);  // allowed once the calls given it returned
    impl::nccl_check(rc, reduce ? "ncclGroupEnd (sharded reduce-scatter)" : "ncclGroupEnd (sharded allgather)", comm);
    return record();
  }
#endif

  // The communicator, or an Error when abort() has released it.
  ncclComm_t live_comm() const {
    if (state_->aborted)
      throw Error(impl::cat("NcclBackend on rank ", rank(),
                            ": the NCCL communicator was aborted (after a stall or a peer's failure); build a new "
                            "backend"));
    return state_->nccl;
  }

  // An event of its own for the collective just enqueued: a free one, or a new one when every
  // event is held by a request in flight.
  Request record() const {
    State& s = *state_;
    if (s.free_events.empty())
      impl::cuda_check(s.add_event(), "cudaEventCreate (gradsync NCCL request: more requests in flight)");
    cudaEvent_t e = s.free_events.back();
    impl::cuda_check(cudaEventRecord(e, stream()), "cudaEventRecord (gradsync NCCL request)");
    s.free_events.pop_back();
    return Request{e};
  }

  void sync() const {
    impl::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (after an NCCL collective)");
    check_async();
  }

  void check_async() const {
    ncclResult_t async = ncclSuccess;
    impl::nccl_check(ncclCommGetAsyncError(live_comm(), &async), "ncclCommGetAsyncError");
    impl::nccl_check(async, "an NCCL collective (asynchronous error)", nccl_comm());
  }

  std::shared_ptr<State> state_;
};

}  // namespace gradsync
