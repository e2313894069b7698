// The edges around the step (issue 43): a rank that skips a call or leaves early, a rank whose own
// error unwinds its sync outside any collective, sample counts given late, twice or out of range, a
// backend reused after a failed sync, two threads on one sync, empty RowSparse handles, default
// names, broadcast_parameters' one message, and where a stall report says the missing ranks are.
// Every case ends with the same kind of error on every rank that waits (within a second where the
// rank at fault is alive; the deadlines here are 30 s or more unless a stall is the point), or with
// exact values; none hangs, none crashes, none is silently wrong.
#include <gradsync/gradsync.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::has;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Table {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
using Clock = std::chrono::steady_clock;

// A peer that is alive and told ends within this: the first poll of the side channel comes after a
// millisecond; the rest is ctest's load on 2 cores (several multi-rank programs at once).
constexpr double kToldWithin_s = 1.0 + gradsync_test::kSchedulingSlack_s;

gradsync::Options opts(double stall_timeout = 30.0, int passes = 1) {
  gradsync::Options o;
  o.backward_passes_per_step = passes;
  o.tuning.collectives = gradsync::Collectives::nonblocking;
  o.stall_timeout = stall_timeout;
  o.tuning.stall_warning = 0;
  o.tuning.read_environment = false;
  return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string rank_str(int r) { return std::to_string(r); }

// What the same call threw on this rank: its kind and message ("" / "none" when it returned).
struct Thrown {
  std::string kind = "none", what;
  double seconds = 0;
};
template <class F>
Thrown thrown_by(F&& f) {
  Thrown t;
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const gradsync::MismatchError& e) {
    t.kind = "mismatch", t.what = e.what();
  } catch (const gradsync::StallError& e) {
    t.kind = "stall", t.what = e.what();
  } catch (const gradsync::ConfigError& e) {
    t.kind = "config", t.what = e.what();
  } catch (const gradsync::Error& e) {
    t.kind = "error", t.what = e.what();
  } catch (const std::exception& e) {
    t.kind = "other", t.what = e.what();
  }
  t.seconds = seconds_since(t0);
  return t;
}

}  // namespace

TEST_CASE("a rank that makes fewer synchronize() calls: its peers stop when its sync ends, naming it and the calls") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a skipped call needs a peer that makes it");
  const int rank = world_rank(), victim = world_size() - 1;
  for (int passes : {1, 2}) {
    CAPTURE(passes);
    Thrown t;
    {
      View g("g", 16);
      Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(60.0, passes));
      sync.add<Dense>(g, "g");
      t = thrown_by([&] {
        for (int call = 1; call <= 8; ++call) {
          if (rank == victim && call == 3) continue;  // "no samples on this pass": the call is skipped
          Kokkos::deep_copy(g, 1.0);
          (void)sync.synchronize();
        }
      });
    }  // the victim's sync ends here, after 7 calls; the others wait in their 8th
    CAPTURE(t.what);
    if (rank == victim) {
      CHECK(t.kind == "none");
    } else {
      CHECK(t.kind == "mismatch");
      CHECK(has(t.what, "rank " + rank_str(victim) + " will not join the arrival check in synchronize() call 8"));
      CHECK(has(t.what, "this sync's collective call 8 on rank " + rank_str(rank)));
      CHECK(has(t.what, "its GradientSync was destroyed after 7 collective calls (the last: synchronize())"));
      CHECK(has(t.what, "The ranks made different numbers of collective calls"));
      CHECK(t.seconds < kToldWithin_s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a normal end is silent on every rank, even while a peer still completes the last call") {
  const int rank = world_rank(), n = world_size();
  // 8 MiB: the last call's sum completes at different times on different ranks, and rank 0 (which
  // sleeps before its last call) destroys its sync while the others may still wait for theirs.
  View g("g", std::size_t(1) << 20);
  Thrown t = thrown_by([&] {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(g, "g");
    for (int call = 1; call <= 3; ++call) {
      Kokkos::deep_copy(g, double(rank + call));
      if (call == 3 && rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!sync.synchronize()) throw std::runtime_error("synchronize() returned false with 1 pass per step");
    }
  });
  CAPTURE(t.what);
  GRADSYNC_CHECK_ALL(t.kind == "none");
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 12345) == 0.5 * (n - 1) + 3.0);
}

