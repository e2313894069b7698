// gradsync: raw CUDA memory and streams, for gradients in device memory that Kokkos does not manage
// (a Kokkos without its CUDA backend, or memory from cudaMalloc, PyTorch, cuDNN...).
//
//   gradsync::Span<float, gradsync::CudaDeviceSpace> g(dev_ptr, n);
//   gradsync::GradientSync<gradsync::NcclBackend, decltype(g)> sync(gradsync::NcclBackend(comm, stream), opt,
//                                                                  gradsync::CudaStream(stream));
//
// The fusion buffer is cudaMalloc'd, packed and unpacked by CUDA kernels on the given stream, and
// staged through cudaMallocHost memory when the backend cannot read device memory. Launching those
// kernels needs nvcc: instantiate the sync in a .cu translation unit. The backends (NcclBackend,
// MpiBackend) and these types compile with any host compiler.
// With Kokkos' CUDA backend, prefer Kokkos::View<T*, Kokkos::CudaSpace>: no header beyond gradsync.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"
#include "impl/cuda_aware.hpp"
#include "impl/fusion_kernels.hpp"
#include "impl/fusion_plan.hpp"
#include "impl/memory_ops.hpp"

namespace gradsync {
namespace impl {

inline void cuda_check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  throw Error(cat(what, " failed: ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc)));
}

}  // namespace impl

/// A CUDA stream as gradsync's execution space for raw device memory: kernels and copies are
/// enqueued on it and fence() waits for them. It does not own the stream. The default is the legacy
/// default stream (correct, but it serialises with every blocking stream: pass your own).
class CudaStream {
 public:
  CudaStream() = default;
  /// On stream `s`, which the caller keeps alive as long as this object is used.
  explicit CudaStream(cudaStream_t s) : stream_(s) {}
  /// The stream.
  cudaStream_t stream() const { return stream_; }
  /// Waits for everything enqueued on the stream (cudaStreamSynchronize); an Error on a CUDA error.
  void fence() const { impl::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  /// fence(), in the labelled form gradsync's kernels call.
  void fence(const std::string&) const { fence(); }
  /// "gradsync::CudaStream", in summaries and messages.
  static const char* name() { return "gradsync::CudaStream"; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// Device memory from cudaMalloc (or any pointer a CUDA kernel can dereference and host code cannot).
struct CudaDeviceSpace {
  using memory_space = CudaDeviceSpace;  ///< Itself, as a Kokkos memory space is.
  using execution_space = CudaStream;    ///< Kernels on it run on a CUDA stream.
  /// "gradsync::CudaDeviceSpace", in summaries and messages.
  static const char* name() { return "gradsync::CudaDeviceSpace"; }
};

/// Page-locked host memory from cudaMallocHost: where device chunks are staged for an MPI that is
/// not CUDA-aware (asynchronous copies at full PCIe/NVLink-C2C bandwidth).
struct CudaPinnedHostSpace {
  using memory_space = CudaPinnedHostSpace;  ///< Itself, as a Kokkos memory space is.
  using execution_space = CudaStream;        ///< Copies to and from it run on a CUDA stream.
  /// "gradsync::CudaPinnedHostSpace", in summaries and messages.
  static const char* name() { return "gradsync::CudaPinnedHostSpace"; }
};

namespace impl {

template <>
struct host_accessible<CudaDeviceSpace> : std::false_type {};
template <>
struct host_accessible<CudaPinnedHostSpace> : std::true_type {};
template <>
struct is_cuda_memory<CudaDeviceSpace> : std::true_type {};
template <>
struct staging_space<CudaDeviceSpace> {
  using type = CudaPinnedHostSpace;
};

/// A reference-counted array of X in raw CUDA memory: the part of Kokkos::View's interface that
/// GradientSync uses (data, extent, the space and value typedefs).
template <class X, class Space>
class CudaBuffer {
 public:
  using memory_space = Space;
  using value_type = X;
  using non_const_value_type = std::remove_const_t<X>;

  CudaBuffer() = default;
  CudaBuffer(const std::string& label, std::size_t n) : n_(n) {
    if (n == 0) return;
    void* p = nullptr;
    const std::size_t bytes = n * sizeof(X);
    if constexpr (std::is_same_v<Space, CudaDeviceSpace>) {
      check_alloc(cudaMalloc(&p, bytes), "cudaMalloc", label, bytes);
      ptr_ = std::shared_ptr<X>(static_cast<X*>(p), [](X* q) { cudaFree(q); });
    } else {
      check_alloc(cudaMallocHost(&p, bytes), "cudaMallocHost", label, bytes);
      ptr_ = std::shared_ptr<X>(static_cast<X*>(p), [](X* q) { cudaFreeHost(q); });
    }
  }
  X* data() const { return ptr_.get(); }
  std::size_t extent(int) const { return n_; }
  std::size_t size() const { return n_; }

 private:
  static void check_alloc(cudaError_t rc, const char* what, const std::string& label, std::size_t bytes) {
    if (rc != cudaSuccess)
      throw Error(cat(what, " of ", bytes, " bytes for ", label, " failed: ", cudaGetErrorName(rc), ": ",
                      cudaGetErrorString(rc)));
  }
  std::shared_ptr<X> ptr_;
  std::size_t n_ = 0;
};

template <class Space>
struct CudaMemoryOps {
  template <class X>
  using buffer = CudaBuffer<X, Space>;

  template <class X>
  static buffer<X> allocate(const std::string& label, std::size_t n) {
    return buffer<X>(label, n);
  }

  // Plan time only: a synchronous copy, then a device-wide sync, so that kernels on any stream
  // (including non-blocking ones) see the new tables.
  template <class X>
  static bool upload(const buffer<X>& dev, const X* host, std::size_t n) {
    cuda_check(cudaMemcpy(dev.data(), host, n * sizeof(X), cudaMemcpyDefault), "cudaMemcpy (gradsync plan upload)");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (gradsync plan upload)");
    return false;
  }

  template <class Dst, class Src>
  static void copy(const CudaStream& exec, const Dst& dst, std::size_t dpos, const Src& src, std::size_t spos,
                   std::size_t len) {
    cuda_check(cudaMemcpyAsync(dst.data() + dpos, src.data() + spos, len * sizeof(*dst.data()), cudaMemcpyDefault,
                               exec.stream()),
               "cudaMemcpyAsync (gradsync host staging)");
  }
};

template <>
struct MemoryOps<CudaDeviceSpace> : CudaMemoryOps<CudaDeviceSpace> {};
template <>
struct MemoryOps<CudaPinnedHostSpace> : CudaMemoryOps<CudaPinnedHostSpace> {};

// The batched kernels are launched as plain CUDA kernels below, never through a Kokkos team.
struct NoTeam {};
template <>
struct team_member<CudaStream> {
  using type = NoTeam;
};

#if defined(__CUDACC__)
namespace cuda {

// Pack and unpack: one block per segment of floats (two for doubles), 256 threads, each loading
// bytes_per_thread bytes (four 16-byte vectors) before storing any. Why: the first H200 run had pack
// at 63% of cudaMemcpy and unpack at 84%; their kernels (8 scalar values per thread, 64-bit index
// math per value) took 78 and 64 registers, so 3 and 4 blocks of 256 fit an SM: 24 and 32 KB of
// loads in flight per SM, the same 3:4 ratio. These take 40 registers (6 blocks, 96 KB in flight per
// SM) and move 16-byte vectors (docs/GPU.md, "Pack and unpack kernels: what the SASS says").
inline constexpr unsigned threads_per_block = 256;
inline constexpr int bytes_per_thread = 64;
// The other kernels (local, scale, wire): two blocks per segment, a grid-stride loop each.
inline constexpr int values_per_thread = 8;

// out[j] = f(in[j], out[j] if Acc) for j < n items V (a T or a Vec16<T>), by this block of the
// segment's gridDim.y: every load of a thread is issued before its first store (memory-level
// parallelism), consecutive threads touch consecutive items (coalesced).
template <bool Acc, class V, class F>
__device__ __forceinline__ void move_items(const V* __restrict__ in, V* __restrict__ out, std::int64_t n, const F& f) {
  constexpr int U = (Acc ? bytes_per_thread / 2 : bytes_per_thread) / int(sizeof(V));  // Acc: in and out loaded
  // A compile-time stride: the k-th item's address is the thread's first plus an immediate offset,
  // so the U loads and stores need one address register pair, not U.
  constexpr std::int64_t step = threads_per_block;
  for (std::int64_t j = std::int64_t(blockIdx.y) * step * U + threadIdx.x; j < n;
       j += std::int64_t(gridDim.y) * step * U) {
    const V* const src = in + j;
    V* const dst = out + j;
    const std::int64_t left = n - j;
    V x[U], old[U];
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (k * step < left) x[k] = src[k * step];
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (Acc && k * step < left) old[k] = dst[k * step];
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (k * step < left) dst[k * step] = apply_op(f, x[k], Acc ? old[k] : x[k]);
  }
}

// out[i] = f(in[i], out[i]) for the n values of one segment, in 16-byte vectors where in and out
// allow (vector_split), the scalars before the first vector and after the last by block 0; in
// scalars otherwise (a misaligned subview).
template <bool Acc, class T, class F>
__device__ __forceinline__ void move_segment(const T* in, T* out, std::int64_t n, const F& f) {
  // Segment pointers are read from memory: say they are global, for LDG/STG instead of generic LD/ST.
  __builtin_assume(__isGlobal(in) && __isGlobal(out));
  const VectorSplit sp = vector_split(in, out, n);
  if (sp.vectors < 0) return move_items<Acc>(in, out, n, f);
  if (blockIdx.y == 0 && threadIdx.x < 2 * Vec16<T>::width) {  // fewer than 2 * width scalars
    const std::int64_t t = threadIdx.x, i = t < sp.head ? t : sp.tail + t - sp.head;
    if (i < n) out[i] = f(in[i], Acc ? out[i] : T(0));
  }
  move_items<Acc>(reinterpret_cast<const Vec16<T>*>(in + sp.head), reinterpret_cast<Vec16<T>*>(out + sp.head),
                  sp.vectors, f);
}

// Launched with threads_per_block threads (move_items relies on it).
template <class T, bool Acc>
__global__ void __launch_bounds__(threads_per_block)
    pack(const Segment<T>* segs, T* buf, std::int64_t first_seg, std::int64_t base, T pre) {
  const Segment<T> s = segs[first_seg + blockIdx.x];
  if constexpr (Acc)
    move_segment<true>(s.ptr, buf + (s.off - base), s.count, ScaleAddOp<T>{pre});
  else
    move_segment<false>(s.ptr, buf + (s.off - base), s.count, ScaleOp<T>{pre});
}

template <class T>
__global__ void __launch_bounds__(threads_per_block)
    unpack(const Segment<T>* segs, const T* buf, std::int64_t first_seg, std::int64_t base, T f) {
  const Segment<T> s = segs[first_seg + blockIdx.x];
  move_segment<false>(buf + (s.off - base), s.ptr, s.count, ScaleOp<T>{f});
}

template <class T>
__global__ void local(const Segment<T>* segs, T* acc, LocalMode mode, T weight, T mult) {
  const Segment<T> s = segs[blockIdx.x];
  T* const g = s.ptr;
  T* const a = mode == LocalMode::scale ? nullptr : acc + s.off;
  const T f = s.scale * mult;
  const std::int64_t stride = std::int64_t(gridDim.y) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < s.count; i += stride)
    local_value(mode, g, a, f, weight, i);
}

// ptr[i] *= f over a chunk reduced in place (gradsync's InPlaceScaleKernel).
template <class T>
__global__ void scale(const Segment<T>* segs, std::int64_t first_seg, T f) {
  const Segment<T> s = segs[first_seg + blockIdx.x];
  const std::int64_t stride = std::int64_t(gridDim.y) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < s.count; i += stride) s.ptr[i] *= f;
}

// Compressed chunks (gradsync's PackKernel / UnpackKernel with a wire format): the same per-value
// functions as the Kokkos kernels; an unpacked value that is not finite records 1 + its segment.
template <class T, class W>
__global__ void pack_wire(const Segment<T>* segs, const T* buf, std::uint16_t* wire, T* res, std::int64_t first_seg,
                          std::int64_t base, T pre, bool acc) {
  const Segment<T> s = segs[first_seg + blockIdx.x];
  const T* const sums = acc ? buf + (s.off - base) : nullptr;
  std::uint16_t* const w = wire + (s.off - base);
  T* const r = res ? res + s.off : nullptr;
  const std::int64_t stride = std::int64_t(gridDim.y) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < s.count; i += stride)
    pack_to_wire<W>(s.ptr, sums, w, r, pre, i);
}

template <class T, class W>
__global__ void unpack_wire(const Segment<T>* segs, const std::uint16_t* wire, std::int64_t first_seg,
                            std::int64_t base, T f, std::int64_t* overflow) {
  const std::int64_t k = first_seg + blockIdx.x;
  const Segment<T> s = segs[k];
  const std::uint16_t* const w = wire + (s.off - base);
  const std::int64_t stride = std::int64_t(gridDim.y) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < s.count; i += stride)
    if (unpack_from_wire<W>(w, s.ptr, f, i) && overflow)
      atomicMax(reinterpret_cast<unsigned long long*>(overflow), static_cast<unsigned long long>(k + 1));
}

inline dim3 grid(std::int64_t nsegs) {
  constexpr std::int64_t per_block = std::int64_t(threads_per_block) * values_per_thread;
  const std::int64_t y = (max_segment_elements + per_block - 1) / per_block;
  return dim3(unsigned(nsegs), unsigned(y < 1 ? 1 : y));
}
// Pack and unpack: enough blocks per segment for max_segment_elements values in one pass.
template <class T>
dim3 move_grid(std::int64_t nsegs) {
  constexpr std::int64_t per_block = std::int64_t(threads_per_block) * bytes_per_thread / std::int64_t(sizeof(T));
  const std::int64_t y = (max_segment_elements + per_block - 1) / per_block;
  return dim3(unsigned(nsegs), unsigned(y < 1 ? 1 : y));
}

template <class T, class M>
void launch(cudaStream_t s, std::int64_t nsegs, const PackKernel<T, CudaStream, M>& k) {
  if (k.format == Compression::fp16)
    pack_wire<T, WireFp16><<<grid(nsegs), threads_per_block, 0, s>>>(
        k.segs.data(), k.buf.data(), k.wire.data(), k.residual.data(), k.first_seg, k.base, k.prescale, k.accumulate);
  else if (k.format == Compression::bf16)
    pack_wire<T, WireBf16><<<grid(nsegs), threads_per_block, 0, s>>>(
        k.segs.data(), k.buf.data(), k.wire.data(), k.residual.data(), k.first_seg, k.base, k.prescale, k.accumulate);
  else if (k.accumulate)
    pack<T, true><<<move_grid<T>(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.buf.data(), k.first_seg, k.base,
                                                                    k.prescale);
  else
    pack<T, false><<<move_grid<T>(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.buf.data(), k.first_seg, k.base,
                                                                     k.prescale);
}
template <class T, class M>
void launch(cudaStream_t s, std::int64_t nsegs, const UnpackKernel<T, CudaStream, M>& k) {
  if (k.format == Compression::fp16)
    unpack_wire<T, WireFp16><<<grid(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.wire.data(), k.first_seg,
                                                                       k.base, k.factor, k.overflow.data());
  else if (k.format == Compression::bf16)
    unpack_wire<T, WireBf16><<<grid(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.wire.data(), k.first_seg,
                                                                       k.base, k.factor, k.overflow.data());
  else
    unpack<T>
        <<<move_grid<T>(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.buf.data(), k.first_seg, k.base, k.factor);
}
template <class T, class M>
void launch(cudaStream_t s, std::int64_t nsegs, const LocalKernel<T, CudaStream, M>& k) {
  local<T><<<grid(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.acc.data(), k.mode, k.weight, k.mult);
}
template <class T, class M>
void launch(cudaStream_t s, std::int64_t nsegs, const InPlaceScaleKernel<T, CudaStream, M>& k) {
  scale<T><<<grid(nsegs), threads_per_block, 0, s>>>(k.segs.data(), k.first_seg, k.factor);
}

}  // namespace cuda
#endif

template <class Kernel>
inline constexpr bool always_false_v = false;

template <>
struct SegmentLaunch<CudaStream> {
  template <class Kernel>
  static void run(const std::string& label, const CudaStream& exec, std::int64_t nsegs, const Kernel& k) {
#if defined(__CUDACC__)
    cuda::launch(exec.stream(), nsegs, k);
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
      throw Error(cat(label, " kernel launch over ", nsegs, " segments failed: ", cudaGetErrorName(rc), ": ",
                      cudaGetErrorString(rc)));
#else
    (void)label, (void)exec, (void)nsegs, (void)k;
    static_assert(always_false_v<Kernel>,
                  "gradsync: a GradientSync over gradsync::CudaDeviceSpace launches CUDA kernels: compile this "
                  "translation unit with nvcc (a .cu file, or LANGUAGE CUDA)");
#endif
  }
};

}  // namespace impl
}  // namespace gradsync
