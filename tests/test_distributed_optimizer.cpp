// DistributedOptimizer: Horovod's aggregation-with-local-variables and partial-optimizer checks,
// broadcast of parameters and optimizer state, and the hybrid global norm against a single-process
// computation on the global batch.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <gradsync/gradsync.hpp>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "blind_backend.hpp"
#include "gradsync_test.hpp"
#include "local_scale_probe.hpp"

using gradsync_test::BlindBackend;
using gradsync_test::error_of;
using gradsync_test::fill_host;
using gradsync_test::host_copy;
using gradsync_test::host_values;
using gradsync_test::max_over_ranks;
using gradsync_test::rel_err;
using gradsync_test::state_of;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
struct Everyone {};    // a process set of every rank
struct Replicated {};  // reduced over it, / world size: an average, outside the fused exchange
template <>
struct gradsync::LocalVarPolicy<Replicated> : gradsync::ReduceOver<Everyone> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// The optimizer of Horovod's test: var += grad. It has no state visitor: the interface's minimum.
struct AddGrad {
  std::vector<std::pair<View, View>> pairs;
  std::size_t add(const View& p, const View& g) {
    pairs.emplace_back(p, g);
    return pairs.size() - 1;
  }
  void step() {
    for (auto& pg : pairs) {
      const auto p = host_copy(pg.first);
      const auto g = host_copy(pg.second);
      for (std::size_t i = 0; i < p.size(); ++i) p(i) += g(i);
      gradsync_test::upload(pg.first, p);
    }
  }
};

double min_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  return x;
}

}  // namespace

TEST_CASE("Horovod's aggregation check with local variables, with and without averaging") {
  const int rank = world_rank(), size = world_size();
  for (bool average : {false, true}) {
    CAPTURE(average);
    gradsync::Options o;
    o.backward_passes_per_step = 4;
    o.average_aggregated_gradients = average;
    gradsync::DistributedOptimizer<AddGrad, Sync> dopt(AddGrad{}, Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o));
    std::vector<View> x, y, gx, gy;
    for (int i = 0; i < 8; ++i) {
      x.emplace_back("x", 1);
      gx.emplace_back("gx", 1);
      y.emplace_back("y", 2);
      gy.emplace_back("gy", 2);
      fill_host(y.back(), [](std::size_t j) { return double(j + 1); });
      dopt.add<Dense>(x.back(), gx.back());
      dopt.add<Dense>(y.back(), gy.back());
    }
    for (int i = 0; i < 4; ++i) {
      dopt.register_local_var(x[std::size_t(i)]);
      dopt.register_local_var(y[std::size_t(i)]);
    }
    GRADSYNC_CHECK_ALL(dopt.is_local(x[3]) && !dopt.is_local(x[4]));
    for (int step = 0; step < 10; ++step) {
      for (int i = 0; i < 8; ++i) {
        Kokkos::deep_copy(gx[std::size_t(i)], 1.0);
        fill_host(gy[std::size_t(i)], [&](std::size_t j) { return j == 0 ? -(rank + 1) : 0; });
      }
      const bool changed = dopt.step();
      CAPTURE(step);
      GRADSYNC_CHECK_ALL(changed == ((step + 1) % 4 == 0));
      const double k = (step + 1) / 4, m = average ? 1 : 4;
      double err = 0;
      for (int i = 0; i < 8; ++i) {
        const bool local = i < 4;
        const double ex = local ? k * m / size : k * m;
        const double ey0 = local ? 1 - k * m * (rank + 1) / size : 1 - k * m * (size + 1) / 2.0;
        const auto xi = host_copy(x[std::size_t(i)]), yi = host_copy(y[std::size_t(i)]);
        err = std::max({err, rel_err(xi(0), ex), rel_err(yi(0), ey0), rel_err(yi(1), 2.0)});
      }
      CAPTURE(err);
      GRADSYNC_CHECK_ALL(err < 1e-15);
    }
  }
}

namespace {

// Horovod's partial-optimizer model: y = W2 (W1 x), L = y² / 2, W1: 2x3, W2: 1x2, x = (1, 2, 3).
// Gradients on a rank whose weights all equal r.
struct TwoLayerGrads {
  std::vector<double> w1, w2;
};
TwoLayerGrads two_layer_grads(double r) {
  const double x[3] = {1, 2, 3};
  double h[2];
  for (int j = 0; j < 2; ++j) h[j] = r * (x[0] + x[1] + x[2]);
  const double y = r * h[0] + r * h[1];
  TwoLayerGrads g;
  for (int j = 0; j < 2; ++j)
    for (int k = 0; k < 3; ++k) g.w1.push_back(y * r * x[k]);  // dL/dh_j = y W2_j
  for (int j = 0; j < 2; ++j) g.w2.push_back(y * h[j]);
  return g;
}

}  // namespace

