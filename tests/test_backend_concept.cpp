// A backend written from include/gradsync/backend.hpp's list alone, with no MPI inside it, run
// through the sync's semantics: the data-parallel average and sum with their scale factors, local
// groups, aggregation over backward passes. Its world is this process (one rank), so every sum is
// the identity and each expected value is exact.
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

namespace {

// The required members only. Nonblocking sums complete on their second test(), as a real backend's
// would some time after they start: the sync has to poll them.
class LoopbackBackend {
 public:
  struct Request {
    int tests_left = 0;  // a default Request is complete
  };
  // What the sync handed over: the data-parallel gradients only, never the local ones.
  struct Counts {
    std::size_t blocking_sums = 0;     // values
    std::size_t nonblocking_sums = 0;  // values
    std::size_t tests = 0;
  };

  static const char* name() { return "loopback"; }
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class MemorySpace>
  bool can_access() const {
    return Kokkos::SpaceAccessibility<Kokkos::DefaultHostExecutionSpace, MemorySpace>::accessible;
  }
  template <class T>
  void allreduce_sum(T*, std::size_t n) const {
    counts_->blocking_sums += n;
  }
  template <class T>
  Request iallreduce_sum(T*, std::size_t n) const {
    counts_->nonblocking_sums += n;
    return Request{2};
  }
  bool test(Request& r) const {
    ++counts_->tests;
    if (r.tests_left > 0) --r.tests_left;
    return r.tests_left == 0;
  }
  void wait(Request& r) const { r.tests_left = 0; }
  template <class T>
  void allreduce_min(T*, std::size_t) const {}
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    std::copy(send, send + n, recv);
  }

  // Shared by the copy the sync holds.
  const Counts& counts() const { return *counts_; }

 private:
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

struct NotABackend {};

using Grad = std::vector<double>;
using Sync = gradsync::GradientSync<LoopbackBackend, Grad>;

static_assert(gradsync::impl::is_backend_v<LoopbackBackend, double, Kokkos::HostSpace>);
static_assert(!gradsync::impl::is_backend_v<NotABackend, double, Kokkos::HostSpace>);
// Minimal: none of the optional capabilities.
static_assert(!gradsync::impl::has_split<LoopbackBackend>::value &&
              !gradsync::impl::has_mpi_comm<LoopbackBackend>::value &&
              !gradsync::impl::has_topology<LoopbackBackend>::value &&
              !gradsync::impl::has_folds_factor<LoopbackBackend>::value &&
              !gradsync::impl::sums_wire<LoopbackBackend>::value &&
              !gradsync::impl::has_ibroadcast<LoopbackBackend>::value &&
              !gradsync::impl::has_max_count<LoopbackBackend>::value &&
              gradsync::impl::reads_memory_space<LoopbackBackend, Kokkos::HostSpace>::value);

struct Dense {};
struct Tower {};

gradsync::Options options(gradsync::Collectives c) {
  gradsync::Options o;
  o.tuning.read_environment = false;  // the semantics under test, whatever GRADSYNC_* says
  o.tuning.collectives = c;
  return o;
}

// Pass p's gradient of tensor `tag`: small integers, so that every expected value is exact.
void fill(Grad& g, int tag, int pass) {
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = double(tag * 100 + int(i) + 10 * pass);
}

}  // namespace

template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

TEST_CASE("a backend written from backend.hpp: average and sum, prescale and postscale") {
  for (auto c : {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking})
    for (auto op : {gradsync::ReduceOp::average, gradsync::ReduceOp::sum})
      for (double stall_timeout : {300.0, 0.0}) {  // waits by test() under a deadline, or by wait()
        CAPTURE(int(c));
        CAPTURE(int(op));
        CAPTURE(stall_timeout);
        gradsync::Options o = options(c);
        o.op = op;
        o.prescale_factor = 2.0;
        o.postscale_factor = 0.25;
        o.stall_timeout = stall_timeout;
        LoopbackBackend backend;
        Sync sync(backend, o);
        Grad a(1000), b(37), d(3);
        sync.add<Dense>(a, "a");
        sync.add<Dense>(b, "b");
        sync.add<Dense>(d, "d");
        for (int pass = 0; pass < 3; ++pass) {
          fill(a, 1, pass);
          fill(b, 2, pass);
          fill(d, 3, pass);
          REQUIRE(sync.synchronize());
          // One rank: the average and the sum are the gradient itself, times prescale * postscale.
          bool exact = true;
          for (std::size_t i = 0; i < a.size(); ++i) exact &= a[i] == 0.5 * double(100 + int(i) + 10 * pass);
          for (std::size_t i = 0; i < b.size(); ++i) exact &= b[i] == 0.5 * double(200 + int(i) + 10 * pass);
          for (std::size_t i = 0; i < d.size(); ++i) exact &= d[i] == 0.5 * double(300 + int(i) + 10 * pass);
          CHECK(exact);
        }
        const std::size_t per_pass = a.size() + b.size() + d.size();
        const LoopbackBackend::Counts& n = backend.counts();
        CHECK(n.blocking_sums + n.nonblocking_sums == 3 * per_pass);
        if (c == gradsync::Collectives::blocking) {
          CHECK(n.nonblocking_sums == 0);
        } else {
          CHECK(n.blocking_sums == 0);
          if (stall_timeout > 0) CHECK(n.tests > 0);  // polled, not waited
        }
        CHECK(sync.stats().bytes_allreduced == 3 * per_pass * sizeof(double));
        const gradsync::SyncSummary s = sync.summary();
        CHECK(s.ranks == 1);
        CHECK(s.backend == "loopback");
      }
}

