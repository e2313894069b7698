// Process sets (issue 18, item 3): groups reduced over a subset of the ranks, one communicator per
// set, the scale written down in process_set.hpp, checked against analytic per-rank values; the
// ranks agree on errors (MismatchError everywhere, naming the set and the ranks).
#include <cmath>
#include <cstdint>
#include <exception>
#include <gradsync/gradsync.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "blind_backend.hpp"
#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::BlindBackend;
using gradsync_test::fill_host;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::rel_err;
using gradsync_test::state_of;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Pairs {};        // a kind of set: consecutive pairs of ranks {0,1}, {2,3}, ...
struct Shard {};        // reduced over the pair, / world size
struct ShardAvg {};     // reduced over the pair, / set size
struct SparseShard {};  // row-sparse over the pair
struct Dense {};
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Shard> : gradsync::ReduceOver<Pairs> {};
template <>
struct gradsync::LocalVarPolicy<ShardAvg> : gradsync::ReduceOver<Pairs, gradsync::SetScale::set_size> {};
template <>
struct gradsync::LocalVarPolicy<SparseShard> : gradsync::ReduceOver<Pairs> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

std::vector<int> pair_of(int r, int n) {
  std::vector<int> s{r - r % 2};
  if (s[0] + 1 < n) s.push_back(s[0] + 1);
  return s;
}
double g_of(int r, int pass, std::size_t i) { return std::cos(0.4 * double(i) + r + 0.25 * pass) + 0.1 * r; }

}  // namespace

TEST_CASE("process sets: a group summed over its pair of ranks, scaled by world or set size") {
  const int r = world_rank(), n = world_size();
  const auto set = pair_of(r, n);
  for (int N : {1, 2}) {
    CAPTURE(N);
    gradsync::Options o;
    o.backward_passes_per_step = N;
    o.average_aggregated_gradients = N > 1;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.bind_process_set<Pairs>(set);
    // Sizes differ between pairs (a shard's tables), agree within one.
    const std::size_t size = 3 + std::size_t(set[0]);
    View a("a", size), b("b", 4), d("d", 5);
    sync.add<Dense>(d);
    sync.add<Shard>(a, "a");
    sync.add<ShardAvg>(b, "b");
    for (int pass = 0; pass < N; ++pass) {
      gradsync_test::fill_host(a, [&](std::size_t i) { return g_of(r, pass, i); });
      gradsync_test::fill_host(b, [&](std::size_t i) { return g_of(r, pass, i + 7); });
      gradsync_test::fill_host(d, [&](std::size_t i) { return g_of(r, pass, i + 3); });
      CHECK(sync.synchronize() == (pass + 1 == N));
    }
    double err = 0;
    const auto av = host_values(a), bv = host_values(b), dv = host_values(d);
    for (std::size_t i = 0; i < size; ++i) {
      double want = 0;
      for (int q : set)
        for (int p = 0; p < N; ++p) want += g_of(q, p, i);
      err = std::max(err, rel_err(av[i], want / N / n));
    }
    for (std::size_t i = 0; i < 4; ++i) {
      double want = 0;
      for (int q : set)
        for (int p = 0; p < N; ++p) want += g_of(q, p, i + 7);
      err = std::max(err, rel_err(bv[i], want / N / double(set.size())));
    }
    for (std::size_t i = 0; i < 5; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q)
        for (int p = 0; p < N; ++p) want += g_of(q, p, i + 3);
      err = std::max(err, rel_err(dv[i], want / N / n));
    }
    CAPTURE(err);
    CHECK(all_ranks(err < 1e-14));
    CHECK(sync.stats().process_set_calls == 2);
    CHECK(sync.stats().process_set_bytes == (size + 4) * sizeof(double));
    CHECK(sync.stats().bytes_allreduced == 5 * sizeof(double));
  }
}

