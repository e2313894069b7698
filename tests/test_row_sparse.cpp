// Row-sparse gradients (issue 18, item 1): local groups scale only the given rows; data-parallel
// groups sum every rank's rows (duplicates within and across ranks), by an allgather or, when the
// rows cover the table, by a densified allreduce; all ranks agree on the choice and on errors.
// References: per-rank values computed analytically on every rank and summed densely in double.
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <map>
#include <string>
#include <vector>

#include "blind_backend.hpp"
#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::BlindBackend;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Emb {};       // data-parallel (replicated) table
struct Sharded {};   // local table, 1/world_size
struct Unscaled {};  // local table, no scale
struct Dense {};
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Sharded> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Unscaled> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

namespace {

template <class T>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight>;
using Ids = Kokkos::View<int*>;
template <class T>
using RS = gradsync::RowSparse<Rows<T>, Ids>;
template <class T>
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>>;

// Rank r's rows this step: k(r) row numbers (with a duplicate when k > 2) in [0, table).
std::vector<int> rows_of(int r, std::int64_t table, int k, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < k; ++i) ids.push_back(int((std::int64_t(7 * i + 3 * r + salt) * 131) % table));
  if (k > 2) ids[std::size_t(k - 1)] = ids[0];  // a duplicate within the rank
  return ids;
}
double value_of(int r, int i, int j) { return std::sin(0.3 * i + 0.7 * j + 1.3 * r) + 0.01 * (r + 1); }

template <class T>
void fill(const RS<T>& g, const std::vector<int>& ids, int r) {
  auto v = gradsync_test::host_mirror(g.values());
  auto x = gradsync_test::host_mirror(g.indices());
  for (std::size_t i = 0; i < v.extent(0); ++i)
    for (std::size_t j = 0; j < v.extent(1); ++j) v(i, j) = T(-99);  // beyond rows(): must stay
  for (std::size_t i = 0; i < ids.size(); ++i) {
    x(i) = ids[i];
    for (std::size_t j = 0; j < v.extent(1); ++j) v(i, j) = T(value_of(r, int(i), int(j)));
  }
  gradsync_test::upload(g.values(), v);
  gradsync_test::upload(g.indices(), x);
  g.set_rows(std::int64_t(ids.size()));
}

// The expected union (ascending) and the rows' sums over ranks times `factor`, in double.
std::map<int, std::vector<double>> expected(std::int64_t table, int width, const std::vector<int>& k, int salt,
                                            double factor) {
  std::map<int, std::vector<double>> m;
  for (int r = 0; r < int(k.size()); ++r) {
    const auto ids = rows_of(r, table, k[std::size_t(r)], salt);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      auto& row = m[ids[i]];
      row.resize(std::size_t(width), 0.0);
      for (int j = 0; j < width; ++j) row[std::size_t(j)] += value_of(r, int(i), j) * factor;
    }
  }
  return m;
}

template <class T>
double error_against(const RS<T>& g, const std::map<int, std::vector<double>>& want, bool& rows_ok) {
  const auto v = gradsync_test::host_copy(g.values());
  const auto x = gradsync_test::host_copy(g.indices());
  rows_ok = g.rows() == std::int64_t(want.size());
  double err = 0;
  std::size_t u = 0;
  for (const auto& [row, vals] : want) {
    if (!rows_ok || u >= std::size_t(g.rows())) break;
    rows_ok = rows_ok && x(u) == row;
    for (std::size_t j = 0; j < vals.size(); ++j) err = std::max(err, gradsync_test::rel_err(double(v(u, j)), vals[j]));
    ++u;
  }
  return err;
}