TEST_CASE("Horovod's partial-optimizer check: 0, 1 or 2 local layers") {
  const int rank = world_rank(), size = world_size();
  const double lr = 0.01;
  for (int num_local = 0; num_local <= 2; ++num_local) {
    CAPTURE(num_local);
    gradsync::SgdOptions so;
    so.lr = lr;
    gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(so), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
    Kokkos::View<double**> w1("w1", 2, 3), g1("g1", 2, 3);
    View w2("w2", 2), g2("g2", 2);
    Kokkos::deep_copy(w1, double(rank));
    Kokkos::deep_copy(w2, double(rank));
    dopt.add<Dense>(w1, g1, "w1");
    dopt.add<Dense>(w2, g2, "w2");
    if (num_local >= 1) dopt.register_local_var(w1);
    if (num_local >= 2) dopt.register_local_var(w2);
    const TwoLayerGrads mine = two_layer_grads(rank);
    fill_host(g1, [&](std::size_t i) { return mine.w1[i]; });
    fill_host(g2, [&](std::size_t i) { return mine.w2[i]; });
    GRADSYNC_CHECK_ALL(dopt.step());
    TwoLayerGrads avg{std::vector<double>(6, 0.0), std::vector<double>(2, 0.0)};
    for (int r = 0; r < size; ++r) {
      const TwoLayerGrads g = two_layer_grads(r);
      for (std::size_t i = 0; i < 6; ++i) avg.w1[i] += g.w1[i] / size;
      for (std::size_t i = 0; i < 2; ++i) avg.w2[i] += g.w2[i] / size;
    }
    double err = 0;
    std::vector<double> g1_h = host_values(g1), w1_h = host_values(w1), g2_h = host_values(g2), w2_h = host_values(w2);
    // The optimizer took the local layers' 1/size (test_local_scale.cpp): their gradients hold the
    // unscaled sums and the factor is pending.
    GRADSYNC_CHECK_ALL(dopt.folds_local_scale());
    GRADSYNC_CHECK_ALL(gradsync_test::pending_scale(dopt.sync(), g1) == (num_local >= 1 ? 1.0 / size : 1.0));
    for (double& g : g1_h) g *= gradsync_test::pending_scale(dopt.sync(), g1);
    for (double& g : g2_h) g *= gradsync_test::pending_scale(dopt.sync(), g2);
    for (std::size_t i = 0; i < 6; ++i) {
      const double got = g1_h[i];
      err = std::max(err, num_local >= 1 ? rel_err(got * size, mine.w1[i]) : rel_err(got, avg.w1[i]));
      err = std::max(err, rel_err(w1_h[i], rank - lr * got));  // the optimizer used the synced gradient
    }
    for (std::size_t i = 0; i < 2; ++i) {
      err = std::max(err, num_local >= 2 ? rel_err(g2_h[i] * size, mine.w2[i]) : rel_err(g2_h[i], avg.w2[i]));
      err = std::max(err, rel_err(w2_h[i], rank - lr * g2_h[i]));
    }
    CAPTURE(err);
    GRADSYNC_CHECK_ALL(err < 1e-14);
    // Bytes on the wire: the data-parallel layers only.
    const std::size_t dp_values = (num_local >= 1 ? 0 : 6) + (num_local >= 2 ? 0 : 2);
    GRADSYNC_CHECK_ALL(dopt.sync().stats().bytes_allreduced == dp_values * sizeof(double));
  }
}

namespace {

double init_value(int rank, int tag, std::size_t i) { return 100.0 * rank + 10.0 * tag + 0.5 * double(i); }

std::vector<double> bcast_copy(std::vector<double> v, int root) {
  MPI_Bcast(v.data(), int(v.size()), MPI_DOUBLE, root, MPI_COMM_WORLD);
  return v;
}

}  // namespace