TEST_CASE("process sets: row-sparse rows summed over the pair") {
  const int r = world_rank(), n = world_size();
  const auto set = pair_of(r, n);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  sync.bind_process_set<Pairs>(set);
  Kokkos::View<double**, Kokkos::LayoutRight> rows("rows", 4, 2);
  Kokkos::View<int*> ids("ids", 4);
  gradsync::RowSparse g(rows, ids, 1000);
  sync.add<SparseShard>(g, "emb");
  auto hv = gradsync_test::host_mirror(rows);
  auto hi = gradsync_test::host_mirror(ids);
  // Rank r touches rows {r, 500}: the pair's union is {q for q in set} plus 500.
  hi(0) = r;
  hi(1) = 500;
  for (int j = 0; j < 2; ++j) hv(0, std::size_t(j)) = 1 + r + j, hv(1, std::size_t(j)) = 10 * (r + 1) + j;
  gradsync_test::upload(rows, hv);
  gradsync_test::upload(ids, hi);
  g.set_rows(2);
  CHECK(sync.synchronize());
  const auto v = gradsync_test::host_copy(rows);
  const auto x = gradsync_test::host_copy(ids);
  bool ok = g.rows() == std::int64_t(set.size()) + 1;
  std::size_t u = 0;
  for (int q : set) {
    ok = ok && x(u) == q;
    for (int j = 0; j < 2; ++j) ok = ok && std::abs(v(u, std::size_t(j)) - double(1 + q + j) / n) < 1e-15;
    ++u;
  }
  ok = ok && x(u) == 500;
  for (int j = 0; j < 2; ++j) {
    double want = 0;
    for (int q : set) want += 10 * (q + 1) + j;
    ok = ok && std::abs(v(u, std::size_t(j)) - want / n) < 1e-13;
  }
  CHECK(all_ranks(ok));
}

TEST_CASE("process sets: errors") {
  const int r = world_rank(), n = world_size();
  GRADSYNC_SUBCASE_FROM_RANKS(2, "sets that do not fit together", "sets that do not fit together need two ranks") {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    sync.bind_process_set<Pairs>(r == 0 ? std::vector<int>{0, 1} : std::vector<int>{r});
    View a("a", 3);
    sync.add<Shard>(a);
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, "process sets") && has(msg, "rank 0's set of 2 ranks is bound by 1 of them") &&
                    has(msg, "partition")));
  }
  GRADSYNC_SUBCASE_FROM_RANKS(2, "members registering different tensors",
                              "members registering different tensors need a pair") {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    sync.bind_process_set<Pairs>(pair_of(r, n));
    View a("a", r == 1 ? 4 : 3);
    sync.add<Shard>(a);
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, "rank 1 registered other tensors") && has(msg, "than rank 0")));
  }
  GRADSYNC_SUBCASE_FROM_RANKS(2, "a kind of set bound on some ranks only",
                              "a kind bound on some ranks only needs another rank without it") {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    if (r == n - 1) sync.bind_process_set<Pairs>({r});
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, gradsync::impl::cat("rank(s) [", n - 1, "] bound other kinds of process sets"))));
  }
  SUBCASE("misuse caught where it happens") {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    View a("a", 3);
    try {
      sync.add<Shard>(a, "w");
      FAIL("no error");
    } catch (const gradsync::Error& e) {
      CHECK(has(e.what(), "tensor 'w' (group "));
      CHECK(has(e.what(), "Shard) is reduced over process set "));
      CHECK(has(e.what(), "bind_process_set<"));
    }
    CHECK_THROWS_AS(sync.bind_process_set<Pairs>({n}), gradsync::Error);
    CHECK_THROWS_AS(sync.bind_process_set<Pairs>({r, r}), gradsync::Error);
    sync.bind_process_set<Pairs>({r});
    CHECK_THROWS_AS(sync.bind_process_set<Pairs>({0, 1, 2, 3}), gradsync::Error);
  }
}

// ---- issue 29, item 7: process sets at scale and in 2-D ----

namespace {

struct Local {};  // a rank's own tower, / world size
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Local> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

// The communicator of this rank's pair, for the tests' own reference broadcasts.
MPI_Comm pair_comm() {
  const int r = world_rank();
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r - r % 2, r, &c);
  return c;
}