TEST_CASE("one rank's own error outside a collective unwinds its sync: peers stop at once, with its message") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "an error on one rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  Kokkos::View<double**, Kokkos::LayoutRight> wide("wide", 4, 3);
  auto column = Kokkos::subview(wide, Kokkos::ALL, 1);  // strided: add() refuses it
  View w("w", 8), gw("gw", 8);
  const Thrown t = thrown_by([&] {
    gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(gradsync::SgdOptions{}),
                                        Sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(60.0)));
    dopt.add<Dense>(w, gw, "w");
    if (rank == victim) dopt.sync().add<Dense>(column, "column");  // throws; dopt unwinds
    dopt.broadcast_parameters(0);
  });
  CAPTURE(t.what);
  CHECK(t.kind == "error");
  if (rank == victim) {
    CHECK(has(t.what, "tensor 'column' (group Dense) is not contiguous"));
  } else {
    CHECK(has(t.what, "rank " + rank_str(victim) + " will not join the broadcast of parameters"));
    CHECK(has(t.what, "destroyed after 0 collective calls while an exception unwound its stack"));
    CHECK(has(t.what, "its last error: gradsync: tensor 'column' (group Dense) is not contiguous"));
    CHECK(t.seconds < kToldWithin_s);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("options refused by one rank's constructor: its peers' first collective call names its error") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "an error on one rank needs a peer that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  View g("g", 8);
  gradsync::Options o = opts(60.0);
  if (rank == victim) o.backward_passes_per_step = 0;
  const Thrown t = thrown_by([&] {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(g, "g");
    (void)sync.synchronize();
  });
  CAPTURE(t.what);
  CHECK(t.kind == "config");
  CHECK(has(t.what, "backward_passes_per_step must be >= 1, got 0"));
  if (rank != victim) {
    CHECK(has(t.what, "rank " + rank_str(victim) + " failed before"));
    CHECK(has(t.what, "(in the GradientSync constructor on rank " + rank_str(victim) + ")"));
    CHECK(t.seconds < kToldWithin_s);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("set_samples() after synchronize(), or twice in a pass: an Error naming set_samples and the rule") {
  const int rank = world_rank(), n = world_size();
  View g("g", 8);
  {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(g, "g");
    Kokkos::deep_copy(g, 1.0);
    GRADSYNC_CHECK_ALL(sync.synchronize());
    const std::string late = error_of([&] { sync.set_samples(3); });
    CAPTURE(late);
    GRADSYNC_CHECK_ALL(has(late, "set_samples(3) on rank " + rank_str(rank) +
                                     " after 1 synchronize() call(s) without counts: a sync is weighted from its "
                                     "first pass"));
    Kokkos::deep_copy(g, double(rank + 1));  // refused: the sync goes on unweighted, exact
    GRADSYNC_CHECK_ALL(sync.synchronize());
    GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 3) == 0.5 * (n + 1));
  }
  {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(g, "g");
    sync.set_samples(rank + 1);
    const std::string twice = error_of([&] { sync.set_samples(7); });
    CAPTURE(twice);
    GRADSYNC_CHECK_ALL(has(twice, "set_samples(7) called twice for pass 1 of synchronize() call 1 on rank " +
                                      rank_str(rank) + ": give one count per pass"));
    Kokkos::deep_copy(g, 1.0);  // the first count holds: sum_r (r+1) / sum_r (r+1) = 1
    GRADSYNC_CHECK_ALL(sync.synchronize());
    GRADSYNC_CHECK_ALL(gradsync_test::rel_err(gradsync_test::value_at(g, 0), 1.0) < 1e-15);
  }
  {  // 2 passes, through DistributedOptimizer: its error names set_samples, never an internal call
    View w("w", 8);
    gradsync::DistributedOptimizer dopt(gradsync::Adam<View>(gradsync::AdamOptions{}),
                                        Sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(30.0, 2)));
    dopt.add<Dense>(w, g, "w");
    Kokkos::deep_copy(g, 1.0);
    GRADSYNC_CHECK_ALL(!dopt.synchronize());
    const std::string late = error_of([&] { dopt.set_samples(3); });
    CAPTURE(late);
    GRADSYNC_CHECK_ALL(has(late, "set_samples(3) on rank " + rank_str(rank) + " after 1 synchronize() call(s)"));
    GRADSYNC_CHECK_ALL(!has(late, "defer_local_scale"));
    GRADSYNC_CHECK_ALL(dopt.synchronize());  // unweighted still: the sum of two passes, averaged
    GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 5) == 2.0);
  }
}

