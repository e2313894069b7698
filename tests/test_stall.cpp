// The stall watchdog: a rank that skips a synchronize(), sleeps past the deadline, or never builds
// its GradientSync is reported by rank number by the ranks that arrived, which throw StallError
// (or MPI_Abort with the report, stall_action = abort); the process always ends by itself.
// Deadlines are short (1 s) so the whole program takes seconds. The reported wait is checked
// against the deadline's promise (never before it, never past 1.1x of it), plus an allowance for
// ranks descheduled on a loaded machine (gradsync_test.hpp: kSchedulingSlack_s).
#include <gradsync/gradsync.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "gradsync_test.hpp"

using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

using gradsync_test::has;

gradsync::Options stall_opts() {
  gradsync::Options o;
  o.op = gradsync::ReduceOp::sum;
  o.stall_timeout = 1.0;
  o.tuning.stall_warning = 0.5;
  o.tuning.read_environment = false;
  return o;
}

double value(int rank, int step, std::size_t i) { return double(100 * (rank + 1) + 10 * step + int(i % 5)); }

void fill(const View& v, int rank, int step) {
  gradsync_test::fill_host(v, [&](std::size_t i) { return value(rank, step, i); });
}

bool summed_ok(const View& v, int step) {
  const auto h = gradsync_test::host_copy(v);
  for (std::size_t i = 0; i < h.size(); ++i) {
    double s = 0;
    for (int r = 0; r < world_size(); ++r) s += value(r, step, i);
    if (h(i) != s) return false;
  }
  return true;
}

// "missing ranks: [2] (arrived: [0, 1])" for a victim `v` among n ranks.
std::string missing_report(int v, int n) {
  std::vector<int> arrived;
  for (int r = 0; r < n; ++r)
    if (r != v) arrived.push_back(r);
  return "missing ranks: " + gradsync::impl::rank_list({v}) + " (arrived: " + gradsync::impl::rank_list(arrived) + ")";
}

struct Caught {
  bool stall = false;
  std::string what;
};
template <class F>
Caught catch_stall(F&& f) {
  Caught c;
  try {
    f();
  } catch (const gradsync::StallError& e) {
    c.stall = true;
    c.what = e.what();
  }
  return c;
}

}  // namespace

namespace {

// Both paths, each behind the watched arrival check: blocking collectives (committed by its second
// round) and nonblocking ones (MpiBackend's default), watched themselves.
constexpr gradsync::Collectives paths[] = {gradsync::Collectives::blocking, gradsync::Collectives::automatic};

gradsync::Options stall_opts(gradsync::Collectives c) {
  gradsync::Options o = stall_opts();
  o.tuning.collectives = c;
  return o;
}

}  // namespace

TEST_CASE("a rank that skips one synchronize() is reported missing by every other rank") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stalled rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  for (auto path : paths) {
    View g("g", 64);  // one chunk
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), stall_opts(path));
    sync.add<Dense>(g);
    const Caught c = catch_stall([&] {
      for (int step = 0; step < 5; ++step) {
        if (rank == victim && step == 2) continue;  // the bug: this rank skips one call
        fill(g, rank, step);
        (void)sync.synchronize();
      }
      // The victim stays (its sync alive) past its peers' deadline: a sync that ended would tell
      // them at once (tests/test_edges.cpp), here they must find it missing.
      if (rank == victim)
        std::this_thread::sleep_for(std::chrono::duration<double>(
            stall_opts().stall_timeout * gradsync_test::kStallPromiseFactor + 2 * gradsync_test::kSchedulingSlack_s));
    });
    CAPTURE(c.what);
    CAPTURE(int(path));
    if (rank == victim) {
      CHECK(!c.stall);  // its four calls were matched by the others' first four
    } else {
      CHECK(c.stall);
      CHECK(has(c.what, missing_report(victim, world_size())));
      CHECK(has(c.what, "for the arrival check in synchronize() call 5"));
      // The deadline holds: not before stall_timeout, and within its promise (1.1x, the grace for
      // late notices included) but for the time a loaded machine kept this rank from running.
      const double deadline = stall_opts().stall_timeout, waited = gradsync_test::reported_wait(c.what);
      CHECK(waited >= deadline);
      CHECK(waited <= deadline * gradsync_test::kStallPromiseFactor + gradsync_test::kSchedulingSlack_s);
    }
  }
}

TEST_CASE("a rank that sleeps past the deadline is reported; when it arrives it stops too") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stalled rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  for (auto path : paths) {
    View g("g", 64);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), stall_opts(path));
    sync.add<Dense>(g);
    fill(g, rank, 0);
    CHECK(sync.synchronize());
    GRADSYNC_CHECK_ALL(summed_ok(g, 0));
    fill(g, rank, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == victim) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    const Caught c = catch_stall([&] { (void)sync.synchronize(); });
    CAPTURE(c.what);
    CAPTURE(int(path));
    if (rank != victim) {
      CHECK(c.stall);
      CHECK(has(c.what, missing_report(victim, world_size())));
      CHECK(has(c.what, "in synchronize() call 2"));
    } else {
      // Its peers gave up in the arrival check and said so: it stops at its next wait (the
      // check's second round, or its first chunk) with their report, its gradient untouched.
      CHECK(c.stall);
      CHECK(has(c.what, "so rank " + std::to_string(victim) + " stops too"));
      CHECK(has(c.what, missing_report(victim, world_size())));
      bool untouched = true;
      const auto h = gradsync_test::host_copy(g);
      for (std::size_t i = 0; i < h.size(); ++i) untouched &= h(i) == value(rank, 1, i);
      CHECK(untouched);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the next path starts together
  }
}

TEST_CASE("a rank that never reaches its first synchronize(): the first collective is watched too") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stalled rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  for (auto path : paths) {
    View g("g", 16);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), stall_opts(path));
    sync.add<Dense>(g);
    MPI_Barrier(MPI_COMM_WORLD);
    const Caught c = catch_stall([&] {
      if (rank != victim) (void)sync.synchronize();
    });
    CAPTURE(c.what);
    CHECK(c.stall == (rank != victim));
    if (rank != victim) {
      CHECK(has(c.what, missing_report(victim, world_size())));
      CHECK(has(c.what, "arrival check"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a rank that never builds its GradientSync: the others' constructors end with StallError") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stalled rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  gradsync::MpiBackend backend(MPI_COMM_WORLD);  // collective, like the user's own setup
  const Caught c = catch_stall([&] {
    if (rank != victim) {
      Sync sync(backend, stall_opts());
    }
  });
  CAPTURE(c.what);
  CHECK(c.stall == (rank != victim));
  if (rank != victim) CHECK(has(c.what, "GradientSync constructor"));
}

// Run by ctest on its own (--no-skip): the report goes to stderr and the job ends with MPI_Abort.
TEST_CASE("stall_action abort" * doctest::skip()) {
  const int rank = world_rank(), victim = world_size() - 1;
  gradsync::Options o = stall_opts();
  o.tuning.stall_action = gradsync::StallAction::abort;
  View g("g", 16);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(g);
  CHECK(sync.synchronize());
  if (rank == victim) std::this_thread::sleep_for(std::chrono::seconds(60));  // killed by the abort
  (void)sync.synchronize();
  FAIL("the job should have been aborted");
}
