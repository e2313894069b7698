// Never hang, never silently wrong: the cross-rank consistency check (shape, count, order, value
// type, option and register_local_var policy mismatches: every rank throws the same
// MismatchError), failures of one rank reported to its peers (NaN/Inf, a resized vector), and
// the validation of every input. Each mismatch case also passes when ranks agree.
#include <gradsync/gradsync.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "blind_backend.hpp"
#include "gradsync_test.hpp"

using gradsync_test::BlindBackend;
using gradsync_test::value_at;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Head {};
struct Tables {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

using gradsync_test::has;

// A short deadline: a bug in the check ends the test in seconds, not at ctest's timeout.
gradsync::Options opts() {
  gradsync::Options o;
  o.stall_timeout = 20;
  o.tuning.stall_warning = 5;
  o.tuning.read_environment = false;
  return o;
}

// What f() threw, as (kind, what()); kind is "" when it returned normally.
struct Outcome {
  std::string kind, what;
};
template <class F>
Outcome outcome_of(F&& f) {
  try {
    f();
  } catch (const gradsync::MismatchError& e) {
    return {"mismatch", e.what()};
  } catch (const gradsync::StallError& e) {
    return {"stall", e.what()};
  } catch (const gradsync::ConfigError& e) {
    return {"config", e.what()};
  } catch (const gradsync::Error& e) {
    return {"error", e.what()};
  }
  return {};
}

// True on every rank when every rank holds the same string.
bool same_on_all_ranks(const std::string& s) {
  const std::uint64_t h = gradsync::impl::fnv1a(s.data(), s.size());
  std::int64_t v[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  return v[0] == -v[1];
}

std::string rank_word(int r) { return "rank " + std::to_string(r); }

// Fills every tensor with rank-dependent integers and checks the summed result exactly.
void fill(const View& v, int rank, int tag) {
  gradsync_test::fill_host(v, [&](std::size_t i) { return double((rank + 1) * 1000 + tag * 10 + int(i % 7)); });
}
double summed(std::size_t i, int tag) {
  double s = 0;
  for (int r = 0; r < world_size(); ++r) s += double((r + 1) * 1000 + tag * 10 + int(i % 7));
  return s;
}

// Runs one synchronize() on every rank and checks that every rank threw a MismatchError with
// the same message containing every part in `expect`.
void expect_mismatch(const std::function<void()>& sync_once, const std::vector<std::string>& expect) {
  const Outcome o = outcome_of(sync_once);
  CAPTURE(o.kind);
  CAPTURE(o.what);
  GRADSYNC_CHECK_ALL(o.kind == "mismatch");
  GRADSYNC_CHECK_ALL(same_on_all_ranks(o.what));
  for (const auto& part : expect) {
    CAPTURE(part);
    GRADSYNC_CHECK_ALL(has(o.what, part));
  }
}

}  // namespace

TEST_CASE("ranks that agree pass the check; local groups may differ per rank") {
  const int rank = world_rank();
  {
    gradsync::Options o = opts();
    o.op = gradsync::ReduceOp::sum;
    View a("a", 10), b("b", 300), table("t", std::size_t(5 + 3 * rank)), tower("w", std::size_t(1 + rank)),
        mine("m", std::size_t(7 + rank));
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    sync.add<Tables>(table);
    if (rank % 2 == 0) sync.add<Tower>(tower);  // a local group only some ranks have
    sync.add<Dense>(mine, "mine");              // made local at run time: its size differs per rank
    sync.register_local_var(mine);
    sync.add<Head>(b, "b");
    for (int step = 0; step < 3; ++step) {
      fill(a, rank, 1 + step);
      fill(b, rank, 2 + step);
      CHECK(sync.synchronize());
      GRADSYNC_CHECK_ALL(value_at(a, 3) == summed(3, 1 + step) && value_at(b, 299) == summed(299, 2 + step));
    }
    GRADSYNC_CHECK_ALL(sync.stats().consistency_checks == 1);  // on_change: before the first exchange only
  }
}

TEST_CASE("check modes: on_change checks after each change, every_step on every call") {
  const int rank = world_rank();
  for (auto mode : {gradsync::CheckMode::off, gradsync::CheckMode::on_change, gradsync::CheckMode::every_step}) {
    gradsync::Options o = opts();
    o.tuning.consistency_check = mode;
    o.backward_passes_per_step = 2;
    View a("a", 10), b("b", 20);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a);
    for (int p = 0; p < 4; ++p) {
      fill(a, rank, p);
      CHECK(sync.synchronize() == (p % 2 == 1));
    }
    sync.add<Dense>(b);
    for (int p = 0; p < 4; ++p) {
      fill(a, rank, p);
      fill(b, rank, p);
      CHECK(sync.synchronize() == (p % 2 == 1));
    }
    const std::uint64_t expect = mode == gradsync::CheckMode::off ? 0 : mode == gradsync::CheckMode::on_change ? 2 : 8;
    CAPTURE(int(mode));
    GRADSYNC_CHECK_ALL(sync.stats().consistency_checks == expect);
  }
}

