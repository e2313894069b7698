// The local scale without a pass of its own (issue 18, item 2): when a DistributedOptimizer owns the
// sync, the local groups' 1/world_size (and 1/N) goes into the optimizer's update kernel. The
// parameters must equal, to the last bit, those of the same training with the sync's own pass
// (fold_local_scale(false), the former behaviour), and the analytic update; and a plain
// GradientSync can hand the factor out instead of applying it.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <gradsync/gradsync.hpp>
#include <string>
#include <vector>

#include "gradsync_test.hpp"
#include "local_scale_probe.hpp"

using gradsync_test::fill_host;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Trunk {};
struct Table {};
struct Tower {};
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Table> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

namespace {

// A gradient value with a nontrivial rounding under 1/n for n = 3 (and under 1/N).
double grad_value(int rank, int step, int pass, std::size_t tensor, std::size_t i) {
  return std::sin(0.37 * double(i) + 1.1 * rank + 0.5 * step + 0.3 * pass + 0.9 * double(tensor)) * 1.7 +
         1e-3 * double(rank + 1);
}

template <class T>
bool bit_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// One model: a data-parallel trunk, a local table (1/n), a local tower (no scale) and a trunk bias
// made local at run time (1/n through scale_local_gradients). Rank-dependent local sizes.
template <class T, class Opt>
struct Model {
  using View = Kokkos::View<T*>;
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
  std::vector<View> p, g;
  gradsync::DistributedOptimizer<Opt, Sync> dopt;

  Model(Opt opt, gradsync::Options o) : dopt(std::move(opt), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o)) {
    const int r = world_rank();
    const std::size_t sizes[4] = {7, std::size_t(5 + r), std::size_t(3 + 2 * r), 2};
    for (std::size_t k = 0; k < 4; ++k) {
      p.emplace_back("p" + std::to_string(k), sizes[k]);
      g.emplace_back("g" + std::to_string(k), sizes[k]);
      fill_host(p.back(), [&](std::size_t i) { return 0.1 * double(i) - 0.2 * double(k) + 0.01 * r; });
    }
    dopt.template add<Trunk>(p[0], g[0], "trunk");
    dopt.template add<Table>(p[1], g[1], "table");
    dopt.template add<Tower>(p[2], g[2], "tower");
    dopt.template add<Trunk>(p[3], g[3], "bias");
    dopt.register_local_var(p[3]);
  }

  // One step of N passes; clip_grad_norm on odd steps when `clip` (below the norm: it scales).
  void step(int s, int N, bool clip) {
    for (int pass = 0; pass < N; ++pass) {
      for (std::size_t k = 0; k < 4; ++k)
        fill_host(g[k], [&](std::size_t i) { return grad_value(world_rank(), s, pass, k, i); });
      const bool ready = dopt.synchronize();
      REQUIRE(ready == (pass + 1 == N));
    }
    if (clip && s % 2 == 1) dopt.clip_grad_norm(0.5);
    dopt.apply();
  }

  std::vector<std::vector<T>> params() const {
    std::vector<std::vector<T>> out;
    for (const View& v : p) out.push_back(host_values(v));
    return out;
  }
};

template <class T, class Opt>
void compare_paths(const Opt& opt, const char* what) {
  const int n = world_size();
  for (int N : {1, 2}) {
    for (bool average : {false, true}) {
      for (bool clip : {false, true}) {
        if (N == 1 && average) continue;
        CAPTURE(what);
        CAPTURE(N);
        CAPTURE(average);
        CAPTURE(clip);
        gradsync::Options o;
        o.backward_passes_per_step = N;
        o.average_aggregated_gradients = average;
        Model<T, Opt> folded(opt, o), pass(opt, o);
        pass.dopt.fold_local_scale(false);
        CHECK(folded.dopt.folds_local_scale());
        CHECK_FALSE(pass.dopt.folds_local_scale());
        bool same = true;
        double norm_diff = 0;
        for (int s = 0; s < 4; ++s) {
          folded.step(s, N, clip);
          pass.step(s, N, clip);
          const auto a = folded.params(), b = pass.params();
          for (std::size_t k = 0; k < a.size(); ++k) same = same && bit_equal(a[k], b[k]);
          // The norm sees the factor while it is pending, as the pass would have left the values.
          if (!clip) norm_diff = std::max(norm_diff, std::abs(folded.dopt.global_norm() - pass.dopt.global_norm()));
        }
        // The folded path leaves the table's unscaled sum with its factor pending (unless it is 1).
        const T f = gradsync_test::deferred_scale(folded.dopt.sync(), folded.g[1]);
        const T expect_f = T(1) / T(n) * (average ? T(1) / T(N) : T(1));
        CHECK(gradsync_test::all_ranks(f == expect_f));
        CHECK(gradsync_test::all_ranks(gradsync_test::deferred_scale(folded.dopt.sync(), folded.g[2]) ==
                                       (average ? T(1) / T(N) : T(1))));
        CHECK(gradsync_test::all_ranks(gradsync_test::deferred_scale(folded.dopt.sync(), folded.g[0]) == T(1)));
        CHECK(gradsync_test::all_ranks(same));
        CHECK(gradsync_test::all_ranks(norm_diff == 0));
      }
    }
  }
}

}  // namespace