std::vector<double> bcast_in(std::vector<double> v, MPI_Comm c) {
  MPI_Bcast(v.data(), int(v.size()), MPI_DOUBLE, 0, c);
  return v;
}

// Every rank's gradients of a 2-D model: data-parallel d (5), a tower t of 2 + r values (local),
// a shard a of 3 + (its pair's first rank) values and b of 4 values reduced over the pair (a / n,
// b / |S|), and a row-sparse shard over the pair (rank r touches rows r and 500 of a 1000-row
// table of width 2).
double gd(int r, std::size_t i) { return std::sin(0.3 + r + 0.7 * double(i)); }
double gt(int r, std::size_t i) { return std::cos(1.1 * r + 0.2 * double(i)); }
double ga(int r, std::size_t i) { return std::cos(0.4 * double(i) + r) + 0.1 * r; }
double gb(int r, std::size_t i) { return std::sin(2.0 + 0.5 * r - 0.3 * double(i)); }
double gs(int r, int row, int j) { return row == 500 ? 10.0 * (r + 1) + j : 1.0 + r + j; }

// The norm the single-process model has: every tensor once, with the values the sync leaves
// (d averaged over n; t / n; a summed over its pair / n; b summed over its pair / |S|; the sparse
// rows summed over the pair / n).
double single_model_norm(int n) {
  double sq = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += gd(q, i);
    sq += (s / n) * (s / n);
  }
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < std::size_t(2 + q); ++i) sq += (gt(q, i) / n) * (gt(q, i) / n);
  for (int lead = 0; lead < n; lead += 2) {  // once per set, not once per member
    const auto set = pair_of(lead, n);
    for (std::size_t i = 0; i < 3 + std::size_t(lead); ++i) {
      double s = 0;
      for (int q : set) s += ga(q, i);
      sq += (s / n) * (s / n);
    }
    for (std::size_t i = 0; i < 4; ++i) {
      double s = 0;
      for (int q : set) s += gb(q, i);
      sq += (s / double(set.size())) * (s / double(set.size()));
    }
    for (int j = 0; j < 2; ++j) {
      double s500 = 0;
      for (int q : set) {
        sq += (gs(q, q, j) / n) * (gs(q, q, j) / n);  // row q: only rank q touches it
        s500 += gs(q, 500, j);
      }
      sq += (s500 / n) * (s500 / n);
    }
  }
  return std::sqrt(sq);
}

}  // namespace