TEST_CASE("sample counts whose sum would overflow: an Error on every rank, never a zero or empty step") {
  const int rank = world_rank(), n = world_size(), victim = n - 1;
  View g("g", 8);
  {  // 2^62 on every rank: refused where it is given
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(g, "g");
    const std::string big = error_of([&] { sync.set_samples(std::int64_t(1) << 62); });
    CAPTURE(big);
    GRADSYNC_CHECK_ALL(has(big, "set_samples(4611686018427387904) on rank " + rank_str(rank)));
    GRADSYNC_CHECK_ALL(has(big, "at most 2^40"));
  }
  if (n > 1) {  // INT64_MAX on one rank, which goes on to synchronize() anyway: every rank throws, naming it
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(g, "g");
    Kokkos::deep_copy(g, 1.0);
    const std::int64_t count = rank == victim ? std::numeric_limits<std::int64_t>::max() : 5;
    const Thrown set = thrown_by([&] { sync.set_samples(count); });
    CHECK(set.kind == (rank == victim ? "error" : "none"));
    const Thrown t = thrown_by([&] { (void)sync.synchronize(); });
    CAPTURE(t.what);
    // The victim's refused count left it unweighted: the arrival round finds it on every rank.
    GRADSYNC_CHECK_ALL(t.kind == "mismatch");
    GRADSYNC_CHECK_ALL(
        has(t.what, "gave sample counts for synchronize() call 1, rank " + rank_str(victim) + " did not") || n == 1);
    GRADSYNC_CHECK_ALL(t.seconds < kToldWithin_s);
    GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 0) == 1.0);  // untouched: no zero step
  }
}

TEST_CASE("a backend reused after a failed sync: a clear Error on every rank, and a new backend is exact") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a failure with chunks in flight needs a peer");
  const int rank = world_rank(), n = world_size(), victim = n > 2 ? 1 : 0;
  constexpr std::size_t len = std::size_t(1) << 20;
  View a("a", len), b("b", len);
  gradsync::MpiBackend backend(MPI_COMM_WORLD);
  gradsync::Options o = opts();
  o.tuning.fusion_threshold_bytes = 64 << 10;  // many chunks: some in flight when the victim throws
  const Thrown first = thrown_by([&] {
    Sync sync(backend, o);
    sync.add<Dense>(a, "a");
    sync.add<Dense>(b, "b");
    Kokkos::deep_copy(a, double(rank + 1));
    Kokkos::deep_copy(b, double(rank + 1));
    sync.mark_ready(b);  // backward produces b first: its chunks start
    if (rank == victim) throw std::runtime_error("backward failed on this rank");
    sync.mark_ready(a);
    (void)sync.synchronize();
  });
  CAPTURE(first.what);
  CHECK(first.kind == (rank == victim ? "other" : "error"));
  const Thrown reuse = thrown_by([&] { Sync again(backend, o); });
  CAPTURE(reuse.what);
  GRADSYNC_CHECK_ALL(reuse.kind == "error");
  GRADSYNC_CHECK_ALL(has(reuse.what, "served a GradientSync that failed"));
  GRADSYNC_CHECK_ALL(has(reuse.what, "Build a new backend from your communicator"));
  const Thrown fresh = thrown_by([&] {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    sync.add<Dense>(b, "b");
    for (int step = 0; step < 2; ++step) {
      Kokkos::deep_copy(a, double(rank + 1));
      Kokkos::deep_copy(b, double(2 * rank));
      sync.mark_ready(b);
      sync.mark_ready(a);
      (void)sync.synchronize();
    }
  });
  CAPTURE(fresh.what);
  GRADSYNC_CHECK_ALL(fresh.kind == "none");
  double worst = 0;
  const auto ha = gradsync_test::host_values(a), hb = gradsync_test::host_values(b);
  for (std::size_t i = 0; i < len; ++i)
    worst = std::max({worst, std::abs(ha[i] - 0.5 * (n + 1)), std::abs(hb[i] - double(n - 1))});
  GRADSYNC_CHECK_ALL(worst == 0.0);
}

