// Never silently wrong, part 2 (issue 24): every setting that shapes the plan or the protocol is
// agreed in the arrival check before the first collective, whatever the local settings say, or is
// harmless when it differs. Each case sets something on one rank only (in code here; through the
// environment in the last test case, which ctest runs under tests/one_rank_env.sh) and checks that
// every rank throws the same MismatchError naming the setting and the ranks within a second, with
// the gradients untouched, or, for harmless settings, that every value is right.
#include <gradsync/gradsync.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "generic_backend.hpp"
#include "gradsync_test.hpp"

using gradsync_test::value_at;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

using gradsync_test::has;

// A deadline far above the one second a mismatch may take: a regression to a stall shows as a
// StallError (or a test timeout), never as a pass.
gradsync::Options opts() {
  gradsync::Options o;
  o.stall_timeout = 30;
  o.tuning.stall_warning = 10;
  o.tuning.read_environment = false;
  return o;
}

constexpr gradsync::Collectives paths[] = {gradsync::Collectives::blocking, gradsync::Collectives::nonblocking};
const char* path_name(gradsync::Collectives c) {
  return c == gradsync::Collectives::blocking ? "blocking" : "nonblocking";
}

struct Outcome {
  std::string kind, what;
  double seconds = 0;  // the slowest rank's time in the failing call
};
template <class F>
Outcome timed_outcome(F&& f) {
  Outcome out;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const gradsync::MismatchError& e) {
    out = {"mismatch", e.what()};
  } catch (const gradsync::StallError& e) {
    out = {"stall", e.what()};
  } catch (const gradsync::ConfigError& e) {
    out = {"config", e.what()};
  } catch (const gradsync::Error& e) {
    out = {"error", e.what()};
  }
  out.seconds =
      gradsync_test::max_over_ranks(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

bool same_on_all_ranks(const std::string& s) {
  const std::uint64_t h = gradsync::impl::fnv1a(s.data(), s.size());
  std::int64_t v[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  return v[0] == -v[1];
}

// "rank 1: X; ranks [0, 2]: Y" as by_rank() writes it, for `odd` holding X and the rest Y.
std::string split(int odd, const std::string& x, const std::string& y) {
  std::vector<std::string> what(static_cast<std::size_t>(world_size()), y);
  what[std::size_t(odd)] = x;
  return gradsync::impl::by_rank(what);
}

void report(const char* what, const Outcome& o) {
  if (world_rank() == 0)
    std::printf("agreement: %d ranks: %s: %s after %.1f ms\n", world_size(), what,
                o.kind.empty() ? "no error" : o.kind.c_str(), o.seconds * 1e3);
}

// Every rank throws a MismatchError with the same message, containing each of `parts`, in under a
// second.
void expect_mismatch(const char* what, const std::function<void()>& f, const std::vector<std::string>& parts) {
  const Outcome o = timed_outcome(f);
  report(what, o);
  CAPTURE(what);
  CAPTURE(o.kind);
  CAPTURE(o.what);
  GRADSYNC_CHECK_ALL(o.kind == "mismatch");
  GRADSYNC_CHECK_ALL(same_on_all_ranks(o.what));
  GRADSYNC_CHECK_ALL(o.seconds < 1.0);
  for (const auto& p : parts) {
    CAPTURE(p);
    GRADSYNC_CHECK_ALL(has(o.what, p));
  }
}

// Rank r's value of tensor k at index i in step s: integers, so sums are exact.
double value(std::size_t k, std::size_t i, int r, int s) {
  return double(1000 * (r + 1) + 100 * s + 10 * int(k) + int(i % 7));
}

// Three gradients: one large enough to be reduced in place (and by MpiBackend's ring), two small ones
// fused; the shape that crashed with host staging on one rank. In V's memory space (the default's:
// device memory on a Kokkos build with CUDA).
template <class V = View>
struct ModelOf {
  std::vector<V> g{V("big", 20000), V("small", 300), V("tiny", 7)};
  void fill(int step) {
    const int r = world_rank();
    for (std::size_t k = 0; k < g.size(); ++k)
      gradsync_test::fill_host(g[k], [&](std::size_t i) { return value(k, i, r, step); });
  }
  template <class S>
  void add_to(S& sync) {
    for (std::size_t k = 0; k < g.size(); ++k) sync.template add<Dense>(g[k], g[k].label());
  }
  // Largest error against the analytic average over ranks.
  double error(int step) const {
    return gradsync_test::worst_vs_rank_average(
        g, world_size(), [&](std::size_t k, std::size_t i, int r) { return value(k, i, r, step); });
  }
  // Whether every gradient still holds this rank's own values of `step` (nothing was exchanged).
  bool untouched(int step) const {
    bool ok = true;
    for (std::size_t k = 0; k < g.size(); ++k) {
      const auto h = gradsync_test::host_copy(g[k]);
      for (std::size_t i = 0; i < h.size(); ++i) ok &= h(i) == value(k, i, world_rank(), step);
    }
    return ok;
  }
};
using Model = ModelOf<>;

// Runs `steps` synchronized steps and checks every value against the analytic average.
template <class S, class M>
void expect_right_values(const char* what, S& sync, M& m, int steps = 3) {
  double worst = 0;
  const Outcome o = timed_outcome([&] {
    for (int s = 0; s < steps; ++s) {
      m.fill(s);
      CHECK(sync.synchronize());
      worst = std::max(worst, m.error(s));
    }
  });
  report(what, o);
  CAPTURE(what);
  CAPTURE(o.what);
  GRADSYNC_CHECK_ALL(o.kind.empty());
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst < 1e-13);
}

}  // namespace

