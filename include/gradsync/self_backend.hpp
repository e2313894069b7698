// gradsync: the single-process backend. Every collective over one rank is the identity.
#pragma once

#include <algorithm>
#include <cstddef>

#include "error.hpp"

namespace gradsync {

class SelfBackend {
 public:
  /// Nonblocking operations complete at once; the request is empty.
  struct Request {};

  static constexpr const char* name() { return "self"; }
  static constexpr bool sums_wire_values = true;  ///< 16-bit wire values too (the identity)
  int rank() const { return 0; }
  int size() const { return 1; }

  /// Every memory space is reachable: nothing is ever moved.
  template <class MemorySpace>
  bool can_access() const {
    return true;
  }

  template <class T>
  void allreduce_sum(T*, std::size_t) const {}
  template <class T>
  Request iallreduce_sum(T*, std::size_t) const {
    return {};
  }
  void wait(Request&) const {}
  bool test(Request&) const { return true; }

  template <class T>
  void allreduce_min(T*, std::size_t) const {}
  template <class T>
  void allreduce_max(T*, std::size_t) const {}
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
  void barrier() const {}
  /// The one rank's process set is itself.
  SelfBackend split(int, int) const { return *this; }

 private:
  static void check_root(int root) {
    if (root != 0) throw Error(impl::cat("broadcast root ", root, " is not a rank of a 1-rank backend"));
  }
};

}  // namespace gradsync
