// online_closure: the Kokkos kernels of the solver and of the closure network.
//
// Every kernel is a functor (it compiles for CUDA as for the host), and every sum runs in a fixed
// order inside one thread: no atomics, so a run is bitwise reproducible and the n-rank vs 1-process
// check measures only the reordering that the distribution itself causes (the allreduce).
//
// A field with a halo of width h over n local cells is a View of n + 2h values: cell i (local,
// 0 <= i < n) at index h + i, the left halo at [0, h), the right halo at [n + h, n + 2h).
#pragma once

#include "../common/example_common.hpp"

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace closure {

using examples::Exec;
using examples::Index;
using examples::Mem;
using examples::Real;
namespace math = examples::math;
using examples::range;

using View1 = Kokkos::View<Real*, Kokkos::LayoutRight, Mem>;
using Matrix = Kokkos::View<Real**, Kokkos::LayoutRight, Mem>;  // [cell][feature]
using IndexView = Kokkos::View<Index*, Kokkos::LayoutRight, Mem>;

constexpr int coarse_halo = 2;  // the closure's faces see two cells on each side

// ---- counter-based random numbers: the same value for the same key on every rank and device ----

using examples::mix;

KOKKOS_INLINE_FUNCTION std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return mix(mix(mix(a) ^ b) ^ c);
}

/// Uniform in (-1, 1).
KOKKOS_INLINE_FUNCTION double symmetric(std::uint64_t h) { return 2.0 * examples::uniform(h) - 1.0; }

/// p[i] = bound * u, u uniform in (-1, 1) from (seed, tag, offset + i): a parameter's values do not
/// depend on which process initialises it.
struct InitUniform {
  View1 p;
  std::uint64_t seed, tag;
  Index offset;
  Real bound;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    p(i) = bound * Real(symmetric(hash(seed, tag, std::uint64_t(offset + i))));
  }
};

/// p(i) += delta: one value changed in place, wherever p lives (finite-difference checks).
struct AddAt {
  View1 p;
  Index i;
  Real delta;
  KOKKOS_INLINE_FUNCTION void operator()(Index) const { p(i) += delta; }
};

// ---- the solver: viscous Burgers u_t + (u^2/2)_x = nu u_xx + f(x, t), periodic on [0, 2 pi) ----

/// Large-scale forcing: three travelling waves, sum_k a_k sin(k x + phase_k + omega_k t).
struct Forcing {
  Real a[3], phase[3], omega[3];
  KOKKOS_INLINE_FUNCTION Real operator()(Real x, Real t) const {
    Real f = 0;
    for (int k = 0; k < 3; ++k) f += a[k] * math::sin(Real(k + 1) * x + phase[k] + omega[k] * t);
    return f;
  }
};

/// Rusanov (local Lax-Friedrichs) flux of u^2/2 between the states a (left) and b (right).
KOKKOS_INLINE_FUNCTION Real rusanov(Real a, Real b) {
  const Real s = (a < 0 ? -a : a) > (b < 0 ? -b : b) ? (a < 0 ? -a : a) : (b < 0 ? -b : b);
  return Real(0.25) * (a * a + b * b) - Real(0.5) * s * (b - a);
}

/// One forward-Euler finite-volume step: out[i] = u[i] - dt/dx (F_{i+1/2} - F_{i-1/2})
/// + dt nu (u[i+1] - 2u[i] + u[i-1]) / dx^2 + dt f(x_i, t). u has a halo of width >= 1; out is
/// written at its interior (halo `out_halo`). x_i comes from the global cell index, so every
/// decomposition evaluates the very same expression for a cell.
struct BurgersStep {
  View1 u, out;
  int halo, out_halo;
  Index first;  // global index of local cell 0
  Real dx, dt, nu, t;
  Forcing f;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    const Real ul = u(halo + i - 1), uc = u(halo + i), ur = u(halo + i + 1);
    const Real x = (Real(first + i) + Real(0.5)) * dx;
    out(out_halo + i) =
        uc - dt / dx * (rusanov(uc, ur) - rusanov(ul, uc)) + dt * nu / (dx * dx) * (ur - 2 * uc + ul) + dt * f(x, t);
  }
};

/// The coarse cell average of the fine field: out[i] = (1/R) sum_k fine[R i + k].
struct Restrict {
  View1 fine, out;
  int fine_halo, out_halo, refine;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    Real s = 0;
    for (int k = 0; k < refine; ++k) s += fine(fine_halo + i * refine + k);
    out(out_halo + i) = s / Real(refine);
  }
};