TEST_CASE("two threads inside one sync: the second is refused with an Error, the first completes exactly") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "rank 0's first thread must wait inside the sync for a peer");
  const int rank = world_rank(), n = world_size();
  View g("g", 64);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  sync.add<Dense>(g, "g");
  sync.prepare();
  Kokkos::deep_copy(g, double(rank + 1));
  std::string refused = "not run";
  bool done = false;
  if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));  // rank 0 waits for them inside
  std::thread first([&] { done = sync.synchronize(); });
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = error_of([&] { (void)sync.synchronize(); });
  }
  first.join();
  CAPTURE(refused);
  GRADSYNC_CHECK_ALL(done);
  if (rank == 0)
    CHECK(has(refused,
              "synchronize() on rank 0 was called while another thread is inside synchronize() of the "
              "same GradientSync"));
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 7) == 0.5 * (n + 1));
  // Two syncs in two threads stay supported only with MPI_THREAD_MULTIPLE; one thread after the
  // other on one sync is fine:
  std::thread later([&] {
    Kokkos::deep_copy(g, double(rank + 1));
    done = sync.synchronize();
  });
  later.join();
  GRADSYNC_CHECK_ALL(done && gradsync_test::value_at(g, 7) == 0.5 * (n + 1));
}

TEST_CASE("an empty RowSparse handle: set_rows() and add() refuse it with an Error, no crash") {
  using Rows = gradsync::RowSparse<Kokkos::View<double**>, Kokkos::View<std::int64_t*>>;
  Rows empty;
  CHECK(empty.rows() == 0);
  const std::string set = error_of([&] { empty.set_rows(0); });
  CHECK(has(set, "RowSparse::set_rows(0) on an empty handle (default-constructed)"));
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  const std::string add = error_of([&] { sync.add<Table>(empty, "emb"); });
  CHECK(has(add, "row-sparse gradient 'emb' (group Table) on rank " + rank_str(world_rank()) +
                     " is an empty RowSparse handle"));
}

// A table of 10 rows of 2 (4 rows a step) and a dense tensor of 6, for the registrations' cases.
struct TableAndDense {
  Kokkos::View<double**> values{"values", 4, 2};
  Kokkos::View<std::int64_t*> indices{"indices", 4};
  gradsync::RowSparse<Kokkos::View<double**>, Kokkos::View<std::int64_t*>> rows{values, indices, 10, 0};
  View dense{"dense", 6};
};

TEST_CASE("default names are unique in a group that holds row-sparse and dense gradients") {
  TableAndDense t;
  auto& rows = t.rows;
  auto& dense = t.dense;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  sync.add<Table>(rows);
  sync.add<Table>(dense);
  std::vector<std::string> names, groups;
  std::vector<gradsync::RegistrationKind> kinds;
  std::vector<std::size_t> sizes;
  const auto collect = [&] {
    names.clear();
    groups.clear();
    kinds.clear();
    sizes.clear();
    sync.registrations().for_each(
        [&](const std::string& name, const std::string& group, gradsync::RegistrationKind kind, std::size_t size) {
          names.push_back(name);
          groups.push_back(group);
          kinds.push_back(kind);
          sizes.push_back(size);
        });
  };
  collect();
  REQUIRE(names.size() == 2);
  CHECK(names[0] != names[1]);
  CHECK(names[0] == "Table[1]");  // dense first (registrations()' order), after the row-sparse Table[0]
  CHECK(names[1] == "Table[0]");
  CHECK(groups[0] == groups[1]);
  CHECK(kinds[0] == gradsync::RegistrationKind::data_parallel);
  CHECK(kinds[1] == gradsync::RegistrationKind::data_parallel);
  CHECK(sizes[0] == 6);
  CHECK(sizes[1] == 20);  // the row-sparse table: 10 rows of 2
  sync.register_local_var(dense);
  collect();
  REQUIRE(kinds.size() == 2);
  CHECK(kinds[0] == gradsync::RegistrationKind::local);
}