template <class T, class Backend = gradsync::MpiBackend>
void data_parallel_case(std::int64_t table, int width, int base_k, gradsync::Options o, bool expect_dense, double tol) {
  const int r = world_rank(), n = world_size();
  std::vector<int> k;
  for (int p = 0; p < n; ++p) k.push_back(p == 1 ? 0 : base_k + p);  // rank 1 (if any) has no rows
  int total = 0, widest = 1;
  for (int x : k) total += x, widest = std::max(widest, x);
  const int cap = std::max(widest, int(std::min<std::int64_t>(total, table)));
  gradsync::GradientSync<Backend, Kokkos::View<T*>> sync(Backend(MPI_COMM_WORLD), o);
  Kokkos::View<T*> dense("dense", 5);
  gradsync_test::fill_host(dense, [&](std::size_t i) { return double(r + 1) * double(i + 1); });
  sync.template add<Dense>(dense, "dense");
  RS<T> g(Rows<T>("rows", std::size_t(cap), std::size_t(width)), Ids("ids", std::size_t(cap)), table);
  sync.template add<Emb>(g, "emb");
  double factor = o.prescale_factor * o.postscale_factor / (o.op == gradsync::ReduceOp::average ? n : 1);
  for (int step = 0; step < 2; ++step) {
    fill(g, rows_of(r, table, k[std::size_t(r)], step), r);
    gradsync_test::fill_host(dense, [&](std::size_t i) { return double(r + 1) * double(i + 1); });
    const auto before = sync.stats();
    CHECK(sync.synchronize());
    bool rows_ok = false;
    const double err = error_against(g, expected(table, width, k, step, factor), rows_ok);
    CAPTURE(err);
    CHECK(all_ranks(rows_ok));
    CHECK(all_ranks(err < tol));
    const double sum_r = double(n) * double(n + 1) / 2;
    const auto dv = host_values(dense);
    double derr = 0;
    for (std::size_t i = 0; i < dv.size(); ++i)
      derr = std::max(derr, gradsync_test::rel_err(dv[i], sum_r * double(i + 1) * factor));
    CHECK(all_ranks(derr < tol));
    const auto after = sync.stats();
    CHECK(after.row_sparse_densified - before.row_sparse_densified == (expect_dense ? 1u : 0u));
    CHECK(after.row_sparse_collectives - before.row_sparse_collectives == (expect_dense ? 1u : 2u));
    // The dense chunks' bytes are the dense tensor's only.
    CHECK(after.bytes_allreduced - before.bytes_allreduced == 5 * sizeof(T));
  }
}

}  // namespace

TEST_CASE("row-sparse, local group: only the given rows are scaled") {
  const int r = world_rank(), n = world_size();
  Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  const int cap = 6 + r;  // sizes differ by rank: local groups may
  RS<double> a(Rows<double>("a", std::size_t(cap), 3), Ids("ia", std::size_t(cap)), 1000000);
  RS<double> b(Rows<double>("b", 4, 2), Ids("ib", 4), 50);
  sync.add<Sharded>(a, "table a");
  sync.add<Unscaled>(b, "table b");
  for (int step = 0; step < 2; ++step) {
    const auto ia = rows_of(r, 1000000, 3 + step + (r % 2), step), ib = rows_of(r, 50, 2, step);
    fill(a, ia, r);
    fill(b, ib, r);
    CHECK(sync.synchronize());
    const auto av = gradsync_test::host_copy(a.values()), bv = gradsync_test::host_copy(b.values());
    bool ok = a.rows() == std::int64_t(ia.size()) && b.rows() == 2;
    for (int i = 0; i < cap; ++i)
      for (int j = 0; j < 3; ++j) {
        const double want = i < int(ia.size()) ? double(value_of(r, i, j)) * (1.0 / n) : -99.0;
        ok = ok && av(std::size_t(i), std::size_t(j)) == want;  // the same rounding as a dense pass
      }
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) ok = ok && bv(std::size_t(i), std::size_t(j)) == (i < 2 ? value_of(r, i, j) : -99.0);
    CHECK(all_ranks(ok));
    CHECK(sync.stats().row_sparse_collectives == 0);
    CHECK(sync.stats().bytes_allreduced == 0);
  }
}