TEST_CASE("shape, count, order, value type, option and policy mismatches: every rank throws the same error") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "one rank always agrees with itself");
  const int rank = world_rank();
  const int last = world_size() - 1;

  SUBCASE("shape") {
    View a("a", 10), b("b", rank == last ? 21 : 20), c("c", 5);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(a, "a");
    sync.add<Dense>(b, "b");
    sync.add<Dense>(c, "c");
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #1", "'b' (group Dense, index 1, 21 x double)", rank_word(last) + ": 'b'",
                     "20 x double"});
  }
  SUBCASE("count") {
    View a("a", 10), b("b", 20), extra("extra", 3);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(a, "a");
    sync.add<Dense>(b, "b");
    if (rank == last) sync.add<Head>(extra, "extra");
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #2", rank_word(last) + ": 'extra' (group Head", "no tensor",
                     "Data-parallel tensor counts", rank_word(last) + ": 3"});
  }
  SUBCASE("order") {
    View a("a", 10), b("b", 20);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    if (rank == last) {
      sync.add<Dense>(b, "b");
      sync.add<Dense>(a, "a");
    } else {
      sync.add<Dense>(a, "a");
      sync.add<Dense>(b, "b");
    }
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #0", rank_word(last) + ": 'b' (group Dense, index 0, 20 x double)"});
  }
  SUBCASE("group") {
    View a("a", 10);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    if (rank == last)
      sync.add<Head>(a, "a");
    else
      sync.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync.synchronize(); }, {"data-parallel tensor #0", "(group Head", "(group Dense"});
  }
  SUBCASE("value type") {
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      Kokkos::View<T*> a("a", 10);
      gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
      sync.template add<Dense>(a, "a");
      (void)sync.synchronize();
    };
    expect_mismatch([&] { rank == last ? run(float{}) : run(double{}); },
                    {"ranks disagree on value type", rank_word(last) + ": float", "double", "same GradientSync"});
  }
  SUBCASE("an option (fusion threshold)") {
    gradsync::Options o = opts();
    if (rank == last) o.tuning.fusion_threshold_bytes = 1024;
    View a("a", 10);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"fusion_threshold_bytes", rank_word(last) + ": 1024", ": by topology (the default)"});
  }
  SUBCASE("reduce op, scale factors and aggregation settings") {
    gradsync::Options o = opts();
    if (rank == last) o.op = gradsync::ReduceOp::sum;
    View a("a", 10);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync.synchronize(); }, {"ranks disagree on op", rank_word(last) + ": sum", "average"});
    gradsync::Options p = opts();
    if (rank == 0) p.postscale_factor = 0.5;
    Sync sync2(gradsync::MpiBackend(MPI_COMM_WORLD), p);
    sync2.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync2.synchronize(); }, {"postscale_factor", "rank 0: 0.5"});
    gradsync::Options q = opts();
    if (rank == last) q.average_aggregated_gradients = true;
    Sync sync3(gradsync::MpiBackend(MPI_COMM_WORLD), q);
    sync3.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync3.synchronize(); }, {"average_aggregated_gradients", rank_word(last) + ": true"});
    gradsync::Options l = opts();
    if (rank == last) l.scale_local_gradients = false;
    Sync sync4(gradsync::MpiBackend(MPI_COMM_WORLD), l);
    sync4.add<Dense>(a, "a");
    expect_mismatch([&] { (void)sync4.synchronize(); }, {"scale_local_gradients", rank_word(last) + ": false"});
  }
  SUBCASE("policy: register_local_var on one rank only") {
    View a("a", 10), b("b", 20), c("c", 30);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(a);
    sync.add<Dense>(b);
    sync.add<Dense>(c);
    if (rank == 0) sync.register_local_var(b);
    const std::string others =
        world_size() == 2 ? "rank 1"
                          : "ranks [1" + std::string(world_size() == 3 ? ", " : "-") + std::to_string(last) + "]";
    expect_mismatch(
        [&] { (void)sync.synchronize(); },
        {"policy mismatch: tensor Dense[1] is local (register_local_var) on rank 0 but data-parallel on " + others,
         "call register_local_var for it on every rank or on none"});
  }
  SUBCASE("a change of the registrations after the first steps") {
    View a("a", 10), b("b", rank == last ? 8 : 9);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(a, "a");
    for (int p = 0; p < 3; ++p) {
      fill(a, rank, p);
      CHECK(sync.synchronize());
    }
    GRADSYNC_CHECK_ALL(value_at(a, 2) == summed(2, 2) / world_size());
    sync.add<Dense>(b, "b");
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #1", rank_word(last) + ": 'b'", "8 x double"});
  }
}

