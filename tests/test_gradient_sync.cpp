// GradientSync against analytic per-rank values: every row of DESIGN.md's semantics table, both
// reduce ops, pre/postscale, aggregation, fusion thresholds, communicators, stats, allocation.
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Tables {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

static_assert(gradsync::is_local_v<Tables> && gradsync::is_local_v<Tower> && !gradsync::is_local_v<Dense>);

namespace {

// The gradient of element i of tensor `tag` on rank r at (global) pass p. Distinct per tensor,
// element, rank and pass, so a value in the wrong place or from the wrong pass cannot match.
double grad_value(int tag, std::size_t i, int r, int p) { return (r + 1) * (i + 1) * 0.5 + 0.25 * p + tag; }

enum class Kind { dense, runtime_local, table, tower };

template <class T>
struct TestTensor {
  Kind kind;
  int tag;
  Kokkos::View<T*> v1;
  Kokkos::View<T**> v2;  // used when two_d
  bool two_d = false;
  // Host mirrors, made once (the allocation test fills between steps): v1 and v2 themselves when
  // they are in host memory.
  typename Kokkos::View<T*>::HostMirror h1 = Kokkos::create_mirror_view(v1);
  typename Kokkos::View<T**>::HostMirror h2 = Kokkos::create_mirror_view(v2);
  T* host() const { return two_d ? h2.data() : h1.data(); }
  std::size_t size() const { return two_d ? v2.size() : v1.size(); }
  void upload() const { two_d ? gradsync_test::upload(v2, h2) : gradsync_test::upload(v1, h1); }
  void download() const { two_d ? gradsync_test::download(h2, v2) : gradsync_test::download(h1, v1); }
};

// A hybrid model: data-parallel tensors of mixed shapes (zero-length, one element, 4096, 2-D),
// one tensor made local at run time, and local groups whose count and sizes differ per rank.
// `big` adds a 280 KiB (float) dense tensor, large enough to be reduced in place by the ring.
template <class T>
std::vector<TestTensor<T>> make_model(int rank, bool big = false) {
  std::vector<TestTensor<T>> m;
  auto one = [&](Kind k, int tag, std::size_t n) { m.push_back({k, tag, Kokkos::View<T*>("g", n), {}, false}); };
  one(Kind::dense, 0, 37);
  for (int j = 0; j <= rank; ++j) one(Kind::table, 100 + j, std::size_t(3 + 2 * rank + j));
  one(Kind::dense, 1, 0);
  one(Kind::tower, 200, std::size_t(5 + rank));
  one(Kind::dense, 2, 1);
  m.push_back({Kind::dense, 3, {}, Kokkos::View<T**>("g2", 5, 7), true});
  one(Kind::runtime_local, 300, 11);
  one(Kind::dense, 4, 4096);
  if (big) one(Kind::dense, 5, 70000);
  return m;
}

template <class Sync, class T>
void register_model(Sync& sync, std::vector<TestTensor<T>>& m) {
  for (auto& t : m) {
    switch (t.kind) {
      case Kind::dense:
      case Kind::runtime_local:
        if (t.two_d)
          sync.template add<Dense>(t.v2);
        else
          sync.template add<Dense>(t.v1);
        break;
      case Kind::table:
        sync.template add<Tables>(t.v1);
        break;
      case Kind::tower:
        sync.template add<Tower>(t.v1);
        break;
    }
  }
  for (auto& t : m)
    if (t.kind == Kind::runtime_local) sync.register_local_var(t.v1);
}

template <class T>
void fill(std::vector<TestTensor<T>>& m, int rank, int pass) {
  for (auto& t : m) {
    T* d = t.host();
    for (std::size_t i = 0; i < t.size(); ++i) d[i] = T(grad_value(t.tag, i, rank, pass));
    t.upload();
  }
}

struct Config {
  gradsync::Options opt;
  std::vector<int> members;  // world ranks in the sync's communicator
  int my_rank;               // this process's world rank (its model)
};

// Largest relative error over every tensor after the cycle of N passes ending at `last_pass`.
template <class T>
double max_error(const std::vector<TestTensor<T>>& m, const Config& c, int last_pass) {
  const auto& o = c.opt;
  const int N = o.backward_passes_per_step;
  const double n = double(c.members.size());
  const double agg = o.average_aggregated_gradients ? N : 1;
  double worst = 0;
  for (const auto& t : m) {
    t.download();
    const T* d = t.host();
    for (std::size_t i = 0; i < t.size(); ++i) {
      auto cycle_sum = [&](int r) {
        double s = 0;
        for (int p = last_pass - N + 1; p <= last_pass; ++p) s += grad_value(t.tag, i, r, p);
        return s;
      };
      double expect = 0;
      switch (t.kind) {
        case Kind::dense: {
          double s = 0;
          for (int r : c.members) s += cycle_sum(r);
          expect = s * o.prescale_factor * o.postscale_factor / agg;
          if (o.op == gradsync::ReduceOp::average) expect /= n;
          break;
        }
        case Kind::table:
          expect = cycle_sum(c.my_rank) / n / agg;
          break;
        case Kind::tower:
          expect = cycle_sum(c.my_rank) / agg;
          break;
        case Kind::runtime_local:
          expect = cycle_sum(c.my_rank) / agg / (o.scale_local_gradients ? n : 1.0);
          break;
      }
      worst = std::max(worst, rel_err(double(d[i]), expect));
    }
  }
  return worst;
}

// Runs `passes` backward passes through `sync` and checks every returned flag and every value.
template <class T, class Sync>
void run_and_check(Sync& sync, std::vector<TestTensor<T>>& m, const Config& c, int passes = 10) {
  const int N = c.opt.backward_passes_per_step;
  for (int p = 0; p < passes; ++p) {
    fill(m, c.my_rank, p);
    const bool ready = sync.synchronize();
    const bool expect_ready = (p + 1) % N == 0;
    CAPTURE(p);
    GRADSYNC_CHECK_ALL(ready == expect_ready);
    if (expect_ready) {
      const double err = max_error(m, c, p);
      CAPTURE(err);
      GRADSYNC_CHECK_ALL(err <= gradsync_test::tol<T>());
    }
  }
}

std::vector<int> world_members() {
  std::vector<int> r(static_cast<std::size_t>(world_size()));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

template <class T>
std::size_t dense_bytes(const std::vector<TestTensor<T>>& m) {
  std::size_t n = 0;
  for (const auto& t : m)
    if (t.kind == Kind::dense) n += t.size();
  return n * sizeof(T);
}

}  // namespace

TEST_CASE_TEMPLATE("every row of the semantics table, against analytic values", T, float, double) {
  using Sync = gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>>;
  const int rank = world_rank();
  int config = 0;
  // Both paths; on the nonblocking one the big tensor is reduced in place by the ring, which
  // takes every factor into its reduction (MpiBackend::folds_factor).
  for (auto coll : {gradsync::Collectives::automatic, gradsync::Collectives::nonblocking})
    for (auto op : {gradsync::ReduceOp::sum, gradsync::ReduceOp::average})
      for (int N : {1, 3, 4})
        for (bool avg_agg : {false, true}) {
          Config c{{}, world_members(), rank};
          c.opt.tuning.collectives = coll;
          c.opt.op = op;
          c.opt.backward_passes_per_step = N;
          c.opt.average_aggregated_gradients = avg_agg;
          c.opt.scale_local_gradients = config % 2 == 0;
          if (config % 3 == 1) {
            c.opt.prescale_factor = 0.5;
            c.opt.postscale_factor = 3.0;
          }
          c.opt.tuning.fusion_threshold_bytes = config % 4 == 0 ? 256 : std::size_t(4) << 20;
          c.opt.tuning.in_place_min_fraction = 0.05;  // 4 MiB chunks: tensors from 205 KiB in place
          CAPTURE(config);
          CAPTURE(N);
          CAPTURE(avg_agg);
          CAPTURE(int(coll));
          ++config;
          auto m = make_model<T>(rank, true);
          Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), c.opt);
          register_model(sync, m);
          run_and_check<T>(sync, m, c);
          // Local tensors never reach the wire: bytes handed over are exactly the dense ones.
          GRADSYNC_CHECK_ALL(sync.stats().bytes_allreduced == sync.stats().steps * dense_bytes(m));
          GRADSYNC_CHECK_ALL(sync.stats().steps == std::uint64_t(10 / N));
          // (With aggregation the buffer holds the sums, and staged through host memory, as device
          // memory is with an MPI that is not CUDA-aware, chunks are copied: nothing in place.)
          const bool staged = !sync.backend().template can_access<typename Kokkos::View<T*>::memory_space>();
          if (N == 1 && !staged)
            GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place >= sync.stats().steps * 70000 * sizeof(T));
          if (staged) GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place == 0);
        }
}

