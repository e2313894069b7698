// A steady step allocates nothing, on every path (issue 34): neither on the heap (operator new,
// tests/alloc_counter.cpp) nor through Kokkos (allocations of 1 byte or more, counted by the test
// main). On a Kokkos build with CUDA every View here is device memory and a Kokkos allocation a
// cudaMalloc, which waits for the whole device: this program is that GPU target, checked on the CPU.
// Each path runs warm-up steps (the plan, its buffers, the tuner's trials), then counted steps, and
// every value of every step is checked against analytic per-rank values, at 1 to 4 ranks.
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <map>
#include <string>
#include <vector>

#include "blind_backend.hpp"
#include "gradsync_test.hpp"
#include "kokkos_counts.hpp"

using gradsync_test::BlindBackend;
using gradsync_test::host_values;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Dense {};
struct Table {};  // local, 1 / world size
struct Tower {};  // local, unscaled
struct Pair {};   // a process set: the ranks of one parity
struct Set {};    // summed over the set, / world size
struct Emb {};    // row-sparse: data-parallel
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Table> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};
template <>
struct gradsync::LocalVarPolicy<Set> : gradsync::ReduceOver<Pair> {};

namespace {

using T = float;
using View = Kokkos::View<T*>;
using C = gradsync::Collectives;

// Rank r's gradient in pass k of step s, element i of tensor t: small integers, exact in fp16 and
// bf16 and in every sum here, so compressed paths are checked as tightly as the others.
double grad_of(int r, int s, int k, int t, std::size_t i) {
  return double(int((i + 3 * std::size_t(t) + std::size_t(r) + 2 * std::size_t(s) + std::size_t(k)) % 7) - 3);
}
// Rank r's samples in pass k of step s (set_samples): uneven, 0 on some ranks and passes.
std::int64_t samples_of(int r, int s, int k) { return (3 * r + 2 * s + k) % 5; }

struct Path {
  const char* name;
  gradsync::Options opt;
  bool mark_ready = false;
  bool samples = false;
  bool process_set = false;
  int warmup = 2;  // steps before counting
};

// Heap and Kokkos allocations while `f` runs (Kokkos' own heap use for reported deep copies left out).
struct Counted {
  long heap = 0, kokkos = 0;
  template <class F>
  void add(F&& f) {
    const gradsync_test::DeepCopiesUncounted uncounted;
    const long h = gradsync_test::heap_allocations();
    const long k = gradsync_test::kokkos_counts().allocations;
    f();
    heap += gradsync_test::heap_allocations() - h;
    kokkos += gradsync_test::kokkos_counts().allocations - k;
  }
  // None of either, on every rank.
  void check_none() const {
    CAPTURE(heap);
    CAPTURE(kokkos);
    CAPTURE(gradsync_test::last_kokkos_allocation());
    GRADSYNC_CHECK_ALL(heap == 0);
    GRADSYNC_CHECK_ALL(kokkos == 0);
  }
};

// A hybrid model: dense tensors (one of 80 KB, reduced in place by the nonblocking path's ring; a
// 2-D one; small ones fused), a tensor made local at run time, a table (1 / world size) and a tower
// (unscaled) whose sizes differ by rank, and, for the process-set path, a group summed over the
// ranks of one parity.
template <class Backend>
void run_path(const Path& p, Backend backend, const std::vector<int>& members) {
  const std::string name = p.name;
  CAPTURE(name);
  const int me = world_rank(), N = p.opt.backward_passes_per_step;
  const double n = double(members.size());
  std::vector<int> pair;
  for (int r : members)
    if (r % 2 == me % 2) pair.push_back(r);
  gradsync::Options o = p.opt;
  o.tuning.read_environment = false;
  o.stall_timeout = 30;  // a hang fails fast
  o.prescale_factor = 2.0;
  o.postscale_factor = 0.25;
  gradsync::GradientSync<Backend, View> sync(std::move(backend), o);
  std::vector<View> dense = {View("d0", 20000), View("d1", 37), View("d2", 1000)};
  Kokkos::View<T**> two_d("d3", 5, 7);
  View runtime_local("rl", 11), table("table", std::size_t(50 + me)), tower("tower", 30), set("set", 64);
  for (auto& v : dense) sync.template add<Dense>(v);
  sync.template add<Dense>(two_d);
  sync.template add<Dense>(runtime_local);
  sync.register_local_var(runtime_local);
  sync.template add<Table>(table);
  sync.template add<Tower>(tower);
  if (p.process_set) {
    sync.template bind_process_set<Pair>(pair);
    sync.template add<Set>(set);
  }
  // Tensor ids for grad_of: dense 0-2, the 2-D one 3, then 4-7.
  const auto fill = [&](int s, int k) {
    for (int t = 0; t < 3; ++t)
      gradsync_test::fill_host(dense[std::size_t(t)], [&](std::size_t i) { return grad_of(me, s, k, t, i); });
    gradsync_test::fill_host(two_d, [&](std::size_t i) { return grad_of(me, s, k, 3, i); });
    gradsync_test::fill_host(runtime_local, [&](std::size_t i) { return grad_of(me, s, k, 4, i); });
    gradsync_test::fill_host(table, [&](std::size_t i) { return grad_of(me, s, k, 5, i); });
    gradsync_test::fill_host(tower, [&](std::size_t i) { return grad_of(me, s, k, 6, i); });
    if (p.process_set) gradsync_test::fill_host(set, [&](std::size_t i) { return grad_of(me, s, k, 7, i); });
  };
  // Weighted sums over passes (and ranks): w = the pass's samples with set_samples, else 1.
  const auto w = [&](int r, int s, int k) { return p.samples ? double(samples_of(r, s, k)) : 1.0; };
  const auto over_passes = [&](int r, int s, int t, std::size_t i, bool weighted) {
    double x = 0;
    for (int k = 0; k < N; ++k) x += (weighted ? w(r, s, k) : 1.0) * grad_of(r, s, k, t, i);
    return x;
  };
  double worst = 0;
  bool returns_right = true;
  const auto check_step = [&](int s) {
    double total = 0;  // the step's samples over the ranks (set_samples), or the rank count
    for (int r : members)
      for (int k = 0; k < N; ++k) total += p.samples ? w(r, s, k) : 0.0;
    const double div = p.samples ? total : n;
    const auto at = [&](double x) { return div > 0 ? x / div : 0.0; };
    const auto worst_of = [&](const auto& v, auto&& want) {
      const auto h = host_values(v);
      for (std::size_t i = 0; i < h.size(); ++i) worst = std::max(worst, gradsync_test::rel_err(double(h[i]), want(i)));
    };
    for (int t = 0; t < 3; ++t)
      worst_of(dense[std::size_t(t)], [&](std::size_t i) {
        double x = 0;
        for (int r : members) x += over_passes(r, s, t, i, true);
        return 2.0 * 0.25 * at(x);
      });
    worst_of(two_d, [&](std::size_t i) {
      double x = 0;
      for (int r : members) x += over_passes(r, s, 3, i, true);
      return 2.0 * 0.25 * at(x);
    });
    worst_of(runtime_local, [&](std::size_t i) { return at(over_passes(me, s, 4, i, true)); });
    worst_of(table, [&](std::size_t i) { return at(over_passes(me, s, 5, i, true)); });
    worst_of(tower, [&](std::size_t i) { return over_passes(me, s, 6, i, false); });
    if (p.process_set)
      worst_of(set, [&](std::size_t i) {
        double x = 0;
        for (int r : pair) x += over_passes(r, s, 7, i, true);
        return 2.0 * 0.25 * x / n;
      });
  };
  Counted counted;
  for (int s = 0; s < p.warmup + 4; ++s) {
    for (int k = 0; k < N; ++k) {
      fill(s, k);  // the test's writes (device uploads on a GPU build) are not counted
      const auto pass = [&] {
        if (p.samples) sync.set_samples(samples_of(me, s, k));
        if (p.mark_ready) {
          for (auto it = dense.rbegin(); it != dense.rend(); ++it) sync.mark_ready(*it);
          sync.mark_ready(two_d);
        }
        returns_right = returns_right && sync.synchronize() == (k + 1 == N);
      };
      if (s < p.warmup)
        pass();
      else
        counted.add(pass);
    }
    check_step(s);
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(returns_right);
  GRADSYNC_CHECK_ALL(worst <= 1e-6);
  GRADSYNC_CHECK_ALL(sync.stats().steps == std::uint64_t(p.warmup + 4));
  counted.check_none();
}

// Row-sparse, data-parallel: rank r gives rows r and r + 1 (mod the table) of width 4 in step s,
// shifted by s; the union holds every rank's rows, the rows two ranks give summed. A table of 1000
// rows is exchanged by allgather, one of 1 row (every rank's two rows are row 0) densified. A dense
// tensor rides along.
template <class Backend>
void run_row_sparse(const char* what, std::int64_t table_rows, bool densified) {
  const std::string name = what;
  CAPTURE(name);
  const int me = world_rank(), n = world_size(), width = 4;
  using Rows = Kokkos::View<T**, Kokkos::LayoutRight>;
  using Ids = Kokkos::View<int*>;
  const int cap = std::max(2, int(std::min<std::int64_t>(2 * n, table_rows)));
  gradsync::RowSparse<Rows, Ids> g(Rows("rows", std::size_t(cap), std::size_t(width)), Ids("ids", std::size_t(cap)),
                                   table_rows);
  View dense("dense", 300);
  gradsync::Options o;
  o.tuning.read_environment = false;
  o.stall_timeout = 30;
  gradsync::GradientSync<Backend, View> sync(Backend(MPI_COMM_WORLD), o);
  sync.template add<Dense>(dense);
  sync.template add<Emb>(g, "emb");
  const auto ids_of = [&](int r, int s) {
    return std::vector<int>{int((r + s) % table_rows), int((r + 1 + s) % table_rows)};
  };
  const auto value = [](int r, int s, int row, int j) { return grad_of(r, s, 0, 8 + j, std::size_t(row)); };
  auto v = gradsync_test::host_mirror(g.values());
  auto x = gradsync_test::host_mirror(g.indices());
  double worst = 0;
  bool rows_ok = true;
  Counted counted;
  const int warmup = 2;
  for (int s = 0; s < warmup + 4; ++s) {
    const auto mine = ids_of(me, s);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      x(i) = mine[i];
      for (int j = 0; j < width; ++j) v(i, std::size_t(j)) = T(value(me, s, mine[i], j));
    }
    gradsync_test::upload(g.values(), v);
    gradsync_test::upload(g.indices(), x);
    gradsync_test::fill_host(dense, [&](std::size_t i) { return grad_of(me, s, 0, 9, i); });
    const auto pass = [&] {
      g.set_rows(std::int64_t(mine.size()));
      rows_ok = rows_ok && sync.synchronize();
    };
    if (s < warmup)
      pass();
    else
      counted.add(pass);
    std::map<int, std::vector<double>> want;  // row -> the average over the ranks
    for (int r = 0; r < n; ++r)
      for (int row : ids_of(r, s)) {
        auto& w = want[row];
        w.resize(std::size_t(width), 0.0);
        for (int j = 0; j < width; ++j) w[std::size_t(j)] += value(r, s, row, j) / n;
      }
    const auto gv = gradsync_test::host_copy(g.values());
    const auto gx = gradsync_test::host_copy(g.indices());
    rows_ok = rows_ok && g.rows() == std::int64_t(want.size());
    std::size_t u = 0;
    for (const auto& [row, vals] : want) {
      if (u >= std::size_t(g.rows())) break;
      rows_ok = rows_ok && gx(u) == row;
      for (int j = 0; j < width; ++j)
        worst = std::max(worst, gradsync_test::rel_err(double(gv(u, std::size_t(j))), vals[std::size_t(j)]));
      ++u;
    }
    const auto dv = host_values(dense);
    for (std::size_t i = 0; i < dv.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += grad_of(r, s, 0, 9, i);
      worst = std::max(worst, gradsync_test::rel_err(double(dv[i]), sum / n));
    }
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(rows_ok);
  GRADSYNC_CHECK_ALL(worst <= 1e-6);
  GRADSYNC_CHECK_ALL(sync.stats().row_sparse_densified == (densified ? warmup + 4u : 0u));
  counted.check_none();
}

gradsync::Options with(void (*f)(gradsync::Options&)) {
  gradsync::Options o;
  f(o);
  return o;
}

std::vector<int> world() {
  std::vector<int> r;
  for (int i = 0; i < world_size(); ++i) r.push_back(i);
  return r;
}

}  // namespace

TEST_CASE("every path of a steady step allocates nothing, values exact") {
  REQUIRE(gradsync_test::kokkos_counting());  // Kokkos allocations are counted by the test main
  const Path paths[] = {
      {"blocking collectives", with([](gradsync::Options& o) { o.tuning.collectives = C::blocking; })},
      {"nonblocking: the ring in place, small tensors packed",
       with([](gradsync::Options& o) { o.tuning.collectives = C::nonblocking; })},
      {"mark_ready in backward order", with([](gradsync::Options& o) { o.tuning.collectives = C::nonblocking; }), true},
      {"256-byte chunks, one in flight", with([](gradsync::Options& o) {
         o.tuning.fusion_threshold_bytes = 256;
         o.tuning.max_chunks_in_flight = 1;
       })},
      {"3 passes, check_finite", with([](gradsync::Options& o) {
         o.backward_passes_per_step = 3;
         o.check_finite = true;
       })},
      {"host staging always",
       with([](gradsync::Options& o) { o.tuning.host_staging = gradsync::HostStaging::always; })},
      {"fp16 with error feedback", with([](gradsync::Options& o) {
         o.compression = gradsync::Compression::fp16;
         o.error_feedback = true;
       })},
      {"bf16, 2 passes, mark_ready", with([](gradsync::Options& o) {
         o.compression = gradsync::Compression::bf16;
         o.backward_passes_per_step = 2;
       }),
       true},
      {"set_samples, 2 passes, mark_ready", with([](gradsync::Options& o) { o.backward_passes_per_step = 2; }), true,
       true},
      {"a process set", gradsync::Options{}, false, false, true},
      {"fusion_threshold_auto, after its trials",
       with([](gradsync::Options& o) { o.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_auto; }), false,
       false, false, 24},
  };
  for (const Path& p : paths) run_path(p, gradsync::MpiBackend(MPI_COMM_WORLD), world());
  // A rank alone: SelfBackend.
  run_path(Path{"SelfBackend", gradsync::Options{}}, gradsync::SelfBackend(), {world_rank()});
  run_path(Path{"a backend that reaches no memory: every chunk staged", gradsync::Options{}},
           BlindBackend(MPI_COMM_WORLD), world());
}

TEST_CASE("row-sparse gradients: a steady step allocates nothing, values exact") {
  REQUIRE(gradsync_test::kokkos_counting());
  run_row_sparse<gradsync::MpiBackend>("allgather of rows", 1000, false);
  run_row_sparse<gradsync::MpiBackend>("densified", 1, true);
  run_row_sparse<BlindBackend>("allgather of rows, staged through host memory", 1000, false);
  run_row_sparse<BlindBackend>("densified, staged through host memory", 1, true);
}