// The arrival check before each exchange tells every rank that one rank's registrations changed,
// so on_change suffices on both paths; every_step gets there without it.
TEST_CASE("registrations changed on one rank only are a MismatchError, not a stall") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "registrations changed on one rank only need another rank");
  const int rank = world_rank(), last = world_size() - 1;
  // (No structured binding: CAPTURE's lambda captures coll, which C++17 allows for variables only.)
  for (const auto& mode_coll : {std::pair{gradsync::CheckMode::every_step, gradsync::Collectives::nonblocking},
                                std::pair{gradsync::CheckMode::on_change, gradsync::Collectives::nonblocking},
                                std::pair{gradsync::CheckMode::on_change, gradsync::Collectives::blocking}}) {
    const gradsync::CheckMode mode = mode_coll.first;
    const gradsync::Collectives coll = mode_coll.second;
    gradsync::Options o = opts();
    o.tuning.consistency_check = mode;
    o.tuning.collectives = coll;
    View a("a", 10), extra("extra", 4);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    fill(a, rank, 0);
    CHECK(sync.synchronize());
    if (rank == last) sync.add<Dense>(extra, "extra");
    CAPTURE(int(coll));
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #1", rank_word(last) + ": 'extra'", "no tensor"});
  }
}

TEST_CASE("check_finite and resize detection on the single-process backend") {
  gradsync::Options o = opts();
  o.check_finite = true;
  std::vector<double> v(20, 1.0);
  gradsync::GradientSync<gradsync::SelfBackend, std::vector<double>> sync(gradsync::SelfBackend{}, o);
  sync.add<Dense>(v, "v");
  CHECK(sync.synchronize());
  v[13] = std::numeric_limits<double>::quiet_NaN();
  CHECK(has(outcome_of([&] { (void)sync.synchronize(); }).what,
            "gradient 'v' (group Dense, 20 values) holds NaN or Inf on rank 0"));
  // The sync failed: every later call says so at once, with the first failure's reason.
  v[13] = 1.0;
  const Outcome again = outcome_of([&] { (void)sync.synchronize(); });
  CHECK(again.kind == "error");
  CHECK(has(again.what,
            "synchronize(): this GradientSync failed in synchronize() (synchronize() call 2) on rank 0: "
            "gradient 'v' (group Dense, 20 values) holds NaN or Inf on rank 0"));
  CHECK(has(again.what, "build a new one on every rank"));
  gradsync::GradientSync<gradsync::SelfBackend, std::vector<double>> fresh(gradsync::SelfBackend{}, o);
  fresh.add<Dense>(v, "v");
  CHECK(fresh.synchronize());
  v.push_back(2.0);
  CHECK(has(outcome_of([&] { (void)fresh.synchronize(); }).what, "(20 -> 21 elements) on rank 0"));
}