// The team form of pack and unpack (what device backends run; host execution spaces run the
// per-segment loops) through a host TeamPolicy: 16-byte vectors where source and destination lie at
// the same offset modulo 16, a scalar head and tail, scalars where they do not.
TEST_CASE_TEMPLATE("pack and unpack team kernels: every size and alignment, with and without accumulation", T, float,
                   double) {
  using namespace gradsync::impl;
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Space = Exec::memory_space;
  const std::vector<std::int64_t> sizes = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 255, 1000, 4096};
  for (int src_shift = 0; src_shift < 4; ++src_shift)
    for (int dst_shift = 0; dst_shift < 4; ++dst_shift) {
      // Segments cut from one source array at src_shift, packed back to back from dst_shift.
      std::int64_t total = 0;
      for (std::int64_t n : sizes) total += n;
      Kokkos::View<T*, Space> src("src", std::size_t(total + 8)), dst("dst", std::size_t(total + 8));
      std::vector<Segment<T>> host;
      std::int64_t at = 0;
      for (std::int64_t n : sizes) {
        host.push_back(Segment<T>{src.data() + src_shift + at, dst_shift + at, n, T(1)});
        at += n;
      }
      auto segs = MemoryOps<Space>::allocate<Segment<T>>("segs", host.size());
      MemoryOps<Space>::upload(segs, host.data(), host.size());
      for (std::int64_t i = 0; i < total + 8; ++i) {
        src(i) = T(i + 1);
        dst(i) = T(-1);
      }
      const auto nsegs = std::int64_t(host.size());
      const Exec exec;
      launch_per_segment("pack", exec, nsegs, PackKernel<T, Exec, Space>{segs, dst, 0, 0, T(2), false});
      launch_per_segment("pack+", exec, nsegs, PackKernel<T, Exec, Space>{segs, dst, 0, 0, T(1), true});
      exec.fence();
      int wrong = 0;
      for (std::int64_t i = 0; i < total + 8; ++i) {
        const bool inside = i >= dst_shift && i < dst_shift + total;
        wrong += dst(i) != (inside ? T(3) * T(i - dst_shift + src_shift + 1) : T(-1));
      }
      launch_per_segment("unpack", exec, nsegs, UnpackKernel<T, Exec, Space>{segs, dst, 0, 0, T(0.5)});
      exec.fence();
      for (std::int64_t i = 0; i < total + 8; ++i) {
        const bool inside = i >= src_shift && i < src_shift + total;
        wrong += src(i) != (inside ? T(1.5) * T(i + 1) : T(i + 1));
      }
      INFO("source at +" << src_shift << ", destination at +" << dst_shift << " values");
      CHECK(wrong == 0);
    }
}

