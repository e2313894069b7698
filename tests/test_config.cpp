// The configuration surface: unknown GRADSYNC_* variables, describe(sync), GRADSYNC_LOG, prepare(),
// and the environment table of docs/ERRORS.md against env.hpp's list.
#include <gradsync/gradsync.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {

struct Dense {};
struct Tables {};
struct Tower {};
struct Head {};

}  // namespace
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};
namespace {

// Host memory on every build: the plan these tests describe (chunks reduced in place) is host memory's;
// on a Kokkos-CUDA build default Views would be staged, and the tests read values on the host.
using Grad = Kokkos::View<double*, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Grad>;

// What f() writes to this process's stderr (file descriptor 2, so fprintf and std::cerr alike).
template <class F>
std::string capture_stderr(F&& f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  try {
    f();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::fclose(tmp);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(tmp);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

// Sets (or unsets, with nullptr) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A small sync, prepared: the first plan build runs the once-per-process warning.
void one_sync() {
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)};
  Grad g("g", 16);
  sync.add<Dense>(g);
  sync.prepare();
  CHECK(sync.synchronize());
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("edit distance and the closest known variable") {
  using gradsync::impl::closest_env_var;
  using gradsync::impl::edit_distance;
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("GRADSYNC_STAL_TIMEOUT_S", "GRADSYNC_STALL_TIMEOUT_S") == 1);  // a letter missing
  CHECK(edit_distance("GRADSYNC_HUGE_PGAES", "GRADSYNC_HUGE_PAGES") == 1);           // two swapped
  CHECK(std::string(closest_env_var("GRADSYNC_STAL_TIMEOUT_S")) == "GRADSYNC_STALL_TIMEOUT_S");
  CHECK(std::string(closest_env_var("GRADSYNC_FUSION_TRESHOLD")) == "GRADSYNC_FUSION_THRESHOLD");
  CHECK(std::string(closest_env_var("GRADSYNC_STALL_TIMEOUT")) == "GRADSYNC_STALL_TIMEOUT_S");
  CHECK(std::string(closest_env_var("GRADSYNC_LGO")) == "GRADSYNC_LOG");
  CHECK(closest_env_var("GRADSYNC_SOMETHING_ELSE_ENTIRELY") == nullptr);  // no likely intent: no guess
}

TEST_CASE("unknown_env_warnings: one message per unknown GRADSYNC_ variable, known ones pass") {
  std::vector<std::string> store = {
      "PATH=/usr/bin",     "GRADSYNC_STAL_TIMEOUT_S=5", "GRADSYNC_HUGE_PAGES=0",
      "GRADSYNC_LOG=info", "GRADSYNC_CUDA_AWARE_MPI=1", "GRADSYNC_SOMETHING_ELSE_ENTIRELY=1",
      "MY_GRADSYNC_STAL=1"};
  std::vector<char*> env;
  for (std::string& s : store) env.push_back(s.data());
  env.push_back(nullptr);
  const auto w = gradsync::impl::unknown_env_warnings(env.data());
  REQUIRE(w.size() == 2);
  CHECK(w[0] ==
        "gradsync: warning: unknown environment variable GRADSYNC_STAL_TIMEOUT_S is ignored; "
        "did you mean GRADSYNC_STALL_TIMEOUT_S?");
  CHECK(w[1] ==
        "gradsync: warning: unknown environment variable GRADSYNC_SOMETHING_ELSE_ENTIRELY is ignored; "
        "the known ones are in docs/ERRORS.md");
  // Every known variable passes.
  std::vector<std::string> known;
  for (const auto& v : gradsync::known_env_vars()) known.push_back(std::string(v.name) + "=1");
  std::vector<char*> kenv;
  for (std::string& s : known) kenv.push_back(s.data());
  kenv.push_back(nullptr);
  CHECK(gradsync::impl::unknown_env_warnings(kenv.data()).empty());
}

TEST_CASE("a misspelled variable warns once per process, at the first sync, naming the closest one") {
  ScopedEnv typo("GRADSYNC_STAL_TIMEOUT_S", "5");
  gradsync::impl::unknown_env_warned() = false;  // as in a fresh process
  std::string err;
  // Nothing is said when the sync is built, once at its first plan build, and never again.
  std::string at_construction = capture_stderr([] { Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)}; });
  err = capture_stderr([] {
    one_sync();
    one_sync();
  });
  GRADSYNC_CHECK_ALL(at_construction.empty());
  GRADSYNC_CHECK_ALL(err ==
                     "gradsync: warning: unknown environment variable GRADSYNC_STAL_TIMEOUT_S is ignored; did "
                     "you mean GRADSYNC_STALL_TIMEOUT_S?\n");
  if (!all_ranks(lines_of(err).size() == 1)) MESSAGE("rank ", world_rank(), " stderr: ", err);
  // The typo changed nothing: the option keeps its value from code.
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)};
  GRADSYNC_CHECK_ALL(sync.options().stall_timeout == 300.0);
}

