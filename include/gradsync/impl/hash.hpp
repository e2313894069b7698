// gradsync internals: FNV-1a, the hash the ranks compare instead of their data.
//
// The side channels' ids, the process sets' layouts and the residuals' names are hashed on every
// rank and the hashes compared: a fixed, byte-order-free function every rank computes alike.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradsync::impl {

inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace gradsync::impl