TEST_CASE("fusion thresholds from 64 bytes to beyond the whole model give the same values") {
  using T = double;
  const int rank = world_rank();
  for (auto staging : {gradsync::HostStaging::automatic, gradsync::HostStaging::always})
    for (int N : {1, 3})
      for (std::size_t threshold : {std::size_t(64), std::size_t(100), std::size_t(4096), std::size_t(1) << 20,
                                    std::size_t(1) << 30, std::size_t(0)}) {
        Config c{{}, world_members(), rank};
        c.opt.tuning.fusion_threshold_bytes = threshold;
        c.opt.backward_passes_per_step = N;
        c.opt.tuning.host_staging = staging;  // always: every chunk goes through the host mirror
        CAPTURE(int(staging));
        CAPTURE(threshold);
        CAPTURE(N);
        auto m = make_model<T>(rank);
        gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD),
                                                                            c.opt);
        register_model(sync, m);
        run_and_check<T>(sync, m, c, 6);
        // Calls per step: one per chunk of floor(threshold / 8) values, or one per non-empty tensor.
        std::size_t expect_calls = 0;
        if (threshold == 0) {
          for (const auto& t : m) expect_calls += t.kind == Kind::dense && t.size() > 0;
        } else {
          const std::size_t chunk = std::max<std::size_t>(1, threshold / sizeof(T)) * sizeof(T);
          expect_calls = (dense_bytes(m) + chunk - 1) / chunk;
        }
        CAPTURE(sync.stats().allreduce_calls);
        GRADSYNC_CHECK_ALL(sync.stats().allreduce_calls == sync.stats().steps * expect_calls);
      }
}