TEST_CASE("folded local scale: Sgd (plain, momentum, Nesterov, weight decay) bit-equal to the sync's pass") {
  gradsync::SgdOptions so;
  so.lr = 0.05;
  compare_paths<double>(gradsync::Sgd<Kokkos::View<double*>>(so), "sgd");
  compare_paths<float>(gradsync::Sgd<Kokkos::View<float*>>(so), "sgd float");
  so.momentum = 0.9;
  so.dampening = 0.1;
  so.weight_decay = 0.01;
  compare_paths<double>(gradsync::Sgd<Kokkos::View<double*>>(so), "sgd momentum");
  so.dampening = 0;
  so.nesterov = true;
  so.maximize = true;
  compare_paths<float>(gradsync::Sgd<Kokkos::View<float*>>(so), "sgd nesterov maximize float");
}

TEST_CASE("folded local scale: Adam, AdamW, amsgrad bit-equal to the sync's pass") {
  gradsync::AdamOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.02;
  compare_paths<double>(gradsync::Adam<Kokkos::View<double*>>(ao), "adam");
  gradsync::AdamWOptions aw;
  aw.amsgrad = true;
  compare_paths<float>(gradsync::AdamW<Kokkos::View<float*>>(aw), "adamw amsgrad float");
  compare_paths<double>(gradsync::AdamW<Kokkos::View<double*>>(aw), "adamw amsgrad");
}

TEST_CASE("folded local scale: plain SGD equals the analytic update, and the sync made no pass") {
  const int r = world_rank(), n = world_size();
  using View = Kokkos::View<double*>;
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
  gradsync::SgdOptions so;
  so.lr = 0.5;
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(so), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  View w("w", 3), gw("gw", 3), t("t", std::size_t(2 + r)), gt("gt", std::size_t(2 + r));
  fill_host(w, [](std::size_t i) { return double(i); });
  fill_host(t, [](std::size_t i) { return 1.0 + double(i); });
  dopt.add<Trunk>(w, gw);
  dopt.add<Table>(t, gt);
  fill_host(gw, [&](std::size_t i) { return double(r + 1) * double(i + 1); });
  fill_host(gt, [&](std::size_t i) { return 3.0 * double(r + 1) + double(i); });
  REQUIRE(dopt.step());
  const auto wv = host_values(w), tv = host_values(t), gtv = host_values(gt);
  double err = 0;
  const double sum_r = double(n) * double(n + 1) / 2;  // sum over ranks of (r + 1)
  for (std::size_t i = 0; i < 3; ++i)
    err = std::max(err, gradsync_test::rel_err(wv[i], double(i) - 0.5 * sum_r * double(i + 1) / n));
  for (std::size_t i = 0; i < tv.size(); ++i) {
    const double g = 3.0 * double(r + 1) + double(i);
    err = std::max(err, gradsync_test::rel_err(gtv[i], g));  // no pass: the unscaled sum is still there
    err = std::max(err, gradsync_test::rel_err(tv[i], 1.0 + double(i) - 0.5 * g / n));
  }
  CAPTURE(err);
  CHECK(gradsync_test::all_ranks(err < 1e-15));
  CHECK(gradsync_test::all_ranks(gradsync_test::pending_scale(dopt.sync(), gt) == (n > 1 ? 1.0 / n : 1.0)));
  CHECK(gradsync_test::all_ranks(gradsync_test::pending_scale(dopt.sync(), gw) == 1.0));
}