TEST_CASE("a failed sync still tells what it held: every exchange parked, its registrations listed") {
  TableAndDense t;
  auto& rows = t.rows;
  auto& dense = t.dense;
  gradsync::Options o = opts();
  o.check_finite = true;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Table>(rows, "emb");
  sync.add<Dense>(dense, "w");
  rows.set_rows(0);
  if (world_rank() == 0) dense(3) = std::numeric_limits<double>::quiet_NaN();  // rank 0's check fails
  const std::string first = error_of([&] { (void)sync.synchronize(); });
  CHECK(has(first, "'w'"));
  // The row-sparse rows and the dense tensor were parked with the failed step, not freed: the
  // queries still list both, and every later call refuses.
  std::vector<std::string> names;
  sync.registrations().for_each([&](const std::string& name, const std::string&, gradsync::RegistrationKind,
                                    std::size_t) { names.push_back(name); });
  CHECK(names == std::vector<std::string>{"w", "emb"});
  CHECK(sync.num_tensors() == 1);
  CHECK(sync.data_parallel_bytes() == 6 * sizeof(double));
  const std::string again = error_of([&] { (void)sync.synchronize(); });
  CHECK(has(again, "cannot be used again"));
}

TEST_CASE("passes_into_cycle counts the passes of an open aggregation cycle") {
  View g("g", 4);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(30.0, 2));
  sync.add<Dense>(g, "g");
  CHECK(sync.passes_into_cycle() == 0);
  CHECK_FALSE(sync.synchronize());
  CHECK(sync.passes_into_cycle() == 1);
  CHECK(sync.synchronize());
  CHECK(sync.passes_into_cycle() == 0);
}

TEST_CASE("broadcast_parameters' MismatchError: one message on every rank, root never compared with itself") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a difference needs two ranks");
  const int rank = world_rank(), n = world_size(), odd = n - 1;
  View w("w", 8), gw("gw", 8), v("v", rank == odd ? 5 : 4), gv("gv", rank == odd ? 5 : 4);
  gradsync::DistributedOptimizer dopt(gradsync::Sgd<View>(gradsync::SgdOptions{}),
                                      Sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts()));
  dopt.add<Dense>(w, gw, "w");
  dopt.add<Dense>(v, gv, "v");
  const Thrown t = thrown_by([&] { dopt.broadcast_parameters(0); });
  CAPTURE(t.what);
  GRADSYNC_CHECK_ALL(t.kind == "mismatch");
  const std::string expect =
      "broadcast_parameters(root 0): the data-parallel parameters of rank(s) " + rank_str(odd) +
      " differ from root's, first at data-parallel parameter #1: on rank " + rank_str(odd) +
      " 'v' (group Dense, 5 values) of its 2, on rank 0 'v' (group Dense, 4 values) of its 2 data-parallel parameters";
  GRADSYNC_CHECK_ALL(has(t.what, expect));
  // The same text on every rank: compare lengths and a hash over ranks.
  std::uint64_t h = gradsync::impl::fnv1a(t.what.data(), t.what.size());
  std::int64_t v2[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};
  MPI_Allreduce(MPI_IN_PLACE, v2, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  GRADSYNC_CHECK_ALL(v2[0] == -v2[1]);
}

