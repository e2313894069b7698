// gradsync internals: how GradientSync allocates, fills and copies its buffers, and launches its
// kernels, per memory and execution space.
//
// The defaults are Kokkos Views and Kokkos TeamPolicy launches, which cover every Kokkos backend
// (Serial, OpenMP, CUDA, HIP, ...). cuda_space.hpp specialises them for gradsync's raw CUDA spaces, so
// device memory owned outside Kokkos (a Span) is synchronized even with a Kokkos that has no CUDA
// backend. GradientSync only goes through the functions below, never through Kokkos directly, for
// anything that touches a buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "../config.hpp"
#include "memory_access.hpp"  // host_accessible_v

namespace gradsync::impl {

/// Buffers of X in MemorySpace: allocation, upload from host, and copies ordered on an execution
/// space instance.
template <class MemorySpace, class Enable = void>
struct MemoryOps {
  template <class X>
  using buffer = Kokkos::View<X*, MemorySpace>;

  template <class X>
  static buffer<X> allocate(const std::string& label, std::size_t n) {
    return buffer<X>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
  }

  // dev[0, n) = host[0, n), complete on return. True when a host mirror had to be allocated.
  template <class X>
  static bool upload(const buffer<X>& dev, const X* host, std::size_t n) {
    auto mirror = Kokkos::create_mirror_view(dev);
    std::copy(host, host + n, mirror.data());
    Kokkos::deep_copy(dev, mirror);
    return mirror.data() != dev.data();
  }

  // dst[dpos, dpos + len) = src[spos, spos + len), ordered on `exec` (asynchronous where the
  // backend allows: device <-> pinned host on a CUDA stream; between host Views, complete on return).
  template <class ExecutionSpace, class Dst, class Src>
  static void copy(const ExecutionSpace& exec, const Dst& dst, std::size_t dpos, const Src& src, std::size_t spos,
                   std::size_t len);
};

/// Whether host code reads and writes both Views' memory: copy_now copies them with memcpy.
template <class Dst, class Src>
inline constexpr bool host_to_host_v =
    host_accessible_v<typename Dst::memory_space>&& host_accessible_v<typename Src::memory_space>;

/// dst = src (Views of one extent), complete on return, with `exec`'s work before it. Between host
/// Views a fence and memcpy, nothing when they are one View: Kokkos 4's deep_copy labels its fences
/// and its host copy kernel with std::strings built per call, and runs that kernel from a
/// default-constructed OpenMP instance, heap allocations at every step.
template <class ExecutionSpace, class Dst, class Src>
void copy_now(const ExecutionSpace& exec, const Dst& dst, const Src& src) {
  if constexpr (host_to_host_v<Dst, Src>) {
    fence(exec, label_fence_copy());
    if (static_cast<const void*>(dst.data()) != static_cast<const void*>(src.data()) && dst.span() > 0)
      std::memcpy(dst.data(), src.data(), dst.span() * sizeof(typename Dst::value_type));
  } else {
    Kokkos::deep_copy(exec, dst, src);
    fence(exec, label_fence_copy());
  }
}

template <class MemorySpace, class Enable>
template <class ExecutionSpace, class Dst, class Src>
void MemoryOps<MemorySpace, Enable>::copy(const ExecutionSpace& exec, const Dst& dst, std::size_t dpos, const Src& src,
                                          std::size_t spos, std::size_t len) {
  const auto d = Kokkos::subview(dst, std::make_pair(dpos, dpos + len));
  const auto s = Kokkos::subview(src, std::make_pair(spos, spos + len));
  if constexpr (host_to_host_v<Dst, Src>)
    copy_now(exec, d, s);
  else
    Kokkos::deep_copy(exec, d, s);
}

template <class X, class MemorySpace>
using BufferView = typename MemoryOps<MemorySpace>::template buffer<X>;

// Free-function forms that read the space off the buffer type.
template <class V>
V allocate_buffer(const std::string& label, std::size_t n) {
  return MemoryOps<typename V::memory_space>::template allocate<typename V::non_const_value_type>(label, n);
}
template <class V, class X>
bool upload_buffer(const V& dev, const X* host, std::size_t n) {
  return MemoryOps<typename V::memory_space>::upload(dev, host, n);
}
// dst[0, n) = src[0, n) between raw pointers into two memory spaces; complete on return.
template <class DstSpace, class SrcSpace, class T>
void copy_values(T* dst, const T* src, std::size_t n) {
  using U = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  if (n > 0) Kokkos::deep_copy(Kokkos::View<T*, DstSpace, U>(dst, n), Kokkos::View<const T*, SrcSpace, U>(src, n));
}
template <class ExecutionSpace, class Dst, class Src>
void copy_buffer(const ExecutionSpace& exec, const Dst& dst, std::size_t dpos, const Src& src, std::size_t spos,
                 std::size_t len) {
  MemoryOps<typename Dst::memory_space>::copy(exec, dst, dpos, src, spos, len);
}

/// The team member type the batched kernels are written against. Lazily named, so that a kernel
/// struct can be instantiated for an execution space that launches it another way.
template <class ExecutionSpace, class Enable = void>
struct team_member {
  using type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
};
template <class ExecutionSpace>
using team_member_t = typename team_member<ExecutionSpace>::type;

/// Launches a batched kernel with one team per segment.
template <class ExecutionSpace, class Enable = void>
struct SegmentLaunch {
  template <class Kernel>
  static void run(const std::string& label, const ExecutionSpace& exec, std::int64_t nsegs, const Kernel& k) {
    Kokkos::parallel_for(label, Kokkos::TeamPolicy<ExecutionSpace>(exec, int(nsegs), Kokkos::AUTO), k);
  }
};

}  // namespace gradsync::impl
