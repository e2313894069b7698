// gradsync internals: a long buffer as the pieces one collective call takes.
//
// MPI and NCCL count elements in an int, and a backend may take fewer (max_count()); every exchange
// of a buffer larger than that splits it alike on every rank, with this one loop.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gradsync::impl {

// Calls f(offset, count) over the consecutive pieces of [0, n) of at most `piece` elements: what
// one call takes (MPI's int count, a backend's max_count()).
template <class F>
void for_pieces(std::size_t n, std::size_t piece, F&& f) {
  for (std::size_t off = 0; off < n; off += piece) f(off, std::min(piece, n - off));
}

}  // namespace gradsync::impl