TEST_CASE("global_norm and clip_grad_norm count each set-reduced shard once (weight 1/|S|)") {
  const int r = world_rank(), n = world_size();
  const auto set = pair_of(r, n);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  sync.bind_process_set<Pairs>(set);
  View d("d", 5), t("t", std::size_t(2 + r)), a("a", 3 + std::size_t(set[0])), b("b", 4);
  Kokkos::View<double**, Kokkos::LayoutRight> rows("rows", 4, 2);
  Kokkos::View<int*> ids("ids", 4);
  gradsync::RowSparse g(rows, ids, 1000);
  sync.add<Dense>(d, "d");
  sync.add<Local>(t, "t");
  sync.add<Shard>(a, "a");
  sync.add<ShardAvg>(b, "b");
  sync.add<SparseShard>(g, "emb");
  gradsync::GlobalNorm<Sync> norm;
  for (int step = 0; step < 2; ++step) {  // the second step reuses the segment table
    CAPTURE(step);
    gradsync_test::fill_host(d, [&](std::size_t i) { return gd(r, i); });
    gradsync_test::fill_host(t, [&](std::size_t i) { return gt(r, i); });
    gradsync_test::fill_host(a, [&](std::size_t i) { return ga(r, i); });
    gradsync_test::fill_host(b, [&](std::size_t i) { return gb(r, i); });
    auto hv = gradsync_test::host_mirror(rows);
    auto hi = gradsync_test::host_mirror(ids);
    hi(0) = r;
    hi(1) = 500;
    for (int j = 0; j < 2; ++j) hv(0, std::size_t(j)) = gs(r, r, j), hv(1, std::size_t(j)) = gs(r, 500, j);
    gradsync_test::upload(rows, hv);
    gradsync_test::upload(ids, hi);
    g.set_rows(2);
    REQUIRE(sync.synchronize());
    const double expect = single_model_norm(n), got = norm.norm(sync);
    CAPTURE(got);
    CAPTURE(expect);
    CHECK(all_ranks(rel_err(got, expect) < 1e-14));
    CHECK(all_ranks(rel_err(gradsync::global_norm(sync), expect) < 1e-14));
    // Clipping below the norm scales every gradient, the shards and the rows included, by one factor.
    const std::vector<double> d0 = host_values(d), a0 = host_values(a), b0 = host_values(b), t0 = host_values(t);
    const auto rows0 = host_values(rows);
    const double max_norm = 0.5 * expect, coef = max_norm / (expect + 1e-6);
    CHECK(all_ranks(rel_err(gradsync::clip_grad_norm(sync, max_norm), expect) < 1e-14));
    double err = 0;
    const auto scaled = [&](const std::vector<double>& before, const std::vector<double>& now) {
      for (std::size_t i = 0; i < before.size(); ++i) err = std::max(err, rel_err(now[i], before[i] * coef));
    };
    scaled(d0, host_values(d));
    scaled(t0, host_values(t));
    scaled(a0, host_values(a));
    scaled(b0, host_values(b));
    scaled(rows0, host_values(rows));
    CAPTURE(err);
    CHECK(all_ranks(err < 1e-15));
    CHECK(all_ranks(rel_err(norm.norm(sync), expect * coef) < 1e-14));
  }
}

namespace {

double init_value(int rank, int tag, std::size_t i) { return 100.0 * rank + 10.0 * tag + 0.5 * double(i); }

}  // namespace