TEST_CASE("a sync of local groups only puts zero bytes on the wire") {
  const int rank = world_rank();
  Kokkos::View<double*> a("a", 10 + rank), b("b", 3);
  gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<double*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  sync.add<Tables>(a);
  sync.add<Tower>(b);
  for (int p = 0; p < 3; ++p) {
    Kokkos::deep_copy(a, 6.0);
    Kokkos::deep_copy(b, 6.0);
    CHECK(sync.synchronize());
  }
  GRADSYNC_CHECK_ALL(sync.stats().bytes_allreduced == 0);
  GRADSYNC_CHECK_ALL(sync.stats().allreduce_calls == 0);
  GRADSYNC_CHECK_ALL(rel_err(gradsync_test::host_copy(a)(0), 6.0 / world_size()) < 1e-15 &&
                     gradsync_test::host_copy(b)(2) == 6.0);
}

TEST_CASE("SelfBackend, MPI_COMM_SELF and a split communicator reduce over their own ranks") {
  using T = double;
  const int rank = world_rank();
  gradsync::Options opt;
  opt.backward_passes_per_step = 2;
  opt.prescale_factor = 2.0;

  SUBCASE("SelfBackend") {
    auto m = make_model<T>(rank);
    gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<T*>> sync(gradsync::SelfBackend{}, opt);
    register_model(sync, m);
    run_and_check<T>(sync, m, Config{opt, {rank}, rank});
  }
  SUBCASE("MPI_COMM_SELF") {
    auto m = make_model<T>(rank);
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>> sync(gradsync::MpiBackend(MPI_COMM_SELF), opt);
    register_model(sync, m);
    run_and_check<T>(sync, m, Config{opt, {rank}, rank});
  }
  SUBCASE("split by rank parity") {
    MPI_Comm parity;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &parity);
    std::vector<int> members;
    for (int r = rank % 2; r < world_size(); r += 2) members.push_back(r);
    {
      auto m = make_model<T>(rank);
      gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>> sync(gradsync::MpiBackend(parity), opt);
      register_model(sync, m);
      run_and_check<T>(sync, m, Config{opt, members, rank});
    }
    MPI_Comm_free(&parity);
  }
}

TEST_CASE("no allocation after the first synchronize") {
  using T = float;
  const int rank = world_rank();
  REQUIRE(gradsync_test::kokkos_counting());           // Kokkos allocations are counted by the test main
  const gradsync_test::DeepCopiesUncounted uncounted;  // Kokkos' own heap use when it reports copies
  for (int N : {1, 3}) {
    gradsync::Options opt;
    opt.backward_passes_per_step = N;
    opt.tuning.fusion_threshold_bytes = 1024;  // many chunks through one window
    opt.check_finite = N == 3;                 // its scan allocates nothing either
    auto m = make_model<T>(rank);
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    register_model(sync, m);
    fill(m, rank, 0);
    CHECK(sync.synchronize() == (N == 1));
    const auto after_first = sync.stats();
    long heap = 0, kokkos = 0;
    int steps = 0;
    for (int p = 1; p <= 12; ++p) {
      fill(m, rank, p);  // the test's own copies to device memory are not counted
      const long before = gradsync_test::heap_allocations();
      const long kokkos_before = gradsync_test::kokkos_counts().allocations;
      steps += sync.synchronize();  // checked after the counted region
      heap += gradsync_test::heap_allocations() - before;
      kokkos += gradsync_test::kokkos_counts().allocations - kokkos_before;
    }
    CAPTURE(N);
    CHECK(steps == (13 / N) - (N == 1));  // calls 2..13 complete a step every Nth call
    CAPTURE(heap);
    CAPTURE(kokkos);
    CAPTURE(gradsync_test::last_kokkos_allocation());
    GRADSYNC_CHECK_ALL(heap == 0);
    GRADSYNC_CHECK_ALL(kokkos == 0);
    GRADSYNC_CHECK_ALL(sync.stats().allocations == after_first.allocations);
    GRADSYNC_CHECK_ALL(sync.stats().plan_builds == 1);
    // The window is one chunk when N == 1; with aggregation it holds every data-parallel sum.
    const std::size_t expect_buffer = N == 1 ? 1024 : dense_bytes(m);
    GRADSYNC_CHECK_ALL(sync.stats().buffer_bytes >= expect_buffer);
  }
}