TEST_CASE("a plain GradientSync hands the factor out instead of the pass, and applies it on request") {
  const int r = world_rank(), n = world_size();
  using View = Kokkos::View<float*>;
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
  for (int N : {1, 3}) {
    CAPTURE(N);
    gradsync::Options o;
    o.backward_passes_per_step = N;
    o.average_aggregated_gradients = N > 1;
    Sync deferred(gradsync::MpiBackend(MPI_COMM_WORLD), o), today(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    View a("a", 11), b("b", 11), c("c", std::size_t(4 + r)), d("d", std::size_t(4 + r));
    deferred.add<Trunk>(a);
    deferred.add<Table>(c);
    today.add<Trunk>(b);
    today.add<Table>(d);
    gradsync::impl::SyncAccess::defer_local_scale(deferred, c);
    gradsync::impl::SyncAccess::defer_local_scale(deferred,
                                                  a);  // data-parallel: no local scale to defer, nothing changes
    std::vector<float> raw_sum(c.size(), 0.f);
    for (int pass = 0; pass < N; ++pass) {
      const auto f = [&](std::size_t i) { return float(grad_value(r, 0, pass, 1, i)); };
      fill_host(c, f);
      fill_host(d, f);
      fill_host(a, f);
      fill_host(b, f);
      for (std::size_t i = 0; i < raw_sum.size(); ++i) raw_sum[i] += f(i);
      const bool ready = deferred.synchronize();  // one after the other: each sync has its own communicator
      CHECK(ready == today.synchronize());
      CHECK_FALSE(gradsync::impl::SyncAccess::local_scale_pending(deferred) != (pass + 1 == N && (n > 1 || N > 1)));
    }
    const float factor = gradsync_test::deferred_scale(deferred, c);
    CHECK(factor == float(1) / float(n) * (N > 1 ? float(1) / float(N) : float(1)));
    CHECK(gradsync_test::pending_scale(deferred, c) == (n > 1 || N > 1 ? factor : 1.f));
    const auto cv = host_values(c), dv = host_values(d);
    bool same_after_factor = true, raw = true;
    for (std::size_t i = 0; i < cv.size(); ++i) {
      same_after_factor = same_after_factor && float(cv[i] * gradsync_test::pending_scale(deferred, c)) == dv[i];
      raw = raw && (N > 1 || cv[i] == raw_sum[i]);  // no pass touched it (N = 1)
    }
    CHECK(gradsync_test::all_ranks(same_after_factor && raw));
    CHECK(gradsync_test::all_ranks(bit_equal(host_values(a), host_values(b))));
    gradsync::impl::SyncAccess::apply_local_scale(deferred);
    CHECK_FALSE(gradsync::impl::SyncAccess::local_scale_pending(deferred));
    CHECK(gradsync_test::pending_scale(deferred, c) == 1.f);
    CHECK(gradsync_test::all_ranks(bit_equal(host_values(c), host_values(d))));
  }
}

TEST_CASE("local scale deferral: errors") {
  using View = Kokkos::View<double*>;
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
  gradsync::Options o;
  o.backward_passes_per_step = 2;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View g("g", 3), other("other", 3);
  sync.add<Table>(g, "emb");
  try {
    gradsync::impl::SyncAccess::defer_local_scale(sync, other);
    FAIL("no error for an unregistered tensor");
  } catch (const gradsync::Error& e) {
    CHECK(has(e.what(), "defer_local_scale: the tensor (3 elements) is not registered"));
  }
  CHECK_FALSE(sync.synchronize());
  try {
    gradsync::impl::SyncAccess::defer_local_scale(sync, g);
    FAIL("no error inside an aggregation cycle");
  } catch (const gradsync::Error& e) {
    CHECK(has(e.what(), "defer_local_scale('emb', group"));
    CHECK(has(e.what(), "after pass 1 of 2"));
  }
  CHECK(sync.synchronize());

  // An optimizer without set_grad_scale keeps the sync's pass and cannot be asked to fold.
  struct Plain {
    std::size_t add(const View&, const View&) { return 0; }
    void step() {}
  };
  gradsync::DistributedOptimizer dopt(Plain{}, Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  CHECK_FALSE(dopt.folds_local_scale());
  CHECK_THROWS_AS(dopt.fold_local_scale(true), gradsync::ConfigError);
}