TEST_CASE("broadcast_parameters: the replicas of a set-reduced parameter take its set's first rank's values") {
  const int r = world_rank(), n = world_size(), root = n - 1;
  const auto set = pair_of(r, n);
  MPI_Comm pc = pair_comm();
  using Opt = gradsync::Adam<View>;
  gradsync::DistributedOptimizer dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.sync().bind_process_set<Pairs>(set);
  // Data-parallel w (from root), a shard s over the pair (from the pair's first rank), a tower t
  // of 1 + r values (kept).
  View w("w", 4), gw("gw", 4), s("s", 3 + std::size_t(set[0])), gs_("gs", s.size()), t("t", std::size_t(1 + r)),
      gt_("gt", t.size());
  dopt.add<Dense>(w, gw, "w");
  dopt.add<Shard>(s, gs_, "s");
  dopt.add<Local>(t, gt_, "t");
  fill_host(w, [&](std::size_t i) { return init_value(r, 0, i); });
  fill_host(s, [&](std::size_t i) { return init_value(r, 1, i); });
  fill_host(t, [&](std::size_t i) { return init_value(r, 2, i); });
  // Rank r takes r + 1 unsynchronized steps: parameters, moments and step counts all differ.
  for (int k = 0; k <= r; ++k) {
    fill_host(gw, [&](std::size_t i) { return std::sin(1.0 + r + k + 0.3 * double(i)); });
    fill_host(gs_, [&](std::size_t i) { return std::cos(2.0 + r + k + 0.3 * double(i)); });
    fill_host(gt_, [&](std::size_t i) { return std::sin(3.0 + r + k + 0.3 * double(i)); });
    dopt.apply();
  }
  const std::vector<double> w0 = host_values(w), s0 = host_values(s), t0 = host_values(t);
  const std::vector<double> sw0 = state_of(dopt.optimizer(), 0), ss0 = state_of(dopt.optimizer(), 1),
                            st0 = state_of(dopt.optimizer(), 2);
  // Before any synchronize(): broadcast_parameters makes the sets' communicators itself.
  dopt.broadcast_parameters(root);
  std::vector<double> w_root = w0, sw_root = sw0;
  MPI_Bcast(w_root.data(), int(w_root.size()), MPI_DOUBLE, root, MPI_COMM_WORLD);
  MPI_Bcast(sw_root.data(), int(sw_root.size()), MPI_DOUBLE, root, MPI_COMM_WORLD);
  const std::vector<double> s_first = bcast_in(s0, pc), ss_first = bcast_in(ss0, pc);
  bool ok = host_values(w) == w_root && state_of(dopt.optimizer(), 0) == sw_root;
  ok = ok && host_values(s) == s_first && state_of(dopt.optimizer(), 1) == ss_first;
  ok = ok && dopt.optimizer().step_count(1) == set[0] + 1;  // the first rank took set[0] + 1 steps
  ok = ok && host_values(t) == t0 && state_of(dopt.optimizer(), 2) == st0;
  for (std::size_t i = 0; i < s.size(); ++i) ok = ok && s_first[i] != init_value(r, 1, i);  // it moved, then came
  CHECK(all_ranks(ok));
  // From the same start, synchronized steps keep the replicas identical within each set.
  for (int k = 0; k < 3; ++k) {
    fill_host(gw, [&](std::size_t i) { return std::cos(r + 2.0 * k + 0.1 * double(i)); });
    fill_host(gs_, [&](std::size_t i) { return std::sin(r + 2.0 * k + 0.1 * double(i)); });
    fill_host(gt_, [&](std::size_t i) { return std::cos(r - 2.0 * k + 0.1 * double(i)); });
    CHECK(all_ranks(dopt.step()));
  }
  CHECK(all_ranks(host_values(s) == bcast_in(host_values(s), pc) &&
                  host_values(w) == bcast_in(host_values(w), MPI_COMM_WORLD)));

  // A parameter the optimizer does not hold (a table updated by hand from a RowSparse gradient).
  View table("table", 6);
  fill_host(table, [&](std::size_t i) { return init_value(r, 3, i); });
  gradsync::broadcast_set_parameter<SparseShard>(dopt.sync(), table);
  std::vector<double> want(6);
  for (std::size_t i = 0; i < 6; ++i) want[i] = init_value(set[0], 3, i);
  CHECK(all_ranks(host_values(table) == want));
  MPI_Comm_free(&pc);
}

TEST_CASE("broadcast_parameters: set members that hold different parameters all throw") {
  const int r = world_rank(), n = world_size();
  GRADSYNC_SKIP_BELOW_RANKS(2, "set members that hold different parameters need a pair");
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.sync().bind_process_set<Pairs>(pair_of(r, n));
  View s("s", 3), gs_("gs", 3);
  // The sync's registrations agree within every pair; rank 1 registers its shard's gradient with the
  // sync only, so its optimizer holds no parameter for it: every rank throws, nothing is sent.
  if (r == 1)
    dopt.sync().add<Shard>(gs_, "s");
  else
    dopt.add<Shard>(s, gs_, "s");
  fill_host(s, [&](std::size_t i) { return init_value(r, 1, i); });
  const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { dopt.broadcast_parameters(0); });
  CAPTURE(msg);
  CHECK(all_ranks(r < 2 ? has(msg,
                              "Pairs [0, 1]: the set-reduced parameters of rank(s) 1 differ from "
                              "its first rank's (rank 0), first at set-reduced parameter #0")
                        : has(msg, "process set(s) of rank(s) 0, 1 (their error names the parameter)")));
  CHECK(
      all_ranks(host_values(s) == std::vector<double>{init_value(r, 1, 0), init_value(r, 1, 1), init_value(r, 1, 2)}));
}

