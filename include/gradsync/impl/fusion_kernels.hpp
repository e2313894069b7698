// gradsync internals: the batched kernels that move gradients into and out of the fusion buffer.
//
// One launch handles every segment of a chunk (a team per segment, threads over its elements), so
// thousands of small tensors cost a few launches, not thousands.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "../compression.hpp"
#include "../config.hpp"
#include "memory_ops.hpp"

namespace gradsync::impl {

/// A contiguous piece of one gradient: `count` values at `ptr`, matched with `count` values of a
/// gradsync buffer at `off`. `scale` is the per-tensor factor of local gradients.
template <class T>
struct Segment {
  T* ptr = nullptr;
  std::int64_t off = 0;
  std::int64_t count = 0;
  T scale = T(1);
};

template <class T, class MemorySpace>
using SegmentView = BufferView<Segment<T>, MemorySpace>;

/// Where a chunk in MemorySpace is staged for a backend that cannot reach it: pinned host memory
/// for CUDA device memory (fast, asynchronous copies), plain host memory otherwise.
template <class MemorySpace>
struct staging_space {
  using type = Kokkos::HostSpace;
};
#if defined(KOKKOS_ENABLE_CUDA)
template <>
struct staging_space<Kokkos::CudaSpace> {
  using type = Kokkos::CudaHostPinnedSpace;
};
#endif
template <class MemorySpace>
using staging_space_t = typename staging_space<MemorySpace>::type;

// Pack and unpack move a segment in 16-byte vectors where its source and destination lie at the same
// offset modulo 16 (always, for tensors whose sizes are multiples of 16 bytes and 16-byte-aligned
// allocations): 128-bit loads and stores on GPUs, a quarter of the instructions of 32-bit ones.
// Each thread loads all its values before storing any, so that a GPU has enough bytes in flight to
// approach cudaMemcpy's bandwidth (docs/GPU.md, "Pack and unpack kernels: what the SASS says").
// Reading a T array through Vec16 is what CUDA's float4 loads do; GCC and Clang treat an aggregate
// of T as aliasing T.
template <class T>
struct alignas(16) Vec16 {
  static_assert(16 % sizeof(T) == 0, "a value type that divides 16 bytes");
  static constexpr int width = int(16 / sizeof(T));
  T v[width];
};

// f on one value, or on each value of a vector; `old` is what the destination held (for f's that
// accumulate, else unused).
template <class F, class T>
GRADSYNC_HOST_DEVICE T apply_op(const F& f, T x, T old) {
  return f(x, old);
}
template <class F, class T>
GRADSYNC_HOST_DEVICE Vec16<T> apply_op(const F& f, Vec16<T> x, Vec16<T> old) {
  for (int l = 0; l < Vec16<T>::width; ++l) x.v[l] = f(x.v[l], old.v[l]);
  return x;
}

/// How the n values of a segment split into `head` scalars, `vectors` Vec16 from in + head and
/// out + head, and the scalars from `tail` to n (fewer than head + width of them in all).
/// `vectors` is -1 when in and out lie at different offsets modulo 16: all scalars.
struct VectorSplit {
  std::int64_t head, vectors, tail;
};
template <class T>
GRADSYNC_HOST_DEVICE VectorSplit vector_split(const T* in, const T* out, std::int64_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(in);
  if (((a ^ reinterpret_cast<std::uintptr_t>(out)) & 15) != 0) return VectorSplit{0, -1, n};
  const std::int64_t to_boundary = std::int64_t(((16 - (a & 15)) & 15) / sizeof(T));
  const std::int64_t head = to_boundary < n ? to_boundary : n;
  const std::int64_t vectors = (n - head) / Vec16<T>::width;
  return VectorSplit{head, vectors, head + vectors * Vec16<T>::width};
}

// The per-value operations of pack (no accumulation, accumulation) and unpack.
template <class T>
struct ScaleOp {
  T f;
  GRADSYNC_HOST_DEVICE T operator()(T x, T) const { return f * x; }
};
template <class T>
struct ScaleAddOp {
  T f;
  GRADSYNC_HOST_DEVICE T operator()(T x, T old) const { return old + f * x; }
};

// The team form of pack and unpack (device backends; host ones run the plain per-segment loops):
// out[j] = f(in[j], out[j]) for the n items j (T or Vec16<T>). Thread g of the team range takes the
// items g, g + G, g + 2G, ... (G = n / U rounded up), U of them, loaded before any is stored; the
// team's threads touch neighbouring items at each step (coalesced). 64 bytes of loads per thread
// (Acc: 32 of in, 32 of out); scalars (a misaligned segment) 32, as each costs an address register
// pair here (a runtime stride) and more would halve the blocks an SM holds.
template <bool Acc, class V, class Member, class F>
KOKKOS_INLINE_FUNCTION void team_move_items(const Member& team, const V* in, V* out, std::int64_t n, const F& f) {
  constexpr int U = int((sizeof(V) < 16 || Acc ? 32 : 64) / sizeof(V));
  const std::int64_t groups = (n + U - 1) / U;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups), [&](std::int64_t g) {
    V x[U] = {}, old[U] = {};  // every use is under its load's condition; GCC cannot tell
    for (int k = 0; k < U; ++k)
      if (g + k * groups < n) x[k] = in[g + k * groups];
    if constexpr (Acc)
      for (int k = 0; k < U; ++k)
        if (g + k * groups < n) old[k] = out[g + k * groups];
    for (int k = 0; k < U; ++k)
      if (g + k * groups < n) out[g + k * groups] = apply_op(f, x[k], Acc ? old[k] : x[k]);
  });
}

