// Uneven data per rank (issue 31): set_samples() weights each rank's gradient by its samples, so
// that data-parallel gradients are the gradient of the mean loss over every sample of the step and
// local ones (scaled by the world size) their rank's share of it. Every value is checked against
// the analytic per-rank expectation, at 1 to 4 ranks, on every path: blocking and nonblocking
// collectives, mark_ready, chunks in place and packed, 1 to 3 passes, compression, error feedback,
// LocalScale::samples, ReduceOver sets and RowSparse gradients.
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <map>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::fill_host;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Dense {};
struct Table {};
struct Tower {};
struct Summed {};     // holds sums over samples already: / N only
struct Pair {};       // a kind of process set: the ranks of one parity
struct SetWorld {};   // over the set, weighted, / N
struct SetSummed {};  // over the set, unweighted, / N
struct SetAvg {};     // over the set, / |S|: refused weighted
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Table> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};
template <>
struct gradsync::LocalVarPolicy<Summed> : gradsync::KeepLocal<gradsync::LocalScale::samples> {};
template <>
struct gradsync::LocalVarPolicy<SetWorld> : gradsync::ReduceOver<Pair> {};
template <>
struct gradsync::LocalVarPolicy<SetSummed> : gradsync::ReduceOver<Pair, gradsync::SetScale::samples> {};
template <>
struct gradsync::LocalVarPolicy<SetAvg> : gradsync::ReduceOver<Pair, gradsync::SetScale::set_size> {};

namespace {

// Rank r's samples in pass k of step s: uneven, and 0 on some ranks and passes (rank 0, pass 0).
std::int64_t samples_of(int r, int s, int k) { return (3 * r + 2 * s + k) % 5; }

// Rank r's gradient value in pass k of step s at element i: small integers, so that every product
// with a count and every sum is exact in fp32 and in bf16 (8 significant bits).
double grad_of(int r, int s, int k, std::size_t t, std::size_t i) {
  return double(int((i + 3 * t + std::size_t(r) + std::size_t(s) + 2 * std::size_t(k)) % 7) - 3);
}

const gradsync::Compression none = gradsync::Compression::none;
const gradsync::ReduceOp average = gradsync::ReduceOp::average;

struct Case {
  const char* name;
  gradsync::Collectives collectives;
  int passes;
  bool mark_ready;
  gradsync::ReduceOp op;
  gradsync::Compression compression;
  bool error_feedback = false;
};

template <class T>
void run_case(const Case& c) {
  const std::string name = c.name;
  CAPTURE(name);
  CAPTURE(c.passes);
  const int n = world_size(), me = world_rank();
  using View = Kokkos::View<T*>;
  gradsync::Options o;
  o.op = c.op;
  o.backward_passes_per_step = c.passes;
  o.compression = c.compression;
  o.error_feedback = c.error_feedback;
  o.prescale_factor = 2.0;
  o.postscale_factor = 0.5;
  o.tuning.collectives = c.collectives;
  o.tuning.fusion_threshold_bytes = 64 << 10;
  o.tuning.read_environment = false;
  // Sizes: one tensor reduced in place (64 KiB and more), small ones fused, locals of both scales.
  const std::vector<std::size_t> dense_sizes = {20000, 37, 1000};
  std::vector<View> dense, table, tower, summed;
  for (std::size_t k = 0; k < dense_sizes.size(); ++k) dense.emplace_back("dense", dense_sizes[k]);
  table.emplace_back("table", 500 + 10 * std::size_t(me));
  tower.emplace_back("tower", 300);
  summed.emplace_back("summed", 200);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  for (auto& v : dense) sync.template add<Dense>(v);
  sync.template add<Table>(table[0]);
  sync.template add<Tower>(tower[0]);
  sync.template add<Summed>(summed[0]);
  const auto fill = [&](int r, int s, int k) {
    for (std::size_t t = 0; t < dense.size(); ++t)
      fill_host(dense[t], [&](std::size_t i) { return grad_of(r, s, k, t, i); });
    fill_host(table[0], [&](std::size_t i) { return grad_of(r, s, k, 10, i); });
    fill_host(tower[0], [&](std::size_t i) { return grad_of(r, s, k, 11, i); });
    fill_host(summed[0], [&](std::size_t i) { return grad_of(r, s, k, 12, i); });
  };
  const double tol = c.compression != gradsync::Compression::none ? 1e-5 : gradsync_test::tol<T>();
  double worst = 0;
  bool returns_right = true;
  for (int s = 0; s < 3; ++s) {
    std::int64_t N = 0;
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < c.passes; ++k) N += samples_of(r, s, k);
    for (int k = 0; k < c.passes; ++k) {
      sync.set_samples(samples_of(me, s, k));
      fill(me, s, k);
      if (c.mark_ready)
        for (auto it = dense.rbegin(); it != dense.rend(); ++it) sync.mark_ready(*it);
      returns_right = returns_right && sync.synchronize() == (k + 1 == c.passes);
    }
    // The analytic values.
    for (std::size_t t = 0; t < dense.size(); ++t) {
      const auto h = host_values(dense[t]);
      for (std::size_t i = 0; i < h.size(); ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r)
          for (int k = 0; k < c.passes; ++k) sum += double(samples_of(r, s, k)) * grad_of(r, s, k, t, i);
        double want = 2.0 * 0.5 * sum;
        if (c.op == gradsync::ReduceOp::average) want = N > 0 ? want / double(N) : 0.0;
        worst = std::max(worst, gradsync_test::rel_err(double(h[i]), want));
      }
    }
    const auto ht = host_values(table[0]);
    for (std::size_t i = 0; i < ht.size(); ++i) {
      double sum = 0;
      for (int k = 0; k < c.passes; ++k) sum += double(samples_of(me, s, k)) * grad_of(me, s, k, 10, i);
      worst = std::max(worst, gradsync_test::rel_err(double(ht[i]), N > 0 ? sum / double(N) : 0.0));
    }
    const auto hw = host_values(tower[0]);
    for (std::size_t i = 0; i < hw.size(); ++i) {
      double sum = 0;
      for (int k = 0; k < c.passes; ++k) sum += grad_of(me, s, k, 11, i);  // LocalScale::none: unweighted
      worst = std::max(worst, gradsync_test::rel_err(double(hw[i]), sum));
    }
    const auto hs = host_values(summed[0]);
    for (std::size_t i = 0; i < hs.size(); ++i) {
      double sum = 0;
      for (int k = 0; k < c.passes; ++k) sum += grad_of(me, s, k, 12, i);  // LocalScale::samples: / N only
      worst = std::max(worst, gradsync_test::rel_err(double(hs[i]), N > 0 ? sum / double(N) : 0.0));
    }
    GRADSYNC_CHECK_ALL(sync.stats().samples == std::uint64_t(N));
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(returns_right);
  GRADSYNC_CHECK_ALL(worst <= tol);
  GRADSYNC_CHECK_ALL(sync.weighted() && sync.stats().steps == 3);
  // Without aggregation and compression the large tensor is reduced in place: the weights then go
  // in before the sum there too.
  if (c.passes == 1 && c.compression == none) GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place > 0);
}