// Ring sums of ten sizes from 66 KiB to 1.2 MiB, all in flight at once: more sums than the ring's 4
// shared receive buffers, lent to sums of whatever size comes next, so a buffer must be grown
// to the largest segment in the first step and never again. Host memory: the ring is MpiBackend's
// sum of host buffers (device memory would be staged, nothing reduced in place).
TEST_CASE("no allocation after the first synchronize, ring sums of many sizes in flight") {
  const int rank = world_rank(), n = world_size();
  const std::vector<std::size_t> sizes = {20000, 70000, 150000, 40000, 300000, 17000, 90000, 250000, 33000, 120000};
  using HostView = Kokkos::View<float*, Kokkos::HostSpace>;
  std::vector<HostView> g;
  gradsync::GradientSync<gradsync::MpiBackend, HostView> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  for (std::size_t s : sizes) {
    g.emplace_back("g", s);
    sync.add<Dense>(g.back());
  }
  long heap = 0;
  double worst = 0;
  for (int p = 0; p <= 12; ++p) {
    for (auto& v : g) Kokkos::deep_copy(v, float(rank + 1 + p));
    const long before = gradsync_test::heap_allocations();
    const bool stepped = sync.synchronize();
    if (p > 0) heap += gradsync_test::heap_allocations() - before;
    CHECK(stepped);
    for (auto& v : g)
      for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, rel_err(v(i), (n + 1) / 2.0 + p));
  }
  CAPTURE(heap);
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst < 1e-6);
  GRADSYNC_CHECK_ALL(heap == 0);
  GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place == 13 * 1090000 * sizeof(float));  // every tensor in place
}

// Capability::region_sums: one ring over several regions as if they were one buffer. Regions of
// every size (empty, one value, smaller than a ring segment, spanning several segments), so that a
// segment crosses regions and goes as several messages: exact sums times the factor, and every rank
// holds rank 0's bits where the order of the additions matters.
TEST_CASE_TEMPLATE("MpiBackend sum over regions: the sums of one buffer, the same bits on every rank", T, float,
                   double) {
  const int rank = world_rank(), n = world_size();
  gradsync::MpiBackend b(MPI_COMM_WORLD);
  const std::size_t at = gradsync::MpiBackend::ring_min_bytes / sizeof(T);
  const std::vector<std::size_t> sizes = {at / 3 + 1, 0, 5, 1, 2 * at + 1, 7, at / 2};
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  auto exact = [](int r, std::size_t k, std::size_t i) { return T(double((r + 1) * int((i + k) % 97)) + 0.25 * r); };
  const T third = T(1) / T(3);
  for (bool order_dependent : {false, true}) {
    CAPTURE(order_dependent);
    auto value = [&](int r, std::size_t k, std::size_t i) {
      return order_dependent ? T(std::sin(double(i) * 0.37 + double(k) + r) / (1.0 + r)) : exact(r, k, i);
    };
    std::vector<std::vector<T>> bufs;
    std::vector<gradsync::SumRegion<T>> regions;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      bufs.emplace_back(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) bufs[k][i] = value(rank, k, i);
    }
    for (auto& v : bufs) regions.push_back({v.data(), v.size()});
    if (!b.sums_regions(total * sizeof(T))) {  // one rank: there is no ring
      CHECK(n == 1);
      CHECK_THROWS_AS(b.iallreduce_sum_regions(regions.data(), regions.size(), third), gradsync::Error);
      continue;
    }
    CHECK_FALSE(b.sums_regions(std::size_t(at - 1) * sizeof(T)));  // below the ring: MPI's own schedule
    auto r = b.iallreduce_sum_regions(regions.data(), regions.size(), third);
    b.wait(r);
    double worst = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        T s = 0;
        for (int q = 0; q < n; ++q) s += value(q, k, i);
        if (!order_dependent) worst = std::max(worst, double(bufs[k][i] != s * third));
        double d = 0;
        for (int q = 0; q < n; ++q) d += double(value(q, k, i));
        if (order_dependent) worst = std::max(worst, std::abs(double(bufs[k][i]) - d / 3));
      }
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst <= (order_dependent ? (sizeof(T) == 4 ? 1e-5 : 1e-13) : 0.0));
    bool same = true;
    for (auto& v : bufs) {
      std::vector<T> ref = v;
      MPI_Bcast(ref.data(), int(ref.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
      same &= v.empty() || std::memcmp(ref.data(), v.data(), v.size() * sizeof(T)) == 0;  // empty: null data
    }
    GRADSYNC_CHECK_ALL(same);
  }
}