template <bool Acc, class T, class Member, class F>
KOKKOS_INLINE_FUNCTION void team_move(const Member& team, const T* in, T* out, std::int64_t n, const F& f) {
#if defined(__CUDA_ARCH__)
  // Segment pointers are read from memory: say they are global, for LDG/STG instead of generic LD/ST.
  __builtin_assume(__isGlobal(in) && __isGlobal(out));
#endif
  const VectorSplit sp = vector_split(in, out, n);
  if (sp.vectors < 0) return team_move_items<Acc>(team, in, out, n, f);
  // Head and tail: fewer than 2 * width scalars.
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, 2 * Vec16<T>::width), [&](std::int64_t t) {
    const std::int64_t i = t < sp.head ? t : sp.tail + t - sp.head;
    if (i < n) out[i] = f(in[i], Acc ? out[i] : T(0));
  });
  team_move_items<Acc>(team, reinterpret_cast<const Vec16<T>*>(in + sp.head),
                       reinterpret_cast<Vec16<T>*>(out + sp.head), sp.vectors, f);
}

// One value of a compressed chunk to the wire: prescale * in[i] (+ the sum of earlier passes, + this
// rank's residual), rounded once; the residual keeps what the rounding dropped. Free functions, so
// that the raw CUDA kernels (cuda_space.hpp) share them.
template <class W, class T>
GRADSYNC_HOST_DEVICE void pack_to_wire(const T* in, const T* sums, std::uint16_t* w, T* res, T pre, std::int64_t i) {
  T v = pre * in[i];
  if (sums) v = sums[i] + v;
  if (res) v += res[i];
  const std::uint16_t b = Wire<W>::encode(v);
  w[i] = b;
  // A value past the format's range keeps no residual: the step fails (fp16) and the next starts clean.
  if (res) {
    const T d = v - T(Wire<W>::decode(b));
    res[i] = d - d == T(0) ? d : T(0);
  }
}

// One value of a compressed chunk back: factor * the wire value; true when it is not finite.
template <class W, class T>
GRADSYNC_HOST_DEVICE bool unpack_from_wire(const std::uint16_t* w, T* out, T factor, std::int64_t i) {
  const std::uint16_t b = w[i];
  out[i] = factor * T(Wire<W>::decode(b));
  return Wire<W>::non_finite(b);
}

