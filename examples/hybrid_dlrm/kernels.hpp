// hybrid_dlrm: the Kokkos kernels of the model.
//
// Every kernel is a functor (so it compiles for CUDA as well as for the host) and every sum runs in
// a fixed order inside one thread: no atomics, so a run is bitwise reproducible and the 1-rank vs
// n-rank check measures only the reordering that distribution itself causes.
#pragma once

#include "../common/example_common.hpp"

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>

namespace dlrm {

using examples::Exec;
using examples::Index;
using examples::Mem;
using examples::Real;
namespace math = examples::math;
using examples::range;

template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;
using Matrix = Kokkos::View<Real**, Kokkos::LayoutRight, Mem>;  // rows = samples (or outputs)
using Cube = Kokkos::View<Real***, Kokkos::LayoutRight, Mem>;   // [sample][table][dim]

// ---- counter-based random numbers: the same value for the same key on every rank and device ----

using examples::mix;

KOKKOS_INLINE_FUNCTION std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

using examples::uniform;  // in (0, 1), never 0 or 1

// ---- initialisation ----

/// p[i] = bound * (2u - 1), u from (seed, tag, i).
struct InitUniform {
  Real* p;
  std::uint64_t seed, tag;
  Real bound;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    p[i] = bound * Real(2.0 * uniform(hash(seed, tag, std::uint64_t(i), 0)) - 1.0);
  }
};

// ---- dense layer: y = act(x W^T + b), W is [out][in] ----

struct DenseForward {
  Matrix x, w, y;
  View1<Real> b;
  int in, out;
  bool relu;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / out;
    const int o = int(idx % out);
    Real acc = b(o);
    for (int k = 0; k < in; ++k) acc += x(s, k) * w(o, k);
    y(s, o) = relu && acc < 0 ? Real(0) : acc;
  }
};

/// dy *= (y > 0): the ReLU's derivative, applied to the incoming gradient.
struct ReluBackward {
  Matrix dy, y;
  int out;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / out;
    const int o = int(idx % out);
    if (!(y(s, o) > 0)) dy(s, o) = 0;
  }
};

/// dx = dy W.
struct DenseBackwardInput {
  Matrix dy, w, dx;
  int in, out;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / in;
    const int k = int(idx % in);
    Real acc = 0;
    for (int o = 0; o < out; ++o) acc += dy(s, o) * w(o, k);
    dx(s, k) = acc;
  }
};

/// gW = dy^T x and gb = column sums of dy (one thread per weight, summing over the samples).
struct DenseBackwardWeights {
  Matrix dy, x, gw;
  View1<Real> gb;
  int in;
  Index samples;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const int o = int(idx / (in + 1));
    const int k = int(idx % (in + 1));
    Real acc = 0;
    if (k < in) {
      for (Index s = 0; s < samples; ++s) acc += dy(s, o) * x(s, k);
      gw(o, k) = acc;
    } else {
      for (Index s = 0; s < samples; ++s) acc += dy(s, o);
      gb(o) = acc;
    }
  }
};

// ---- sigmoid + binary cross-entropy on the logit z ----

/// Sums the per-sample loss and writes dz = (sigmoid(z) - label) * scale, where scale makes the
/// loss this rank differentiates L_r = (n / B) * sum_s loss_s (see trainer.hpp).
struct SigmoidBce {
  Matrix z, dz;
  View1<Real> label;
  Real scale;
  KOKKOS_INLINE_FUNCTION void operator()(Index s, Real& sum) const {
    const Real v = z(s, 0), y = label(s);
    // log(1 + e^v) - v y, written so that no exponential overflows.
    const Real softplus = (v > 0 ? v : Real(0)) + math::log1p(math::exp(-(v > 0 ? v : -v)));
    sum += softplus - v * y;
    const Real p = v >= 0 ? Real(1) / (Real(1) + math::exp(-v)) : math::exp(v) / (Real(1) + math::exp(v));
    dz(s, 0) = (p - y) * scale;
  }
};

// ---- dot interaction over the vectors v_0 = bottom output, v_1..v_T = embeddings ----

KOKKOS_INLINE_FUNCTION Real vec(const Matrix& h, const Cube& e, Index s, int i, int d) {
  return i == 0 ? h(s, d) : e(s, i - 1, d);
}

/// out[s] = (v_0, <v_i, v_j> for every pair i < j), width dim + V(V-1)/2.
struct InteractionForward {
  Matrix h, out;
  Cube e;
  View1<int> pair_i, pair_j;
  int dim, width;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / width;
    const int c = int(idx % width);
    if (c < dim) {
      out(s, c) = h(s, c);
      return;
    }
    const int i = pair_i(c - dim), j = pair_j(c - dim);
    Real acc = 0;
    for (int d = 0; d < dim; ++d) acc += vec(h, e, s, i, d) * vec(h, e, s, j, d);
    out(s, c) = acc;
  }
};

