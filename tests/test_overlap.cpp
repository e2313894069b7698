// mark_ready (overlap with backward), in-place reduction of large tensors, fused order, blocking and
// nonblocking collectives and the auto chunk size: every combination gives the values of a plain
// synchronize(), bit for bit, which are checked against analytic averages.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <gradsync/gradsync.hpp>
#include <random>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::fill_host;
using gradsync_test::host_copy;
using gradsync_test::host_values;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;
using gradsync_test::worst_vs_rank_average;

namespace {
struct Dense {};
struct Tables {};
}  // namespace

template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
// The in-place tests: MpiBackend reduces in place only memory it reaches (device memory with an MPI
// that is not CUDA-aware is staged through host memory, every chunk copied).
using HostView = Kokkos::View<double*, Kokkos::HostSpace>;
using HostSync = gradsync::GradientSync<gradsync::MpiBackend, HostView>;

double grad_value(int tag, std::size_t i, int r, int p) { return (r + 1) * (i % 97 + 1) * 0.5 + 0.25 * p + tag; }

// Dense tensors of mixed sizes (empty, one value, small, larger than every in-place threshold
// used here) around a local table whose size differs per rank, in V's memory space.
template <class V = View>
struct ModelOf {
  std::vector<V> dense;
  V table;
  explicit ModelOf(int rank) {
    for (std::size_t n : {std::size_t(5), std::size_t(300), std::size_t(0), std::size_t(1), std::size_t(2000),
                          std::size_t(17), std::size_t(64), std::size_t(700)})
      dense.emplace_back("g", n);
    table = V("t", std::size_t(9 + rank));
  }
  void fill(int rank, int pass) {
    for (std::size_t k = 0; k < dense.size(); ++k)
      fill_host(dense[k], [&](std::size_t i) { return grad_value(int(k), i, rank, pass); });
    fill_host(table, [&](std::size_t i) { return grad_value(100, i, rank, pass); });
  }
  template <class S>
  void add_to(S& s) {
    s.template add<Dense>(dense[0]);
    s.template add<Dense>(dense[1]);
    s.template add<Tables>(table);
    for (std::size_t k = 2; k < dense.size(); ++k) s.template add<Dense>(dense[k]);
  }
};
using Model = ModelOf<>;

// Largest relative error against the analytic values after the cycle of N passes ending at `last`.
template <class M>
double analytic_error(const M& m, int rank, int n, int N, int last) {
  double worst = 0;
  for (std::size_t k = 0; k < m.dense.size(); ++k) {
    const auto h = host_copy(m.dense[k]);
    for (std::size_t i = 0; i < h.size(); ++i) {
      double s = 0;
      for (int r = 0; r < n; ++r)
        for (int p = last - N + 1; p <= last; ++p) s += grad_value(int(k), i, r, p);
      worst = std::max(worst, rel_err(h(i), s / n));
    }
  }
  const auto table = host_copy(m.table);
  for (std::size_t i = 0; i < table.size(); ++i) {
    double s = 0;
    for (int p = last - N + 1; p <= last; ++p) s += grad_value(100, i, rank, p);
    worst = std::max(worst, rel_err(table(i), s / n));
  }
  return worst;
}

// Whether two Views hold the same bits (on the host).
bool bitwise_equal(const View& a, const View& b) {
  const std::vector<double> x = host_values(a), y = host_values(b);
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

bool bitwise_equal(const Model& a, const Model& b) {
  for (std::size_t k = 0; k < a.dense.size(); ++k)
    if (!bitwise_equal(a.dense[k], b.dense[k])) return false;
  return bitwise_equal(a.table, b.table);
}

}  // namespace

