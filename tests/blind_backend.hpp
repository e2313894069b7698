// A backend that reaches no memory space: MpiBackend whose can_access() is false, so that every
// exchange goes through gradsync's host staging, the path of device memory with an MPI that is not
// CUDA-aware, testable without a GPU.
#pragma once

#include <gradsync/mpi_backend.hpp>

namespace gradsync_test {

struct BlindBackend : gradsync::MpiBackend {
  using MpiBackend::MpiBackend;
  static constexpr const char* name() { return "blind"; }
  template <class MemorySpace>
  bool can_access() const {
    return false;
  }
};

}  // namespace gradsync_test