TEST_CASE("a correct environment warns nothing; read_environment = false warns nothing either") {
  ScopedEnv typo("GRADSYNC_STAL_TIMEOUT_S", nullptr);
  ScopedEnv good("GRADSYNC_STALL_TIMEOUT_S", "120");
  ScopedEnv pages("GRADSYNC_HUGE_PAGES", "on");
  gradsync::impl::unknown_env_warned() = false;
  const std::string err = capture_stderr([] { one_sync(); });
  GRADSYNC_CHECK_ALL(err.empty());
  {
    ScopedEnv bad("GRADSYNC_STALL_TIMOUT_S", "1");
    gradsync::impl::unknown_env_warned() = false;
    const std::string off = capture_stderr([] {
      gradsync::Options o;
      o.tuning.read_environment = false;  // the program ignores GRADSYNC_*: a typo there changes nothing
      Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD), o};
      Grad g("g", 16);
      sync.add<Dense>(g);
      CHECK(sync.synchronize());
    });
    GRADSYNC_CHECK_ALL(off.empty());
  }
  gradsync::impl::unknown_env_warned() = true;  // later tests: already warned
}

namespace {

// The model of the describe and prepare tests. Sizes in doubles:
//   Dense  a 100,000 (800,000 B: in place)   b 1,000 (packed)   c 600,000 (4,800,000 B: two in-place
//          pieces of 300,000, since a chunk holds at most 4 MiB = 524,288 doubles)
//   Tables t 1,000 * (rank + 1), KeepLocal<world_size>    Tower u 50, KeepLocal<none>
//   Head   h1 10 (packed), h2 20 made local by register_local_var (scaled by 1/n)
// Fused order (reverse): h1, c, b, a -> chunks c0, c1, a (in place) and {h1, b} packed: 4 chunks.
struct Model {
  int r = world_rank();
  Grad a{"a", 100000}, b{"b", 1000}, c{"c", 600000}, t{"t", std::size_t(1000 * (world_rank() + 1))}, u{"u", 50},
      h1{"h1", 10}, h2{"h2", 20};

  template <class S>
  void add_to(S& sync) {
    sync.template add<Dense>(a);
    sync.template add<Dense>(b);
    sync.template add<Dense>(c);
    sync.template add<Tables>(t);
    sync.template add<Tower>(u);
    sync.template add<Head>(h1);
    sync.template add<Head>(h2);
    sync.register_local_var(h2);
  }
  // Rank r's gradient values: integers, so the average over ranks is known exactly.
  static double value(std::size_t k, std::size_t i, int rank) {
    return double(rank + 1) * double(k + 1) + double(i % 5);
  }
  std::vector<Grad> all() const { return {a, b, c, t, u, h1, h2}; }
  void fill() {
    auto v = all();
    for (std::size_t k = 0; k < v.size(); ++k)
      for (std::size_t i = 0; i < v[k].size(); ++i) v[k](i) = value(k, i, r);
  }
};

}  // namespace