TEST_CASE("names given to add() are compared: same-size tensors in swapped order on one rank") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "one rank has no peer whose names could differ");
  const int rank = world_rank(), odd = world_size() - 1;
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    Kokkos::View<float*> a("a", 1000), b("b", 1000);
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<float*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    if (rank == odd) {
      sync.add<Dense>(b, "b");
      sync.add<Dense>(a, "a");
    } else {
      sync.add<Dense>(a, "a");
      sync.add<Dense>(b, "b");
    }
    Kokkos::deep_copy(a, float(1 + rank));  // averaged crosswise before: a = b = 51 at 2 ranks
    Kokkos::deep_copy(b, float(100 + rank));
    expect_mismatch("names swapped on one rank", [&] { (void)sync.synchronize(); },
                    {"data-parallel tensor #0", split(odd, "'b' (group Dense, index 0, 1000 x float)",
                                                      "'a' (group Dense, index 0, 1000 x float)")});
    GRADSYNC_CHECK_ALL(value_at(a, 999) == float(1 + rank) && value_at(b, 0) == float(100 + rank));
  }
  // A name given on some ranks only is a difference too: give names on every rank or on none.
  View a("a", 10);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  if (rank == odd)
    sync.add<Dense>(a);
  else
    sync.add<Dense>(a, "a");
  expect_mismatch(
      "a name given on some ranks only", [&] { (void)sync.synchronize(); },
      {split(odd, "'Dense[0]' (group Dense, index 0, 10 x double)", "'a' (group Dense, index 0, 10 x double)")});
}

