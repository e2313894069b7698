// gradsync: the backend concept, the one reference for writing a backend.
//
// A backend is the class B of GradientSync<B, Tensor>: the collectives over one communicator of
// ranks (MpiBackend, NcclBackend, SelfBackend). GradientSync holds it by value and calls it from
// one thread. "Collective": every rank of the communicator calls it, in the same order, with the
// same n; "local": no other rank takes part. Buffers hold n contiguous values, summed in place.
//
// MUST provide (GradientSync names the first one missing in a static_assert, check_backend below):
//
//   struct Request;  (or an alias)
//       A nonblocking collective in flight. Default-constructible and movable (move-only is best: a
//       copy could be waited after its collective was freed): the sync keeps one per chunk and
//       never copies one. A default-constructed or moved-from Request is complete.
//   static const char* name();
//       Local. The backend's name in messages and in describe().
//   int rank() const;
//   int size() const;
//       Local. This rank, in [0, size()), and the communicator's number of ranks (>= 1).
//   template <class MemorySpace> bool can_access() const;
//       Local. Whether the collectives may be handed pointers into MemorySpace (a Kokkos memory
//       space); where not, the sync stages the values through host memory. The same on every rank.
//   template <class T> void allreduce_sum(T* buf, std::size_t n) const;
//       Collective, blocking: buf[0, n) = the sum over the ranks. T: float and double (the global
//       norm sums a double whatever the gradients hold), WireFp16 and WireBf16 where the backend
//       declares Capability::wire_sums (below).
//   template <class T> Request iallreduce_sum(T* buf, std::size_t n) const;
//       Collective, nonblocking: starts the same sum; the caller touches buf only once the Request
//       is complete. n fits an int (the sync's chunks never exceed INT_MAX values). T: as
//       allreduce_sum.
//   bool test(Request& r) const;
//       Local, nonblocking: whether r's collective is complete (true again on a complete Request).
//       The sync polls with it while it packs and unpacks other chunks: it is where the backend
//       advances collectives that need the caller to progress them.
//   void wait(Request& r) const;
//       Local, blocking: returns once r is complete (at once on a complete Request).
//   template <class T> void allreduce_min(T* buf, std::size_t n) const;
//       Collective, blocking: the element-wise minimum over the ranks. T: std::int64_t, host memory
//       (the ranks' agreement on options and registrations, where the backend has no comm()).
//   template <class T> void allgather(const T* send, T* recv, std::size_t n) const;
//       Collective, blocking: recv holds size() * n values, rank r's n values at recv + r * n.
//       T: unsigned char and std::int64_t in host memory (agreement, process sets, row-sparse
//       counts), the gradients' value type where can_access (row-sparse values).
//   The backend itself is move-constructible: GradientSync takes it by value.
//
// MAY provide, each declared in the backend's `capabilities` (the Capability in brackets; each entry
// says what the sync does without it). The sync uses exactly what is declared: a declared capability
// whose member is missing or mistyped, and an optional member present but undeclared, are each a
// static_assert naming it (check_capabilities below). A class derived from a backend inherits its
// declaration and extends it with `Base::capabilities::with<Capability::...>`:
//
//   using capabilities = gradsync::Capabilities<gradsync::Capability::split, gradsync::Capability::abort>;
//
//   template <class T> void broadcast(T* buf, std::size_t n, int root) const;
//       Collective, blocking: every rank's buf = root's. Not detected: DistributedOptimizer's
//       broadcast_parameters() and broadcast_set_parameter() call it, GradientSync never does.
//   B split(int color, int key) const;  [Capability::split]
//       Collective over this backend's ranks, blocking: a backend over the ranks that give the same
//       color, ordered by key (MPI_Comm_split). Without it: no process sets (bind_process_set is a
//       static_assert). It may return another backend type (a class derived from MpiBackend).
//   std::size_t max_count() const;  [Capability::max_count]
//       Local: the most elements one call takes; the process sets' sums are split into pieces of
//       this many. Without it: INT_MAX, the count type of MPI and NCCL.
//   MPI_Comm comm() const;  [Capability::comm, checked in impl/mpi_traits.hpp: this header needs no MPI]
//       Local: the backend's MPI communicator. With it the sync duplicates it into a side channel
//       (impl/stall.hpp): the stall report names the missing ranks, a rank that fails tells its
//       peers, and the ranks agree before every exchange. Without it the agreement runs through
//       allreduce_min and allgather on the first call only, and waits have no listening.
//   bool ordered_on(const ExecutionSpace& exec) const;  [Capability::ordered_on]
//       Local: true when the collectives are enqueued on exec's own stream, after the work already
//       there: the sync hands a packed chunk over without fencing. Without it: false.
//   template <class T> Request ibroadcast(T* buf, std::size_t n, int root) const;  [Capability::ibroadcast]
//   template <class T> Request iallreduce_min(T* buf, std::size_t n) const;  [Capability::iallreduce_min]
//   template <class T> Request iallgather(const T* send, T* recv, std::size_t n) const;  [Capability::iallgather]
//       Collective, nonblocking forms of broadcast, allreduce_min and allgather (n fits an int):
//       the helpers (impl/watched.hpp) wait for them under the stall watchdog. Without them the
//       helpers call the blocking forms.
//   const Topology& topology() const;  [Capability::topology]
//       Local: which ranks share a node (topology.hpp), the same on every rank; it picks the plan.
//       Without it: one node.
//   template <class T> void hierarchical_allreduce_sum(T* buf, std::size_t n) const;  [Capability::hierarchical_sum]
//       Collective, blocking: allreduce_sum's sum in stages over the nodes (Algorithm::hierarchical).
//       Without it: Algorithm::hierarchical is a ConfigError, automatic never picks it.
//   template <class T> Request ihierarchical_allreduce_sum(T* buf, std::size_t n) const;
//       [Capability::nonblocking_hierarchical_sum] Collective, nonblocking form of it. Without it: a
//       hierarchical plan blocks.
//   bool folds_factor(std::size_t bytes) const;  [Capability::folds_factor]
//   template <class T> Request iallreduce_sum(T* buf, std::size_t n, T factor) const;
//       Local: whether a nonblocking sum of `bytes` can multiply by a factor inside the reduction;
//       if so the sync calls the second, collective and nonblocking: buf = factor * sum. Without
//       them: never, the sync scales in its own kernels.
//   bool sums_regions(std::size_t bytes) const;  [Capability::region_sums]
//   template <class T> Request iallreduce_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor) const;
//       Local, then collective and nonblocking: whether a sum of `bytes` in all can run over several
//       regions as one buffer (their concatenation), and that sum: each region = factor * its sum
//       over ranks; every rank passes regions of the same sizes. The sync then sums consecutive
//       chunks (large tensors in place, a packed slot) as one collective. Without them: one
//       collective per chunk.
//   template <class T> Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k,
//                                                         T factor[, T pre]) const;  [Capability::shard_sums]
//   template <class T> Request iallgather_regions(const SumRegion<T>* regions, std::size_t k) const;
//       Collective, nonblocking, the two halves of a sharded step (Options::shard) over k regions
//       taken as one buffer of n values: the first leaves factor * (sum over ranks of [pre *] values,
//       pre each rank's own, every rank calling the same form) in this rank's slice only (shard_slice(n, size, rank),
//       below; the rest is unspecified), the second sends each rank's slice to every rank. Every rank passes regions of
//       the same sizes. Without them: Options::shard is a ConfigError.
//   template <class T> Request iallreduce_sum(T* buf, std::size_t n, T factor, T pre) const;
//       [Capability::weighted_fold] Collective, nonblocking, where folds_factor(bytes): buf = factor * sum
//       over ranks of (pre * buf), each rank's own pre (set_samples' weights). Without it: a
//       weighted sync scales such chunks in a pass of its own before the sum.
//   bool cuda_aware() const;  [Capability::cuda_aware]
//       Local: whether device memory goes to the collectives, decided at run time; the ranks check
//       that they agree, since it changes the collectives. Without it: nothing to agree on.
//   bool prefers_blocking_allreduce() const;  [Capability::blocking_preference]
//       Local: whether a chunk's blocking sum beats a nonblocking one, for Collectives::automatic.
//       Without it: the trait gradsync::prefers_blocking_allreduce<B> (below), false unless
//       specialized.
//   allreduce_sum and iallreduce_sum of WireFp16 / WireBf16  [Capability::wire_sums]
//       The sums take WireFp16 / WireBf16 arrays (compression.hpp), added in at least fp32. Without
//       it: a compressed sync is a ConfigError.
//   template <class MemorySpace> bool can_reduce_wire() const;  [Capability::can_reduce_wire]
//       Local: where 16-bit wire values can be summed. Without it: wherever can_access.
//   bool sums_wire_in_place(std::size_t wire_bytes) const;  [Capability::wire_ring]
//   template <class W, class T>
//   Request iallreduce_wire_in_place(T* buf, std::size_t n, T pre, T post, T* residual) const;
//       Local, then collective and nonblocking: compressed sums in place, converting as they go
//       (impl/wire_ring.hpp); the Request has `std::int64_t non_finite`. Without them: the sync
//       packs a 16-bit copy and sums it.
//   template <class W, class T>
//   Request ireduce_scatter_wire_in_place(T* buf, std::size_t n, T pre, T post, T* residual) const;
//       [Capability::wire_shard] Collective, nonblocking: the reduce-scatter half of the above (a
//       sharded step with compression): this rank's slice (shard_slice) ends holding post * its sum,
//       the rest is unspecified; `non_finite` covers that slice. Without it: Options::shard with
//       compression is a ConfigError.
//   template <class MemorySpace> static constexpr bool reads_memory_space = ...;  [Capability::reads_memory_space]
//       Compile time: whether the backend can read MemorySpace at all, whatever the run time
//       (NcclBackend: device memory only); GradientSync over a space it cannot is a static_assert.
//       Without it: every space, decided at run time by can_access.
//   void abort() const noexcept;  [Capability::abort]
//       Local, on the failure path: abandons the collectives in flight (NcclBackend:
//       ncclCommAbort); the backend and its copies are unusable afterwards. Without it: requests in
//       flight are kept alive until they complete.
//   MPI_Comm notice_comm() const;  [Capability::notice_comm, checked in impl/mpi_traits.hpp]
//       Local: the process group's notice communicator (impl/notice_comm.hpp), where a sync that
//       ends tells its peers. Without it: they learn at the deadline.
//   void retire(std::string why) const noexcept; std::string retired() const;  [Capability::retire]
//       Local: a failed sync marks its backend, whose communicator may hold pending collectives;
//       every copy then refuses a new GradientSync (backend_traits.hpp). Without it: nothing marks.
//
// tests/test_backend_concept.cpp is a backend written from this list alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "compression.hpp"
#include "topology.hpp"

