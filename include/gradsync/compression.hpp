// gradsync: wire compression. Data-parallel gradients travel as 16-bit floats (IEEE fp16 or bfloat16)
// and are added in fp32 wherever gradsync adds; the conversions ride in the pack and unpack kernels,
// or, for chunks summed in place by MpiBackend's ring, in the ring's own passes (impl/wire_ring.hpp).
//
// The formats are bit patterns (no CUDA or compiler half type), converted with integer arithmetic that
// is the same on host and device: round to nearest even, NaN kept, overflow to infinity (which the
// sync turns into an Error for fp16, docs/COMPRESSION.md). Per group, a policy may override
// Options::compression (CompressWith<>); local groups are never sent, hence never compressed.
#pragma once

#include <string.h>  // memcpy, usable in device code too
#include <cstdint>

#include <type_traits>

#include "config.hpp"
#include "local_var_policy.hpp"
#include "options.hpp"

// Host and device (also in raw CUDA kernels compiled by nvcc against a Kokkos without CUDA).
#if defined(__CUDACC__)
#define GRADSYNC_HOST_DEVICE __host__ __device__ inline
#else
#define GRADSYNC_HOST_DEVICE KOKKOS_INLINE_FUNCTION
#endif

namespace gradsync {

/// One value on the wire, as its bits. Backends sum arrays of these (MpiBackend: a user-defined
/// MPI_Op adding in fp32; NcclBackend: ncclFloat16 / ncclBfloat16).
struct WireFp16 {
  std::uint16_t bits;  ///< IEEE binary16
};
/// One bfloat16 value on the wire, as its bits (see WireFp16).
struct WireBf16 {
  std::uint16_t bits;  ///< bfloat16: the upper half of a binary32
};
static_assert(sizeof(WireFp16) == 2 && sizeof(WireBf16) == 2, "gradsync: a wire value is two bytes");

/// Policy of a data-parallel group with its own wire format, whatever Options::compression says:
/// `template <> struct gradsync::LocalVarPolicy<Head> : gradsync::CompressWith<gradsync::Compression::none> {};`
/// keeps a sensitive group in full precision while the rest is compressed.
template <Compression C>
struct CompressWith : DataParallel {
  static constexpr Compression compression = C;  ///< the group's wire format
};

namespace impl {

template <class P, class = void>
struct policy_has_compression : std::false_type {};
template <class P>
struct policy_has_compression<P, std::void_t<decltype(P::compression)>> : std::true_type {};

}  // namespace impl

/// Whether Group's policy chooses its own wire format (else it follows Options::compression).
template <class Group>
inline constexpr bool has_compression_choice_v = impl::policy_has_compression<LocalVarPolicy<Group>>::value;

namespace impl {

/// Group's wire format as an int: -1 follows Options::compression, else a Compression.
template <class Group>
constexpr int group_compression() {
  using P = LocalVarPolicy<Group>;
  if constexpr (policy_has_compression<P>::value) {
    static_assert(!P::is_local,
                  "gradsync: a local group is never sent, so it has no wire format: remove `compression` from "
                  "its LocalVarPolicy (or make it data-parallel, e.g. CompressWith<...>)");
    static_assert(std::is_same_v<std::remove_cv_t<decltype(P::compression)>, Compression>,
                  "gradsync: LocalVarPolicy<Group>::compression must be a gradsync::Compression");
    return int(P::compression);
  } else {
    return -1;
  }
}

GRADSYNC_HOST_DEVICE std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
GRADSYNC_HOST_DEVICE float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// The conversions below are written as selects, without early returns, so that compilers vectorize
// the pack and unpack loops and the sum's loop (a branchy fp16 conversion ran several times slower).

/// float -> bfloat16, round to nearest even (overflow rounds to infinity); NaN stays a quiet NaN.
GRADSYNC_HOST_DEVICE std::uint16_t bf16_from_float(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return std::uint16_t(std::int32_t(u & 0x7fffffffu) > 0x7f800000 ? (u >> 16) | 0x40u : rounded);
}
GRADSYNC_HOST_DEVICE float bf16_to_float(std::uint16_t b) { return bits_float(std::uint32_t(b) << 16); }

/// float -> IEEE half, round to nearest even, subnormals included; at least 65520 (the midpoint past
/// 65504) becomes infinity. (The scheme of F. Giesen's float_to_half_fast3_rtne.)
GRADSYNC_HOST_DEVICE std::uint16_t fp16_from_float(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // A normal half (>= 2^-14): exponent rebased from 127 to 15, rounded at the 13 dropped bits; a
  // carry past 65504 gives infinity's pattern.
  const std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // A subnormal half (< 2^-14): adding 0.5 makes the FPU round to a multiple of 2^-24, the half's unit.
  const std::uint32_t sub = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  // Signed comparisons (a < 2^31): SSE2 has no unsigned one, and these loops should vectorize there too.
  const std::int32_t s = std::int32_t(a);
  const std::uint32_t special = s > 0x7f800000 ? 0x7e00u : 0x7c00u;  // NaN, or 65536 and above
  return std::uint16_t(sign | (s >= 0x47800000 ? special : s < 0x38800000 ? sub : normal));
}
GRADSYNC_HOST_DEVICE float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t em = std::uint32_t(h & 0x7fffu) << 13, e = em & 0x0f800000u;
  const std::uint32_t normal = em + 0x38000000u;   // exponent rebased from 15 to 127
  const std::uint32_t special = em + 0x70000000u;  // infinity, NaN: all exponent bits set
  // Zero and subnormals: m * 2^-24, as (2^-14 + m * 2^-24) - 2^-14 (exact).
  const std::uint32_t sub = float_bits(bits_float(em + 0x38800000u) - 0x1p-14f);
  return bits_float(sign | (e == 0x0f800000u ? special : e == 0 ? sub : normal));
}

/// double -> float rounded to odd (truncate, then set the last bit when inexact): rounding that
/// float to a 16-bit format to nearest even then equals rounding the double directly, since float
/// keeps more than two extra bits.
GRADSYNC_HOST_DEVICE float float_round_to_odd(double d) {
  const float f = float(d);
  const std::uint32_t u = float_bits(f);
  const double af = f < 0 ? -double(f) : double(f), ad = d < 0 ? -d : d;
  const bool inexact = f == f && double(f) != d;
  // Rounded away from zero: step back to the truncation (the magnitude's pattern minus one).
  return bits_float(inexact ? ((af > ad ? u - 1u : u) | 1u) : u);
}

/// The conversions of one wire format.
template <class W>
struct Wire;
template <>
struct Wire<WireFp16> {
  static constexpr Compression format = Compression::fp16;
  GRADSYNC_HOST_DEVICE static std::uint16_t encode(float x) { return fp16_from_float(x); }
  GRADSYNC_HOST_DEVICE static std::uint16_t encode(double x) { return fp16_from_float(float_round_to_odd(x)); }
  GRADSYNC_HOST_DEVICE static float decode(std::uint16_t b) { return fp16_to_float(b); }
  /// Infinity or NaN: beyond the format's range (or a non-finite gradient).
  GRADSYNC_HOST_DEVICE static bool non_finite(std::uint16_t b) { return (b & 0x7c00u) == 0x7c00u; }
};
template <>
struct Wire<WireBf16> {
  static constexpr Compression format = Compression::bf16;
  GRADSYNC_HOST_DEVICE static std::uint16_t encode(float x) { return bf16_from_float(x); }
  GRADSYNC_HOST_DEVICE static std::uint16_t encode(double x) { return bf16_from_float(float_round_to_odd(x)); }
  GRADSYNC_HOST_DEVICE static float decode(std::uint16_t b) { return bf16_to_float(b); }
  GRADSYNC_HOST_DEVICE static bool non_finite(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u; }
};

template <class T>
inline constexpr bool is_wire_v = std::is_same_v<T, WireFp16> || std::is_same_v<T, WireBf16>;

/// The sum of two wire values as gradsync adds them: in fp32, rounded once to the format.
template <class W>
GRADSYNC_HOST_DEVICE std::uint16_t wire_add(std::uint16_t a, std::uint16_t b) {
  return Wire<W>::encode(Wire<W>::decode(a) + Wire<W>::decode(b));
}

}  // namespace impl
}  // namespace gradsync