TEST_CASE("a mismatch every rank finds is every rank's own: none blames the rank that found it first") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a mismatch between ranks needs two of them");
  // The last rank's watched waits listen 0.1 s longer after their collective completed, so the
  // others find the mismatch and fail first. They find it in the consistency check's result, as it
  // does: none tells it (a notice would arrive first and make its message "rank 0 failed before ...").
  const int rank = world_rank(), odd = world_size() - 1;
  struct Hold {
    ~Hold() { gradsync::impl::completed_wait_delay_s() = 0; }
  } hold;
  if (rank == odd) gradsync::impl::completed_wait_delay_s() = 0.1;
  Kokkos::View<float*> a("a", 1000), b("b", 1000);
  gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<float*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts());
  sync.add<Dense>(rank == odd ? b : a, rank == odd ? "b" : "a");
  sync.add<Dense>(rank == odd ? a : b, rank == odd ? "a" : "b");
  expect_mismatch("names swapped on the last rank, which completes its waits late", [&] { (void)sync.synchronize(); },
                  {"data-parallel tensor #0",
                   split(odd, "'b' (group Dense, index 0, 1000 x float)", "'a' (group Dense, index 0, 1000 x float)")});
  // Its later calls say the same on every rank too: the sync failed in the consistency check.
  const Outcome later = timed_outcome([&] { (void)sync.synchronize(); });
  CAPTURE(later.what);
  GRADSYNC_CHECK_ALL(later.kind == "mismatch" && !has(later.what, "failed before") &&
                     has(later.what, "data-parallel tensor #0"));
}

TEST_CASE("the same names in the same order pass, and the values are the averages") {
  const int rank = world_rank(), n = world_size();
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    Kokkos::View<float*> a("a", 1000), b("b", 1000);
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<float*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(a, "a");
    sync.add<Dense>(b, "b");
    Kokkos::deep_copy(a, float(1 + rank));
    Kokkos::deep_copy(b, float(100 + rank));
    CHECK(sync.synchronize());
    // The average of 1..n and of 100..99+n.
    GRADSYNC_CHECK_ALL(value_at(a, 0) == float(n + 1) / 2 && value_at(a, 999) == float(n + 1) / 2);
    GRADSYNC_CHECK_ALL(value_at(b, 0) == float(199 + n) / 2 && value_at(b, 999) == float(199 + n) / 2);
  }
}

TEST_CASE("settings that shape the plan or the protocol, set on one rank only: a MismatchError naming it") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a setting on one rank only needs another rank without it");
  const int rank = world_rank(), odd = world_size() - 1;
  struct Case {
    const char* what;
    std::function<void(gradsync::Options&)> set;
    std::vector<std::string> parts;  // in the message
  };
  const std::vector<Case> cases = {
      {"host_staging = always",
       [](gradsync::Options& o) { o.tuning.host_staging = gradsync::HostStaging::always; },
       {"ranks disagree on host_staging: " + split(odd, "always", "auto")}},
      {"consistency_check = off",
       [](gradsync::Options& o) { o.tuning.consistency_check = gradsync::CheckMode::off; },
       {"ranks disagree on consistency_check: " + split(odd, "off", "on_change")}},
      {"consistency_check = every_step",
       [](gradsync::Options& o) { o.tuning.consistency_check = gradsync::CheckMode::every_step; },
       {"ranks disagree on consistency_check: " + split(odd, "every_step", "on_change")}},
      {"check_finite",
       [](gradsync::Options& o) { o.check_finite = true; },
       {"ranks disagree on check_finite: " + split(odd, "true", "false")}},
      {"fusion_order",
       [](gradsync::Options& o) { o.tuning.fusion_order = gradsync::FusionOrder::registration; },
       {"ranks disagree on fusion_order: " + split(odd, "registration", "reverse")}},
      {"in_place_min_bytes",
       [](gradsync::Options& o) { o.tuning.in_place_min_bytes = 1 << 20; },
       {"ranks disagree on in_place_min_bytes: " + split(odd, "1048576", "65536")}},
  };
  for (auto path : paths)
    for (const Case& c : cases) {
      CAPTURE(path_name(path));
      CAPTURE(c.what);
      gradsync::Options o = opts();
      o.tuning.collectives = path;
      if (rank == odd) c.set(o);
      Model m;
      Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      m.add_to(sync);
      m.fill(0);
      expect_mismatch(
          c.what, [&] { (void)sync.synchronize(); }, c.parts);
      GRADSYNC_CHECK_ALL(m.untouched(0));
    }
  // The collectives option itself, on one rank only.
  gradsync::Options o = opts();
  o.tuning.collectives = rank == odd ? gradsync::Collectives::blocking : gradsync::Collectives::nonblocking;
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  m.add_to(sync);
  m.fill(0);
  expect_mismatch("collectives", [&] { (void)sync.synchronize(); },
                  {"ranks disagree on collectives: " + split(odd, "blocking", "nonblocking")});
  GRADSYNC_CHECK_ALL(m.untouched(0));
}

