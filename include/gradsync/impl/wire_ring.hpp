// gradsync internals: compressed sums in place. A compressed chunk that lies contiguously in the
// gradients' memory is summed by the backend's ring over that memory, the conversions riding in the
// passes the ring makes anyway: a segment becomes 16 bits as it is sent, received 16-bit values are
// added in fp32 (T) to this rank's own and rounded once as the sum moves on, and the owner's last
// addition rounds the whole sum, which every rank then writes back as post * that value. No pack or
// unpack pass and no 16-bit copy of the chunk: the chunk costs what an uncompressed one reduced in
// place does, plus the conversions, on half the bytes on the wire.
//
// Rounding: each rank rounds each value once (its own contribution plus the partial sum it received,
// or the whole sum for the owner), p roundings per value against the packed path's 2p - 1, so
// docs/COMPRESSION.md's bound holds. With error feedback a rank keeps what its rounding dropped,
// which now includes the partial sums' roundings: all of the sum's roundings are fed back.
// fp16: a sum past 65504 becomes infinity on the wire, which every rank then holds and reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../compression.hpp"
#include "../error.hpp"
#include "vector_clones.hpp"

namespace gradsync::impl {

/// The ring's passes over one segment of n values of T (host loops; the ring runs on the CPU), type
/// erased so that the ring's state need not be a template. Factors come as double from a T (exact).
struct WireRingOps {
  // out = wire(pre * v + res): this rank's values as the ring's first send.
  void (*first)(const void* v, std::uint16_t* out, void* res, double pre, std::size_t n);
  // io = wire(pre * v + res + io): a received partial sum with this rank's values added, to send on.
  void (*add)(const void* v, std::uint16_t* io, void* res, double pre, std::size_t n);
  // As add, the owner's last addition, and v = post * io: returns the first non-finite sum (fp16), or -1.
  std::int64_t (*finish)(void* v, std::uint16_t* io, void* res, double pre, double post, std::size_t n);
  // v = post * in (the allgather's write back): returns the first non-finite value (fp16), or -1.
  std::int64_t (*write)(void* v, const std::uint16_t* in, double post, std::size_t n);
};

// One loop per case, each without branches, so that each vectorizes (as the pack and unpack kernels),
// in the CPU's widest vectors (impl/vector_clones.hpp).
template <class W, class T>
struct WireRingLoops {
  using F = Wire<W>;
  // Only fp16 reports non-finite sums (docs/COMPRESSION.md); bf16 has fp32's range.
  static constexpr bool flags = std::is_same_v<W, WireFp16>;

  // What a rounding dropped; none past the format's range (the step fails, the next starts clean).
  static T kept(T x, std::uint16_t b) {
    const T d = x - T(F::decode(b));
    return d - d == T(0) ? d : T(0);
  }
  // x rounded to the wire, what the rounding dropped kept in res (error feedback).
  static std::uint16_t round_keeping(T x, T& res) {
    const std::uint16_t b = F::encode(x);
    res = kept(x, b);
    return b;
  }
  static std::int64_t first_non_finite(const std::uint16_t* w, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (F::non_finite(w[i])) return std::int64_t(i);
    return -1;
  }

  GRADSYNC_IMPL_VECTOR_CLONES
  static void first(const void* vp, std::uint16_t* out, void* rp, double pre_d, std::size_t n) {
    const T* v = static_cast<const T*>(vp);
    T* res = static_cast<T*>(rp);
    const T pre = T(pre_d);
    if (res) {
      for (std::size_t i = 0; i < n; ++i) out[i] = round_keeping(pre * v[i] + res[i], res[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) out[i] = F::encode(T(pre * v[i]));
    }
  }

  GRADSYNC_IMPL_VECTOR_CLONES
  static void add(const void* vp, std::uint16_t* io, void* rp, double pre_d, std::size_t n) {
    const T* v = static_cast<const T*>(vp);
    T* res = static_cast<T*>(rp);
    const T pre = T(pre_d);
    if (res) {
      for (std::size_t i = 0; i < n; ++i) io[i] = round_keeping((pre * v[i] + res[i]) + T(F::decode(io[i])), res[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) io[i] = F::encode(T(pre * v[i] + T(F::decode(io[i]))));
    }
  }

  GRADSYNC_IMPL_VECTOR_CLONES
  static std::int64_t finish(void* vp, std::uint16_t* io, void* rp, double pre_d, double post_d, std::size_t n) {
    T* v = static_cast<T*>(vp);
    T* res = static_cast<T*>(rp);
    const T pre = T(pre_d), post = T(post_d);
    std::uint32_t bad = 0;
    if (res) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t b = round_keeping((pre * v[i] + res[i]) + T(F::decode(io[i])), res[i]);
        io[i] = b;
        v[i] = post * T(F::decode(b));  // the value every other rank writes from b
        if constexpr (flags) bad |= F::non_finite(b) ? 1u : 0u;
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t b = F::encode(T(pre * v[i] + T(F::decode(io[i]))));
        io[i] = b;
        v[i] = post * T(F::decode(b));
        if constexpr (flags) bad |= F::non_finite(b) ? 1u : 0u;
      }
    }
    return bad ? first_non_finite(io, n) : -1;
  }

