// Process sets (issue 18, item 3): groups reduced over a subset of the ranks, one communicator per
// set, the scale written down in process_set.hpp, checked against analytic per-rank values; the
// ranks agree on errors (MismatchError everywhere, naming the set and the ranks).
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Pairs {};       // a kind of set: consecutive pairs of ranks {0,1}, {2,3}, ...
struct Shard {};       // reduced over the pair, / world size
struct ShardAvg {};    // reduced over the pair, / set size
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
  SUBCASE("sets that do not fit together") {
    if (n < 2) return;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    sync.bind_process_set<Pairs>(r == 0 ? std::vector<int>{0, 1} : std::vector<int>{r});
    View a("a", 3);
    sync.add<Shard>(a);
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, "process sets") && has(msg, "rank 0's set of 2 ranks is bound by 1 of them") &&
                    has(msg, "partition")));
  }
  SUBCASE("members registering different tensors") {
    if (n < 2) return;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    sync.bind_process_set<Pairs>(pair_of(r, n));
    View a("a", r == 1 ? 4 : 3);
    sync.add<Shard>(a);
    const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    CHECK(all_ranks(has(msg, "rank 1 registered other tensors") && has(msg, "than rank 0")));
  }
  SUBCASE("a kind of set bound on some ranks only") {
    if (n < 2) return;
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