// buf[off - base + i] = (accumulate ? buf[...] : 0) + prescale * ptr[i]
// Compressed chunks (format != none) write that value to wire[off - base + i] in the wire format
// instead (buf is then only read, when accumulating); with error feedback (residual given, indexed
// by fused position) this rank's rounding error of the last step is added first and the new one kept.
template <class T, class ExecutionSpace, class MemorySpace>
struct PackKernel {
  using member_type = team_member_t<ExecutionSpace>;
  SegmentView<T, MemorySpace> segs;
  BufferView<T, MemorySpace> buf;
  std::int64_t first_seg, base;
  T prescale;
  bool accumulate;
  BufferView<std::uint16_t, MemorySpace> wire = {};
  BufferView<T, MemorySpace> residual = {};
  Compression format = Compression::none;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const Segment<T> s = segs(first_seg + team.league_rank());
    if (format == Compression::fp16) return team_wire<WireFp16>(team, s);
    if (format == Compression::bf16) return team_wire<WireBf16>(team, s);
    T* const out = buf.data() + (s.off - base);
    if (accumulate)
      team_move<true>(team, s.ptr, out, s.count, ScaleAddOp<T>{prescale});
    else
      team_move<false>(team, s.ptr, out, s.count, ScaleOp<T>{prescale});
  }

  // Host execution spaces: one iteration per segment, a plain loop the compiler vectorizes.
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k) const {
    const Segment<T> s = segs(first_seg + k);
    if (format == Compression::fp16) return loop_wire<WireFp16>(s);
    if (format == Compression::bf16) return loop_wire<WireBf16>(s);
    T* const out = buf.data() + (s.off - base);
    const T* const in = s.ptr;
    const T pre = prescale;
    if (accumulate)
      for (std::int64_t i = 0; i < s.count; ++i) out[i] += pre * in[i];
    else if (pre == T(1))
      for (std::int64_t i = 0; i < s.count; ++i) out[i] = in[i];
    else
      for (std::int64_t i = 0; i < s.count; ++i) out[i] = pre * in[i];
  }

  template <class W>
  KOKKOS_INLINE_FUNCTION void team_wire(const member_type& team, const Segment<T>& s) const {
    const T* const in = s.ptr;
    const T* const sums = accumulate ? buf.data() + (s.off - base) : nullptr;
    std::uint16_t* const w = wire.data() + (s.off - base);
    T* const res = residual.data() ? residual.data() + s.off : nullptr;
    const T pre = prescale;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count),
                         [&](std::int64_t i) { pack_to_wire<W>(in, sums, w, res, pre, i); });
  }
  template <class W>
  KOKKOS_INLINE_FUNCTION void loop_wire(const Segment<T>& s) const {
    const T* const in = s.ptr;
    const T* const sums = accumulate ? buf.data() + (s.off - base) : nullptr;
    std::uint16_t* const w = wire.data() + (s.off - base);
    T* const res = residual.data() ? residual.data() + s.off : nullptr;
    const T pre = prescale;
    // One loop per case, each without branches, so that each vectorizes.
    if (sums && res)
      for (std::int64_t i = 0; i < s.count; ++i) pack_to_wire<W>(in, sums, w, res, pre, i);
    else if (sums)
      for (std::int64_t i = 0; i < s.count; ++i) w[i] = Wire<W>::encode(T(sums[i] + pre * in[i]));
    else if (res)
      for (std::int64_t i = 0; i < s.count; ++i) {
        const T v = pre * in[i] + res[i];
        const std::uint16_t b = Wire<W>::encode(v);
        w[i] = b;
        const T d = v - T(Wire<W>::decode(b));
        res[i] = d - d == T(0) ? d : T(0);  // not finite past the format's range: no residual
      }
    else
      for (std::int64_t i = 0; i < s.count; ++i) w[i] = Wire<W>::encode(T(pre * in[i]));
  }
};