namespace gradsync {

/// True when a backend's blocking allreduce of a chunk beats its nonblocking one in the sync's
/// pipeline; Options::tuning.collectives = automatic follows it. False by default: nonblocking chunks
/// overlap packing, unpacking and (with mark_ready) backward. A backend may instead answer at run
/// time with a member `bool prefers_blocking_allreduce() const`, which wins over this trait:
/// MpiBackend does (blocking only where its nonblocking sums would go to Open MPI's libnbc, whose
/// reduce-then-broadcast schedule is slower for fewer than 4 ranks).
template <class Backend>
struct prefers_blocking_allreduce : std::false_type {};

/// prefers_blocking_allreduce<Backend>::value.
template <class Backend>
inline constexpr bool prefers_blocking_allreduce_v = prefers_blocking_allreduce<Backend>::value;

/// The optional members a backend may offer (the "MAY provide" list above). A backend declares
/// the ones it offers, `using capabilities = gradsync::Capabilities<Capability::split, ...>;`, and
/// the sync uses exactly those: a declared capability whose member is missing or mistyped, or a
/// member present but undeclared, is a static_assert, never a feature silently turned off.
enum class Capability {
  split,                         ///< B split(int color, int key) const
  max_count,                     ///< std::size_t max_count() const
  comm,                          ///< MPI_Comm comm() const (impl/mpi_traits.hpp checks it)
  notice_comm,                   ///< MPI_Comm notice_comm() const (impl/mpi_traits.hpp checks it)
  ordered_on,                    ///< bool ordered_on(const ExecutionSpace&) const
  ibroadcast,                    ///< Request ibroadcast(T*, n, root) const
  iallreduce_min,                ///< Request iallreduce_min(T*, n) const
  iallgather,                    ///< Request iallgather(const T*, T*, n) const
  topology,                      ///< const Topology& topology() const
  hierarchical_sum,              ///< void hierarchical_allreduce_sum(T*, n) const
  nonblocking_hierarchical_sum,  ///< Request ihierarchical_allreduce_sum(T*, n) const
  folds_factor,                  ///< bool folds_factor(bytes) const and iallreduce_sum(T*, n, factor)
  weighted_fold,                 ///< Request iallreduce_sum(T*, n, factor, pre) const
  region_sums,                   ///< sums_regions(bytes) and iallreduce_sum_regions(regions, k, factor)
  shard_sums,                    ///< ireduce_scatter_sum_regions and iallgather_regions (Options::shard)
  cuda_aware,                    ///< bool cuda_aware() const
  blocking_preference,           ///< bool prefers_blocking_allreduce() const
  wire_sums,                     ///< the sums take WireFp16 / WireBf16 (compression.hpp)
  can_reduce_wire,               ///< bool can_reduce_wire\<MemorySpace\>() const
  wire_ring,                     ///< sums_wire_in_place(bytes) and iallreduce_wire_in_place
  wire_shard,                    ///< ireduce_scatter_wire_in_place (Options::shard with compression)
  reads_memory_space,            ///< static constexpr bool reads_memory_space\<MemorySpace\>
  abort,                         ///< void abort() const noexcept
  retire,                        ///< void retire(std::string) const noexcept; std::string retired() const
};

/// One part of a sum over several regions (Capability::region_sums): `count` values at `data`.
template <class T>
struct SumRegion {
  T* data;            ///< the first value
  std::size_t count;  ///< how many
};

/// The slice of n values that rank `rank` of `size` owns in a sharded step (Capability::shard_sums):
/// [rank * n / size, (rank + 1) * n / size), balanced to within one value.
inline std::pair<std::size_t, std::size_t> shard_slice(std::size_t n, int size, int rank) {
  return {std::size_t(rank) * n / std::size_t(size), std::size_t(rank + 1) * n / std::size_t(size)};
}

/// A backend's declared capabilities (see Capability). `with<...>` adds some: a class derived from
/// MpiBackend that adds ordered_on declares `MpiBackend::capabilities::with<Capability::ordered_on>`.
template <Capability... Cs>
struct Capabilities {
  /// Whether `c` is declared.
  static constexpr bool has(Capability c) { return (false || ... || (c == Cs)); }
  /// These capabilities and `More`.
  template <Capability... More>
  using with = Capabilities<Cs..., More...>;
};

/// The capabilities of backend B: its member type `capabilities`, or none. Specialise it for a
/// backend whose class you cannot edit.
template <class B, class = void>
struct backend_capabilities {
  using type = Capabilities<>;  ///< None declared.
};
/// A backend with a member type `capabilities`: that declaration.
template <class B>
struct backend_capabilities<B, std::void_t<typename B::capabilities>> {
  using type = typename B::capabilities;  ///< B's declaration.
};

namespace impl {

// A one-rank sharded reduce-scatter (the slice is everything): regions = factor * (pre * regions),
// on the host. MpiBackend and SelfBackend at one rank.
template <class T>
void scale_regions(const SumRegion<T>* regions, std::size_t k, T factor, T pre) {
  if (factor * pre == T(1)) return;
  for (std::size_t i = 0; i < k; ++i)
    for (std::size_t j = 0; j < regions[i].count; ++j) regions[i].data[j] = factor * (pre * regions[i].data[j]);
}

// ---- What a backend must provide ----

template <class B, class = void>
struct has_request : std::false_type {};
template <class B>
struct has_request<B, std::void_t<typename B::Request>>
    : std::bool_constant<std::is_default_constructible_v<typename B::Request> &&
                         std::is_move_constructible_v<typename B::Request> &&
                         std::is_move_assignable_v<typename B::Request>> {};

template <class B, class = void>
struct has_name : std::false_type {};
template <class B>
struct has_name<B, std::void_t<decltype(B::name())>> : std::is_convertible<decltype(B::name()), std::string> {};

template <class B, class = void>
struct has_rank : std::false_type {};
template <class B>
struct has_rank<B, std::void_t<decltype(std::declval<const B&>().rank())>>
    : std::is_convertible<decltype(std::declval<const B&>().rank()), int> {};

template <class B, class = void>
struct has_size : std::false_type {};
template <class B>
struct has_size<B, std::void_t<decltype(std::declval<const B&>().size())>>
    : std::is_convertible<decltype(std::declval<const B&>().size()), int> {};

template <class B, class M, class = void>
struct has_can_access : std::false_type {};
template <class B, class M>
struct has_can_access<B, M, std::void_t<decltype(bool(std::declval<const B&>().template can_access<M>()))>>
    : std::true_type {};

template <class B, class T, class = void>
struct has_allreduce_sum : std::false_type {};
template <class B, class T>
struct has_allreduce_sum<B, T,
                         std::void_t<decltype(std::declval<const B&>().allreduce_sum((T*)nullptr, std::size_t()))>>
    : std::true_type {};

// The Request it returns, so a backend without Request fails here too, not with a hard error.
template <class B, class T, class = void>
struct has_iallreduce_sum : std::false_type {};
template <class B, class T>
struct has_iallreduce_sum<
    B, T,
    std::void_t<typename B::Request, decltype(std::declval<const B&>().iallreduce_sum((T*)nullptr, std::size_t()))>>
    : std::is_convertible<decltype(std::declval<const B&>().iallreduce_sum((T*)nullptr, std::size_t())),
                          typename B::Request> {};

template <class B, class = void>
struct has_test : std::false_type {};
template <class B>
struct has_test<B, std::void_t<decltype(bool(std::declval<const B&>().test(std::declval<typename B::Request&>())))>>
    : std::true_type {};

template <class B, class = void>
struct has_wait : std::false_type {};
template <class B>
struct has_wait<B, std::void_t<decltype(std::declval<const B&>().wait(std::declval<typename B::Request&>()))>>
    : std::true_type {};

template <class B, class T, class = void>
struct has_allreduce_min : std::false_type {};
template <class B, class T>
struct has_allreduce_min<B, T,
                         std::void_t<decltype(std::declval<const B&>().allreduce_min((T*)nullptr, std::size_t()))>>
    : std::true_type {};

template <class B, class T, class = void>
struct has_allgather : std::false_type {};
template <class B, class T>
struct has_allgather<
    B, T, std::void_t<decltype(std::declval<const B&>().allgather((const T*)nullptr, (T*)nullptr, std::size_t()))>>
    : std::true_type {};

/// Whether B provides every member a GradientSync<B, Tensor> of value type V in MemorySpace calls.
template <class B, class V, class MemorySpace>
inline constexpr bool is_backend_v =
    std::conjunction_v<has_request<B>, has_name<B>, has_rank<B>, has_size<B>, has_can_access<B, MemorySpace>,
                       has_allreduce_sum<B, V>, has_allreduce_sum<B, double>, has_iallreduce_sum<B, V>,
                       has_iallreduce_sum<B, double>, has_test<B>, has_wait<B>, has_allreduce_min<B, std::int64_t>,
                       has_allgather<B, unsigned char>, has_allgather<B, std::int64_t>, has_allgather<B, V>,
                       std::is_move_constructible<B>>;

/// One static_assert per required member, in the order of the list above, so that the first one
/// missing is named (GradientSync calls it next to its own static_asserts). True, or no compile.
template <class B, class V, class MemorySpace>
constexpr bool check_backend() {
  static_assert(has_request<B>::value,
                "gradsync: the Backend lacks `struct Request` (default-constructible, movable) (see "
                "include/gradsync/backend.hpp)");
  static_assert(has_name<B>::value,
                "gradsync: the Backend lacks `static const char* name()` (see include/gradsync/backend.hpp)");
  static_assert(has_rank<B>::value,
                "gradsync: the Backend lacks `int rank() const` (see include/gradsync/backend.hpp)");
  static_assert(has_size<B>::value,
                "gradsync: the Backend lacks `int size() const` (see include/gradsync/backend.hpp)");
  static_assert(has_can_access<B, MemorySpace>::value,
                "gradsync: the Backend lacks `template <class MemorySpace> bool can_access() const` (see "
                "include/gradsync/backend.hpp)");
  static_assert(has_allreduce_sum<B, V>::value && has_allreduce_sum<B, double>::value,
                "gradsync: the Backend lacks `template <class T> void allreduce_sum(T* buf, std::size_t n) const` "
                "(see include/gradsync/backend.hpp)");
  static_assert(has_iallreduce_sum<B, V>::value && has_iallreduce_sum<B, double>::value,
                "gradsync: the Backend lacks `template <class T> Request iallreduce_sum(T* buf, std::size_t n) const` "
                "(see include/gradsync/backend.hpp)");
  static_assert(has_test<B>::value,
                "gradsync: the Backend lacks `bool test(Request& r) const` (see include/gradsync/backend.hpp)");
  static_assert(has_wait<B>::value,
                "gradsync: the Backend lacks `void wait(Request& r) const` (see include/gradsync/backend.hpp)");
  static_assert(has_allreduce_min<B, std::int64_t>::value,
                "gradsync: the Backend lacks `template <class T> void allreduce_min(T* buf, std::size_t n) const` "
                "(see include/gradsync/backend.hpp)");
  static_assert(
      has_allgather<B, unsigned char>::value && has_allgather<B, std::int64_t>::value && has_allgather<B, V>::value,
      "gradsync: the Backend lacks `template <class T> void allgather(const T* send, T* recv, std::size_t n) "
      "const` (see include/gradsync/backend.hpp)");
  static_assert(std::is_move_constructible_v<B>,
                "gradsync: the Backend is not move-constructible (see include/gradsync/backend.hpp)");
  return true;
}

// ---- What a backend may provide: detected, to check what it declares ----

template <class B, class = void>
struct detects_split : std::false_type {};
template <class B>
struct detects_split<B, std::void_t<decltype(std::declval<const B&>().split(0, 0))>> : std::true_type {};

// The backend of a process set: what split() returns (a class derived from MpiBackend splits into
// a plain MpiBackend).
template <class B, class = void>
struct split_result {
  using type = B;
};
template <class B>
struct split_result<B, std::void_t<decltype(std::declval<const B&>().split(0, 0))>> {
  using type = decltype(std::declval<const B&>().split(0, 0));
};

template <class B, class = void>
struct detects_max_count : std::false_type {};
template <class B>
struct detects_max_count<B, std::void_t<decltype(std::size_t(std::declval<const B&>().max_count()))>> : std::true_type {
};

template <class Backend, class ExecutionSpace, class = void>
struct detects_ordered_on : std::false_type {};
template <class Backend, class ExecutionSpace>
struct detects_ordered_on<
    Backend, ExecutionSpace,
    std::void_t<decltype(bool(std::declval<const Backend&>().ordered_on(std::declval<const ExecutionSpace&>())))>>
    : std::true_type {};

template <class B, class = void>
struct detects_ibroadcast : std::false_type {};
template <class B>
struct detects_ibroadcast<
    B, std::void_t<decltype(std::declval<const B&>().ibroadcast((double*)nullptr, std::size_t(), 0))>>
    : std::true_type {};
template <class B, class = void>
struct detects_iallreduce_min : std::false_type {};
template <class B>
struct detects_iallreduce_min<
    B, std::void_t<decltype(std::declval<const B&>().iallreduce_min((std::int64_t*)nullptr, std::size_t()))>>
    : std::true_type {};
template <class B, class = void>
struct detects_iallgather : std::false_type {};
template <class B>
struct detects_iallgather<B, std::void_t<decltype(std::declval<const B&>().iallgather(
                                 (const double*)nullptr, (double*)nullptr, std::size_t()))>> : std::true_type {};

template <class B, class = void>
struct detects_topology : std::false_type {};
template <class B>
struct detects_topology<
    B, std::enable_if_t<std::is_same_v<std::decay_t<decltype(std::declval<const B&>().topology())>, Topology>>>
    : std::true_type {};
template <class B, class = void>
struct detects_hierarchical_sum : std::false_type {};
template <class B>
struct detects_hierarchical_sum<B, std::void_t<decltype(std::declval<const B&>().hierarchical_allreduce_sum(
                                       static_cast<float*>(nullptr), std::size_t()))>> : std::true_type {};
template <class B, class = void>
struct detects_nonblocking_hierarchical_sum : std::false_type {};
template <class B>
struct detects_nonblocking_hierarchical_sum<B,
                                            std::void_t<decltype(std::declval<const B&>().ihierarchical_allreduce_sum(
                                                static_cast<float*>(nullptr), std::size_t()))>> : std::true_type {};

template <class B, class = void>
struct detects_folds_factor : std::false_type {};
template <class B>
struct detects_folds_factor<B, std::void_t<decltype(std::declval<const B&>().folds_factor(std::size_t()))>>
    : std::true_type {};

template <class B, class = void>
struct detects_weighted_fold : std::false_type {};
template <class B>
struct detects_weighted_fold<B, std::void_t<decltype(std::declval<const B&>().iallreduce_sum(
                                    static_cast<float*>(nullptr), std::size_t(), 1.0f, 1.0f))>> : std::true_type {};

template <class B, class = void>
struct detects_region_sums : std::false_type {};
template <class B>
struct detects_region_sums<B, std::void_t<decltype(bool(std::declval<const B&>().sums_regions(std::size_t()))),
                                          decltype(std::declval<const B&>().iallreduce_sum_regions(
                                              static_cast<const SumRegion<float>*>(nullptr), std::size_t(), 1.0f))>>
    : std::true_type {};

template <class B, class = void>
struct detects_shard_sums : std::false_type {};
template <class B>
struct detects_shard_sums<B, std::void_t<decltype(std::declval<const B&>().ireduce_scatter_sum_regions(
                                             static_cast<const SumRegion<float>*>(nullptr), std::size_t(), 1.0f, 1.0f)),
                                         decltype(std::declval<const B&>().iallgather_regions(
                                             static_cast<const SumRegion<float>*>(nullptr), std::size_t()))>>
    : std::true_type {};

template <class B, class = void>
struct detects_cuda_aware : std::false_type {};
template <class B>
struct detects_cuda_aware<B, std::void_t<decltype(bool(std::declval<const B&>().cuda_aware()))>> : std::true_type {};

template <class B, class = void>
struct detects_blocking_preference : std::false_type {};
template <class B>
struct detects_blocking_preference<B,
                                   std::void_t<decltype(bool(std::declval<const B&>().prefers_blocking_allreduce()))>>
    : std::true_type {};

template <class B, class = void>
struct detects_sums_wire : std::false_type {};
template <class B>
struct detects_sums_wire<
    B, std::void_t<decltype(std::declval<const B&>().allreduce_sum((WireBf16*)nullptr, std::size_t())),
                   decltype(std::declval<const B&>().iallreduce_sum((WireFp16*)nullptr, std::size_t()))>>
    : std::true_type {};

template <class B, class M, class = void>
struct detects_can_reduce_wire : std::false_type {};
template <class B, class M>
struct detects_can_reduce_wire<B, M,
                               std::void_t<decltype(bool(std::declval<const B&>().template can_reduce_wire<M>()))>>
    : std::true_type {};

template <class B, class = void>
struct detects_wire_ring : std::false_type {};
template <class B>
struct detects_wire_ring<B, std::void_t<decltype(bool(std::declval<const B&>().sums_wire_in_place(std::size_t())))>>
    : std::true_type {};

template <class B, class M, class = void>
struct detects_reads_memory_space : std::false_type {};
template <class B, class M>
struct detects_reads_memory_space<B, M, std::void_t<decltype(bool(B::template reads_memory_space<M>))>>
    : std::true_type {};

template <class B, class = void>
struct detects_abort : std::false_type {};
template <class B>
struct detects_abort<B, std::void_t<decltype(std::declval<const B&>().abort())>> : std::true_type {};

// ---- What a backend declares (Capabilities): the traits the sync asks ----

template <class B>
constexpr bool declares(Capability c) {
  return backend_capabilities<B>::type::has(c);
}
template <class B>
struct has_split : std::bool_constant<declares<B>(Capability::split)> {};
template <class B>
struct has_max_count : std::bool_constant<declares<B>(Capability::max_count)> {};
template <class B, class ExecutionSpace>
struct has_ordered_on : std::bool_constant<declares<B>(Capability::ordered_on)> {};
template <class B>
struct has_ibroadcast : std::bool_constant<declares<B>(Capability::ibroadcast)> {};
template <class B>
struct has_iallreduce_min : std::bool_constant<declares<B>(Capability::iallreduce_min)> {};
template <class B>
struct has_iallgather : std::bool_constant<declares<B>(Capability::iallgather)> {};
template <class B>
struct has_topology : std::bool_constant<declares<B>(Capability::topology)> {};
template <class B>
struct has_hierarchical_sum : std::bool_constant<declares<B>(Capability::hierarchical_sum)> {};
template <class B>
struct has_nonblocking_hierarchical_sum : std::bool_constant<declares<B>(Capability::nonblocking_hierarchical_sum)> {};
template <class B>
struct has_folds_factor : std::bool_constant<declares<B>(Capability::folds_factor)> {};
template <class B>
struct has_weighted_fold : std::bool_constant<declares<B>(Capability::weighted_fold)> {};
template <class B, class = void>
struct detects_wire_shard : std::false_type {};
template <class B>
struct detects_wire_shard<
    B, std::void_t<decltype(std::declval<const B&>().template ireduce_scatter_wire_in_place<WireBf16>(
           static_cast<float*>(nullptr), std::size_t(), 1.0f, 1.0f, static_cast<float*>(nullptr)))>> : std::true_type {
};

template <class B>
struct has_region_sums : std::bool_constant<declares<B>(Capability::region_sums)> {};
template <class B>
struct has_shard_sums : std::bool_constant<declares<B>(Capability::shard_sums)> {};
template <class B>
struct has_cuda_aware : std::bool_constant<declares<B>(Capability::cuda_aware)> {};
template <class B>
struct has_blocking_preference : std::bool_constant<declares<B>(Capability::blocking_preference)> {};
template <class B>
struct sums_wire : std::bool_constant<declares<B>(Capability::wire_sums)> {};
template <class B, class M>
struct has_can_reduce_wire : std::bool_constant<declares<B>(Capability::can_reduce_wire)> {};
template <class B>
struct has_wire_ring : std::bool_constant<declares<B>(Capability::wire_ring)> {};
template <class B>
struct has_wire_shard : std::bool_constant<declares<B>(Capability::wire_shard)> {};
template <class B>
struct has_abort : std::bool_constant<declares<B>(Capability::abort)> {};
// Undeclared: every memory space (decided at run time by can_access).
template <class B, class M, class = void>
struct reads_memory_space : std::true_type {};
template <class B, class M>
struct reads_memory_space<B, M, std::enable_if_t<declares<B>(Capability::reads_memory_space)>>
    : std::bool_constant<B::template reads_memory_space<M>> {};

// Declared and present must agree, both ways: a declared capability whose member is missing or
// mistyped would fail deep inside the sync (or, were it detected, silently turn the feature off); a
// member present but undeclared is a capability the backend's author meant to offer.
#define GRADSYNC_CHECK_DECLARED(cap, present, member)                                    \
  static_assert(!declares<B>(Capability::cap) || (present),                              \
                "gradsync: the Backend declares Capability::" #cap " but lacks `" member \
                "`, or its signature differs (see include/gradsync/backend.hpp)")
#define GRADSYNC_CHECK_CAPABILITY(cap, present, member)                                         \
  GRADSYNC_CHECK_DECLARED(cap, present, member);                                                \
  static_assert(declares<B>(Capability::cap) || !(present),                                     \
                "gradsync: the Backend has `" member "` but does not declare Capability::" #cap \
                " in its `capabilities` (see include/gradsync/backend.hpp)")

/// One check per optional member, for a GradientSync<B, Tensor> of value type V in MemorySpace run
/// on ExecutionSpace (GradientSync calls it next to check_backend). True, or no compile.
template <class B, class V, class MemorySpace, class ExecutionSpace>
constexpr bool check_capabilities() {
  GRADSYNC_CHECK_CAPABILITY(split, detects_split<B>::value, "B split(int color, int key) const");
  GRADSYNC_CHECK_CAPABILITY(max_count, detects_max_count<B>::value, "std::size_t max_count() const");
  GRADSYNC_CHECK_CAPABILITY(ordered_on, (detects_ordered_on<B, ExecutionSpace>::value),
                            "bool ordered_on(const ExecutionSpace&) const");
  GRADSYNC_CHECK_CAPABILITY(ibroadcast, detects_ibroadcast<B>::value, "Request ibroadcast(T*, std::size_t, int) const");
  GRADSYNC_CHECK_CAPABILITY(iallreduce_min, detects_iallreduce_min<B>::value,
                            "Request iallreduce_min(T*, std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(iallgather, detects_iallgather<B>::value,
                            "Request iallgather(const T*, T*, std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(topology, detects_topology<B>::value, "const Topology& topology() const");
  GRADSYNC_CHECK_CAPABILITY(hierarchical_sum, detects_hierarchical_sum<B>::value,
                            "void hierarchical_allreduce_sum(T*, std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(nonblocking_hierarchical_sum, detects_nonblocking_hierarchical_sum<B>::value,
                            "Request ihierarchical_allreduce_sum(T*, std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(folds_factor, detects_folds_factor<B>::value, "bool folds_factor(std::size_t) const");
  // Overloads and instantiations of required members: a generic template (T anything) matches them
  // without meaning to offer them, so only the declared direction is checked.
  GRADSYNC_CHECK_DECLARED(weighted_fold, detects_weighted_fold<B>::value,
                          "Request iallreduce_sum(T*, std::size_t, T factor, T pre) const");
  GRADSYNC_CHECK_CAPABILITY(region_sums, detects_region_sums<B>::value,
                            "bool sums_regions(std::size_t) const and "
                            "Request iallreduce_sum_regions(const SumRegion<T>*, std::size_t, T) const");
  GRADSYNC_CHECK_CAPABILITY(shard_sums, detects_shard_sums<B>::value,
                            "Request ireduce_scatter_sum_regions(const SumRegion<T>*, std::size_t, T, T) const and "
                            "Request iallgather_regions(const SumRegion<T>*, std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(cuda_aware, detects_cuda_aware<B>::value, "bool cuda_aware() const");
  GRADSYNC_CHECK_CAPABILITY(blocking_preference, detects_blocking_preference<B>::value,
                            "bool prefers_blocking_allreduce() const");
  GRADSYNC_CHECK_DECLARED(wire_sums, detects_sums_wire<B>::value,
                          "allreduce_sum and iallreduce_sum of WireBf16 / WireFp16");
  GRADSYNC_CHECK_CAPABILITY(can_reduce_wire, (detects_can_reduce_wire<B, MemorySpace>::value),
                            "template <class MemorySpace> bool can_reduce_wire() const");
  GRADSYNC_CHECK_CAPABILITY(wire_ring, detects_wire_ring<B>::value, "bool sums_wire_in_place(std::size_t) const");
  GRADSYNC_CHECK_CAPABILITY(
      wire_shard, detects_wire_shard<B>::value,
      "template <class W, class T> Request ireduce_scatter_wire_in_place(T*, std::size_t, T, T, T*) "
      "const");
  GRADSYNC_CHECK_CAPABILITY(reads_memory_space, (detects_reads_memory_space<B, MemorySpace>::value),
                            "template <class MemorySpace> static constexpr bool reads_memory_space");
  GRADSYNC_CHECK_CAPABILITY(abort, detects_abort<B>::value, "void abort() const noexcept");
  return true;
}

}  // namespace impl
}  // namespace gradsync
