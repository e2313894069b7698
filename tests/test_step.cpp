// The step protocol (impl/sync_step.hpp) when training goes wrong: an exception thrown by the user's
// own code with chunks in flight, a NaN found by check_finite during overlap, registrations changed
// mid-step, a failure inside a collective phase on one rank. In every case no rank crashes or hangs,
// the peers throw at once an error naming the rank that failed (never "missing", never after the
// stall deadline: the deadlines here are 20 s and 0), no NaN reaches another rank, later calls of
// the failed sync throw at once, and MPI and a new sync work afterwards with exact values.
#include <gradsync/gradsync.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::has;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

constexpr std::size_t kLen = 128;  // one chunk per tensor (1 KiB chunks)

gradsync::Options opts(double stall_timeout = 20.0) {
  gradsync::Options o;
  o.op = gradsync::ReduceOp::average;
  o.tuning.fusion_threshold_bytes = kLen * sizeof(double);
  o.tuning.collectives = gradsync::Collectives::nonblocking;
  o.stall_timeout = stall_timeout;
  o.tuning.stall_warning = 0;
  o.tuning.read_environment = false;
  return o;
}

double value(std::size_t k, std::size_t i, int rank) { return (rank + 1) * double(k + 1) + 0.01 * double(i); }
double average(std::size_t k, std::size_t i, int n) { return 0.5 * (n + 1) * double(k + 1) + 0.01 * double(i); }

// Built by appending: "g" + std::to_string(k) (an insert at 0 inside std::string) raised g++ 12's
// -Wstringop-overflow in C++20 at -O3 (a false positive, an error under -Werror).
std::string grad_name(std::size_t k) {
  std::string s = "g";
  s += std::to_string(k);
  return s;
}

struct Model {
  std::vector<View> g;
  explicit Model(std::size_t len = kLen) {
    for (int k = 0; k < 4; ++k) g.emplace_back(grad_name(std::size_t(k)), len);
  }
  void fill(int rank) {
    for (std::size_t k = 0; k < g.size(); ++k)
      gradsync_test::fill_host(g[k], [&](std::size_t i) { return value(k, i, rank); });
  }
  template <class S>
  void add_to(S& sync) {
    for (std::size_t k = 0; k < g.size(); ++k) sync.template add<Dense>(g[k], grad_name(k));
  }
  bool averaged(int n) const {
    bool ok = true;
    for (std::size_t k = 0; k < g.size(); ++k) {
      const auto h = gradsync_test::host_values(g[k]);
      for (std::size_t i = 0; i < h.size(); ++i) ok &= gradsync_test::rel_err(h[i], average(k, i, n)) < 1e-14;
    }
    return ok;
  }
  bool finite() const {
    bool ok = true;
    for (const View& v : g)
      for (double x : gradsync_test::host_values(v)) ok &= std::isfinite(x);
    return ok;
  }
};

// After a failure: plain MPI on the world communicator works, and so does a new sync.
void mpi_and_a_new_sync_work() {
  MPI_Barrier(MPI_COMM_WORLD);
  int x = world_rank();
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  GRADSYNC_CHECK_ALL(x == world_size() * (world_size() - 1) / 2);
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  m.add_to(sync);
  for (int step = 0; step < 2; ++step) {
    m.fill(world_rank());
    for (auto it = m.g.rbegin(); it != m.g.rend(); ++it) sync.mark_ready(*it);
    GRADSYNC_CHECK_ALL(sync.synchronize());
    GRADSYNC_CHECK_ALL(m.averaged(world_size()));
  }
}

// MpiBackend whose nonblocking sum throws on one rank: a failure inside a collective phase that no
// check of gradsync's own raises (an MPI error, a count limit, a device error would look the same).
class FailingBackend : public gradsync::MpiBackend {
 public:
  FailingBackend(MPI_Comm comm, int failing_rank) : MpiBackend(comm), failing_rank_(failing_rank) {}
  using MpiBackend::iallreduce_sum;
  template <class T>
  Request iallreduce_sum(T* buf, std::size_t n) const {
    if (rank() == failing_rank_) throw std::runtime_error("injected failure in the backend's sum");
    return MpiBackend::iallreduce_sum(buf, n);
  }

 private:
  int failing_rank_;
};

}  // namespace

