// gradsync internals: impl::Watched, a backend's collectives as gradsync's helpers use them (global
// norm, broadcast of parameters, row-sparse exchange, process-set setup), each waited under the stall
// watchdog.
//
// It has the blocking interface the helpers are written against (allreduce_sum, broadcast,
// allgather), but starts the backend's nonblocking form where it has one (MpiBackend) and waits for
// it with impl::wait_for: a rank that skips the helper is named by its peers at the deadline, and a
// peer's failure notice ends the wait at once, whatever stall_timeout says. A backend without a
// nonblocking form blocks as before. Counts above the MPI limit are split, as the exchange splits them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../backend.hpp"
#include "../options.hpp"
#include "control_fwd.hpp"  // impl/stall.hpp defines Control: include it where Watched is used
#include "pieces.hpp"
#include "test_hooks.hpp"
#include "wait_site.hpp"

namespace gradsync::impl {

template <class Backend>
class Watched {
 public:
  // `what` names the helper in the reports ("global norm's allreduce"); `call`: the synchronize()
  // call it follows.
  Watched(const Backend& b, Control<Backend>& ctl, const Options& o, std::int64_t call, const char* what)
      : b_(b), ctl_(ctl), o_(o), call_(call), what_(what) {}

  int rank() const { return b_.rank(); }
  int size() const { return b_.size(); }
  template <class MemorySpace>
  bool can_access() const {
    return b_.template can_access<MemorySpace>();
  }
  const Backend& backend() const { return b_; }
  /// The same watch over another communicator of this backend type (a process set's): its waits
  /// listen to the sync's side channel. A communicator of another type (a backend whose split()
  /// returns another type) keeps its own, blocking collectives.
  template <class Other>
  decltype(auto) over(const Other& other) const {
    if constexpr (std::is_same_v<Other, Backend>)
      return Watched(other, ctl_, o_, call_, what_);
    else
      return (other);
  }
  // Blocking (MPI_Comm_split has no nonblocking form): call it only where every rank is committed.
  auto split(int color, int key) const { return b_.split(color, key); }

  template <class T>
  void allreduce_sum(T* buf, std::size_t n) const {
    for_pieces(n, mpi_max_count(), [&](std::size_t off, std::size_t cnt) {
      auto r = b_.iallreduce_sum(buf + off, cnt);
      wait(r);
    });
  }
  template <class T>
  void broadcast(T* buf, std::size_t n, int root) const {
    if constexpr (has_ibroadcast<Backend>::value) {
      for_pieces(n, mpi_max_count(), [&](std::size_t off, std::size_t cnt) {
        auto r = b_.ibroadcast(buf + off, cnt, root);
        wait(r);
      });
    } else {
      b_.broadcast(buf, n, root);
    }
  }
  template <class T>
  void allreduce_min(T* buf, std::size_t n) const {
    if constexpr (has_iallreduce_min<Backend>::value) {
      for_pieces(n, mpi_max_count(), [&](std::size_t off, std::size_t cnt) {
        auto r = b_.iallreduce_min(buf + off, cnt);
        wait(r);
      });
    } else {
      b_.allreduce_min(buf, n);
    }
  }
  /// recv holds size()*n values: rank r's `n` values at recv + r*n (n must fit one MPI call).
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    if constexpr (has_iallgather<Backend>::value) {
      auto r = b_.iallgather(send, recv, n);
      wait(r);
    } else {
      b_.allgather(send, recv, n);
    }
  }

 private:
  void wait(typename Backend::Request& r) const { wait_for(b_, r, ctl_, o_, WaitSite{what_, call_, -1, 0}); }

  const Backend& b_;
  Control<Backend>& ctl_;
  const Options& o_;
  std::int64_t call_;
  const char* what_;
};

}  // namespace gradsync::impl