TEST_CASE("describe(sync): groups, tensors, bytes, plan and options on real values") {
  const int r = world_rank(), n = world_size();
  Model m;
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)};
  m.add_to(sync);
  const std::size_t local_bytes = 8000u * std::size_t(r + 1) + 400 + 160;

  // Before the plan exists: registrations known, plan not.
  gradsync::SyncSummary s0 = sync.summary();
  GRADSYNC_CHECK_ALL(!s0.planned && s0.chunks == 0);
  GRADSYNC_CHECK_ALL(describe(sync).find("plan: not built yet (prepare() or the first synchronize() builds it); "
                                         "fusion_threshold_bytes by topology, 4,194,304 bytes (4.0 MiB)") !=
                     std::string::npos);

  sync.prepare();
  const gradsync::SyncSummary s = sync.summary();
  GRADSYNC_CHECK_ALL(s.backend == "mpi" && s.rank == r && s.ranks == n && s.value_type == "double" &&
                     s.memory_space == Kokkos::HostSpace::name());
  REQUIRE(s.groups.size() == 4);
  GRADSYNC_CHECK_ALL(s.groups[0].name.find("Dense") != std::string::npos && s.groups[0].tensors == 3 &&
                     s.groups[0].bytes == 5608000 && !s.groups[0].policy_local);
  GRADSYNC_CHECK_ALL(s.groups[1].tensors == 1 && s.groups[1].bytes == 8000u * std::size_t(r + 1) &&
                     s.groups[1].policy_local && s.groups[1].scale == gradsync::LocalScale::world_size);
  GRADSYNC_CHECK_ALL(s.groups[2].tensors == 1 && s.groups[2].bytes == 400 && s.groups[2].policy_local &&
                     s.groups[2].scale == gradsync::LocalScale::none);
  GRADSYNC_CHECK_ALL(s.groups[3].tensors == 2 && s.groups[3].bytes == 240 && s.groups[3].runtime_local_tensors == 1 &&
                     s.groups[3].runtime_local_bytes == 160);
  GRADSYNC_CHECK_ALL(s.data_parallel_tensors == 4 && s.data_parallel_bytes == 5608080);
  GRADSYNC_CHECK_ALL(s.data_parallel_bytes == sync.data_parallel_bytes());
  GRADSYNC_CHECK_ALL(s.local_tensors == 3 && s.local_bytes == local_bytes);
  GRADSYNC_CHECK_ALL(s.planned && !s.blocking && !s.staged && !s.tuning);
  GRADSYNC_CHECK_ALL(s.chunks == 4 && s.chunks_in_place == 3 && s.largest_chunk_bytes == 2400000);
  // MpiBackend folds the scale into its ring for in-place host sums of 64 KiB and more, on 2+ ranks.
  GRADSYNC_CHECK_ALL(s.chunks_folded == (n > 1 ? 3u : 0u));
  GRADSYNC_CHECK_ALL(s.fusion_threshold_bytes == (std::size_t(4) << 20));

  const std::string d = describe(sync);
  const auto has = [&](const std::string& line) {
    const bool ok = d.find(line) != std::string::npos;
    if (!ok) MESSAGE("missing: ", line, "\nin:\n", d);
    return ok;
  };
  const std::string ns = std::to_string(n);
  GRADSYNC_CHECK_ALL(has("gradsync: GradientSync on rank " + std::to_string(r) + " of " + ns +
                         ", backend mpi, double gradients in memory space " + std::string(Kokkos::HostSpace::name())));
  GRADSYNC_CHECK_ALL(has("Dense: 3 tensors, 5,608,000 bytes (5.3 MiB), data-parallel\n"));
  GRADSYNC_CHECK_ALL(has("Tables: 1 tensor, " + gradsync::impl::grouped(8000u * std::size_t(r + 1)) +
                         " bytes, local, scaled by 1/" + ns + "\n"));
  GRADSYNC_CHECK_ALL(has("Tower: 1 tensor, 400 bytes, local, not scaled\n"));
  GRADSYNC_CHECK_ALL(
      has("Head: 2 tensors, 240 bytes, data-parallel (1 tensor, 160 bytes local by "
          "register_local_var, scaled by 1/" +
          ns + ")\n"));
  GRADSYNC_CHECK_ALL(
      has("  data-parallel: 4 tensors, 5,608,080 bytes (5.3 MiB) handed to the backend per step; "
          "local: 3 tensors, " +
          gradsync::impl::grouped(local_bytes) + " bytes never sent\n"));
  GRADSYNC_CHECK_ALL(
      has("  plan: 4 chunks per step (3 reduced in place, 1 packed through the fusion buffer); "
          "fusion_threshold_bytes by topology, 4,194,304 bytes (4.0 MiB), largest chunk 2,400,000 bytes (2.3 MiB)\n"));
  // One node (this test never spans hosts): flat, by rule, nothing timed.
  GRADSYNC_CHECK_ALL(
      has("  topology: 1 node x " + ns + (n == 1 ? " rank" : " ranks") + "; algorithm flat (automatic)\n"));
  GRADSYNC_CHECK_ALL(s.topology.nodes == 1 && s.topology.local_size == n && s.algorithm == gradsync::Algorithm::flat &&
                     s.chunks_in_flight == 16 && s.plan_candidates == 1 && s.candidate_seconds.empty());
  GRADSYNC_CHECK_ALL(has("  collectives: nonblocking, up to 16 chunks in flight, " + std::string(n > 1 ? "3" : "0") +
                         " with the scale folded into the backend's sum; no host staging"));
  GRADSYNC_CHECK_ALL(has("  options: op average, prescale 1, postscale 1, backward_passes_per_step 1"));
}