TEST_CASE("broadcast_parameters: data-parallel parameters and state from root, local ones kept") {
  const int rank = world_rank(), size = world_size(), root = size - 1;
  gradsync::AdamWOptions ao;
  ao.lr = 0.1;
  ao.amsgrad = true;
  using Opt = gradsync::AdamW<View>;
  gradsync::DistributedOptimizer dopt(Opt(ao), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  // Data-parallel a (5) and b (2x3); local: a tower of 3 + rank values, c made local at run time.
  View a("a", 5), ga("ga", 5), tower("tower", std::size_t(3 + rank)), gt("gt", std::size_t(3 + rank)), c("c", 4),
      gc("gc", 4);
  Kokkos::View<double**> b("b", 2, 3), gb("gb", 2, 3);
  // Each tensor as its values in memory order (b's too), in the Views' memory space.
  using Flat = Kokkos::View<double*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const std::vector<Flat> params = {Flat(a.data(), a.size()), Flat(tower.data(), tower.size()),
                                    Flat(b.data(), b.size()), Flat(c.data(), c.size())};
  const std::vector<Flat> grads = {Flat(ga.data(), ga.size()), Flat(gt.data(), gt.size()), Flat(gb.data(), gb.size()),
                                   Flat(gc.data(), gc.size())};
  dopt.add<Dense>(a, ga, "a");
  dopt.add<Tower>(tower, gt, "tower");
  dopt.add<Dense>(b, gb, "b");
  dopt.add<Dense>(c, gc, "c");
  dopt.register_local_var(c);
  const bool local[] = {false, true, false, true};
  for (int t = 0; t < 4; ++t) fill_host(params[std::size_t(t)], [&](std::size_t i) { return init_value(rank, t, i); });
  // Rank r takes r + 1 unsynchronized optimizer steps with its own gradients: every rank's
  // parameters, moments and step counts differ before the broadcast.
  for (int s = 0; s <= rank; ++s) {
    for (int t = 0; t < 4; ++t)
      fill_host(grads[std::size_t(t)],
                [&](std::size_t i) { return std::sin(1.0 + rank + 3.0 * s + 0.7 * t + 0.3 * double(i)); });
    dopt.apply();
  }
  std::vector<std::vector<double>> before_p, before_s;
  for (int t = 0; t < 4; ++t) {
    before_p.push_back(host_values(params[std::size_t(t)]));
    before_s.push_back(state_of(dopt.optimizer(), std::size_t(t)));
  }
  dopt.broadcast_parameters(root);
  bool ok = true;
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    const std::vector<double> now_p = host_values(params[std::size_t(t)]);
    const std::vector<double> now_s = state_of(dopt.optimizer(), std::size_t(t));
    if (local[t]) {
      ok = ok && now_p == before_p[std::size_t(t)] && now_s == before_s[std::size_t(t)];
      ok = ok && dopt.optimizer().step_count(std::size_t(t)) == rank + 1;
    } else {
      ok = ok && now_p == bcast_copy(before_p[std::size_t(t)], root) &&
           now_s == bcast_copy(before_s[std::size_t(t)], root);
      ok = ok && dopt.optimizer().step_count(std::size_t(t)) == size;
    }
  }
  GRADSYNC_CHECK_ALL(ok);
  GRADSYNC_CHECK_ALL(tower.size() == std::size_t(3 + rank) && gt.size() == std::size_t(3 + rank));
  // From the same start, synchronized steps keep the data-parallel parameters identical everywhere.
  for (int s = 0; s < 3; ++s) {
    for (int t = 0; t < 4; ++t)
      fill_host(grads[std::size_t(t)], [&](std::size_t i) { return std::cos(rank + 2.0 * s + t + 0.1 * double(i)); });
    GRADSYNC_CHECK_ALL(dopt.step());
  }
  double spread = 0;
  for (int t : {0, 2})
    for (const double v : host_values(params[std::size_t(t)]))
      spread = std::max(spread, max_over_ranks(v) - min_over_ranks(v));
  CAPTURE(spread);
  GRADSYNC_CHECK_ALL(spread == 0);
}