TEST_CASE("an exception during backward with chunks in flight: no crash, the peers name the rank") {
  const int rank = world_rank(), n = world_size();
  // 1 KiB chunks go to MPI_Iallreduce; 128 KiB ones to gradsync's ring, reduced in place.
  for (std::size_t len : {kLen, std::size_t(16384)})
    for (double deadline : {20.0, 0.0})
      for (int victim : {0, n - 1, -1}) {  // -1: every rank throws
        const bool everyone = victim < 0;
        CAPTURE(len);
        CAPTURE(deadline);
        CAPTURE(victim);
        Model m(len);
        std::string sync_error;
        bool user_error = false;
        try {
          gradsync::Options o = opts(deadline);
          o.tuning.fusion_threshold_bytes = len * sizeof(double);
          Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
          m.add_to(sync);
          m.fill(rank);
          sync.mark_ready(m.g[3]);  // the step opens and its first chunk is launched
          if (everyone || rank == victim) throw std::runtime_error("loss is NaN");  // the user's own code
          for (int k = 2; k >= 0; --k) sync.mark_ready(m.g[std::size_t(k)]);
          (void)sync.synchronize();  // waits for chunks the victim never launches
        } catch (const gradsync::Error& e) {
          sync_error = e.what();
        } catch (const std::runtime_error& e) {
          user_error = std::string(e.what()) == "loss is NaN";
        }
        CAPTURE(sync_error);
        if (rank == victim) {
          CHECK(user_error);
          CHECK(sync_error.empty());
        } else if (everyone) {
          // Its own exception, or, when a faster peer's abandonment reached it first (still in
          // mark_ready()'s checks: MPICH's timing shows it), that peer named.
          CHECK((user_error ? sync_error.empty() : has(sync_error, "abandoned its step with the exchange in flight")));
        } else {
          CHECK(!user_error);
          CHECK(has(sync_error, "rank " + std::to_string(victim) + " abandoned its step with the exchange in flight"));
          CHECK(has(sync_error, "while an exception unwound the stack"));
          CHECK(has(sync_error, "so rank " + std::to_string(rank) + " stops too"));
          CHECK(!has(sync_error, "missing"));
        }
        mpi_and_a_new_sync_work();
      }
}

TEST_CASE("check_finite during overlap: the NaN never leaves its rank, every rank names it") {
  const int rank = world_rank(), n = world_size(), victim = n - 1;
  gradsync::Options o = opts();
  o.check_finite = true;
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  m.add_to(sync);
  m.fill(rank);
  for (auto it = m.g.rbegin(); it != m.g.rend(); ++it) sync.mark_ready(*it);
  GRADSYNC_CHECK_ALL(sync.synchronize());  // finite: no false alarm
  GRADSYNC_CHECK_ALL(m.averaged(n));
  m.fill(rank);
  if (rank == victim) gradsync_test::set_value(m.g[1], 5, std::nan(""));
  std::string what;
  try {
    for (auto it = m.g.rbegin(); it != m.g.rend(); ++it) sync.mark_ready(*it);  // the victim throws at g1's chunk
    (void)sync.synchronize();
  } catch (const gradsync::Error& e) {
    what = e.what();
  }
  CAPTURE(what);
  GRADSYNC_CHECK_ALL(
      has(what, "gradient 'g1' (group Dense, 128 values) holds NaN or Inf on rank " + std::to_string(victim)));
  if (rank != victim) {
    // "before the <phase this rank waits in>": the allreduce, or the arrival check when the victim's
    // notice overtakes this rank (seen under MPICH).
    CHECK((has(what, "rank " + std::to_string(victim) + " failed before the allreduce of synchronize() call 2") ||
           has(what, "rank " + std::to_string(victim) + " failed before the arrival check of synchronize() call 2")));
    CHECK(m.finite());  // nothing of the victim's g1 was summed here
  }
  // The sync failed on every rank: each later call says so at once.
  const std::string later = error_of([&] { (void)sync.synchronize(); });
  GRADSYNC_CHECK_ALL(has(later, "synchronize(): this GradientSync failed in "));
  GRADSYNC_CHECK_ALL(has(later, "holds NaN or Inf on rank " + std::to_string(victim)));
  GRADSYNC_CHECK_ALL(has(later, "build a new one on every rank"));
  GRADSYNC_CHECK_ALL(has(error_of([&] { sync.mark_ready(m.g[0]); }), "this GradientSync failed"));
  GRADSYNC_CHECK_ALL(has(error_of([&] { sync.add<Dense>(m.g[0]); }), "this GradientSync failed"));
  mpi_and_a_new_sync_work();
}