// ptr[i] = factor * buf[off - base + i]
// Compressed chunks read wire[off - base + i] instead; with `overflow` given, a sum that is not finite
// (fp16: beyond 65504) records 1 + its segment's index there (the largest such), for the sync's Error.
template <class T, class ExecutionSpace, class MemorySpace>
struct UnpackKernel {
  using member_type = team_member_t<ExecutionSpace>;
  SegmentView<T, MemorySpace> segs;
  BufferView<T, MemorySpace> buf;
  std::int64_t first_seg, base;
  T factor;
  BufferView<std::uint16_t, MemorySpace> wire = {};
  Compression format = Compression::none;
  BufferView<std::int64_t, MemorySpace> overflow = {};

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::int64_t k = first_seg + team.league_rank();
    const Segment<T> s = segs(k);
    if (format == Compression::fp16) return team_wire<WireFp16>(team, s, k);
    if (format == Compression::bf16) return team_wire<WireBf16>(team, s, k);
    team_move<false>(team, buf.data() + (s.off - base), s.ptr, s.count, ScaleOp<T>{factor});
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k) const {
    const Segment<T> s = segs(first_seg + k);
    if (format == Compression::fp16) return loop_wire<WireFp16>(s, first_seg + k);
    if (format == Compression::bf16) return loop_wire<WireBf16>(s, first_seg + k);
    const T* const in = buf.data() + (s.off - base);
    T* const out = s.ptr;
    const T f = factor;
    for (std::int64_t i = 0; i < s.count; ++i) out[i] = f * in[i];
  }

  template <class W>
  KOKKOS_INLINE_FUNCTION void team_wire(const member_type& team, const Segment<T>& s, std::int64_t k) const {
    const std::uint16_t* const in = wire.data() + (s.off - base);
    T* const out = s.ptr;
    const T f = factor;
    std::int64_t* const flag = overflow.data();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) {
      if (unpack_from_wire<W>(in, out, f, i) && flag) Kokkos::atomic_fetch_max(flag, k + 1);
    });
  }
  template <class W>
  KOKKOS_INLINE_FUNCTION void loop_wire(const Segment<T>& s, std::int64_t k) const {
    const std::uint16_t* const in = wire.data() + (s.off - base);
    T* const out = s.ptr;
    const T f = factor;
    if (!overflow.data()) {  // two plain loops, so that each vectorizes
      for (std::int64_t i = 0; i < s.count; ++i) out[i] = f * T(Wire<W>::decode(in[i]));
      return;
    }
    std::uint32_t bad = 0;
    for (std::int64_t i = 0; i < s.count; ++i) {
      const std::uint16_t b = in[i];
      out[i] = f * T(Wire<W>::decode(b));
      bad += Wire<W>::non_finite(b) ? 1u : 0u;
    }
    if (bad) Kokkos::atomic_fetch_max(overflow.data(), k + 1);
  }
};

// ptr[i] *= factor: the scale of a chunk reduced in place in the gradients' own memory.
template <class T, class ExecutionSpace, class MemorySpace>
struct InPlaceScaleKernel {
  using member_type = team_member_t<ExecutionSpace>;
  SegmentView<T, MemorySpace> segs;
  std::int64_t first_seg;
  T factor;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const Segment<T> s = segs(first_seg + team.league_rank());
    T* const g = s.ptr;
    const T f = factor;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) { g[i] *= f; });
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k) const {
    const Segment<T> s = segs(first_seg + k);
    T* const g = s.ptr;
    const T f = factor;
    for (std::int64_t i = 0; i < s.count; ++i) g[i] *= f;
  }
};

/// What the local kernel does to each local segment (w: the pass's weight, m: the step's
/// multiplier, both 1 but for set_samples' weighted segments).
enum class LocalMode {
  scale,       // ptr  = scale * m * (w * ptr)           (N == 1)
  store,       // acc  = w * ptr                         (first pass of N > 1)
  accumulate,  // acc += w * ptr                         (passes 2 .. N-1)
  finish,      // ptr  = scale * m * (acc + w * ptr)     (pass N)
};