  GRADSYNC_IMPL_VECTOR_CLONES
  static std::int64_t write(void* vp, const std::uint16_t* in, double post_d, std::size_t n) {
    T* v = static_cast<T*>(vp);
    const T post = T(post_d);
    std::uint32_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t b = in[i];
      v[i] = post * T(F::decode(b));
      if constexpr (flags) bad |= F::non_finite(b) ? 1u : 0u;
    }
    return bad ? first_non_finite(in, n) : -1;
  }
};

template <class W, class T>
inline constexpr WireRingOps wire_ring_ops = {&WireRingLoops<W, T>::first, &WireRingLoops<W, T>::add,
                                              &WireRingLoops<W, T>::finish, &WireRingLoops<W, T>::write};

/// A compressed sum over one rank: buf[0, n) = post * wire(pre * buf + residual), `residual` (or null)
/// keeping what the rounding dropped, as the packed path rounds. Returns the first value that is not
/// finite (fp16), or -1. Allocates its 16-bit copy (one rank only: not a steady-state path).
template <class W, class T>
std::int64_t round_through_wire(T* buf, int n, T pre, T post, T* residual) {
  std::vector<std::uint16_t> wire(std::size_t(n > 0 ? n : 0));
  wire_ring_ops<W, T>.first(buf, wire.data(), residual, double(pre), wire.size());
  return wire_ring_ops<W, T>.write(buf, wire.data(), double(post), wire.size());
}

// A backend that sums compressed chunks in place, converting as it goes (has_wire_ring,
// backend.hpp): `bool sums_wire_in_place(std::size_t wire_bytes) const` (MpiBackend: its ring's sums)
// and `Request iallreduce_wire_in_place<W>(T* buf, std::size_t n, T pre, T post, T* residual) const`,
// whose Request tells, once complete, the first value that is not finite (`non_finite`, -1: none).

/// Whether a contiguous chunk of n values in wire format `kind` (int(Compression)) is summed in place.
template <class B>
bool wire_ring_fits(const B& b, int kind, std::int64_t n) {
  if constexpr (has_wire_ring<B>::value)
    return kind != 0 && b.sums_wire_in_place(std::size_t(n) * sizeof(std::uint16_t));
  else
    return false;
}

/// Starts data[0, n) = post * (sum over ranks of pre * data + residual), 16 bits on the wire.
template <class B, class T>
typename B::Request start_wire_ring([[maybe_unused]] const B& b, [[maybe_unused]] int kind, [[maybe_unused]] T* data,
                                    [[maybe_unused]] std::int64_t n, [[maybe_unused]] T pre, [[maybe_unused]] T post,
                                    [[maybe_unused]] T* residual) {
  if constexpr (has_wire_ring<B>::value) {
    if (kind == int(Compression::fp16))
      return b.template iallreduce_wire_in_place<WireFp16>(data, std::size_t(n), pre, post, residual);
    return b.template iallreduce_wire_in_place<WireBf16>(data, std::size_t(n), pre, post, residual);
  } else {
    throw Error("gradsync internal: a compressed chunk in place over a backend without a wire ring");
  }
}

/// The first value of a completed in-place compressed sum that is not finite (fp16), or -1.
template <class B>
std::int64_t wire_ring_non_finite([[maybe_unused]] const typename B::Request& r) {
  if constexpr (has_wire_ring<B>::value)
    return r.non_finite;
  else
    return -1;
}

}  // namespace gradsync::impl