// The options of the small cases: no environment, a 20 s deadline so that a hang fails fast.
gradsync::Options small_options() {
  gradsync::Options o;
  o.tuning.read_environment = false;
  o.stall_timeout = 20;
  return o;
}

}  // namespace

TEST_CASE("set_samples: data-parallel and local values weighted by samples, every path") {
  using C = gradsync::Collectives;
  const Case cases[] = {
      {"nonblocking", C::nonblocking, 1, false, average, none},
      {"blocking", C::blocking, 1, false, average, none},
      {"mark_ready", C::nonblocking, 1, true, average, none},
      {"2 passes", C::nonblocking, 2, false, average, none},
      {"3 passes, mark_ready", C::nonblocking, 3, true, average, none},
      {"3 passes, blocking", C::blocking, 3, false, average, none},
      {"op = sum", C::nonblocking, 2, false, gradsync::ReduceOp::sum, none},
      {"bf16", C::nonblocking, 1, false, average, gradsync::Compression::bf16},
      {"bf16, 2 passes", C::nonblocking, 2, true, average, gradsync::Compression::bf16},
      {"bf16, error feedback", C::nonblocking, 1, false, average, gradsync::Compression::bf16, true},
      {"bf16, error feedback, 3 passes", C::nonblocking, 3, true, average, gradsync::Compression::bf16, true},
  };
  for (const Case& c : cases) {
    run_case<double>(c);
    run_case<float>(c);
  }
}