TEST_CASE("broadcast_parameters: ranks that disagree on data-parallel parameters all throw") {
  const int rank = world_rank(), size = world_size();
  GRADSYNC_SKIP_BELOW_RANKS(2, "parameters that differ between ranks need two of them");
  for (bool by_count : {false, true}) {
    CAPTURE(by_count);
    gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
    View a("a", 4), ga("ga", 4);
    View b("b", !by_count && rank == 1 ? 3 : 2), gb("gb", b.size());
    View extra("extra", 1), gextra("gextra", 1);
    dopt.add<Dense>(a, ga, "a");
    dopt.add<Dense>(b, gb, "b");
    if (by_count && rank == size - 1) dopt.add<Dense>(extra, gextra, "extra");
    const std::string what = error_of<gradsync::MismatchError>([&] { dopt.broadcast_parameters(0); });
    CAPTURE(what);
    const std::string who = by_count ? std::to_string(size - 1) : "1";
    GRADSYNC_CHECK_ALL(what.find("rank(s) " + who + " differ") != std::string::npos);
    GRADSYNC_CHECK_ALL(what.find(by_count ? "parameter #2" : "parameter #1") != std::string::npos);
  }
}

namespace {

// A hybrid model on the global batch: a data-parallel linear trunk z = W x (W: 2x3), on rank r a
// tower a_r of 2 + r values (a local group) and a bias c_r made local at run time:
//   pred = Σ_j a_r[j] z[j mod 2] + c_r,  L_r = mean over rank r's samples of (pred - t)² / 2,
//   L = mean over ranks of L_r.
constexpr int samples = 6;
double xval(int r, int s, int i) { return std::sin(1.0 + 7.0 * r + 3.0 * s + i); }
double target(int r, int s) { return std::cos(0.5 + r + 2.0 * s); }
double w_init(int i) { return 0.1 * (i + 1) - 0.25; }
double a_init(int r, int j) { return 0.3 - 0.1 * j + 0.05 * r; }
double c_init(int r) { return 0.2 * r - 0.1; }

struct RankGrads {
  std::vector<double> w, a;
  double c = 0;
};

// dL_r/d(parameters) of rank r's own loss.
RankGrads rank_grads(int r) {
  RankGrads g{std::vector<double>(6, 0.0), std::vector<double>(std::size_t(2 + r), 0.0), 0};
  for (int s = 0; s < samples; ++s) {
    double z[2] = {0, 0};
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 3; ++i) z[k] += w_init(3 * k + i) * xval(r, s, i);
    double pred = c_init(r);
    for (int j = 0; j < 2 + r; ++j) pred += a_init(r, j) * z[j % 2];
    const double e = (pred - target(r, s)) / samples;
    for (int j = 0; j < 2 + r; ++j) g.a[std::size_t(j)] += e * z[j % 2];
    g.c += e;
    for (int k = 0; k < 2; ++k) {
      double dz = 0;
      for (int j = k; j < 2 + r; j += 2) dz += e * a_init(r, j);
      for (int i = 0; i < 3; ++i) g.w[std::size_t(3 * k + i)] += dz * xval(r, s, i);
    }
  }
  return g;
}

// |dL/dθ| in one process: the trunk's gradient is the mean over ranks, each tower's and bias's
// gradient is its rank's divided by n (only that rank's samples touch it).
double single_process_norm(int n) {
  std::vector<double> w(6, 0.0);
  double sq = 0;
  for (int r = 0; r < n; ++r) {
    const RankGrads g = rank_grads(r);
    for (std::size_t i = 0; i < 6; ++i) w[i] += g.w[i] / n;
    for (double v : g.a) sq += (v / n) * (v / n);
    sq += (g.c / n) * (g.c / n);
  }
  for (double v : w) sq += v * v;
  return std::sqrt(sq);
}

// Counts the backend's allreduces, blocking or not (global_norm must make exactly one of one value;
// it starts a nonblocking one and waits for it under the stall watchdog).
struct CountingBackend : gradsync::MpiBackend {
  using gradsync::MpiBackend::iallreduce_sum;
  using gradsync::MpiBackend::MpiBackend;
  mutable long calls = 0, values = 0;
  template <class T>
  void allreduce_sum(T* buf, std::size_t n) const {
    ++calls;
    values += long(n);
    gradsync::MpiBackend::allreduce_sum(buf, n);
  }
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n) const {
    ++calls;
    values += long(n);
    return gradsync::MpiBackend::iallreduce_sum(buf, n);
  }
};

}  // namespace