TEST_CASE("a NaN or Inf in a gradient: every rank throws, naming the tensor and the rank (check_finite)") {
  const int rank = world_rank();
  const int last = world_size() - 1;
  // Blocking collectives: the peers stop in the arrival check's second round; nonblocking (MPI's
  // default): in the allreduce they already posted.
  for (auto coll : {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking})
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                       -std::numeric_limits<double>::infinity()}) {
      gradsync::Options o = opts();
      o.check_finite = true;
      o.tuning.collectives = coll;
      View a("a", 100), w("w", 3000);
      Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      sync.add<Dense>(a, "a");
      sync.add<Dense>(w, "w");
      fill(a, rank, 0);
      fill(w, rank, 1);
      CHECK(sync.synchronize());  // finite: no false alarm
      GRADSYNC_CHECK_ALL(value_at(w, 2999) == summed(2999, 1) / world_size());
      fill(a, rank, 0);
      fill(w, rank, 1);
      if (rank == last) gradsync_test::set_value(w, 2345, bad);
      const Outcome out = outcome_of([&] { (void)sync.synchronize(); });
      CAPTURE(out.what);
      GRADSYNC_CHECK_ALL(out.kind == "error");
      GRADSYNC_CHECK_ALL(
          has(out.what, "gradient 'w' (group Dense, 3000 values) holds NaN or Inf on rank " + std::to_string(last)));
      // Nonblocking: a peer may hear the notice before its own arrival check completed locally (MPICH
      // completes a nonblocking allreduce on the ranks at different times), else in the allreduce.
      const std::string failed = "rank " + std::to_string(last) + " failed before the ";
      if (rank != last)
        CHECK((has(out.what, failed + "arrival check") ||
               (coll == gradsync::Collectives::nonblocking && has(out.what, failed + "allreduce"))));
    }
}

