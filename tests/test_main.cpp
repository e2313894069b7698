// The MPI-aware doctest main of every gradsync test program.
//
// Every rank runs every test. Rank 0 prints the full report; other ranks print only their
// failures. The exit status is agreed with one allreduce, so a failure on any rank fails the run
// on all of them and no rank is left waiting in a collective. A run whose world size is not the
// one ctest launched it for fails at once (launch_check.hpp). Every test case's Kokkos deep copies,
// launches and allocations are counted (kokkos_counts.hpp): one over its device-time budget fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
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
  int any = result != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
