// gradsync internals: the kernels of the row-sparse exchange (row_sparse.hpp).
//
// Each step of the exchange that touches values runs on the gradients' execution space: reading the
// rows out (weighted, padded), checking row numbers, merging the gathered rows, and the densified
// path's scatter and compaction. RangePolicy functors on raw pointers, so that they are correct on a
// device and compile under Kokkos 3.4 and 4.x alike.
#pragma once

#include <cstdint>

#include "../config.hpp"

namespace gradsync::impl {

template <class T>
struct SparseScale {  // p[i] *= f
  T* p;
  T f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { p[i] *= f; }
};

template <class I>
struct SparseReadIndices {  // dst[i] = idx[i] for i < n, -1 (padding) up to the launch's end
  const I* idx;
  std::int64_t* dst;
  std::int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst[i] = i < n ? std::int64_t(idx[i]) : -1; }
};

template <class T>
struct SparseReadValues {  // dst[i] = f * src[i] for i < n, 0 (padding) up to the launch's end
  const T* src;
  T* dst;
  std::int64_t n;
  T f;  // set_samples(): this rank's weight, before the sum (1 otherwise)
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst[i] = i < n ? f * src[i] : T(0); }
};

// *bad += the row numbers outside [0, table_rows). A parallel_for with an atomic on the (rare) bad
// row, not a parallel_reduce: Kokkos 4's parallel_reduce builds a std::string fence label at every
// call (a heap allocation per step), and the count goes straight into the counts the ranks exchange.
template <class I>
struct SparseCountBad {
  const I* idx;
  std::int64_t table_rows;
  std::int64_t* bad;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t r = std::int64_t(idx[i]);
    if (r < 0 || r >= table_rows) Kokkos::atomic_add(bad, std::int64_t(1));
  }
};

// out row u = f * sum of the gathered rows src[begin[u] .. begin[u+1]) (rank order), row number uniq[u].
template <class T, class I>
struct SparseMerge {
  const std::int64_t *uniq, *begin, *src;
  const T* recv;
  T* out;
  I* out_idx;
  std::int64_t w;
  T f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const std::int64_t u = k / w, j = k % w;
    T s = T(0);
    for (std::int64_t q = begin[u]; q < begin[u + 1]; ++q) s += recv[src[q] * w + j];
    out[k] = f * s;
    if (j == 0) out_idx[u] = I(uniq[u]);
  }
};

template <class T>
struct SparseZero {
  T* p;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { p[i] = T(0); }
};

// Densified: row r of the table at dense[r * (w + 1)], its last column counts the ranks' rows.
template <class T>
struct SparseScatter {
  const std::int64_t* idx;
  const T* v;
  T* dense;
  std::int64_t w;
  T f;  // set_samples(): this rank's weight (the count column stays 1)
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const std::int64_t r = k / (w + 1), j = k % (w + 1);
    Kokkos::atomic_add(&dense[idx[r] * (w + 1) + j], j < w ? f * v[r * w + j] : T(1));
  }
};

// The rows whose count is positive, ascending, scaled, into out (a scan over the table's n rows);
// their number into *total. The scan returns nothing: Kokkos 4's parallel_scan into a host value
// fences with a std::string label at every call (a heap allocation per step).
template <class T, class I>
struct SparseCompact {
  using value_type = std::int64_t;
  const T* dense;
  T* out;
  I* out_idx;
  std::int64_t w, n;
  T f;
  std::int64_t* total;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r, std::int64_t& pos, bool final) const {
    const bool hit = dense[r * (w + 1) + w] > T(0);
    if (final && hit) {
      out_idx[pos] = I(r);
      for (std::int64_t j = 0; j < w; ++j) out[pos * w + j] = f * dense[r * (w + 1) + j];
    }
    if (hit) ++pos;
    if (final && r == n - 1) *total = pos;
  }
};

}  // namespace gradsync::impl