TEST_CASE("global_norm of a hybrid model equals the single-process norm on the global batch") {
  const int rank = world_rank(), size = world_size();
  const double expect = single_process_norm(size);
  for (int N : {1, 2}) {
    CAPTURE(N);
    gradsync::Options o;
    o.backward_passes_per_step = N;
    o.average_aggregated_gradients = true;  // N passes over the same batch average to the same gradient
    using CSync = gradsync::GradientSync<CountingBackend, View>;
    gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(), CSync(CountingBackend(MPI_COMM_WORLD), o));
    View w("w", 6), gw("gw", 6), a("a", std::size_t(2 + rank)), ga("ga", std::size_t(2 + rank)), c("c", 1), gc("gc", 1);
    dopt.add<Dense>(w, gw, "trunk");
    dopt.add<Tower>(a, ga, "tower");
    dopt.add<Dense>(c, gc, "bias");
    dopt.register_local_var(c);
    const RankGrads mine = rank_grads(rank);
    bool ready = false;
    for (int p = 0; p < N; ++p) {
      fill_host(gw, [&](std::size_t i) { return mine.w[i]; });
      fill_host(ga, [&](std::size_t i) { return mine.a[i]; });
      Kokkos::deep_copy(gc, mine.c);
      ready = dopt.synchronize();
    }
    GRADSYNC_CHECK_ALL(ready);
    const long calls_before = dopt.sync().backend().calls, values_before = dopt.sync().backend().values;
    const double norm = dopt.global_norm();
    CAPTURE(norm);
    CAPTURE(expect);
    GRADSYNC_CHECK_ALL(rel_err(norm, expect) < 1e-14);
    GRADSYNC_CHECK_ALL(dopt.sync().backend().calls - calls_before == 1);
    GRADSYNC_CHECK_ALL(dopt.sync().backend().values - values_before == 1);
    GRADSYNC_CHECK_ALL(rel_err(gradsync::global_norm(dopt.sync()), expect) < 1e-14);

    // Clipping above the norm changes nothing; below it scales every gradient by one factor. The
    // local gradients hold unscaled sums (the optimizer takes the factor): clipping applies it first.
    const std::vector<double> gw0 = host_values(gw), ga_raw = host_values(ga);
    const double gc_raw = host_values(gc)[0];
    GRADSYNC_CHECK_ALL(rel_err(dopt.clip_grad_norm(2 * expect), expect) < 1e-14);
    GRADSYNC_CHECK_ALL(host_values(gw) == gw0 && host_values(gc)[0] == gc_raw);
    GRADSYNC_CHECK_ALL(gradsync::impl::SyncAccess::local_scale_pending(dopt.sync()) ==
                       (size > 1 || N > 1));  // a factor other than 1
    std::vector<double> ga0 = ga_raw;
    for (double& g : ga0) g *= gradsync_test::pending_scale(dopt.sync(), ga);
    const double gc0 = gc_raw * gradsync_test::pending_scale(dopt.sync(), gc);
    const double max_norm = 0.25 * expect, coef = max_norm / (expect + 1e-6);
    GRADSYNC_CHECK_ALL(rel_err(dopt.clip_grad_norm(max_norm), expect) < 1e-14);
    const std::vector<double> gw1 = host_values(gw), ga1 = host_values(ga);
    double err = rel_err(host_values(gc)[0], gc0 * coef);
    for (std::size_t i = 0; i < 6; ++i) err = std::max(err, rel_err(gw1[i], gw0[i] * coef));
    for (std::size_t i = 0; i < ga.size(); ++i) err = std::max(err, rel_err(ga1[i], ga0[i] * coef));
    CAPTURE(err);
    GRADSYNC_CHECK_ALL(err < 1e-14);
    GRADSYNC_CHECK_ALL(rel_err(dopt.global_norm(), expect * coef) < 1e-14);
  }
}

TEST_CASE("clip_grad_norm: non-finite norms") {
  const int rank = world_rank();
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  View w("w", 3), gw("gw", 3), t("t", 2), gt("gt", 2);
  dopt.add<Dense>(w, gw);
  dopt.add<Tower>(t, gt);
  Kokkos::deep_copy(gw, 1.0);
  Kokkos::deep_copy(gt, 1.0);
  if (rank == 0) gradsync_test::set_value(gt, 1, std::numeric_limits<double>::infinity());  // one rank's local shard
  GRADSYNC_CHECK_ALL(dopt.synchronize());
  // Every rank sees the infinite norm.
  GRADSYNC_CHECK_ALL(!error_of([&] { dopt.clip_grad_norm(1.0, true); }).empty());
  CHECK_THROWS_AS(dopt.clip_grad_norm(-1.0), gradsync::ConfigError);
}