// A NaN on every rank: each rank fails on its own check and tells its peers, and no rank reads the
// notices. MPI may give a later side channel the context of that one (MPICH does, once it is freed):
// the syncs built next on the same communicator must not read those notices (issue 32). Their waits
// listen to the side channel for a while after each collective completed (a test hook), so a stale
// notice would be read; several rounds, so that contexts are reused.
TEST_CASE("after a failure told by every rank, fresh syncs on the same communicator synchronize correctly") {
  const int rank = world_rank();
  struct Hold {
    Hold() { gradsync::impl::completed_wait_delay_s() = 0.005; }
    ~Hold() { gradsync::impl::completed_wait_delay_s() = 0; }
  };
  for (int round = 0; round < 4; ++round) {
    {
      gradsync::Options o = opts();
      o.check_finite = true;
      View a("a", 100);
      Sync failing(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      failing.add<Dense>(a, "a");
      fill(a, rank, 0);
      gradsync_test::set_value(a, 7, std::numeric_limits<double>::quiet_NaN());
      const Outcome out = outcome_of([&] { (void)failing.synchronize(); });
      CAPTURE(out.what);
      GRADSYNC_CHECK_ALL(out.kind == "error");
    }
    const Hold hold;
    for (int fresh = 0; fresh < 3; ++fresh) {
      View w("w", 3000);
      bool exact = true;  // checked on every rank after the syncs, whether or not they threw
      const Outcome out = outcome_of([&] {
        Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
        sync.add<Dense>(w, "w");
        for (int step = 0; step < 2; ++step) {
          fill(w, rank, step);
          exact = sync.synchronize() && exact;
          exact = exact && value_at(w, 2999) == summed(2999, step) / world_size() &&
                  value_at(w, 3) == summed(3, step) / world_size();
        }
      });
      CAPTURE(round);
      CAPTURE(out.what);
      GRADSYNC_CHECK_ALL(out.kind.empty());
      GRADSYNC_CHECK_ALL(exact);
    }
  }
}

TEST_CASE("a std::vector resized after registration is refused (on the rank that resized it, and its peers)") {
  const int rank = world_rank();
  const int last = world_size() - 1;
  std::vector<double> v(50, 1.0), u(10, 1.0);
  gradsync::GradientSync<gradsync::MpiBackend, std::vector<double>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  sync.add<Dense>(v, "v");
  sync.add<Dense>(u, "u");
  CHECK(sync.synchronize());
  GRADSYNC_CHECK_ALL(v[7] == 1.0);
  if (rank == last) v.resize(80, 1.0);
  const Outcome out = outcome_of([&] { (void)sync.synchronize(); });
  CAPTURE(out.what);
  GRADSYNC_CHECK_ALL(out.kind == "error");
  GRADSYNC_CHECK_ALL(has(out.what,
                         "tensor 'v' (group Dense) was resized or reallocated after it was registered "
                         "(50 -> 80 elements) on rank " +
                             std::to_string(last)));
}

TEST_CASE("a memory space the backend cannot reach: staged through host, or a ConfigError with never") {
  const int rank = world_rank();
  View a("a", 1000);
  {
    gradsync::GradientSync<BlindBackend, View> sync(BlindBackend(MPI_COMM_WORLD), opts());
    sync.add<Dense>(a, "a");
    fill(a, rank, 3);
    CHECK(sync.synchronize());
    GRADSYNC_CHECK_ALL(value_at(a, 999) == summed(999, 3) / world_size());
  }
  gradsync::Options o = opts();
  o.tuning.host_staging = gradsync::HostStaging::never;
  gradsync::GradientSync<BlindBackend, View> sync(BlindBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a, "a");
  const Outcome out = outcome_of([&] { (void)sync.synchronize(); });
  CAPTURE(out.what);
  GRADSYNC_CHECK_ALL(out.kind == "config" && has(out.what, "host_staging = never, but backend 'blind' cannot access"));
}

TEST_CASE("invalid options are ConfigErrors naming the option") {
  const auto bad = [](auto set, const char* what) {
    gradsync::Options o = opts();
    set(o);
    const Outcome out = outcome_of([&] { Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), o); });
    CAPTURE(out.what);
    CHECK(out.kind == "config");
    CHECK(has(out.what, what));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  bad([](gradsync::Options& o) { o.backward_passes_per_step = 0; }, "backward_passes_per_step must be >= 1, got 0");
  bad([](gradsync::Options& o) { o.backward_passes_per_step = -3; }, "backward_passes_per_step must be >= 1");
  bad([](gradsync::Options& o) { o.prescale_factor = -1; }, "prescale_factor must be finite and >= 0");
  bad([&](gradsync::Options& o) { o.prescale_factor = nan; }, "prescale_factor must be finite and >= 0");
  bad([&](gradsync::Options& o) { o.postscale_factor = nan; }, "postscale_factor must be finite and >= 0");
  bad([](gradsync::Options& o) { o.postscale_factor = -0.5; }, "postscale_factor must be finite and >= 0");
  bad([](gradsync::Options& o) { o.stall_timeout = -1; }, "stall_timeout must be finite and >= 0");
  bad([&](gradsync::Options& o) { o.tuning.stall_warning = nan; }, "stall_warning must be finite and >= 0");
  bad([](gradsync::Options& o) { o.tuning.spin_before_yield = -0.5; }, "spin_before_yield must be finite and >= 0");
  bad([](gradsync::Options& o) { o.tuning.max_chunks_in_flight = -1; },
      "max_chunks_in_flight must be >= 0 (0: by topology), got -1");
}