TEST_CASE("the same options everywhere: host_staging always and CUDA-aware MPI give the right values") {
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    o.tuning.host_staging = gradsync::HostStaging::always;
    Model m;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    expect_right_values("host_staging = always on every rank", sync, m);
  }
  // Host memory handed to a "CUDA-aware" MPI: blocking collectives, no ring. (Explicitly host:
  // device memory would reach this MPI, which is not CUDA-aware.)
  using HostView = Kokkos::View<double*, Kokkos::HostSpace>;
  ModelOf<HostView> m;
  gradsync::GradientSync<gradsync::MpiBackend, HostView> sync(
      gradsync::MpiBackend(MPI_COMM_WORLD, gradsync::CudaAwareMpi::yes), opts());
  m.add_to(sync);
  expect_right_values("CUDA-aware MPI on every rank", sync, m);
}

TEST_CASE("CUDA-aware MPI on one rank only (MpiBackend's CudaAwareMpi; GRADSYNC_CUDA_AWARE_MPI alike)") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "CUDA-aware MPI on one rank only needs another rank without it");
  const int rank = world_rank(), odd = world_size() - 1;
  Model m;
  Sync sync(
      gradsync::MpiBackend(MPI_COMM_WORLD, rank == odd ? gradsync::CudaAwareMpi::yes : gradsync::CudaAwareMpi::no),
      opts());
  m.add_to(sync);
  m.fill(0);
  expect_mismatch("CUDA-aware MPI on one rank", [&] { (void)sync.synchronize(); },
                  {"ranks disagree on CUDA-aware MPI", split(odd, "yes", "no"), "GRADSYNC_CUDA_AWARE_MPI alike"});
  GRADSYNC_CHECK_ALL(m.untouched(0));
}

TEST_CASE("harmless when they differ: deadlines, warnings, stall action, huge pages, chunks in flight") {
  const int rank = world_rank(), odd = world_size() - 1;
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    o.tuning.fusion_threshold_bytes = 4096;  // many chunks, so the number in flight matters
    if (rank == odd) {
      o.stall_timeout = 0;
      o.tuning.stall_warning = 0;
      o.tuning.stall_action = gradsync::StallAction::abort;
      o.tuning.huge_pages = false;
      o.tuning.max_chunks_in_flight = 1;
    } else {
      o.stall_timeout = 30 + rank;
      o.tuning.stall_warning = 5 + rank;
    }
    Model m;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    expect_right_values("stall_timeout 0 (and others) on one rank", sync, m, 4);
    // A registration changed on one rank only is still a MismatchError, not a hang on the rank
    // without a deadline: the arrival check runs on every rank whatever its deadline.
    View extra("extra", 5);
    if (rank == odd && world_size() > 1) sync.add<Dense>(extra, "extra");
    m.fill(4);
    if (world_size() > 1)
      expect_mismatch(
          "a registration changed on the rank without a deadline", [&] { (void)sync.synchronize(); },
          {"data-parallel tensor #3", split(odd, "'extra' (group Dense, index 3, 5 x double)", "no tensor")});
  }
}