/// dv_i = [i == 0] dout[0..dim) + sum_{j != i} dout[pair(i, j)] v_j.
struct InteractionBackward {
  Matrix dout, h, dh;
  Cube e, de;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> pair_index;  // [V][V] -> pair number
  int dim, vectors;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / (Index(vectors) * dim);
    const int i = int((idx / dim) % vectors);
    const int d = int(idx % dim);
    Real acc = i == 0 ? dout(s, d) : Real(0);
    for (int j = 0; j < vectors; ++j)
      if (j != i) acc += dout(s, dim + pair_index(i, j)) * vec(h, e, s, j, d);
    if (i == 0)
      dh(s, d) = acc;
    else
      de(s, i - 1, d) = acc;
  }
};

// ---- embedding tables: lookup into the all-to-all send buffer, and the sparse-row gradient ----
//
// A rank holds its tables stacked in one [rows][dim] view (table i starts at row_offset(i)). For
// owned table i and global sample s, pos(i * B + s) is where that sample's vector sits in the
// all-to-all buffer exchanged with the rank that owns sample s (the same place going forward and
// coming back).

struct EmbeddingLookup {
  Matrix tables;
  View1<int> ids;  // [owned table][global sample]
  View1<Index> row_offset, pos;
  View1<Real> send;
  Index batch;
  int dim;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index is = idx / dim;  // i * batch + s
    const int d = int(idx % dim);
    const Index i = is / batch;
    send(pos(is) + d) = tables(row_offset(i) + ids(is), d);
  }
};

/// This rank's samples' embeddings between the all-to-all buffer and e[s][t][d]: out of the
/// buffer going forward (to_buffer = false), and their gradients back into the same places of
/// the buffer going backward (to_buffer = true). One index map serves both directions, so the
/// reverse all-to-all sends each gradient exactly where its embedding came from.
struct EmbeddingBlocks {
  View1<Real> buf;
  View1<Index> table_offset;  // where table t's vectors for this rank's samples start in buf
  Cube e;
  int tables, dim;
  bool to_buffer;
  Real scale = 1;  // to the buffer: --uneven sends each sample's own gradient (b x its share of the mean)
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index s = idx / (Index(tables) * dim);
    const int t = int((idx / dim) % tables);
    const int d = int(idx % dim);
    const Index at = table_offset(t) + s * dim + d;
    if (to_buffer)
      buf(at) = scale * e(s, t, d);
    else
      e(s, t, d) = buf(at);
  }
};

/// Sparse-row gradient of owned table i: grad(i, k) = sum of the gradients of every sample of the
/// global batch that looked up row uniq_row(first(i) + k), for the first `count(i)` slots; the
/// other slots are zero. Samples are visited in increasing order (CSR lists built on the host).
struct SparseRowGradient {
  View1<Real> recv;
  View1<Index> pos;
  View1<Index> uniq_first, uniq_count;  // per owned table: first unique entry, number of unique rows
  View1<Index> csr_begin;               // per unique entry: its samples in csr_sample[begin, begin')
  View1<Index> csr_sample;
  Cube grad;  // [owned table][slot][dim], slot < batch
  Index batch;
  int dim;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index i = idx / (batch * dim);
    const Index k = (idx / dim) % batch;
    const int d = int(idx % dim);
    Real acc = 0;
    if (k < uniq_count(i)) {
      const Index u = uniq_first(i) + k;
      for (Index q = csr_begin(u); q < csr_begin(u + 1); ++q) acc += recv(pos(i * batch + csr_sample(q)) + d);
    }
    grad(i, k, d) = acc;
  }
};

// ---- SGD ----

struct AxpyUpdate {  // p -= lr * g
  Real* p;
  const Real* g;
  Real lr;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const { p[i] -= lr * g[i]; }
};

/// Updates only the rows the batch touched (rows are unique within a table: no races).
struct SparseRowUpdate {
  Matrix tables;
  Cube grad;
  View1<Index> row_offset, uniq_first, uniq_table;
  View1<int> uniq_row;
  Real lr;
  int dim;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index u = idx / dim;
    const int d = int(idx % dim);
    const Index i = uniq_table(u);
    tables(row_offset(i) + uniq_row(u), d) -= lr * grad(i, u - uniq_first(i), d);
  }
};

// SGD on the rows a table's RowSparse gradient holds after the sync: tables(offset + id(k), d) -= lr g(k, d).
struct TableRowUpdate {
  Matrix tables;
  Cube grad;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids;
  Index table, offset;
  Real lr;
  int dim;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index k = idx / dim;
    const int d = int(idx % dim);
    tables(offset + ids(table, k), d) -= lr * grad(table, k, d);
  }
};

}  // namespace dlrm