TEST_CASE("a shared sync (Sync as a reference type); steady steps allocate nothing") {
  const int rank = world_rank();
  gradsync::Options o;
  o.backward_passes_per_step = 2;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  gradsync::AdamOptions ao;
  ao.amsgrad = true;
  gradsync::DistributedOptimizer<gradsync::Adam<View>, Sync&> dopt(gradsync::Adam<View>(ao), sync);
  View w("w", 300), gw("gw", 300), t("t", std::size_t(5 + rank)), gt("gt", std::size_t(5 + rank));
  dopt.add<Dense>(w, gw);
  dopt.add<Tower>(t, gt);
  GRADSYNC_CHECK_ALL(sync.num_tensors() == 2 && &dopt.sync() == &sync);
  // Host mirrors made once (gw and gt themselves in host memory). Counted: the library's part of
  // each pass, not the test's upload of the gradients to device memory.
  const auto gw_h = gradsync_test::host_mirror(gw), gt_h = gradsync_test::host_mirror(gt);
  long heap = 0, kokkos = 0;
  auto pass = [&](int p) {
    for (std::size_t i = 0; i < gw.size(); ++i) gw_h(i) = std::sin(rank + p + 0.01 * double(i));
    for (std::size_t i = 0; i < gt.size(); ++i) gt_h(i) = std::cos(rank + p + 0.1 * double(i));
    gradsync_test::upload(gw, gw_h);
    gradsync_test::upload(gt, gt_h);
    const long heap_before = gradsync_test::heap_allocations();
    const long kokkos_before = gradsync_test::kokkos_counts().allocations;
    if (dopt.synchronize()) {
      dopt.clip_grad_norm(0.5);
      dopt.apply();
    }
    heap += gradsync_test::heap_allocations() - heap_before;
    kokkos += gradsync_test::kokkos_counts().allocations - kokkos_before;
  };
  pass(0);
  pass(1);                                    // the first full cycle builds every plan and table
  REQUIRE(gradsync_test::kokkos_counting());  // Kokkos allocations are counted by the test main
  heap = kokkos = 0;
  {
    const gradsync_test::DeepCopiesUncounted uncounted;  // Kokkos' own heap use when it reports copies
    for (int p = 2; p < 12; ++p) pass(p);
  }
  CAPTURE(heap);
  CAPTURE(kokkos);
  CAPTURE(gradsync_test::last_kokkos_allocation());
  GRADSYNC_CHECK_ALL(heap == 0 && kokkos == 0);
  GRADSYNC_CHECK_ALL(sync.stats().steps == 6 && dopt.optimizer().step_count(0) == 6);
  GRADSYNC_CHECK_ALL(sync.stats().bytes_allreduced == 6 * 300 * sizeof(double));
}

TEST_CASE("global_norm in float accumulates in double") {
  const int rank = world_rank(), size = world_size();
  using FView = Kokkos::View<float*>;
  using FSync = gradsync::GradientSync<gradsync::MpiBackend, FView>;
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<FView>(), FSync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  FView w("w", 6), gw("gw", 6), a("a", std::size_t(2 + rank)), ga("ga", std::size_t(2 + rank)), c("c", 1), gc("gc", 1);
  dopt.add<Dense>(w, gw);
  dopt.add<Tower>(a, ga);
  dopt.add<Dense>(c, gc);
  dopt.register_local_var(c);
  const RankGrads mine = rank_grads(rank);
  fill_host(gw, [&](std::size_t i) { return float(mine.w[i]); });
  fill_host(ga, [&](std::size_t i) { return float(mine.a[i]); });
  Kokkos::deep_copy(gc, float(mine.c));
  GRADSYNC_CHECK_ALL(dopt.synchronize());
  const double norm = dopt.global_norm(), expect = single_process_norm(size);
  CAPTURE(norm);
  CAPTURE(expect);
  GRADSYNC_CHECK_ALL(rel_err(norm, expect) < 1e-6);
}