TEST_CASE("broadcast_set_parameter: a size that differs within a set is one MismatchError on its members") {
  const int r = world_rank(), n = world_size();
  GRADSYNC_SKIP_BELOW_RANKS(2, "a set whose members differ needs a pair");
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  sync.bind_process_set<Pairs>(pair_of(r, n));
  View g("g", 3);
  sync.add<Shard>(g, "g");
  sync.prepare();  // the sets' communicators
  View table("table", r == 1 ? 7 : 6);
  fill_host(table, [&](std::size_t i) { return init_value(r, 3, i); });
  const std::string msg =
      gradsync_test::error_of<gradsync::MismatchError>([&] { gradsync::broadcast_set_parameter<Shard>(sync, table); });
  CAPTURE(msg);
  // Both members of pair {0, 1} throw the same message (an agreed mismatch); the other pairs broadcast.
  const std::string want = "gradsync: broadcast_set_parameter<" + gradsync::impl::type_name<Shard>() +
                           ">: process set " + gradsync::impl::type_name<Pairs>() +
                           " [0, 1]: rank 1's parameter differs in size from the set's first rank's (rank 0 has 6 "
                           "values, rank 1 has 7)";
  CHECK(all_ranks(r < 2 ? msg == want : msg.empty()));
  std::vector<double> kept(table.size());
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = init_value(r < 2 ? r : r - r % 2, 3, i);
  CHECK(all_ranks(host_values(table) == kept));  // nothing sent within the failed pair
  CHECK(all_ranks(r >= 2 || has(gradsync_test::error_of([&] { sync.prepare(); }), "this GradientSync failed")));
}

namespace {
// A backend whose calls take at most 4 elements (the backend concept's max_count(), backend.hpp),
// and so do the backends of its process sets: the pieces a user's backend with a limit gets.
template <class Base>
struct FourPerCall : Base {
  explicit FourPerCall(const Base& b) : Base(b) {}
  std::size_t max_count() const { return 4; }
  FourPerCall<gradsync::MpiBackend> split(int color, int key) const {
    return FourPerCall<gradsync::MpiBackend>(gradsync::MpiBackend::split(color, key));
  }
};
}  // namespace

TEST_CASE("process sets: tensors above the backend's count limit are reduced in pieces") {
  const int r = world_rank(), n = world_size();
  const auto set = pair_of(r, n);
  // Integer values and ReduceOp::sum: every partial sum is exact, so pieces must match exactly.
  const auto value = [](int q, std::size_t i) { return double((q + 1) * (int(i) + 1)); };
  const auto run = [&](auto backend) {
    using B = decltype(backend);
    gradsync::Options o;
    o.op = gradsync::ReduceOp::sum;
    gradsync::GradientSync<B, View> sync(backend, o);
    sync.template bind_process_set<Pairs>(set);
    View a("a", 11), b("b", 3), c("c", 8);
    sync.template add<Shard>(a, "a");
    sync.template add<ShardAvg>(b, "b");
    sync.template add<Shard>(c, "c");
    // max_count() 4: a: 4 + 4 + 3, b: 3, c: 4 + 4
    bool ok = true;
    std::string what;
    for (int step = 0; step < 2; ++step) {
      for (const View& v : {a, b, c}) fill_host(v, [&](std::size_t i) { return value(r, i); });
      try {
        ok = ok && sync.synchronize();
      } catch (const std::exception& e) {
        ok = false;
        what = e.what();
      }
      for (const View& v : {a, b, c}) {
        const auto h = host_values(v);
        for (std::size_t i = 0; i < h.size(); ++i) {
          double want = 0;
          for (int q : set) want += value(q, i);
          ok = ok && h[i] == want;
        }
      }
    }
    CAPTURE(what);
    CHECK(all_ranks(ok));
    CHECK(all_ranks(sync.stats().process_set_calls == 2 * 6 &&
                    sync.stats().process_set_bytes == 2 * 22 * sizeof(double)));
  };
  SUBCASE("in place") { run(FourPerCall<gradsync::MpiBackend>(gradsync::MpiBackend(MPI_COMM_WORLD))); }
  SUBCASE("through the host staging buffer") { run(FourPerCall<BlindBackend>(BlindBackend(MPI_COMM_WORLD))); }
}
