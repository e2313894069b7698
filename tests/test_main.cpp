// The MPI-aware doctest main of every gradsync test program.
//
// Every rank runs every test. Rank 0 prints the full report; other ranks print only their
// failures. The exit status is agreed with one allreduce, so a failure on any rank fails the run
// on all of them and no rank is left waiting in a collective. A run whose world size is not the
// one ctest launched it for fails at once (launch_check.hpp). Every test case's Kokkos deep copies,
// launches and allocations are counted (kokkos_counts.hpp): one over its device-time budget fails.
// A case that cannot run at this world size says so (GRADSYNC_SKIP_BELOW_RANKS): it is listed as
// skipped with its reason, and a program in which no selected case ran exits 77, which ctest counts
// as skipped (gradsync_add_mpi_test sets SKIP_RETURN_CODE 77), not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kokkos_counts.hpp"
#include "launch_check.hpp"

namespace {

// A test case may spend this much estimated device time on a GPU build (KokkosCounts::device_seconds):
// a tenth of the usual 120 s ctest timeout; the whole program five times that.
// GSYNC_TEST_KOKKOS_BUDGET_S sets the case budget (the test of this check lowers it).
double case_budget_s() {
  const char* s = std::getenv("GSYNC_TEST_KOKKOS_BUDGET_S");
  return s && *s ? std::atof(s) : 12.0;
}

struct CaseCounts {
  const char* name;
  gradsync_test::KokkosCounts counts;
};
std::vector<CaseCounts> g_cases;

// Records each test case's counts (subcases included: doctest ends a case once, after its reruns).
struct KokkosCountsListener : doctest::IReporter {
  explicit KokkosCountsListener(const doctest::ContextOptions&) {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    name_ = tc.m_name;
    start_ = gradsync_test::kokkos_counts();
  }
  void test_case_end(const doctest::CurrentTestCaseStats&) override {
    g_cases.push_back({name_, gradsync_test::kokkos_counts() - start_});
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

  const char* name_ = "";
  gradsync_test::KokkosCounts start_;
};
REGISTER_LISTENER("gradsync_kokkos_counts", 1, KokkosCountsListener);

// What gradsync_test::skip_case recorded: a whole case, or one subcase of a case that ran.
struct Skipped {
  std::string where, why;
  bool whole_case;
};
std::vector<Skipped> g_skipped;
std::string g_case;
std::vector<std::string> g_subcases;  // the subcases the running case is inside, outermost first
bool g_case_skipped = false;
unsigned g_cases_started = 0, g_cases_skipped = 0;

// Follows the running case and subcase for skip_case, and counts the cases skipped whole.
struct SkipListener : doctest::IReporter {
  explicit SkipListener(const doctest::ContextOptions&) {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    g_case = tc.m_name;
    g_subcases.clear();
    g_case_skipped = false;
    ++g_cases_started;
  }
  void test_case_reenter(const doctest::TestCaseData&) override { g_subcases.clear(); }
  void subcase_start(const doctest::SubcaseSignature& s) override { g_subcases.push_back(s.m_name.c_str()); }
  void subcase_end() override {
    if (!g_subcases.empty()) g_subcases.pop_back();
  }
  void test_case_end(const doctest::CurrentTestCaseStats&) override {
    if (g_case_skipped) ++g_cases_skipped;
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("gradsync_skips", 2, SkipListener);

// Rank 0 lists what was skipped: doctest's own summary above counts a skipped case as passed.
void report_skipped(int rank, int size) {
  if (rank != 0 || g_skipped.empty()) return;
  std::fprintf(stdout,
               "[gradsync] at %d rank(s): %u of %u test cases ran, %u skipped whole, %u in part (doctest's "
               "summary above counts them as passed)\n",
               size, g_cases_started - g_cases_skipped, g_cases_started, g_cases_skipped,
               unsigned(g_skipped.size()) - g_cases_skipped);
  for (const Skipped& s : g_skipped)
    std::fprintf(stdout, "[gradsync] skipped%s: \"%s\": %s\n", s.whole_case ? "" : " in part", s.where.c_str(),
                 s.why.c_str());
  std::fflush(stdout);
}

// False when a test case or the program is over its budget (said on every rank: the counts may
// differ; on stdout, where doctest reports its failures). GSYNC_TEST_KOKKOS_COUNTS=1 prints every case's counts on rank
// 0.
bool kokkos_counts_within_budget(int rank) {
  if (!gradsync_test::kokkos_counting()) return true;
  const char* show = std::getenv("GSYNC_TEST_KOKKOS_COUNTS");
  const bool print = rank == 0 && show && *show && *show != '0';
  bool ok = true;
  const double case_budget = case_budget_s(), program_budget = 5 * case_budget;
  gradsync_test::KokkosCounts total;
  for (const CaseCounts& c : g_cases) {
    const auto& k = c.counts;
    total = total + k;
    const bool over = k.device_seconds() > case_budget;
    if (print || over)
      std::fprintf(stdout,
                   "%skokkos counts, rank %d: %ld deep copies (%ld of one value), %ld launches, %ld allocations: "
                   "~%.2f s on a GPU build: %s\n",
                   over ? "gradsync test: over budget: " : "", rank, k.deep_copies, k.small_copies, k.launches,
                   k.allocations, k.device_seconds(), c.name);
    ok = ok && !over;
  }
  const bool over = total.device_seconds() > program_budget;
  if (print || over)
    std::fprintf(stdout,
                 "%skokkos counts, rank %d, whole program: %ld deep copies (%ld of one value), %ld launches, %ld "
                 "allocations: ~%.2f s on a GPU build (budget %.3g s per case, %.3g s in all)\n",
                 over ? "gradsync test: over budget: " : "", rank, total.deep_copies, total.small_copies,
                 total.launches, total.allocations, total.device_seconds(), case_budget, program_budget);
  if (!ok || over)
    std::fprintf(stdout,
                 "gradsync test: a GPU build would run past the timeout: read and write Views through one host "
                 "mirror per View (tests/gradsync_test.hpp: host_copy, host_mirror, upload), not value by value\n");
  return ok && !over;
}

}  // namespace

// Declared in gradsync_test.hpp, which this file does not include: the main includes no gradsync
// header, so that programs built with and without the test hooks share it.
namespace gradsync_test {
namespace {
void record_skip(int ranks, const char* why) {
  std::string where = g_case;
  for (const std::string& sub : g_subcases) where += " / " + sub;
  for (const Skipped& s : g_skipped)
    if (s.where == where) return;  // a case with subcases is run once per subcase
  g_skipped.push_back({where, "needs " + std::to_string(ranks) + " ranks: " + why, g_subcases.empty()});
  if (g_subcases.empty()) g_case_skipped = true;
}
}  // namespace

void skip_case(int ranks, const char* why) {
  // Its return would end doctest's pass through the case, so the subcases after this one would
  // never run (nor be reported): a misuse that would hide cases, failed as such.
  if (!g_subcases.empty())
    FAIL_CHECK(
        "GRADSYNC_SKIP_BELOW_RANKS inside a SUBCASE hides the subcases after it: use "
        "GRADSYNC_SUBCASE_FROM_RANKS");
  record_skip(ranks, why);
}

bool subcase_runs(int ranks, const char* why) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n >= ranks) return true;
  record_skip(ranks, why);
  return false;
}
}  // namespace gradsync_test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!gradsync_test::launched_world_size_ok()) {
    MPI_Finalize();
    return 2;
  }
  int result = 0;
  gradsync_test::prepare_kokkos_counting();
  Kokkos::initialize(argc, argv);
  gradsync_test::start_kokkos_counting();
  {
    doctest::Context ctx(argc, argv);
    if (rank != 0) ctx.setOption("minimal", true);
    result = ctx.run();
    if (ctx.shouldExit()) {
      Kokkos::finalize();
      MPI_Finalize();
      return result;
    }
  }
  if (!kokkos_counts_within_budget(rank)) result = 1;
  Kokkos::finalize();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  report_skipped(rank, size);
  // Skips depend on the world size only, so every rank finds the same; agreed anyway, like a failure.
  int flags[2] = {result != 0 ? 1 : 0, g_cases_started > 0 && g_cases_skipped == g_cases_started ? 0 : 1};
  MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (flags[0]) return 1;
  if (!flags[1]) {
    if (rank == 0) std::fprintf(stdout, "[gradsync] nothing ran at %d rank(s): exit 77, skipped\n", size);
    return 77;
  }
  return 0;
}