// Value i of a local segment by mode (the segment's factor f, this pass's weight, the accumulator a,
// null in scale mode): LocalKernel and the raw CUDA kernel (cuda_space.hpp) share it.
template <class T>
GRADSYNC_HOST_DEVICE void local_value(LocalMode mode, T* g, T* a, T f, T weight, std::int64_t i) {
  switch (mode) {
    case LocalMode::scale:
      g[i] = f * (weight * g[i]);
      break;
    case LocalMode::store:
      a[i] = weight * g[i];
      break;
    case LocalMode::accumulate:
      a[i] += weight * g[i];
      break;
    case LocalMode::finish:
      g[i] = f * (a[i] + weight * g[i]);
      break;
  }
}

template <class T, class ExecutionSpace, class MemorySpace>
struct LocalKernel {
  using member_type = team_member_t<ExecutionSpace>;
  SegmentView<T, MemorySpace> segs;
  BufferView<T, MemorySpace> acc;
  LocalMode mode;
  T weight = T(1), mult = T(1);  // set_samples(): this pass's samples, 1 / the step's (exact when 1)

  KOKKOS_INLINE_FUNCTION void apply(T* g, T* a, T f, std::int64_t i) const { local_value(mode, g, a, f, weight, i); }
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const Segment<T> s = segs(team.league_rank());
    // acc is empty in scale mode: form the pointer only where it is used.
    T* const a = mode == LocalMode::scale ? nullptr : acc.data() + s.off;
    const T f = s.scale * mult;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) { apply(s.ptr, a, f, i); });
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k) const {
    const Segment<T> s = segs(k);
    T* const a = mode == LocalMode::scale ? nullptr : acc.data() + s.off;
    const T f = s.scale * mult;
    for (std::int64_t i = 0; i < s.count; ++i) apply(s.ptr, a, f, i);
  }
};

/// Whether an execution space runs on the host: there a RangePolicy over segments with plain loops
/// costs less than a team per segment; on GPUs a team per segment spreads the elements.
template <class ExecutionSpace, class = void>
struct is_host_execution_space : std::false_type {};
template <class ExecutionSpace>
struct is_host_execution_space<ExecutionSpace, std::void_t<typename ExecutionSpace::memory_space>>
    : std::is_same<typename ExecutionSpace::memory_space, Kokkos::HostSpace> {};
template <class ExecutionSpace>
inline constexpr bool is_host_execution_space_v = is_host_execution_space<ExecutionSpace>::value;

/// One team per segment: any kernel with a team operator().
template <class ExecutionSpace, class Kernel>
void launch_per_segment(const std::string& label, const ExecutionSpace& exec, std::int64_t nsegs, const Kernel& k) {
  if (nsegs <= 0) return;
  SegmentLaunch<ExecutionSpace>::run(label, exec, nsegs, k);
}

/// [0, n) on `exec`, for the element-wise kernels of a step. An explicit chunk size: Kokkos 4's
/// automatic one asks a default-constructed execution space for its concurrency, a heap allocation
/// at every launch (OpenMP with deprecated code on); device backends ignore it.
template <class ExecutionSpace>
Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>> step_range(const ExecutionSpace& exec,
                                                                                std::int64_t n) {
  return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(exec, std::int64_t(0), n,
                                                                              Kokkos::ChunkSize(1));
}

/// The fusion kernels (a team operator() and a per-segment one): plain loops over segments on host
/// execution spaces, a team per segment elsewhere.
template <class ExecutionSpace, class Kernel>
void launch_segments(const std::string& label, const ExecutionSpace& exec, std::int64_t nsegs, const Kernel& k) {
  if (nsegs <= 0) return;
  if constexpr (is_host_execution_space_v<ExecutionSpace>)
    Kokkos::parallel_for(label, step_range(exec, nsegs), k);
  else
    launch_per_segment(label, exec, nsegs, k);
}

}  // namespace gradsync::impl