TEST_CASE("set_samples: no sample on any rank gives zero gradients and counts an empty step") {
  const int me = world_rank();
  using View = Kokkos::View<double*>;
  gradsync::Options o = small_options();
  View a("a", 100), t("t", 50);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a);
  sync.add<Table>(t);
  Kokkos::deep_copy(a, 1.0 + me);
  Kokkos::deep_copy(t, 2.0 + me);
  sync.set_samples(0);
  GRADSYNC_CHECK_ALL(sync.synchronize());
  bool zero = true;
  for (double x : host_values(a)) zero = zero && x == 0.0;
  for (double x : host_values(t)) zero = zero && x == 0.0;
  GRADSYNC_CHECK_ALL(zero && sync.stats().empty_steps == 1 && sync.stats().samples == 0);
}

TEST_CASE("set_samples on some ranks only: a MismatchError on every rank naming them") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "set_samples on some ranks only needs a rank without it");
  const int me = world_rank(), n = world_size();
  using View = Kokkos::View<double*>;
  gradsync::Options o = small_options();
  View a("a", 100);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a);
  if (me != n - 1) sync.set_samples(3);
  const std::string e = error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
  CAPTURE(e);
  const std::string last = std::to_string(n - 1);
  GRADSYNC_CHECK_ALL(has(e, "set_samples(): rank") && has(e, "did not: a weighted sync needs a count") &&
                     has(e, "rank " + last + " did not"));
}

TEST_CASE("a weighted sync's count forgotten on one rank: every rank stops, naming it") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a count forgotten on one rank needs another rank that gave it");
  const int me = world_rank();
  using View = Kokkos::View<double*>;
  gradsync::Options o = small_options();
  View a("a", 100);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a);
  sync.set_samples(2);
  GRADSYNC_CHECK_ALL(sync.synchronize());
  if (me != 0) sync.set_samples(2);  // rank 0 forgets the second step's count
  const std::string e = error_of([&] { (void)sync.synchronize(); });
  CAPTURE(e);
  GRADSYNC_CHECK_ALL(has(e, "set_samples() was not called for pass 1 of synchronize() call 2 on rank 0"));
}

TEST_CASE("set_samples: bad counts and the combinations it cannot weight are refused clearly") {
  using View = Kokkos::View<double*>;
  gradsync::Options o = small_options();
  View a("a", 10), b("b", 10);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a);
  CHECK(has(error_of([&] { sync.set_samples(-1); }), "a sample count is 0 or more"));
  {  // an average over the set's size would need each set's own samples
    gradsync::GradientSync<gradsync::MpiBackend, View> set(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    set.bind_process_set<Pair>({world_rank()});
    set.add<SetAvg>(b, "b");
    CHECK(has(error_of<gradsync::ConfigError>([&] { set.set_samples(1); }), "SetAvg), SetScale::set_size on rank"));
  }
  {  // LocalScale::samples divides by the step's samples: without set_samples there are none
    gradsync::GradientSync<gradsync::MpiBackend, View> summed(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    summed.add<Summed>(b, "b");
    const std::string e = error_of<gradsync::ConfigError>([&] { (void)summed.synchronize(); });
    CAPTURE(e);
    GRADSYNC_CHECK_ALL(has(e, "tensor 'b' (group ") && has(e, "Summed) on rank") &&
                       has(e, "which set_samples() gives"));
  }
  o.average_aggregated_gradients = true;
  o.backward_passes_per_step = 2;
  gradsync::GradientSync<gradsync::MpiBackend, View> agg(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  agg.add<Dense>(a);
  CHECK(has(error_of<gradsync::ConfigError>([&] { agg.set_samples(1); }),
            "average_aggregated_gradients has nothing left to do"));
}

TEST_CASE("DistributedOptimizer::set_samples: SGD follows the weighted gradient") {
  const int n = world_size(), me = world_rank();
  using View = Kokkos::View<double*>;
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
  using Opt = gradsync::Sgd<View>;
  gradsync::Options o = small_options();
  gradsync::SgdOptions so;
  so.lr = 0.5;
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(so), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o));
  View w("w", 8), gw("gw", 8), t("t", 4), gt("gt", 4);
  Kokkos::deep_copy(w, 1.0);
  Kokkos::deep_copy(t, 1.0);
  dopt.add<Dense>(w, gw);
  dopt.add<Table>(t, gt);
  const std::int64_t mine = me + 1;  // rank r: r + 1 samples
  const double N = double(n) * double(n + 1) / 2;
  Kokkos::deep_copy(gw, double(me + 1));
  Kokkos::deep_copy(gt, double(me + 1));
  dopt.set_samples(mine);
  GRADSYNC_CHECK_ALL(dopt.step());
  double sum = 0;
  for (int r = 0; r < n; ++r) sum += double(r + 1) * double(r + 1);
  const double want_w = 1.0 - 0.5 * sum / N, want_t = 1.0 - 0.5 * double(mine) * double(me + 1) / N;
  bool ok = true;
  for (double x : host_values(w)) ok = ok && std::abs(x - want_w) < 1e-14;
  for (double x : host_values(t)) ok = ok && std::abs(x - want_t) < 1e-14;
  GRADSYNC_CHECK_ALL(ok);
}