/// The initial state: u(x) = sin(x) + 0.5 cos(2x + 0.3), sampled at cell centres.
struct InitialState {
  View1 u;
  int halo;
  Index first;
  Real dx;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    const Real x = (Real(first + i) + Real(0.5)) * dx;
    u(halo + i) = math::sin(x) + Real(0.5) * math::cos(2 * x + Real(0.3));
  }
};

/// Copies the interior of `from` (halo `from_halo`) into the interior of `to` (halo `to_halo`).
struct CopyInterior {
  View1 from, to;
  int from_halo, to_halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const { to(to_halo + i) = from(from_halo + i); }
};

// ---- halo exchange ----

/// One process holds the whole periodic domain: its halo is its own other end.
struct PeriodicHalo {
  View1 u;
  Index n;
  int halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index k) const {
    u(k) = u(n + k);                // left halo  <- last cells
    u(n + halo + k) = u(halo + k);  // right halo <- first cells
  }
};

/// buf[0, h) = first h cells (for the left neighbour), buf[h, 2h) = last h cells (for the right).
struct PackHalo {
  View1 u, buf;
  Index n;
  int halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index k) const {
    buf(k) = u(halo + k);
    buf(halo + k) = u(n + k);
  }
};

/// Left halo <- recv[0, h) (the left neighbour's last cells), right halo <- recv[h, 2h).
struct UnpackHalo {
  View1 u, recv;
  Index n;
  int halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index k) const {
    u(k) = recv(k);
    u(n + halo + k) = recv(halo + k);
  }
};

// ---- the closure: a data-parallel trunk and a local head per subdomain, in flux form ----
//
// The correction is a subgrid flux G at every face, so the closure conserves the integral of u
// (the momentum) as the finite-volume scheme does. Face f (0 <= f <= n) is the left face of local
// cell f; the trunk sees the four cells around it, x_f = u[f-2 .. f+1]:
//   a1_f = tanh(w1 x_f + b1),   a2_f = tanh(w2 a1_f + b2)        (the trunk: data-parallel)
//   G_p(f) = v_p . a2_f                                           (the head of subdomain p: local)
//   pred_i = ustar_i + dt/dx (G_p(i) - G_p(i+1)),  p = the subdomain of cell i.
// Parameters are flat Views: w1 [H][4], b1 [H], w2 [H][H], b2 [H], head [subdomain][H]. A face on
// the border of two subdomains is evaluated by both, each with its own head (a constant bias would
// cancel in the difference, so the head has none).

constexpr int face_stencil = 4;

/// The trunk at every face of the n local cells: x, a1, a2 have n + 1 rows.
struct TrunkForward {
  View1 u;  // coarse state, halo coarse_halo
  View1 w1, b1, w2, b2;
  Matrix x, a1, a2;
  int hidden;
  KOKKOS_INLINE_FUNCTION void operator()(Index f) const {
    for (int m = 0; m < face_stencil; ++m) x(f, m) = u(f + m);  // u(coarse_halo + f - 2 + m)
    for (int j = 0; j < hidden; ++j) {
      Real z = b1(j);
      for (int m = 0; m < face_stencil; ++m) z += w1(j * face_stencil + m) * x(f, m);
      a1(f, j) = math::tanh(z);
    }
    for (int j = 0; j < hidden; ++j) {
      Real z = b2(j);
      for (int k = 0; k < hidden; ++k) z += w2(j * hidden + k) * a1(f, k);
      a2(f, j) = math::tanh(z);
    }
  }
};

/// pred_i = ustar_i + dt/dx * v_p . (a2_i - a2_{i+1}).
struct FluxCorrection {
  View1 ustar, pred, head;
  Kokkos::View<int*, Kokkos::LayoutRight, Mem> sub;  // local subdomain of each local cell
  Matrix a2;
  int hidden;
  Real dt_dx;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    const Index h0 = Index(sub(i)) * hidden;
    Real c = 0;
    for (int j = 0; j < hidden; ++j) c += head(h0 + j) * (a2(i, j) - a2(i + 1, j));
    pred(i) = ustar(i) + dt_dx * c;
  }
};

using Mask = Kokkos::View<int*, Kokkos::LayoutRight, Mem>;  // 1: the cell is a training sample

/// dc_i = dL/dpred_i * dt/dx for L = weight * sum over the selected cells of (pred_i - target_i)^2 / 2.
struct LossSeed {
  View1 pred, target, dc;
  Mask selected;
  Real weight, dt_dx;
  KOKKOS_INLINE_FUNCTION void operator()(Index i) const {
    dc(i) = selected(i) ? weight * (pred(i) - target(i)) * dt_dx : Real(0);
  }
};