// Capability::shard_sums: the two halves of a sharded step over regions of every size (as above),
// at every size (one value per rank and fewer; the ring runs at any size here). After the
// reduce-scatter, this rank's slice (shard_slice) holds factor * the exact sum (weighted: of each
// rank's pre * values); after the allgather, every value is its owner's, on every rank.
TEST_CASE_TEMPLATE("MpiBackend sharded halves over regions: the slice's sum, then every owner's values", T, float,
                   double) {
  const int rank = world_rank(), n = world_size();
  gradsync::MpiBackend b(MPI_COMM_WORLD);
  auto exact = [](int r, std::size_t k, std::size_t i) { return T(double((r + 1) * int((i + k) % 97)) + 0.25 * r); };
  const T third = T(1) / T(3);
  for (const std::vector<std::size_t>& sizes : {std::vector<std::size_t>{3}, std::vector<std::size_t>{0, 1, 2},
                                                std::vector<std::size_t>{5000, 0, 7, 1, 20011, 3}}) {
    for (bool weighted : {false, true}) {
      CAPTURE(sizes.size());
      CAPTURE(weighted);
      std::size_t total = 0;
      for (std::size_t s : sizes) total += s;
      std::vector<std::vector<T>> bufs;
      std::vector<gradsync::SumRegion<T>> regions;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        bufs.emplace_back(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) bufs[k][i] = exact(rank, k, i);
      }
      for (auto& v : bufs) regions.push_back({v.data(), v.size()});
      const T pre = T(rank + 1);  // exact weights
      auto r = weighted ? b.ireduce_scatter_sum_regions(regions.data(), regions.size(), third, pre)
                        : b.ireduce_scatter_sum_regions(regions.data(), regions.size(), third);
      b.wait(r);
      const auto [lo, hi] = gradsync::shard_slice(total, n, rank);
      bool ok = true;
      std::size_t at = 0;
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i, ++at) {
          if (at < lo || at >= hi) {
            bufs[k][i] = T(-1);  // unspecified: the allgather must overwrite it
            continue;
          }
          T s = 0;
          for (int q = 0; q < n; ++q) s += (weighted ? T(q + 1) : T(1)) * exact(q, k, i);
          ok &= bufs[k][i] == s * third;
        }
      GRADSYNC_CHECK_ALL(ok);
      std::vector<std::vector<T>> mine = bufs;  // this rank's slice, to compare with the others'
      auto g = b.iallgather_regions(regions.data(), regions.size());
      b.wait(g);
      bool same = true;
      for (std::size_t k = 0; k < bufs.size(); ++k) {
        std::vector<T> ref = bufs[k];
        MPI_Bcast(ref.data(), int(ref.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
        same &= ref.empty() || std::memcmp(ref.data(), bufs[k].data(), ref.size() * sizeof(T)) == 0;
        for (T x : bufs[k]) same &= x != T(-1);
      }
      at = 0;
      for (std::size_t k = 0; k < sizes.size(); ++k)  // this rank's slice came back as it was
        for (std::size_t i = 0; i < sizes[k]; ++i, ++at)
          if (at >= lo && at < hi) same &= bufs[k][i] == mine[k][i];
      GRADSYNC_CHECK_ALL(same);
    }
  }
}