TEST_CASE("mark_ready in any order, on any subset, gives the values of a plain synchronize") {
  const int rank = world_rank(), n = world_size();
  std::mt19937 rng(1234u + unsigned(rank));  // each rank marks in its own order
  int config = 0;
  for (int N : {1, 3})
    for (auto coll : {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking})
      for (auto order : {gradsync::FusionOrder::reverse, gradsync::FusionOrder::registration})
        for (std::size_t threshold : {std::size_t(64), std::size_t(4096), std::size_t(0)})
          for (double in_place : {0.0, 0.25, HUGE_VAL}) {
            gradsync::Options opt;
            opt.backward_passes_per_step = N;
            opt.tuning.collectives = coll;
            opt.tuning.fusion_order = order;
            opt.tuning.fusion_threshold_bytes = threshold;
            opt.tuning.in_place_min_fraction = in_place;
            opt.tuning.in_place_min_bytes = 0;
            if (config % 3 == 2) opt.tuning.host_staging = gradsync::HostStaging::always;
            if (config % 4 == 1) opt.tuning.max_chunks_in_flight = 1;  // each chunk completes before the next starts
            CAPTURE(config);
            ++config;
            Model plain(rank), marked(rank);
            Sync a(gradsync::MpiBackend(MPI_COMM_WORLD), opt), b(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
            plain.add_to(a);
            marked.add_to(b);
            for (int p = 0; p < 2 * N; ++p) {
              plain.fill(rank, p);
              marked.fill(rank, p);
              // Backward: a random order per rank and pass, some tensors twice, some never
              // (synchronize() finishes them), the local table too.
              std::vector<std::size_t> idx(marked.dense.size());
              for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
              std::shuffle(idx.begin(), idx.end(), rng);
              const std::size_t marks = std::size_t(p) % 2 == 0 ? idx.size() : idx.size() / 2;
              for (std::size_t j = 0; j < marks; ++j) {
                b.mark_ready(marked.dense[idx[j]]);
                if (j % 3 == 0) b.mark_ready(marked.dense[idx[j]]);
              }
              b.mark_ready(marked.table);
              const bool ra = a.synchronize(), rb = b.synchronize();
              CAPTURE(p);
              GRADSYNC_CHECK_ALL(ra == rb && ra == ((p + 1) % N == 0));
              if (ra) {
                GRADSYNC_CHECK_ALL(bitwise_equal(plain, marked));
                const double err = analytic_error(plain, rank, n, N, p);
                CAPTURE(err);
                GRADSYNC_CHECK_ALL(err <= 1e-13);
              }
            }
            GRADSYNC_CHECK_ALL(a.stats().bytes_allreduced == b.stats().bytes_allreduced);
            GRADSYNC_CHECK_ALL(a.stats().allreduce_calls == b.stats().allreduce_calls);
          }
}

TEST_CASE("mark_ready of a tensor that is not registered throws, and the sync goes on") {
  const int rank = world_rank();
  Model m(rank);
  Sync s(gradsync::MpiBackend(MPI_COMM_WORLD));
  m.add_to(s);
  View stranger("x", 3);
  GRADSYNC_CHECK_ALL(!gradsync_test::error_of([&] { s.mark_ready(stranger); }).empty());
  m.fill(rank, 0);
  s.mark_ready(m.dense[4]);
  CHECK(s.synchronize());
  GRADSYNC_CHECK_ALL(analytic_error(m, rank, world_size(), 1, 0) <= 1e-13);
}

TEST_CASE("large tensors are reduced in place: no bytes through the fusion buffer") {
  const int rank = world_rank();
  ModelOf<HostView> m(rank);
  gradsync::Options opt;
  opt.tuning.in_place_min_fraction = 0;  // every tensor reduced where it is
  opt.tuning.in_place_min_bytes = 0;
  opt.tuning.fusion_threshold_bytes = 1024;  // the 2000-value tensor in pieces of 128 values
  HostSync s(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  m.add_to(s);
  for (int p = 0; p < 3; ++p) {
    m.fill(rank, p);
    CHECK(s.synchronize());
    GRADSYNC_CHECK_ALL(analytic_error(m, rank, world_size(), 1, p) <= 1e-13);
  }
  // One call per piece of each non-empty tensor: ceil(size / 128) each.
  std::uint64_t calls = 0;
  for (const auto& g : m.dense) calls += (g.size() + 127) / 128;
  GRADSYNC_CHECK_ALL(s.stats().allreduce_calls == 3 * calls);
  GRADSYNC_CHECK_ALL(s.stats().bytes_in_place == s.stats().bytes_allreduced);
}

TEST_CASE("tensors side by side in memory are reduced in place when the fused order follows memory") {
  const int rank = world_rank(), n = world_size();
  HostView arena("arena", 1000);
  const std::pair<std::size_t, std::size_t> cuts[] = {{0, 100}, {100, 300}, {300, 1000}};
  for (auto order : {gradsync::FusionOrder::registration, gradsync::FusionOrder::reverse}) {
    gradsync::Options opt;
    opt.tuning.fusion_order = order;
    opt.tuning.in_place_min_fraction = HUGE_VAL;  // no tensor is large: only adjacency can avoid the copy
    HostSync s(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    for (auto c : cuts) s.add<Dense>(Kokkos::subview(arena, c));
    for (int p = 0; p < 2; ++p) {
      for (std::size_t i = 0; i < arena.size(); ++i) arena(i) = grad_value(0, i, rank, p);
      CHECK(s.synchronize());
      const auto value = [&](std::size_t, std::size_t i, int r) { return grad_value(0, i, r, p); };
      const double worst = worst_vs_rank_average(std::vector<HostView>{arena}, n, value);
      GRADSYNC_CHECK_ALL(worst <= 1e-13);
    }
    // Registration order is memory order here: one contiguous chunk, no copy. Reversed, it is not.
    const bool in_place = s.stats().bytes_in_place == s.stats().bytes_allreduced;
    GRADSYNC_CHECK_ALL(in_place == (order == gradsync::FusionOrder::registration));
  }
}

TEST_CASE("fusion_threshold_auto settles on one candidate on every rank and keeps the values exact") {
  const int rank = world_rank(), n = world_size();
  Model m(rank);
  gradsync::Options opt;
  opt.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_auto;
  Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  m.add_to(s);
  const int steps = int(gradsync::impl::chunk_candidates().size()) * gradsync::impl::PlanTuner::steps_per_candidate + 3;
  for (int p = 0; p < steps; ++p) {
    m.fill(rank, p);
    CHECK(s.synchronize());
    GRADSYNC_CHECK_ALL(analytic_error(m, rank, n, 1, p) <= 1e-13);
  }
  const auto& c = gradsync::impl::chunk_candidates();
  const double chosen = double(s.fusion_threshold_bytes());
  GRADSYNC_CHECK_ALL(std::find(c.begin(), c.end(), s.fusion_threshold_bytes()) != c.end());
  GRADSYNC_CHECK_ALL(gradsync_test::max_over_ranks(chosen) == chosen &&
                     -gradsync_test::max_over_ranks(-chosen) == chosen);
  // The plan is built once per candidate and once for the choice, then never again.
  GRADSYNC_CHECK_ALL(s.stats().plan_builds == c.size() + 1);
}

TEST_CASE("an arena of gradients is reduced in place as one region, in either fused order, with mark_ready too") {
  const int rank = world_rank(), n = world_size();
  // Five gradients carved from one allocation, small and large: 5000 values, 1000 per piece.
  const std::pair<std::size_t, std::size_t> cuts[] = {{0, 5}, {5, 2005}, {2005, 2010}, {2010, 4000}, {4000, 5000}};
  for (auto order : {gradsync::FusionOrder::reverse, gradsync::FusionOrder::registration}) {
    gradsync::Options opt;
    opt.tuning.fusion_order = order;
    opt.tuning.fusion_threshold_bytes = 1000 * sizeof(double);
    opt.tuning.in_place_min_bytes = 0;
    HostView plain_arena("plain", 5000), marked_arena("marked", 5000);
    HostSync plain(gradsync::MpiBackend(MPI_COMM_WORLD), opt), marked(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    std::vector<HostView> parts;
    for (auto c : cuts) {
      plain.add<Dense>(Kokkos::subview(plain_arena, c));
      parts.push_back(Kokkos::subview(marked_arena, c));
      marked.add<Dense>(parts.back());
    }
    CAPTURE(int(order));
    for (int p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < 5000; ++i) plain_arena(i) = marked_arena(i) = grad_value(0, i, rank, p);
      for (std::size_t k = parts.size(); k-- > 0;) marked.mark_ready(parts[k]);  // backward: last layer first
      CHECK(plain.synchronize());
      CHECK(marked.synchronize());
      const double worst =
          worst_vs_rank_average(std::vector<HostView>{plain_arena}, n,
                                [&](std::size_t, std::size_t i, int r) { return grad_value(0, i, r, p); });
      CAPTURE(worst);
      GRADSYNC_CHECK_ALL(worst <= 1e-13);
      GRADSYNC_CHECK_ALL(std::memcmp(plain_arena.data(), marked_arena.data(), 5000 * sizeof(double)) == 0);
    }
    // Five pieces of 1000 values per step, all in place; tensor by tensor it would be 1+2+1+2+1.
    GRADSYNC_CHECK_ALL(plain.stats().allreduce_calls == 3 * 5);
    GRADSYNC_CHECK_ALL(marked.stats().allreduce_calls == 3 * 5);
    GRADSYNC_CHECK_ALL(plain.stats().bytes_in_place == plain.stats().bytes_allreduced);
  }
}

TEST_CASE("neighbours in memory on some ranks only: no rank merges, the values hold") {
  const int rank = world_rank(), n = world_size();
  // Rank 0 carves its gradients from one allocation, the others allocate each one: the plans (and
  // so the collectives) must still match, so nobody merges.
  const std::size_t sizes[] = {2000, 5, 1995, 1000};
  HostView arena("arena", 5000);
  std::vector<HostView> g;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    g.push_back(rank == 0 ? HostView(Kokkos::subview(arena, std::make_pair(at, at + s))) : HostView("g", s));
    at += s;
  }
  gradsync::Options opt;
  opt.tuning.fusion_threshold_bytes = 1000 * sizeof(double);
  opt.tuning.in_place_min_bytes = 0;
  HostSync s(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  for (auto& v : g) s.add<Dense>(v);
  for (int p = 0; p < 2; ++p) {
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k](i) = grad_value(int(k), i, rank, p);
    CHECK(s.synchronize());
    const double worst =
        worst_vs_rank_average(g, n, [&](std::size_t k, std::size_t i, int r) { return grad_value(int(k), i, r, p); });
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst <= 1e-13);
  }
  // Tensor by tensor on every rank (a single rank has nobody to disagree with: it merges).
  const std::uint64_t per_step = n == 1 ? 5 : 2 + 1 + 2 + 1;
  CAPTURE(s.stats().allreduce_calls);
  GRADSYNC_CHECK_ALL(s.stats().allreduce_calls == 2 * per_step);
}

// A small model in the shape of DLRM's MLP: large tensors reduced in place and a packed chunk of
// small ones, within one fusion threshold, go as one ring over their regions
// (Capability::region_sums): one collective per step, the analytic average times both factors,
// and bitwise the values of mark_ready in backward order. Rank 0 carves its small tensors side by
// side in fused order (its packed chunk is contiguous, so reduced in place), the others allocate
// each one (packed): the regions' sizes agree all the same.
TEST_CASE("a small model's chunks go as one sum over their regions, in place and packed alike") {
  const int rank = world_rank(), n = world_size();
  const std::size_t sizes[] = {9000, 3, 20000, 17, 1, 12000, 40};  // >= 8192 doubles (64 KiB): in place
  const std::size_t small[] = {1, 3, 4, 6};
  struct Grads {
    HostView arena{"arena", 61};
    std::vector<HostView> g;
    Grads(const std::size_t* sizes, const std::size_t* small, int rank) {
      std::size_t at = 61;  // fused order is backward's: 40, 1, 17, 3 lie in the arena from its start
      for (std::size_t k = 0; k < 7; ++k) {
        const bool carved = rank == 0 && std::find(small, small + 4, k) != small + 4;
        if (carved) at -= sizes[k];
        g.push_back(carved ? HostView(Kokkos::subview(arena, std::make_pair(at, at + sizes[k])))
                           : HostView("g", sizes[k]));
      }
    }
    void fill(int r, int p) {
      for (std::size_t k = 0; k < g.size(); ++k)
        for (std::size_t i = 0; i < g[k].size(); ++i) g[k](i) = grad_value(int(k), i, r, p);
    }
  };
  Grads plain(sizes, small, rank), marked(sizes, small, rank);
  gradsync::Options opt;
  opt.prescale_factor = 2.0;
  opt.postscale_factor = 0.25;
  HostSync a(gradsync::MpiBackend(MPI_COMM_WORLD), opt), b(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  for (std::size_t k = 0; k < 7; ++k) {
    a.add<Dense>(plain.g[k]);
    b.add<Dense>(marked.g[k]);
  }
  for (int p = 0; p < 3; ++p) {
    plain.fill(rank, p);
    marked.fill(rank, p);
    for (std::size_t k = 7; k-- > 0;) b.mark_ready(marked.g[k]);
    CHECK(a.synchronize());
    CHECK(b.synchronize());
    const double worst = worst_vs_rank_average(
        plain.g, n, [&](std::size_t k, std::size_t i, int r) { return 0.5 * grad_value(int(k), i, r, p); });
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst <= 1e-13);
    bool same = true;
    for (std::size_t k = 0; k < 7; ++k)
      same &= std::memcmp(plain.g[k].data(), marked.g[k].data(), sizes[k] * sizeof(double)) == 0;
    GRADSYNC_CHECK_ALL(same);
  }
  // Three tensors of their own and the packed chunk: one ring a step (one rank has no ring: a call per chunk).
  CAPTURE(a.stats().allreduce_calls);
  GRADSYNC_CHECK_ALL(a.stats().allreduce_calls == 3u * (n == 1 ? 4u : 1u));
  GRADSYNC_CHECK_ALL(b.stats().allreduce_calls == a.stats().allreduce_calls);
  const std::uint64_t packed = rank == 0 ? 0 : 61 * sizeof(double);
  GRADSYNC_CHECK_ALL(a.stats().bytes_in_place == a.stats().bytes_allreduced - 3 * packed);
}