/// max_i |u_{i+1} - u_{i-1}|: the steepest cell (|du/dx| times 2 dx, which cancels in a threshold
/// relative to it). u has a halo >= 1.
struct Steepness {
  View1 u;
  int halo;
  KOKKOS_INLINE_FUNCTION Real at(Index i) const {
    const Real d = u(halo + i + 1) - u(halo + i - 1);
    return d < 0 ? -d : d;
  }
  KOKKOS_INLINE_FUNCTION void operator()(Index i, Real& m) const {
    const Real s = at(i);
    if (s > m) m = s;
  }
};

/// selected_i = (steepness_i >= threshold), and their count. The state is the same bits on every
/// decomposition and the threshold a max (exact in any order), so every decomposition selects the
/// same cells.
struct SelectSteep {
  Steepness steep;
  Mask selected;
  Real threshold;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, Index& count) const {
    selected(i) = steep.at(i) >= threshold ? 1 : 0;
    count += selected(i);
  }
};

/// sum over the selected cells of (a_i - b_i)^2 (no halos).
struct SelectedSquaredDistance {
  View1 a, b;
  Mask selected;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, Real& sum) const {
    const Real d = a(i) - b(i);
    if (selected(i)) sum += d * d;
  }
};

/// sum_i (a_i - b_i)^2 over the interiors (halos a_halo, b_halo).
struct SquaredDistance {
  View1 a, b;
  int a_halo, b_halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, Real& sum) const {
    const Real d = a(a_halo + i) - b(b_halo + i);
    sum += d * d;
  }
};

/// sum_i a_i^2 over the interior (halo a_halo).
struct SquaredNorm {
  View1 a;
  int a_halo;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, Real& sum) const { sum += a(a_halo + i) * a(a_halo + i); }
};

/// The heads' gradient: ghead[p][j] = sum over p's cells of dc_i (a2_ij - a2_{i+1,j}); one thread
/// per value, cells in increasing order.
struct HeadGradient {
  View1 dc, ghead;
  Matrix a2;
  IndexView first;  // local cells of local subdomain p: [first(p), first(p + 1))
  int hidden;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index p = idx / hidden;
    const int j = int(idx % hidden);
    Real s = 0;
    for (Index i = first(p); i < first(p + 1); ++i) s += dc(i) * (a2(i, j) - a2(i + 1, j));
    ghead(idx) = s;
  }
};

/// dz2_fj = dL/da2_fj (1 - a2_fj^2): face f is the left face of cell f (sign +) and the right face
/// of cell f - 1 (sign -), for the local cells among them; a border face's other cell is the
/// neighbour's, which evaluates the face itself.
struct HeadBackward {
  View1 dc, head;
  Kokkos::View<int*, Kokkos::LayoutRight, Mem> sub;
  Matrix a2, dz2;
  Index cells;
  int hidden;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index f = idx / hidden;
    const int j = int(idx % hidden);
    Real g = 0;
    if (f < cells) g += dc(f) * head(Index(sub(f)) * hidden + j);
    if (f > 0) g -= dc(f - 1) * head(Index(sub(f - 1)) * hidden + j);
    const Real a = a2(f, j);
    dz2(f, j) = g * (1 - a * a);
  }
};

/// dz1_ik = (sum_j dz2_ij w2_jk) (1 - a1_ik^2): back through the second layer and the first tanh.
struct HiddenBackward {
  Matrix dz2, a1, dz1;
  View1 w2;
  int hidden;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const Index i = idx / hidden;
    const int k = int(idx % hidden);
    Real s = 0;
    for (int j = 0; j < hidden; ++j) s += dz2(i, j) * w2(j * hidden + k);
    const Real a = a1(i, k);
    dz1(i, k) = s * (1 - a * a);
  }
};

/// A dense layer's gradient: gw[o][k] = sum_i dz_io x_ik, gb[o] = sum_i dz_io; one thread per value,
/// faces in increasing order.
struct DenseWeightGradient {
  Matrix dz, x;
  View1 gw, gb;
  int in;
  Index cells;
  KOKKOS_INLINE_FUNCTION void operator()(Index idx) const {
    const int o = int(idx / (in + 1));
    const int k = int(idx % (in + 1));
    Real s = 0;
    if (k < in) {
      for (Index i = 0; i < cells; ++i) s += dz(i, o) * x(i, k);
      gw(Index(o) * in + k) = s;
    } else {
      for (Index i = 0; i < cells; ++i) s += dz(i, o);
      gb(o) = s;
    }
  }
};

}  // namespace closure