// MpiBackend's nonblocking sum: host buffers of at least ring_min_bytes go through gradsync's own
// ring (reduce-scatter + allgather), smaller ones to MPI_Iallreduce. Sizes around the threshold,
// not divisible by the rank count, several operations in flight completed in any order by test()
// or wait(): exact sums of exactly representable values, and identical bits on every rank for
// values whose sum depends on the order.
TEST_CASE_TEMPLATE("MpiBackend nonblocking sum: exact, and the same bits on every rank", T, float, double) {
  const int rank = world_rank(), n = world_size();
  gradsync::MpiBackend b(MPI_COMM_WORLD);
  const std::size_t at = gradsync::MpiBackend::ring_min_bytes / sizeof(T);
  // Eight ring sums, more than the ring's receive buffers (4): later ones wait for a buffer, and a
  // buffer lent to a smaller sum grows for a larger one.
  const std::vector<std::size_t> sizes = {
      3, at - 1, at, at + 1, 3 * at + 2, (std::size_t(1) << 20) + 7, 2 * at + 1, 5 * at + 3, at + 5, 7 * at};
  auto exact = [](int r, std::size_t i) { return T(double((r + 1) * int(i % 97)) + 0.25 * r); };
  std::vector<std::vector<T>> bufs;
  for (std::size_t s : sizes) {
    bufs.emplace_back(s);
    for (std::size_t i = 0; i < s; ++i) bufs.back()[i] = exact(rank, i);
  }
  // All in flight at once; completed by polling in reverse order, the last ones by wait().
  std::vector<gradsync::MpiBackend::Request> reqs;
  for (auto& v : bufs) reqs.push_back(b.iallreduce_sum(v.data(), v.size()));
  std::vector<bool> done(reqs.size(), false);
  for (std::size_t left = reqs.size(); left > 2;)
    for (std::size_t k = reqs.size(); k-- > 2;)
      if (!done[k] && b.test(reqs[k])) done[k] = true, --left;
  b.wait(reqs[1]);
  b.wait(reqs[0]);
  bool ok = true;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::size_t i = 0; i < sizes[k]; ++i) {
      T s = 0;
      for (int r = 0; r < n; ++r) s += exact(r, i);
      ok &= bufs[k][i] == s;
    }
  GRADSYNC_CHECK_ALL(ok);
  CHECK(b.test(reqs[3]));  // a completed request stays complete

  // A factor (an average's 1/n) is folded into ring sums, each value rounded once after its exact
  // sum; other sums refuse one, so the caller knows to scale.
  const T third = T(1) / T(3);
  bufs.clear();
  reqs.clear();
  for (std::size_t s : sizes) {
    bufs.emplace_back(s);
    for (std::size_t i = 0; i < s; ++i) bufs.back()[i] = exact(rank, i);
    if (b.folds_factor(s * sizeof(T)))
      reqs.push_back(b.iallreduce_sum(bufs.back().data(), s, third));
    else
      CHECK_THROWS_AS(b.iallreduce_sum(bufs.back().data(), s, third), gradsync::Error);
  }
  for (auto& q : reqs) b.wait(q);
  CHECK(reqs.size() == (n == 1 ? 0u : 8u));
  ok = true;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (!b.folds_factor(sizes[k] * sizeof(T))) continue;
    for (std::size_t i = 0; i < sizes[k]; ++i) {
      T s = 0;
      for (int r = 0; r < n; ++r) s += exact(r, i);
      ok &= bufs[k][i] == s * third;
    }
  }
  GRADSYNC_CHECK_ALL(ok);

  // Order-dependent values: every rank must hold rank 0's bits (replicas never drift apart).
  std::vector<T> v(3 * at + 5), ref(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = T(std::sin(double(i) * 0.37 + rank) / (1.0 + rank));
  auto r = b.iallreduce_sum(v.data(), v.size());
  b.wait(r);
  ref = v;
  MPI_Bcast(ref.data(), int(ref.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  GRADSYNC_CHECK_ALL(std::memcmp(ref.data(), v.data(), v.size() * sizeof(T)) == 0);
  double worst = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += double(T(std::sin(double(i) * 0.37 + q) / (1.0 + q)));
    worst = std::max(worst, std::abs(double(v[i]) - s));
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst <= (sizeof(T) == 4 ? 1e-5 : 1e-13));
}