TEST_CASE("registrations and scales changed while a step is open are refused; the step goes on intact") {
  const int rank = world_rank(), n = world_size();
  View a("a", 200), b("b", 50);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  sync.add<Dense>(a, "a");
  gradsync_test::fill_host(a, [&](std::size_t) { return rank + 1.0; });
  gradsync_test::fill_host(b, [&](std::size_t) { return rank + 1.0; });
  sync.mark_ready(a);  // opens the step
  GRADSYNC_CHECK_ALL(has(error_of([&] { sync.add<Dense>(b, "b"); }), "add() called while a step is open"));
  GRADSYNC_CHECK_ALL(
      has(error_of([&] { sync.register_local_var(a); }), "register_local_var() called while a step is open"));
  GRADSYNC_CHECK_ALL(has(error_of([&] { gradsync::impl::SyncAccess::defer_local_scale(sync, a); }),
                         "defer_local_scale('a', group Dense) called while a step is open"));
  GRADSYNC_CHECK_ALL(has(error_of([&] { sync.prepare(); }), "prepare() called while a step is open"));
  GRADSYNC_CHECK_ALL(
      has(error_of([&] { (void)gradsync::global_norm(sync); }), "global_norm() called while a step is open"));
  GRADSYNC_CHECK_ALL(sync.num_tensors() == 1);
  GRADSYNC_CHECK_ALL(sync.synchronize());
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(a, 199) == 0.5 * (n + 1));
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(b, 0) == rank + 1.0);  // never registered: untouched
  // Between steps the same calls are legal.
  sync.add<Dense>(b, "b");
  gradsync_test::fill_host(a, [&](std::size_t) { return rank + 1.0; });
  GRADSYNC_CHECK_ALL(sync.synchronize());
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(b, 49) == 0.5 * (n + 1));
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(a, 0) == 0.5 * (n + 1));

  // Inside an aggregation cycle too.
  gradsync::Options o = opts();
  o.backward_passes_per_step = 2;
  Sync agg(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View c("c", 10);
  agg.add<Dense>(a, "a");
  gradsync_test::fill_host(a, [&](std::size_t) { return rank + 1.0; });
  GRADSYNC_CHECK_ALL(!agg.synchronize());
  GRADSYNC_CHECK_ALL(
      has(error_of([&] { agg.add<Dense>(c, "c"); }), "add() called after pass 1 of 2 of an aggregation cycle"));
  GRADSYNC_CHECK_ALL(agg.synchronize());
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(a, 3) == n + 1.0);  // the sum of two passes, averaged
}

TEST_CASE("a failure inside a collective phase on one rank is told: every peer throws at once, naming it") {
  const int rank = world_rank(), n = world_size(), victim = n - 1;
  GRADSYNC_SKIP_BELOW_RANKS(2, "a failure on one rank needs a peer to be told");
  for (double deadline : {20.0, 0.0}) {
    CAPTURE(deadline);
    Model m;
    gradsync::GradientSync<FailingBackend, View> sync(FailingBackend(MPI_COMM_WORLD, victim), opts(deadline));
    m.add_to(sync);
    m.fill(rank);
    std::string what, kind;
    try {
      (void)sync.synchronize();
    } catch (const gradsync::StallError& e) {
      what = e.what(), kind = "stall";
    } catch (const gradsync::Error& e) {
      what = e.what(), kind = "error";
    } catch (const std::runtime_error& e) {
      what = e.what(), kind = "runtime";
    }
    CAPTURE(what);
    if (rank == victim) {
      CHECK(kind == "runtime");  // the original exception, rethrown
      CHECK(what == "injected failure in the backend's sum");
    } else {
      CHECK(kind == "error");
      // "before the <phase this rank waits in>": the allreduce, or still the consistency check when
      // the victim's notice overtakes this rank (seen under MPICH).
      CHECK((has(what, "rank " + std::to_string(victim) + " failed before the allreduce of") ||
             has(what, "rank " + std::to_string(victim) + " failed before the consistency check")));
      CHECK(has(what, " of synchronize() call 1, so rank " + std::to_string(rank) +
                          " stops too: injected failure in the backend's sum (in synchronize() on rank " +
                          std::to_string(victim) + ")"));
    }
    const std::string later = error_of([&] { (void)sync.synchronize(); });
    GRADSYNC_CHECK_ALL(
        has(later, "this GradientSync failed in synchronize() (synchronize() call 1) on rank " + std::to_string(rank)));
    GRADSYNC_CHECK_ALL(has(later, "injected failure in the backend's sum"));
    mpi_and_a_new_sync_work();
  }
}

