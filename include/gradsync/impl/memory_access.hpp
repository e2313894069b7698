// gradsync internals: who can read memory in a Kokkos memory space: the host, a CUDA device.
//
// Whether a buffer is staged through host memory follows from these two answers and from what the
// backend takes; they are properties of the memory space alone, so they need no MPI (the MPI side,
// whether the library is CUDA-aware, is impl/cuda_aware.hpp).
#pragma once

#include <type_traits>

#include "../config.hpp"

namespace gradsync::impl {

/// Whether host code (an MPI library's own loops) can read memory in MemorySpace. Specialised for
/// gradsync's raw CUDA spaces in cuda_space.hpp.
template <class MemorySpace, class Enable = void>
struct host_accessible : std::bool_constant<Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible> {};
template <class MemorySpace>
inline constexpr bool host_accessible_v = host_accessible<MemorySpace>::value;

/// Whether MemorySpace is memory a CUDA device can address (what NCCL and a CUDA-aware MPI take).
template <class MemorySpace, class Enable = void>
struct is_cuda_memory : std::false_type {};
#if defined(KOKKOS_ENABLE_CUDA)
template <>
struct is_cuda_memory<Kokkos::CudaSpace> : std::true_type {};
template <>
struct is_cuda_memory<Kokkos::CudaUVMSpace> : std::true_type {};
#endif
template <class MemorySpace>
inline constexpr bool is_cuda_memory_v = is_cuda_memory<MemorySpace>::value;

}  // namespace gradsync::impl