namespace {
using Rows = Kokkos::View<double**, Kokkos::LayoutRight>;
using Ids = Kokkos::View<int*>;
using RS = gradsync::RowSparse<Rows, Ids>;
using RowMap = std::map<int, std::vector<double>>;

// Rank r's row `slot` (0, 1: table rows r and r + 1) in step s, column j: small integers.
double row_value(int r, int s, int slot, int j) { return grad_of(r, s, 0, std::size_t(30 + slot), std::size_t(j)); }

void fill_rows(const RS& g, int me, int s) {
  auto v = gradsync_test::host_mirror(g.values());
  auto x = gradsync_test::host_mirror(g.indices());
  for (int slot = 0; slot < 2; ++slot) {
    x(std::size_t(slot)) = me + slot;
    for (std::size_t j = 0; j < v.extent(1); ++j) v(std::size_t(slot), j) = row_value(me, s, slot, int(j));
  }
  gradsync_test::upload(g.values(), v);
  gradsync_test::upload(g.indices(), x);
  g.set_rows(2);
}

RowMap read_rows(const RS& g) {
  const auto v = gradsync_test::host_copy(g.values());
  const auto x = gradsync_test::host_copy(g.indices());
  RowMap m;
  for (std::int64_t i = 0; i < g.rows(); ++i)
    for (std::size_t j = 0; j < v.extent(1); ++j) m[x(std::size_t(i))].push_back(v(std::size_t(i), j));
  return m;
}

// The rows of `ranks` summed, rank r's weighted by weight(r) and all by f.
template <class W>
RowMap expected_rows(const std::vector<int>& ranks, int s, int width, W&& weight, double f) {
  RowMap m;
  for (int r : ranks)
    for (int slot = 0; slot < 2; ++slot) {
      auto& row = m[r + slot];
      row.resize(std::size_t(width), 0.0);
      for (int j = 0; j < width; ++j) row[std::size_t(j)] += f * weight(r) * row_value(r, s, slot, j);
    }
  return m;
}

double rows_error(const RowMap& got, const RowMap& want) {
  if (got.size() != want.size()) return 1e300;
  double worst = 0;
  for (const auto& [row, vals] : want) {
    const auto it = got.find(row);
    if (it == got.end() || it->second.size() != vals.size()) return 1e300;
    for (std::size_t j = 0; j < vals.size(); ++j)
      worst = std::max(worst, gradsync_test::rel_err(it->second[j], vals[j]));
  }
  return worst;
}
}  // namespace