TEST_CASE("broadcast_parameters and global_norm through staging copies") {
  const int rank = world_rank(), size = world_size(), root = size - 1;
  using USync = gradsync::GradientSync<BlindBackend, View>;
  gradsync::DistributedOptimizer dopt(gradsync::Adam<View>(), USync(BlindBackend(MPI_COMM_WORLD)));
  View a("a", 7), ga("ga", 7), t("t", std::size_t(1 + rank)), gt("gt", std::size_t(1 + rank));
  dopt.add<Dense>(a, ga);
  dopt.add<Tower>(t, gt);
  fill_host(a, [&](std::size_t i) { return init_value(rank, 0, i); });
  fill_host(ga, [&](std::size_t i) { return std::sin(rank + 0.5 * double(i)); });
  fill_host(t, [&](std::size_t i) { return init_value(rank, 1, i); });
  fill_host(gt, [&](std::size_t i) { return std::cos(rank + double(i)); });
  for (int s = 0; s <= rank; ++s) dopt.apply();
  const std::vector<double> a0 = host_values(a), t0 = host_values(t);
  const std::vector<double> sa0 = state_of(dopt.optimizer(), 0), st0 = state_of(dopt.optimizer(), 1);
  dopt.broadcast_parameters(root);
  bool ok = host_values(a) == bcast_copy(a0, root) && state_of(dopt.optimizer(), 0) == bcast_copy(sa0, root) &&
            host_values(t) == t0 && state_of(dopt.optimizer(), 1) == st0;
  GRADSYNC_CHECK_ALL(ok);
  GRADSYNC_CHECK_ALL(dopt.synchronize());  // the sync stages its fused chunks through host memory too
  double sq = 0;
  for (int r = 0; r < size; ++r)
    for (std::size_t i = 0; i < std::size_t(1 + r); ++i) sq += std::pow(std::cos(r + double(i)) / size, 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    double avg = 0;
    for (int r = 0; r < size; ++r) avg += std::sin(r + 0.5 * double(i)) / size;
    sq += avg * avg;
  }
  const double norm = dopt.global_norm();
  CAPTURE(norm);
  GRADSYNC_CHECK_ALL(rel_err(norm, std::sqrt(sq)) < 1e-14);
}

