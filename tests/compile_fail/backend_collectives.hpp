// The collectives every backend must provide (backend.hpp), for the compile-fail programs' backends:
// each derives from it and adds, or leaves out, the members its error is about.
#pragma once

#include <cstddef>

struct BackendCollectives {
  struct Request {};
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
  bool test(Request&) const { return true; }
  void wait(Request&) const {}
  template <class T>
  void allreduce_min(T*, std::size_t) const {}
  template <class T>
  void allgather(const T*, T*, std::size_t) const {}
};