TEST_CASE("set_samples: ReduceOver sets and RowSparse gradients weighted, 1 and 2 passes") {
  const int n = world_size(), me = world_rank();
  using View = Kokkos::View<double*>;
  std::vector<int> set, all;
  for (int r = me % 2; r < n; r += 2) set.push_back(r);
  for (int r = 0; r < n; ++r) all.push_back(r);
  const int width = 3;
  for (int passes : {1, 2}) {
    CAPTURE(passes);
    gradsync::Options o = small_options();
    o.backward_passes_per_step = passes;
    o.prescale_factor = 2.0;
    o.postscale_factor = 0.75;
    const double f = 1.5;  // prescale x postscale
    gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.bind_process_set<Pair>(set);
    View w("w", 40), sm("sm", 30);
    sync.add<SetWorld>(w, "w");
    sync.add<SetSummed>(sm, "sm");
    // Row-sparse (one pass only): data-parallel, local and over the set; rank r holds rows r, r + 1.
    Rows dv("dv", 2 * std::size_t(n), width), lv("lv", 2, width), sv("sv", 2 * std::size_t(n), width);
    Ids di("di", 2 * std::size_t(n)), li("li", 2), si("si", 2 * std::size_t(n));
    const RS dp(dv, di, n + 1), loc(lv, li, n + 1), over(sv, si, n + 1);
    if (passes == 1) {
      sync.add<Dense>(dp, "dp rows");
      sync.add<Table>(loc, "local rows");
      sync.add<SetWorld>(over, "set rows");
    }
    double worst = 0;
    for (int s = 0; s < 3; ++s) {
      std::int64_t N = 0;
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < passes; ++k) N += samples_of(r, s, k);
      const double inv = N > 0 ? 1.0 / double(N) : 0.0;
      for (int k = 0; k < passes; ++k) {
        sync.set_samples(samples_of(me, s, k));
        fill_host(w, [&](std::size_t i) { return grad_of(me, s, k, 20, i); });
        fill_host(sm, [&](std::size_t i) { return grad_of(me, s, k, 21, i); });
        if (passes == 1) {
          fill_rows(dp, me, s);
          fill_rows(loc, me, s);
          fill_rows(over, me, s);
        }
        (void)sync.synchronize();
      }
      const auto hw = host_values(w), hs = host_values(sm);
      for (std::size_t i = 0; i < hw.size(); ++i) {
        double sum = 0;
        for (int r : set)
          for (int k = 0; k < passes; ++k) sum += double(samples_of(r, s, k)) * grad_of(r, s, k, 20, i);
        worst = std::max(worst, gradsync_test::rel_err(hw[i], f * sum * inv));
      }
      for (std::size_t i = 0; i < hs.size(); ++i) {
        double sum = 0;
        for (int r : set)
          for (int k = 0; k < passes; ++k) sum += grad_of(r, s, k, 21, i);
        worst = std::max(worst, gradsync_test::rel_err(hs[i], f * sum * inv));
      }
      if (passes == 1) {
        const auto nr = [&](int r) { return double(samples_of(r, s, 0)); };
        worst = std::max(worst, rows_error(read_rows(dp), expected_rows(all, s, width, nr, f * inv)));
        worst = std::max(worst, rows_error(read_rows(loc), expected_rows({me}, s, width, nr, inv)));
        worst = std::max(worst, rows_error(read_rows(over), expected_rows(set, s, width, nr, f * inv)));
      }
    }
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst <= 1e-14);
  }
}

TEST_CASE("set_samples with error feedback: residuals follow N, so the rounding errors telescope") {
  // One rank (MPI_COMM_SELF on every rank): the sum is this rank's value, rounded once to bf16.
  // With residuals rescaled by N / N_prev, the steps' results add up to the exact gradients' sum
  // but for the last residual (at most half a bf16 unit of the last value); kept as they were,
  // each change of N would leave an error behind.
  using View = Kokkos::View<double*>;
  gradsync::Options o = small_options();
  o.compression = gradsync::Compression::bf16;
  o.error_feedback = true;
  View g("g", 64);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_SELF), o);
  sync.add<Dense>(g);
  const std::int64_t counts[] = {1, 3, 7, 2, 5};
  std::vector<double> got(64, 0.0), want(64, 0.0);
  double largest = 0;
  for (int t = 0; t < 30; ++t) {
    const auto value = [&](std::size_t i) { return 0.1 * double(i + 1) + 0.013 * t; };
    fill_host(g, value);
    sync.set_samples(counts[t % 5]);
    REQUIRE(sync.synchronize());
    const auto h = host_values(g);
    for (std::size_t i = 0; i < h.size(); ++i) {
      got[i] += h[i];
      want[i] += value(i);
      largest = std::max(largest, value(i));
    }
  }
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  CAPTURE(worst);
  CAPTURE(largest);
  GRADSYNC_CHECK_ALL(worst <= largest / 256);
}

TEST_CASE("describe(sync) says how a weighted sync scales its local groups") {
  using View = Kokkos::View<double*>;
  View a("a", 10), t("t", 10), s("s", 10), w("w", 10);
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), small_options());
  sync.add<Dense>(a);
  sync.add<Table>(t);
  sync.add<Summed>(s);
  sync.add<Tower>(w);
  const std::string before = gradsync::describe(sync);
  sync.set_samples(world_rank());
  (void)sync.synchronize();
  const std::string after = gradsync::describe(sync);
  CAPTURE(before);
  CAPTURE(after);
  GRADSYNC_CHECK_ALL(has(before, "Table: 1 tensor, 80 bytes, local, scaled by 1/" + std::to_string(world_size())) &&
                     has(after, "Table: 1 tensor, 80 bytes, local, weighted by this rank's samples / the step's") &&
                     has(after, "Summed: 1 tensor, 80 bytes, local, divided by the step's samples") &&
                     has(after, "Tower: 1 tensor, 80 bytes, local, not scaled"));
}