TEST_CASE("DistributedOptimizer::add refuses a wrong gradient size, an overlap, a strided parameter") {
  const std::string add = "gradsync: DistributedOptimizer::add: ";
  const std::string on_rank = " on rank " + std::to_string(world_rank());
  gradsync::DistributedOptimizer<AddGrad, Sync> dopt(AddGrad{}, Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  View w("w", 10), gw("gw", 10), b("b", 4), gb9("gb9", 9), gb4("gb4", 4);
  dopt.add<Dense>(w, gw, "w");
  const std::string sizes = error_of([&] { dopt.add<Dense>(b, gb9, "b"); });
  CHECK(sizes == add + "parameter 'b' (group Dense) has 4 values but its gradient has 9" + on_rank);
  const std::string twice = error_of([&] { dopt.add<Dense>(w, gw, "w again"); });
  CHECK(twice == add + "parameter 'w again' (group Dense) overlaps parameter 'w' already registered" + on_rank +
                     " (the same parameter registered twice)");
  const auto tail = Kokkos::subview(w, std::make_pair(6, 10));
  const std::string overlap = error_of([&] { dopt.add<Tower>(tail, gb4, "tail"); });
  CHECK(overlap == add + "parameter 'tail' (group Tower) overlaps parameter 'w' already registered" + on_rank);
  Kokkos::View<double**, Kokkos::LayoutRight> m("m", 4, 3);  // a column strided on every backend
  const auto column = Kokkos::subview(m, Kokkos::ALL, 1);    // stride 3
  const std::string strided = error_of([&] { dopt.add<Dense>(column, gb4, "m.col1"); });
  CHECK(strided == add + "parameter 'm.col1' (group Dense) is not contiguous");
  // A refused add leaves the sync and the optimizer as they were.
  CHECK(dopt.sync().num_tensors() == 1);
  CHECK(dopt.optimizer().pairs.size() == 1);
}

namespace {
// Sgd that refuses a parameter of 7 values once the sync has its gradient, as an optimizer whose
// state allocation failed would.
using BaseSgd = gradsync::Sgd<View>;  // (inside, View is the optimizer's own member type)
struct PickySgd : BaseSgd {
  using BaseSgd::BaseSgd;
  template <class P, class G>
  std::size_t add(const P& p, const G& g) {
    if (p.size() == 7) throw std::runtime_error("PickySgd: no room for 7 values");
    return BaseSgd::add(p, g);
  }
};
}  // namespace

TEST_CASE("DistributedOptimizer::add is all or nothing: a refusal after the sync took the gradient leaves none") {
  const int n = world_size(), rank = world_rank();
  gradsync::SgdOptions so;
  so.lr = 0.5;
  gradsync::DistributedOptimizer<PickySgd, Sync> dopt(PickySgd(so), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  std::vector<int> everyone;
  for (int r = 0; r < n; ++r) everyone.push_back(r);
  dopt.sync().bind_process_set<Everyone>(everyone);
  View w("w", 5), gw("gw", 5), t("t", 3), gt("gt", 3), bad("bad", 7), gbad("gbad", 7);
  View x("x", 4), gx("gx", 4), s("s", 2), gs("gs", 2);
  dopt.add<Dense>(w, gw);  // Dense[0]
  dopt.add<Tower>(t, gt);  // Tower[0]: its scale folded into the update (Sgd has set_grad_scale)

  // The optimizer refuses after the sync registered the gradient: data-parallel, local with its
  // scale deferred, over a process set.
  const std::string refused = "PickySgd: no room for 7 values";
  CHECK(error_of<std::runtime_error>([&] { dopt.add<Dense>(bad, gbad); }) == refused);
  CHECK(error_of<std::runtime_error>([&] { dopt.add<Tower>(bad, gbad, "bad tower"); }) == refused);
  CHECK(error_of<std::runtime_error>([&] { dopt.add<Replicated>(bad, gbad); }) == refused);
  // The sync refuses: the gradient overlaps one registered (the parameters do not).
  const std::string by_sync = error_of([&] { dopt.add<Dense>(x, Kokkos::subview(gw, std::make_pair(1, 5))); });
  CHECK(by_sync ==
        "gradsync: tensor 'Dense[1]' (group Dense) overlaps tensor 'Dense[0]' (group Dense) already "
        "registered");
  // This object refuses before anything: a gradient of another size.
  const std::string sizes = error_of([&] { dopt.add<Dense>(x, gbad); });
  CHECK(sizes ==
        "gradsync: DistributedOptimizer::add: parameter 'Dense[1]' (group Dense) has 4 values but its "
        "gradient has 7 on rank " +
            std::to_string(rank));
  CHECK(dopt.num_params() == 2);
  CHECK(dopt.sync().num_tensors() == 2);
  CHECK(dopt.optimizer().num_params() == 2);

  // Correct adds after the refusals: the default names count the registered parameters only.
  dopt.add<Dense>(x, gx);
  dopt.add<Replicated>(s, gs);
  const std::string again = error_of([&] { dopt.add<Dense>(x, gx); });
  CHECK(again ==
        "gradsync: DistributedOptimizer::add: parameter 'Dense[2]' (group Dense) overlaps parameter "
        "'Dense[1]' already registered on rank " +
            std::to_string(rank) + " (the same parameter registered twice)");
  CHECK(dopt.num_params() == 4);
  CHECK(dopt.sync().num_tensors() == 4);
  CHECK(dopt.optimizer().num_params() == 4);

  // Two steps, analytic: p -= lr * g with g the rank average (Dense, Replicated) or this rank's
  // gradient / n (Tower); the refused gradient is nobody's and keeps this rank's values.
  const auto grad_of = [&](std::size_t i) { return double(rank + 1) * double(i + 1); };
  for (const View& p : {w, t, x, s}) fill_host(p, [](std::size_t) { return 1.0; });
  fill_host(gbad, [&](std::size_t) { return 100.0 + rank; });
  for (int step = 1; step <= 2; ++step) {
    for (const View& g : {gw, gt, gx, gs}) fill_host(g, grad_of);
    REQUIRE(dopt.step());
    double worst = 0;
    const double mean = double(n + 1) / 2;
    for (const View& p : {w, x, s}) {
      const auto h = host_copy(p);
      for (std::size_t i = 0; i < h.size(); ++i)
        worst = std::max(worst, rel_err(h(i), 1 - step * 0.5 * mean * (i + 1)));
    }
    const auto ht = host_copy(t);
    for (std::size_t i = 0; i < ht.size(); ++i)
      worst = std::max(worst, rel_err(ht(i), 1 - step * 0.5 * grad_of(i) / n));
    const auto hb = host_copy(gbad);
    for (std::size_t i = 0; i < hb.size(); ++i) worst = std::max(worst, rel_err(hb(i), 100.0 + rank));
    CAPTURE(step);
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst < 1e-14);
  }
}