TEST_CASE("a backend written from backend.hpp: local groups scaled by 1/world_size = 1, never handed over") {
  for (auto c : {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking})
    for (bool scale_local : {true, false}) {
      CAPTURE(int(c));
      CAPTURE(scale_local);
      gradsync::Options o = options(c);
      o.prescale_factor = 4.0;  // data-parallel only
      o.scale_local_gradients = scale_local;
      LoopbackBackend backend;
      Sync sync(backend, o);
      Grad dense(50), tower(20), runtime_local(30);
      sync.add<Dense>(dense, "dense");
      sync.add<Tower>(tower, "tower");
      sync.add<Dense>(runtime_local, "runtime_local");
      sync.register_local_var(runtime_local);
      fill(dense, 1, 0);
      fill(tower, 2, 0);
      fill(runtime_local, 3, 0);
      REQUIRE(sync.synchronize());
      bool exact = true;
      for (std::size_t i = 0; i < dense.size(); ++i) exact &= dense[i] == 4.0 * double(100 + int(i));
      for (std::size_t i = 0; i < tower.size(); ++i) exact &= tower[i] == double(200 + int(i));
      for (std::size_t i = 0; i < runtime_local.size(); ++i) exact &= runtime_local[i] == double(300 + int(i));
      CHECK(exact);
      const LoopbackBackend::Counts& n = backend.counts();
      CHECK(n.blocking_sums + n.nonblocking_sums == dense.size());
      CHECK(sync.stats().bytes_allreduced == dense.size() * sizeof(double));
    }
}

TEST_CASE("a backend written from backend.hpp: backward_passes_per_step = 2") {
  for (auto c : {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking})
    for (bool average_aggregated : {false, true}) {
      CAPTURE(int(c));
      CAPTURE(average_aggregated);
      gradsync::Options o = options(c);
      o.backward_passes_per_step = 2;
      o.average_aggregated_gradients = average_aggregated;
      o.postscale_factor = 0.5;
      LoopbackBackend backend;
      Sync sync(backend, o);
      Grad dense(64), tower(8), runtime_local(16);
      sync.add<Dense>(dense, "dense");
      sync.add<Tower>(tower, "tower");
      sync.add<Dense>(runtime_local, "runtime_local");
      sync.register_local_var(runtime_local);
      const double agg = average_aggregated ? 2.0 : 1.0;
      for (int cycle = 0; cycle < 2; ++cycle) {
        const int first = 2 * cycle;
        for (int pass = first; pass < first + 2; ++pass) {
          fill(dense, 1, pass);
          fill(tower, 2, pass);
          fill(runtime_local, 3, pass);
          const bool ready = sync.synchronize();
          CHECK(ready == (pass == first + 1));
        }
        // The cycle's two passes summed (then / 2 with average_aggregated_gradients); the
        // postscale applies to the data-parallel group only.
        const auto cycle_sum = [&](int tag, std::size_t i) {
          return double(tag * 100 + int(i) + 10 * first) + double(tag * 100 + int(i) + 10 * (first + 1));
        };
        bool exact = true;
        for (std::size_t i = 0; i < dense.size(); ++i) exact &= dense[i] == 0.5 * cycle_sum(1, i) / agg;
        for (std::size_t i = 0; i < tower.size(); ++i) exact &= tower[i] == cycle_sum(2, i) / agg;
        for (std::size_t i = 0; i < runtime_local.size(); ++i) exact &= runtime_local[i] == cycle_sum(3, i) / agg;
        CAPTURE(cycle);
        CHECK(exact);
      }
      // One exchange per cycle, of the data-parallel values only.
      const LoopbackBackend::Counts& n = backend.counts();
      CHECK(n.blocking_sums + n.nonblocking_sums == 2 * dense.size());
    }
}