TEST_CASE("describe(sync): blocking collectives, staging, aggregation and fusion_threshold_auto") {
  const int n = world_size();
  Model m;
  gradsync::Options o;
  o.tuning.collectives = gradsync::Collectives::blocking;
  o.tuning.host_staging = gradsync::HostStaging::always;  // staged: nothing is reduced in place
  o.backward_passes_per_step = 2;
  o.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_auto;
  o.tuning.read_environment = false;
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD), o};
  m.add_to(sync);
  sync.prepare();
  const gradsync::SyncSummary s = sync.summary();
  // The tuner's first candidate is 8 MiB = 1,048,576 doubles; the 701,010 data-parallel values are
  // fused in order h1, c, b, a into one packed chunk.
  GRADSYNC_CHECK_ALL(s.blocking && s.staged && s.tuning && s.fusion_threshold_bytes == (std::size_t(8) << 20));
  GRADSYNC_CHECK_ALL(s.chunks == 1 && s.chunks_in_place == 0 && s.chunks_folded == 0 &&
                     s.largest_chunk_bytes == 5608080);
  const std::string d = describe(sync);
  GRADSYNC_CHECK_ALL(d.find("  plan: 1 chunk per step (0 reduced in place, 1 packed through the fusion buffer); "
                            "fusion_threshold_bytes auto, timing 8,388,608 bytes (8.0 MiB), largest chunk "
                            "5,608,080 bytes (5.3 MiB)\n  collectives: one blocking allreduce per chunk; staged "
                            "through host memory") != std::string::npos);
  GRADSYNC_CHECK_ALL(d.find("backward_passes_per_step 2") != std::string::npos);
  (void)n;
}