namespace {
// A sync of Model after one step with the right values, and their global norm checked.
void first_step_and_norm(Model& m, Sync& sync) {
  const int rank = world_rank(), n = world_size();
  m.add_to(sync);
  m.fill(rank);
  GRADSYNC_CHECK_ALL(sync.synchronize());
  double expect = 0;
  for (std::size_t k = 0; k < m.g.size(); ++k)
    for (std::size_t i = 0; i < kLen; ++i) expect += average(k, i, n) * average(k, i, n);
  GRADSYNC_CHECK_ALL(gradsync_test::rel_err(gradsync::global_norm(sync), std::sqrt(expect)) < 1e-14);
}
}  // namespace

TEST_CASE("the global norm under a deadline: the norm of the averaged gradients") {
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(2.0));
  first_step_and_norm(m, sync);
}

TEST_CASE("the global norm is watched: a rank that skips it is named by every rank that waited") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a rank that skips the norm needs a peer that waits for it");
  const int rank = world_rank(), n = world_size(), victim = n - 1;
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(2.0));
  first_step_and_norm(m, sync);
  m.fill(rank);
  std::string what;
  try {
    if (rank != victim) (void)gradsync::global_norm(sync);  // the bug: the victim skips it
    (void)sync.synchronize();
  } catch (const gradsync::StallError& e) {
    what = e.what();
  }
  CAPTURE(what);
  if (rank != victim) {
    CHECK(has(what, "for the global norm's allreduce"));
    CHECK(has(what, "rank " + std::to_string(victim) + ": arrival check"));  // where the victim waits
  } else {
    CHECK(has(what, "failed before the arrival check of synchronize() call 2, so rank " + std::to_string(victim) +
                        " stops too"));
  }
  // The deadline holds: not before it (2 s), within its promise (1.1x) but for the time a loaded
  // machine kept this rank from running (gradsync_test.hpp: kSchedulingSlack_s).
  if (rank != victim) {
    const double deadline = opts(2.0).stall_timeout, waited = gradsync_test::reported_wait(what);
    CHECK(waited >= deadline);
    CHECK(waited <= deadline * gradsync_test::kStallPromiseFactor + gradsync_test::kSchedulingSlack_s);
  }
  GRADSYNC_CHECK_ALL(has(error_of([&] { (void)gradsync::global_norm(sync); }), "this GradientSync failed"));
  mpi_and_a_new_sync_work();
}

TEST_CASE("broadcast_parameters is watched: a rank that skips it is named, none waits forever") {
  const int rank = world_rank(), n = world_size(), victim = n - 1;
  GRADSYNC_SKIP_BELOW_RANKS(2, "a rank that skips the broadcast needs a peer that waits for it");
  View w("w", 40), gw("gw", 40);
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(2.0)));
  dopt.template add<Dense>(w, gw, "w");
  gradsync_test::fill_host(w, [&](std::size_t i) { return rank + 0.5 * double(i); });
  dopt.broadcast_parameters(0);  // every rank: root's values everywhere
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(w, 39) == 19.5);
  std::string what;
  try {
    if (rank != victim) dopt.broadcast_parameters(0);  // the bug: the victim skips it
    (void)dopt.synchronize();
  } catch (const gradsync::StallError& e) {
    what = e.what();
  }
  CAPTURE(what);
  if (rank != victim) {
    CHECK(has(what, "for the broadcast of parameters"));
    CHECK(has(what, "rank " + std::to_string(victim) + ": arrival check"));
  } else {
    CHECK(has(what, "so rank " + std::to_string(victim) + " stops too"));
  }
  GRADSYNC_CHECK_ALL(has(error_of([&] { dopt.broadcast_parameters(0); }), "this GradientSync failed"));
  mpi_and_a_new_sync_work();
}