TEST_CASE("row-sparse, data-parallel: allgather of rows, duplicates summed, average and sum") {
  data_parallel_case<double>(100000, 4, 3, {}, false, 1e-14);
  gradsync::Options o;
  o.op = gradsync::ReduceOp::sum;
  o.prescale_factor = 0.5;
  o.postscale_factor = 3.0;
  data_parallel_case<double>(100000, 3, 5, o, false, 1e-14);
  data_parallel_case<float>(1 << 20, 8, 4, {}, false, 2e-6);
}

TEST_CASE("row-sparse, data-parallel: densified when the rows cover the table") {
  data_parallel_case<double>(12, 4, 30, {}, true, 1e-14);
  gradsync::Options o;
  o.op = gradsync::ReduceOp::sum;
  data_parallel_case<float>(9, 2, 14, o, true, 2e-6);
}

TEST_CASE("row-sparse, data-parallel, through host memory: a backend that cannot reach the rows") {
  data_parallel_case<double, BlindBackend>(100000, 4, 3, {}, false, 1e-14);
  data_parallel_case<float, BlindBackend>(12, 4, 30, {}, true, 2e-6);
}

TEST_CASE("row-sparse, data-parallel: bytes follow the rows, not the table") {
  const int r = world_rank();
  std::uint64_t bytes[2] = {0, 0};
  int idx = 0;
  for (std::int64_t table : {std::int64_t(100000), std::int64_t(10000000)}) {
    Sync<float> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    RS<float> g(Rows<float>("rows", 64, 16), Ids("ids", 64), table);
    sync.add<Emb>(g);
    fill(g, rows_of(r, table, 8, 0), r);
    CHECK(sync.synchronize());
    bytes[idx++] = sync.stats().row_sparse_bytes;
  }
  CHECK(bytes[0] == bytes[1]);
  CHECK(bytes[0] == 8 * (16 * 4 + 8));  // this rank's share of the allgathers: 8 rows and their numbers
}

TEST_CASE("row-sparse, data-parallel: no rows anywhere") {
  Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  RS<double> g(Rows<double>("rows", 4, 2), Ids("ids", 4), 10, 0);
  sync.add<Emb>(g);
  CHECK(sync.synchronize());
  CHECK(g.rows() == 0);
  CHECK(sync.stats().row_sparse_collectives == 0);
}

TEST_CASE("global_norm and clip_grad_norm: the rows a row-sparse gradient holds, data-parallel ones once") {
  const int r = world_rank(), n = world_size();
  const std::int64_t table = 50, local_table = 40;
  const int width = 3;
  Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  std::vector<int> k;  // data-parallel rows per rank (with a duplicate from 3 on)
  for (int p = 0; p < n; ++p) k.push_back(2 + p % 3);
  RS<double> e(Rows<double>("e", 4 * std::size_t(n), width), Ids("ei", 4 * std::size_t(n)), table);
  RS<double> s(Rows<double>("s", 4, width), Ids("si", 4), local_table);  // local: distinct rows
  sync.add<Emb>(e, "emb");
  sync.add<Sharded>(s, "sharded");
  gradsync::GlobalNorm<Sync<double>> norm;
  for (int step = 0; step < 2; ++step) {  // the rows in use change: the second call reuses the table
    CAPTURE(step);
    const auto local_k = [&](int q) { return 1 + (q + step) % 2; };
    fill(e, rows_of(r, table, k[std::size_t(r)], step), r);
    fill(s, rows_of(r, local_table, local_k(r), 10 + step), r);
    REQUIRE(sync.synchronize());
    double sq = 0;  // the single process: the union once, each rank's local rows / n
    for (const auto& [row, vals] : expected(table, width, k, step, 1.0 / n))
      for (double v : vals) sq += v * v;
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < local_k(q); ++i)
        for (int j = 0; j < width; ++j) sq += std::pow(value_of(q, i, j) / n, 2);
    const double expect = std::sqrt(sq);
    CHECK(all_ranks(gradsync_test::rel_err(norm.norm(sync), expect) < 1e-14));
    // Clipping scales the rows in use only: the slots beyond rows() keep fill()'s -99.
    const auto e0 = host_values(e.values()), s0 = host_values(s.values());
    const double coef = 0.5 * expect / (expect + 1e-6);
    CHECK(all_ranks(gradsync_test::rel_err(norm.clip(sync, 0.5 * expect), expect) < 1e-14));
    const auto e1 = host_values(e.values()), s1 = host_values(s.values());
    bool ok = true;
    const auto check = [&](const std::vector<double>& before, const std::vector<double>& now, std::int64_t used) {
      for (std::size_t i = 0; i < before.size(); ++i)
        ok = ok && (std::int64_t(i) < used ? gradsync_test::rel_err(now[i], before[i] * coef) < 1e-15
                                           : now[i] == -99 && before[i] == -99);
    };
    check(e0, e1, e.rows() * width);
    check(s0, s1, s.rows() * width);
    CHECK(all_ranks(ok));
  }
}