TEST_CASE("prepare(): the plan, the check and the buffers before the first synchronize(), values exact") {
  const int n = world_size();
  for (bool watched : {true, false}) {
    CAPTURE(watched);
    Model m;
    gradsync::Options o;
    o.tuning.read_environment = false;
    if (!watched) o.stall_timeout = 0;  // no deadline: the same agreement, waited without one
    Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD), o};
    m.add_to(sync);
    m.fill();
    sync.prepare();
    const gradsync::Stats p = sync.stats();
    GRADSYNC_CHECK_ALL(p.plan_builds == 1 && p.consistency_checks == 1 && p.passes == 0 && p.allreduce_calls == 0 &&
                       p.bytes_allreduced == 0 && p.allocations > 0);
    // prepare() touched no value.
    bool untouched = true;
    const auto v = m.all();
    for (std::size_t k = 0; k < v.size(); ++k)
      for (std::size_t i = 0; i < v[k].size(); ++i) untouched = untouched && v[k](i) == Model::value(k, i, m.r);
    GRADSYNC_CHECK_ALL(untouched);

    GRADSYNC_CHECK_ALL(sync.synchronize());
    const gradsync::Stats s = sync.stats();
    GRADSYNC_CHECK_ALL(s.plan_builds == 1 && s.consistency_checks == 1 && s.allocations == p.allocations);
    // Chunks: c's two halves, a, and b with h1 packed; with a ring (2+ ranks) c's second half, a
    // and the packed chunk fit one fusion threshold and go as one sum over their regions.
    GRADSYNC_CHECK_ALL(s.allreduce_calls == (n == 1 ? 4u : 2u) && s.bytes_allreduced == 5608080);
    // Data-parallel: the average over ranks; local: Tables / n, Tower as is, h2 / n.
    const std::vector<Grad> dp = {m.a, m.b, m.c, m.h1};
    const std::size_t dp_k[] = {0, 1, 2, 5};
    double worst = 0;
    for (std::size_t j = 0; j < dp.size(); ++j)
      for (std::size_t i = 0; i < dp[j].size(); ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += Model::value(dp_k[j], i, q);
        worst = std::max(worst, gradsync_test::rel_err(dp[j](i), sum / n));
      }
    for (std::size_t i = 0; i < m.t.size(); ++i)
      worst = std::max(worst, gradsync_test::rel_err(m.t(i), Model::value(3, i, m.r) / n));
    for (std::size_t i = 0; i < m.u.size(); ++i)
      worst = std::max(worst, gradsync_test::rel_err(m.u(i), Model::value(4, i, m.r)));
    for (std::size_t i = 0; i < m.h2.size(); ++i)
      worst = std::max(worst, gradsync_test::rel_err(m.h2(i), Model::value(6, i, m.r) / n));
    GRADSYNC_CHECK_ALL(worst <= gradsync_test::tol<double>());

    // A second prepare() between steps does nothing new; a change of registrations is rebuilt by it.
    sync.prepare();
    GRADSYNC_CHECK_ALL(sync.stats().plan_builds == 1 && sync.stats().consistency_checks == 1);
    Grad extra("extra", 7);
    sync.add<Dense>(extra);
    sync.prepare();
    GRADSYNC_CHECK_ALL(sync.stats().plan_builds == 2 && sync.stats().consistency_checks == 2);
    m.fill();
    Kokkos::deep_copy(extra, double(m.r));
    GRADSYNC_CHECK_ALL(sync.synchronize());
    GRADSYNC_CHECK_ALL(sync.stats().plan_builds == 2 && std::abs(extra(6) - (n - 1) / 2.0) <= 1e-15);
  }
}

TEST_CASE("prepare() inside an aggregation cycle is refused") {
  gradsync::Options o;
  o.backward_passes_per_step = 2;
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD), o};
  Grad g("g", 8);
  sync.add<Dense>(g);
  GRADSYNC_CHECK_ALL(!sync.synchronize());
  const std::string e = gradsync_test::error_of([&] { sync.prepare(); });
  GRADSYNC_CHECK_ALL(e ==
                     "gradsync: prepare() called after pass 1 of 2 of an aggregation cycle; call it only "
                     "between steps (after synchronize() returned true): the sums held for the cycle would "
                     "no longer match");
  GRADSYNC_CHECK_ALL(sync.synchronize());
}

TEST_CASE("prepare() on some ranks only is a MismatchError") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "prepare() on some ranks only needs another rank that synchronizes");
  Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)};
  Grad g("g", 8);
  sync.add<Dense>(g);
  const std::string e = gradsync_test::error_of<gradsync::MismatchError>([&] {
    if (world_rank() == 0)
      sync.prepare();
    else
      (void)sync.synchronize();
  });
  GRADSYNC_CHECK_ALL(e.find("some ranks called prepare() while others called synchronize() or mark_ready(): "
                            "prepare() is collective, call it on every rank") != std::string::npos);
}