TEST_CASE("zero fusion threshold means one call per tensor") {
  const int rank = world_rank();
  gradsync::Options o = opts();
  o.tuning.fusion_threshold_bytes = 0;
  View a("a", 10), b("b", 0), c("c", 5000);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(a);
  sync.add<Dense>(b);
  sync.add<Dense>(c);
  fill(a, rank, 1);
  fill(c, rank, 2);
  CHECK(sync.synchronize());
  GRADSYNC_CHECK_ALL(sync.stats().allreduce_calls == 2);  // the empty tensor costs no call
  GRADSYNC_CHECK_ALL(value_at(a, 9) == summed(9, 1) / world_size() &&
                     value_at(c, 4999) == summed(4999, 2) / world_size());
}

TEST_CASE("counts above the per-call maximum are split (small override of INT_MAX)") {
  const int rank = world_rank();
  SUBCASE("fused chunks") {
    const std::size_t saved = gradsync::impl::max_chunk_elements();
    gradsync::impl::max_chunk_elements() = 7;
    for (std::size_t threshold : {std::size_t(0), std::size_t(4) << 20}) {
      gradsync::Options o = opts();
      o.op = gradsync::ReduceOp::sum;
      o.tuning.fusion_threshold_bytes = threshold;
      View a("a", 30), b("b", 3);
      Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      sync.add<Dense>(a);
      sync.add<Dense>(b);
      fill(a, rank, 1);
      fill(b, rank, 2);
      CHECK(sync.synchronize());
      bool ok = true;
      const auto ah = gradsync_test::host_copy(a), bh = gradsync_test::host_copy(b);
      for (std::size_t i = 0; i < 30; ++i) ok &= ah(i) == summed(i, 1);
      for (std::size_t i = 0; i < 3; ++i) ok &= bh(i) == summed(i, 2);
      CAPTURE(threshold);
      GRADSYNC_CHECK_ALL(ok);
      // per tensor: ceil(30/7) + 1 calls; fused: ceil(33/7)
      GRADSYNC_CHECK_ALL(sync.stats().allreduce_calls == (threshold == 0 ? 6u : 5u));
    }
    gradsync::impl::max_chunk_elements() = saved;
  }
  SUBCASE("blocking backend collectives") {
    const std::size_t saved = gradsync::impl::mpi_max_count();
    gradsync::impl::mpi_max_count() = 3;
    gradsync::MpiBackend b(MPI_COMM_WORLD);
    std::vector<double> x(10), y(10);
    for (std::size_t i = 0; i < 10; ++i) x[i] = double(rank + 1) * double(i);
    b.allreduce_sum(x.data(), x.size());
    for (std::size_t i = 0; i < 10; ++i) y[i] = rank == 0 ? double(i) + 0.5 : -1.0;
    b.broadcast(y.data(), y.size(), 0);
    const double n = world_size();
    bool ok = true;
    for (std::size_t i = 0; i < 10; ++i) ok &= x[i] == n * (n + 1) / 2 * double(i) && y[i] == double(i) + 0.5;
    GRADSYNC_CHECK_ALL(ok);
    // A nonblocking call cannot be split by the backend: a clear error, never a truncated count.
    const Outcome out = outcome_of([&] { b.iallreduce_sum(x.data(), x.size()); });
    CHECK(has(out.what, "a single MPI call of 10 elements exceeds the limit of 3"));
    gradsync::impl::mpi_max_count() = saved;
  }
}

namespace {
struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};
}  // namespace