TEST_CASE("a rank without a deadline that arrives late stops with its peers' stall report") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a late rank needs a peer that waits for it");
  const int rank = world_rank(), late = 0;
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    o.stall_timeout = rank == late ? 0 : 1.0;
    o.tuning.stall_warning = rank == late ? 0 : 0.5;
    Model m;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    m.fill(0);
    CHECK(sync.synchronize());
    GRADSYNC_CHECK_ALL(m.error(0) < 1e-13);
    m.fill(1);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::string kind, what;
    try {
      (void)sync.synchronize();
    } catch (const gradsync::StallError& e) {
      kind = "stall";
      what = e.what();
    }
    CAPTURE(what);
    GRADSYNC_CHECK_ALL(kind == "stall");
    GRADSYNC_CHECK_ALL(has(what, "missing ranks: [0]"));
    if (rank == late) {
      CHECK(has(what, "so rank 0 stops too"));
      CHECK(m.untouched(1));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("check_finite without a deadline: the NaN rank's peers stop at once instead of hanging") {
  const int rank = world_rank(), odd = world_size() - 1;
  for (auto path : paths)
    for (bool overlap : {false, true}) {  // overlap: chunks launched by mark_ready before the scan
      if (overlap && path == gradsync::Collectives::blocking) continue;
      CAPTURE(path_name(path));
      CAPTURE(overlap);
      gradsync::Options o = opts();
      o.tuning.collectives = path;
      o.stall_timeout = 0;
      o.check_finite = true;
      Model m;
      Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      m.add_to(sync);
      expect_right_values("check_finite, stall_timeout 0, finite values", sync, m);
      m.fill(3);
      if (rank == odd) gradsync_test::set_value(m.g[1], 123, std::numeric_limits<double>::quiet_NaN());
      const Outcome out = timed_outcome([&] {
        if (overlap)
          for (std::size_t k = m.g.size(); k-- > 0;) sync.mark_ready(m.g[k]);
        (void)sync.synchronize();
      });
      report("NaN on one rank, stall_timeout 0", out);
      CAPTURE(out.what);
      GRADSYNC_CHECK_ALL(out.kind == "error");
      GRADSYNC_CHECK_ALL(
          has(out.what, "gradient 'small' (group Dense, 300 values) holds NaN or Inf on rank " + std::to_string(odd)));
      GRADSYNC_CHECK_ALL(out.seconds < 1.0);
      if (rank != odd) CHECK(has(out.what, "rank " + std::to_string(odd) + " failed before the "));
    }
}

TEST_CASE("a std::vector resized on one rank, without a deadline: every rank stops") {
  const int rank = world_rank(), odd = world_size() - 1;
  for (auto path : paths) {
    CAPTURE(path_name(path));
    gradsync::Options o = opts();
    o.tuning.collectives = path;
    o.stall_timeout = 0;
    std::vector<double> v(50, 1.0), u(10, 2.0);
    gradsync::GradientSync<gradsync::MpiBackend, std::vector<double>> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(v, "v");
    sync.add<Dense>(u, "u");
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(rank + 1);
    CHECK(sync.synchronize());
    GRADSYNC_CHECK_ALL(v[49] == double(world_size() + 1) / 2 && u[9] == 2.0);
    if (rank == odd) v.resize(80, 1.0);
    const Outcome out = timed_outcome([&] { (void)sync.synchronize(); });
    report("a vector resized on one rank, stall_timeout 0", out);
    CAPTURE(out.what);
    GRADSYNC_CHECK_ALL(out.kind == "error");
    GRADSYNC_CHECK_ALL(has(out.what, "(50 -> 80 elements) on rank " + std::to_string(odd)));
    GRADSYNC_CHECK_ALL(out.seconds < 1.0);
  }
}

namespace {
// MpiBackend without its communicator: a backend with no side channel (like a user's own), whose
// sync runs the agreement on its first call only, through the backend's blocking collectives.
struct PlainName {
  static constexpr const char* value = "plain";
};
using PlainBackend = gradsync_test::GenericMpiBackend<PlainName>;
static_assert(!gradsync::impl::has_mpi_comm<PlainBackend>::value);
}  // namespace

TEST_CASE("a backend without a side channel agrees on the options at its first call") {
  using PlainSync = gradsync::GradientSync<PlainBackend, View>;
  Model m;
  PlainSync sync(PlainBackend(MPI_COMM_WORLD), opts());
  m.add_to(sync);
  double worst = 0;
  for (int s = 0; s < 3; ++s) {
    m.fill(s);
    CHECK(sync.synchronize());
    worst = std::max(worst, m.error(s));
  }
  GRADSYNC_CHECK_ALL(worst < 1e-13);
  GRADSYNC_CHECK_ALL(sync.stats().consistency_checks == 1);
}

TEST_CASE("a backend without a side channel: an option set on one rank only is a MismatchError at the first call") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "an option set on one rank only needs another rank without it");
  const int rank = world_rank(), odd = world_size() - 1;
  using PlainSync = gradsync::GradientSync<PlainBackend, View>;
  gradsync::Options o = opts();
  if (rank == odd) o.tuning.consistency_check = gradsync::CheckMode::off;
  Model m;
  PlainSync sync(PlainBackend(MPI_COMM_WORLD), o);
  m.add_to(sync);
  m.fill(0);
  expect_mismatch("consistency_check = off on one rank, no side channel", [&] { (void)sync.synchronize(); },
                  {"ranks disagree on consistency_check: " + split(odd, "off", "on_change")});
  GRADSYNC_CHECK_ALL(m.untouched(0));
}