TEST_CASE("a StallError says where the missing rank was last seen and where it is now") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a missing rank needs a rank that waits for it");
  const int rank = world_rank(), victim = world_size() - 1;
  View g("g", 8);
  for (bool elsewhere : {false, true}) {
    CAPTURE(elsewhere);
    // The victim's own deadline is later: the report under test is its peers'.
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(rank == victim ? 4.0 : 1.0));
    sync.add<Dense>(g, "g");
    Kokkos::deep_copy(g, 1.0);
    GRADSYNC_CHECK_ALL(sync.synchronize());
    const Thrown t = thrown_by([&] {
      if (rank != victim) {
        (void)sync.synchronize();
      } else if (elsewhere) {
        (void)gradsync::global_norm(sync);  // waits in another call of the same sync
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // "computing"
      }
    });
    CAPTURE(t.what);
    if (rank != victim) {
      CHECK(t.kind == "stall");
      CHECK(has(t.what, "missing ranks: [" + rank_str(victim) + "]"));
      CHECK(has(t.what, "last seen with rank "));  // this rank's report, or the one of the peer that reported first
      CHECK(has(t.what, "in synchronize() call 1, which they completed"));
      if (elsewhere)
        CHECK(
            has(t.what, "rank " + rank_str(victim) +
                            " now waiting in the global norm's allreduce in global_norm() after synchronize() call 1"));
      else
        CHECK(has(t.what, "rank " + rank_str(victim) +
                              " now in no wait of this sync (computing, in the program's own "
                              "MPI, or stopped)"));
    } else {
      CHECK(t.kind == (elsewhere ? "stall" : "none"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a program's own all-to-all under the sync's watchdog: exact values, the sync untouched") {
  const int rank = world_rank(), n = world_size();
  View g("g", 8);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(1.0));
  sync.add<Dense>(g, "g");
  {  // an all-to-all: rank r sends 100 r + p to rank p
    std::vector<double> send(std::size_t(n) * 2), recv(std::size_t(n) * 2, -1.0);
    std::vector<int> counts(std::size_t(n), 2), displs(std::size_t(n), 0);
    for (int p = 0; p < n; ++p) {
      displs[std::size_t(p)] = 2 * p;
      send[std::size_t(2 * p)] = 100.0 * rank + p;
      send[std::size_t(2 * p + 1)] = -(100.0 * rank + p);
    }
    gradsync::alltoallv(sync, send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                        MPI_COMM_WORLD, "embedding all-to-all");
    bool exact = true;
    for (int p = 0; p < n; ++p)
      exact &= recv[std::size_t(2 * p)] == 100.0 * p + rank && recv[std::size_t(2 * p + 1)] == -(100.0 * p + rank);
    GRADSYNC_CHECK_ALL(exact);
  }
  Kokkos::deep_copy(g, double(rank));  // the sync itself is untouched by the program's waits
  GRADSYNC_CHECK_ALL(sync.synchronize());
  GRADSYNC_CHECK_ALL(gradsync_test::value_at(g, 0) == 0.5 * (n - 1));
}

TEST_CASE("a program's own exchange with a stopped peer: a StallError naming the exchange at the deadline") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stopped peer needs a rank that waits for it");
  const int rank = world_rank(), n = world_size();
  View g("g", 8);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts(1.0));
  sync.add<Dense>(g, "g");
  Kokkos::deep_copy(g, double(rank));
  GRADSYNC_CHECK_ALL(sync.synchronize());
  // A ring halo exchange in which the last rank is stopped past the deadline: the rank that needs
  // its values ends with a StallError naming the exchange at the deadline, never before it, never
  // much after it; the victim then joins late with plain MPI so that every message is matched.
  const int victim = n - 1, left = (rank + n - 1) % n, right = (rank + 1) % n;
  double out = rank, in = -1;
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  Thrown t;
  if (rank != victim) {
    MPI_Irecv(&in, 1, MPI_DOUBLE, left, 7, MPI_COMM_WORLD, &req[0]);
    MPI_Isend(&out, 1, MPI_DOUBLE, right, 7, MPI_COMM_WORLD, &req[1]);
    t = thrown_by([&] { gradsync::wait_all(sync, 2, req, "halo exchange"); });
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    MPI_Irecv(&in, 1, MPI_DOUBLE, left, 7, MPI_COMM_WORLD, &req[0]);
    MPI_Isend(&out, 1, MPI_DOUBLE, right, 7, MPI_COMM_WORLD, &req[1]);
  }
  MPI_Waitall(2, req, MPI_STATUSES_IGNORE);  // what is left (the stalled rank's receive completes now)
  CAPTURE(t.what);
  if (left == victim) {
    CHECK(t.kind == "stall");
    CHECK(has(t.what,
              "s for the halo exchange in gradsync::wait_all() after synchronize() call 1; ranks not "
              "waiting in it: "));
    CHECK(t.seconds >= 1.0);
    CHECK(t.seconds < 1.0 * gradsync_test::kStallPromiseFactor + gradsync_test::kSchedulingSlack_s);
  } else if (rank != victim) {
    CHECK(t.kind == "none");
  }
  GRADSYNC_CHECK_ALL(in == double(left));
  MPI_Barrier(MPI_COMM_WORLD);
}