TEST_CASE("GRADSYNC_* environment variables override the code; malformed values are ConfigErrors") {
  gradsync::Options base;  // reads the environment
  SUBCASE("values") {
    EnvVar a("GRADSYNC_FUSION_THRESHOLD", "64K"), b("GRADSYNC_BACKWARD_PASSES_PER_STEP", "3"),
        c("GRADSYNC_STALL_TIMEOUT_S", "12.5"), d("GRADSYNC_STALL_WARNING_S", "2"), e("GRADSYNC_STALL_ACTION", "abort"),
        f("GRADSYNC_CONSISTENCY_CHECK", "every_step"), g("GRADSYNC_CHECK_FINITE", "on"),
        h("GRADSYNC_HOST_STAGING", "always"), i("GRADSYNC_SPIN_BEFORE_YIELD_S", "0.001");
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), base);
    const gradsync::Options& o = sync.options();
    CHECK(o.tuning.fusion_threshold_bytes == 65536);
    CHECK(o.backward_passes_per_step == 3);
    CHECK(o.stall_timeout == 12.5);
    CHECK(o.tuning.stall_warning == 2.0);
    CHECK(o.tuning.stall_action == gradsync::StallAction::abort);
    CHECK(o.tuning.consistency_check == gradsync::CheckMode::every_step);
    CHECK(o.check_finite);
    CHECK(o.tuning.host_staging == gradsync::HostStaging::always);
    CHECK(o.tuning.spin_before_yield == 0.001);
    {
      gradsync::Options fixed = base;
      fixed.tuning.spin_before_yield = 0;
      EnvVar j("GRADSYNC_SPIN_BEFORE_YIELD_S", "auto");
      Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), fixed);
      CHECK(s.options().tuning.spin_before_yield == gradsync::spin_before_yield_auto);
    }
    gradsync::Options off = base;
    off.tuning.read_environment = false;
    Sync plain(gradsync::MpiBackend(MPI_COMM_WORLD), off);
    CHECK(plain.options().tuning.fusion_threshold_bytes == base.tuning.fusion_threshold_bytes);
  }
  SUBCASE("malformed") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {"GRADSYNC_FUSION_THRESHOLD", "lots"},      {"GRADSYNC_FUSION_THRESHOLD", "-5"},
        {"GRADSYNC_FUSION_THRESHOLD", "4MB"},       {"GRADSYNC_FUSION_THRESHOLD", "99999999999999999999999"},
        {"GRADSYNC_BACKWARD_PASSES_PER_STEP", "0"}, {"GRADSYNC_BACKWARD_PASSES_PER_STEP", "2.5"},
        {"GRADSYNC_STALL_TIMEOUT_S", "-1"},         {"GRADSYNC_STALL_TIMEOUT_S", "nan"},
        {"GRADSYNC_STALL_WARNING_S", "soon"},       {"GRADSYNC_STALL_ACTION", "explode"},
        {"GRADSYNC_CONSISTENCY_CHECK", "always"},   {"GRADSYNC_CHECK_FINITE", "maybe"},
        {"GRADSYNC_HOST_STAGING", "sometimes"},     {"GRADSYNC_STALL_TIMEOUT_S", ""},
        {"GRADSYNC_SPIN_BEFORE_YIELD_S", "-1"},     {"GRADSYNC_SPIN_BEFORE_YIELD_S", "fast"}};
    for (const auto& var_value : cases) {
      const char* const var = var_value.first;
      const char* const value = var_value.second;
      EnvVar e(var, value);
      const Outcome out = outcome_of([&] { Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), base); });
      CAPTURE(var);
      CAPTURE(value);
      CAPTURE(out.what);
      CHECK(out.kind == "config");
      CHECK(has(out.what, std::string("environment variable ") + var));
    }
  }
  GRADSYNC_SUBCASE_FROM_RANKS(2, "set on one rank only: every rank throws a MismatchError",
                              "a variable set on one rank only needs another rank") {
    const int last = world_size() - 1;
    std::unique_ptr<EnvVar> e;
    if (world_rank() == last) e = std::make_unique<EnvVar>("GRADSYNC_FUSION_THRESHOLD", "1K");
    gradsync::Options o = opts();
    o.tuning.read_environment = true;
    View a("a", 10);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a);
    expect_mismatch([&] { (void)sync.synchronize(); },
                    {"fusion_threshold_bytes", rank_word(last) + ": 1024", "GRADSYNC_* environment variable"});
  }
}