// Run by ctest through tests/one_rank_env.sh, which exports one GRADSYNC_* variable on one rank only
// and tells every rank which (GSTEST_ONE_RANK_ENV="VAR=VALUE@RANK"): the user's path, the options
// read from the environment when the GradientSync is built.
TEST_CASE("a GRADSYNC_ variable set on one rank by the launcher" * doctest::skip()) {
  const char* spec = std::getenv("GSTEST_ONE_RANK_ENV");
  REQUIRE(spec != nullptr);
  const std::string s = spec;
  const std::size_t eq = s.find('='), at = s.rfind('@');
  REQUIRE((eq != std::string::npos && at != std::string::npos && eq < at));
  const std::string var = s.substr(0, eq), val = s.substr(eq + 1, at - eq - 1);
  const int odd = std::stoi(s.substr(at + 1));
  const int rank = world_rank();
  REQUIRE(odd < world_size());
  // The launcher did its part: the variable is set on that rank only.
  const char* mine = std::getenv(var.c_str());
  GRADSYNC_CHECK_ALL((rank == odd) == (mine != nullptr && val == mine));

  gradsync::Options o = opts();
  o.tuning.read_environment = true;
  Model m;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  m.add_to(sync);
  // What each variable must end in: a MismatchError naming the option, or right values.
  const std::map<std::string, std::string> named = {
      {"GRADSYNC_HOST_STAGING", "ranks disagree on host_staging: "},
      {"GRADSYNC_CONSISTENCY_CHECK", "ranks disagree on consistency_check: "},
      {"GRADSYNC_CHECK_FINITE", "ranks disagree on check_finite: "},
      {"GRADSYNC_ALGORITHM", "ranks disagree on algorithm: "},
      {"GRADSYNC_CUDA_AWARE_MPI", "ranks disagree on CUDA-aware MPI"},
      {"GRADSYNC_FUSION_THRESHOLD", "ranks disagree on fusion_threshold_bytes: "},
      {"GRADSYNC_BACKWARD_PASSES_PER_STEP", "ranks disagree on backward_passes_per_step: "}};
  const auto it = named.find(var);
  if (it != named.end()) {
    m.fill(0);
    expect_mismatch(s.c_str(), [&] { (void)sync.synchronize(); }, {it->second, "rank " + std::to_string(odd) + ": "});
    GRADSYNC_CHECK_ALL(m.untouched(0));
  } else {
    // Harmless ones: the variable took effect on that rank, and every value is right.
    if (var == "GRADSYNC_STALL_TIMEOUT_S") GRADSYNC_CHECK_ALL((sync.options().stall_timeout == 0) == (rank == odd));
    if (var == "GRADSYNC_HUGE_PAGES") GRADSYNC_CHECK_ALL(sync.options().tuning.huge_pages == (rank != odd));
    expect_right_values(s.c_str(), sync, m, 4);
  }
}