TEST_CASE("GRADSYNC_LOG=info prints describe(sync) from rank 0 at the first plan build; info_all from every rank") {
  const int r = world_rank();
  for (const char* level : {"info", "info_all"}) {
    CAPTURE(level);
    ScopedEnv log("GRADSYNC_LOG", level);
    Model m;
    std::string expected;
    const std::string err = capture_stderr([&] {
      Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)};
      m.add_to(sync);
      CHECK(sync.synchronize());  // first plan build: printed
      expected = describe(sync) + "\n";
      CHECK(sync.synchronize());  // not again
    });
    const bool prints = std::string(level) == "info_all" || r == 0;
    GRADSYNC_CHECK_ALL(err == (prints ? expected : std::string()));
    if (!all_ranks(err == (prints ? expected : std::string()))) MESSAGE("rank ", r, " stderr:\n", err);
  }
  {
    ScopedEnv log("GRADSYNC_LOG", "off");
    GRADSYNC_CHECK_ALL(capture_stderr([] { one_sync(); }).empty());
  }
  ScopedEnv log("GRADSYNC_LOG", "verbose");
  const std::string e =
      gradsync_test::error_of<gradsync::ConfigError>([] { Sync sync{gradsync::MpiBackend(MPI_COMM_WORLD)}; });
  GRADSYNC_CHECK_ALL(e == "gradsync: environment variable GRADSYNC_LOG='verbose' is not one of: off, info, info_all");
}

TEST_CASE("docs/ERRORS.md's environment table lists exactly env.hpp's known variables") {
  std::ifstream f(GRADSYNC_DOCS_DIR "/ERRORS.md");
  REQUIRE(f.good());
  std::set<std::string> documented;
  // A row starts "| `GRADSYNC_NAME` |" (no <regex>: GCC 12 warns inside it at -O2 with sanitizers).
  const std::string head = "| `GRADSYNC_";
  for (std::string line; std::getline(f, line);) {
    if (line.compare(0, head.size(), head) != 0) continue;
    const std::size_t end = line.find("` |", 3);
    const std::string name = end == std::string::npos ? "" : line.substr(3, end - 3);
    if (!name.empty() && name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == std::string::npos)
      documented.insert(name);
  }
  std::set<std::string> known;
  for (const auto& v : gradsync::known_env_vars()) known.insert(v.name);
  CHECK(documented == known);
}

TEST_CASE("a launcher that started more processes than MPI_COMM_WORLD holds is a warning, once") {
  // The pure rule: each launcher's count against the world.
  const auto env = [](const char* slurm, const char* pmi, const char* ompi) {
    return [=](const char* n) -> const char* {
      const std::string s = n;
      return s == "SLURM_STEP_NUM_TASKS" ? slurm : s == "PMI_SIZE" ? pmi : s == "OMPI_COMM_WORLD_SIZE" ? ompi : nullptr;
    };
  };
  CHECK(gradsync::impl::launcher_size_warning(env(nullptr, nullptr, nullptr), 1).empty());
  CHECK(gradsync::impl::launcher_size_warning(env("4", "4", "4"), 4).empty());
  CHECK(gradsync::impl::launcher_size_warning(env("2", nullptr, nullptr), 4).empty());  // mpirun inside a step
  const std::string srun = gradsync::impl::launcher_size_warning(env("4", nullptr, nullptr), 1);
  CHECK(gradsync_test::has(srun, "srun started 4 processes (SLURM_STEP_NUM_TASKS=4) but MPI_COMM_WORLD holds 1"));
  CHECK(gradsync_test::has(gradsync::impl::launcher_size_warning(env(nullptr, "3", nullptr), 1), "PMI_SIZE=3"));
  CHECK(gradsync_test::has(gradsync::impl::launcher_size_warning(env(nullptr, nullptr, "2"), 1),
                           "Open MPI's mpirun started 2"));
  // In a sync: rank 0 says it at the first plan build, once per process; the others say nothing.
  ScopedEnv pmi("PMI_SIZE", "64");
  gradsync::impl::launcher_size_warned() = false;
  const std::string err = capture_stderr([] {
    one_sync();
    one_sync();
  });
  const bool want = world_rank() == 0;
  CAPTURE(err);
  GRADSYNC_CHECK_ALL(want ? lines_of(err).size() == 1 && gradsync_test::has(err,
                                                                            "started 64 processes (PMI_SIZE=64) but "
                                                                            "MPI_COMM_WORLD holds " +
                                                                                std::to_string(world_size()))
                          : err.empty());
}
