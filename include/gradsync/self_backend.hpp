// gradsync: the single-process backend. Every collective over one rank is the identity.
#pragma once

#include <algorithm>
#include <cstddef>

#include "backend.hpp"
#include "error.hpp"

namespace gradsync {

/// GradientSync's backend for one process: every collective is the identity (or a copy), nothing
/// communicates or allocates. For tests and single-process runs of code written for several ranks.
class SelfBackend {
 public:
  /// Nonblocking operations complete at once; the request is empty.
  struct Request {};

  /// "self", in summaries and messages.
  static constexpr const char* name() { return "self"; }
  /// Splits into itself; sums 16-bit wire values too (the identity); shards a step (one slice: all).
  using capabilities = Capabilities<Capability::split, Capability::wire_sums, Capability::shard_sums>;
  /// Always 0.
  int rank() const { return 0; }
  /// Always 1.
  int size() const { return 1; }

  /// Every memory space is reachable: nothing is ever moved.
  template <class MemorySpace>
  bool can_access() const {
    return true;
  }

  /// The sum over one rank: the values as they are.
  template <class T>
  void allreduce_sum(T*, std::size_t) const {}
  /// The same, complete at once.
  template <class T>
  Request iallreduce_sum(T*, std::size_t) const {
    return {};
  }
  /// Options::shard over one rank: the slice is everything, times `factor` (and `pre`). Host memory
  /// only when a factor is not 1.
  template <class T>
  Request ireduce_scatter_sum_regions(const SumRegion<T>* regions, std::size_t k, T factor, T pre = T(1)) const {
    impl::scale_regions(regions, k, factor, pre);
    return {};
  }
  /// Nothing to gather from other ranks.
  template <class T>
  Request iallgather_regions(const SumRegion<T>*, std::size_t) const {
    return {};
  }
  /// Returns at once.
  void wait(Request&) const {}
  /// Always complete.
  bool test(Request&) const { return true; }

  /// The values as they are.
  template <class T>
  void allreduce_min(T*, std::size_t) const {}
  /// The values as they are.
  template <class T>
  void allreduce_max(T*, std::size_t) const {}
  /// The values as they are; an Error unless root is 0.
  template <class T>
  void broadcast(T*, std::size_t, int root) const {
    check_root(root);
  }
  /// Host memory only: recv[0..n) = send[0..n).
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    std::copy(send, send + n, recv);
  }
  /// Host memory only: each rank sends `n` values to every rank.
  template <class T>
  void alltoall(const T* send, T* recv, std::size_t n) const {
    std::copy(send, send + n, recv);
  }
  /// Host memory only: the one block this rank sends to itself, as MpiBackend::alltoallv.
  template <class T>
  void alltoallv(const T* send, const int* send_counts, const int* send_displs, T* recv, const int* recv_counts,
                 const int* recv_displs) const {
    if (send_counts[0] != recv_counts[0])
      throw Error(
          impl::cat("alltoallv on a 1-rank backend: sends ", send_counts[0], " values but receives ", recv_counts[0]));
    std::copy(send + send_displs[0], send + send_displs[0] + send_counts[0], recv + recv_displs[0]);
  }
  /// Returns at once.
  void barrier() const {}
  /// The one rank's process set is itself.
  SelfBackend split(int, int) const { return *this; }

 private:
  static void check_root(int root) {
    if (root != 0) throw Error(impl::cat("broadcast root ", root, " is not a rank of a 1-rank backend"));
  }
};

}  // namespace gradsync