TEST_CASE("row-sparse: errors on every rank, naming the tensor and the ranks") {
  const int r = world_rank(), n = world_size();
  const int culprit = n - 1;
  SUBCASE("a row number outside the table") {
    Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    RS<double> g(Rows<double>("rows", 4 * n, 2), Ids("ids", std::size_t(4 * n)), 100);
    sync.add<Emb>(g, "items");
    fill(g, r == culprit ? std::vector<int>{1, 100} : std::vector<int>{2, 3}, r);
    const std::string msg = gradsync_test::error_of([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, "row-sparse gradient 'items'") && has(msg, "outside [0, 100)") &&
                    has(msg, gradsync::impl::cat("rank(s) ", culprit, " (1 rows)"))));
  }
  SUBCASE("a capacity below the union of the ranks' rows") {
    Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    const int cap = r == culprit ? 2 : 2 * n;
    RS<double> g(Rows<double>("rows", std::size_t(cap), 2), Ids("ids", std::size_t(cap)), 1000);
    sync.add<Emb>(g, "items");
    fill(g, std::vector<int>{10 * r, 10 * r + 1}, r);
    const std::string msg = gradsync_test::error_of([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    if (n > 1)
      CHECK(all_ranks(has(msg, "capacity is smaller on rank(s) ") && has(msg, gradsync::impl::cat(culprit, " (2)")) &&
                      has(msg, gradsync::impl::cat("may need ", 2 * n, " rows"))));
    else
      CHECK(msg.empty());
  }
  SUBCASE("table sizes that differ between ranks") {
    Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    RS<double> g(Rows<double>("rows", 4, 2), Ids("ids", 4), r == culprit && n > 1 ? 11 : 10);
    sync.add<Emb>(g, "items");
    fill(g, std::vector<int>{1}, r);
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(n == 1 ? msg.empty() : has(msg, "items")));
  }
  SUBCASE("misuse caught where it happens") {
    RS<double> g(Rows<double>("rows", 4, 2), Ids("ids", 4), 10);
    CHECK_THROWS_AS(g.set_rows(5), gradsync::Error);
    CHECK_THROWS_AS(RS<double>(Rows<double>("rows", 4, 2), Ids("ids", 3), 10), gradsync::Error);
    gradsync::Options o;
    o.backward_passes_per_step = 2;
    Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    try {
      sync.add<Emb>(g, "items");
      FAIL("no error");
    } catch (const gradsync::ConfigError& e) {
      CHECK(has(e.what(), "row-sparse gradient 'items'"));
      CHECK(has(e.what(), "backward_passes_per_step must be 1"));
    }
    Sync<double> s2(gradsync::MpiBackend(MPI_COMM_WORLD));
    Kokkos::View<double*> alias(g.values().data(), 3);
    s2.add<Emb>(g, "items");
    CHECK_THROWS_AS(s2.add<Dense>(alias), gradsync::Error);
  }
}
