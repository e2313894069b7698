// gradsync internals: the limits tests lower to reach rare paths on small data (the count one MPI
// call takes, the largest fused chunk, which ranks count as a node). In a program they are
// constants; a test program defines GRADSYNC_TEST_HOOKS (tests/CMakeLists.txt does, for the few that
// lower them: gradsync_test_program's HOOKS) and they become variables it may set, alike on every
// rank. Define it in every translation unit of a program or in none.
#pragma once

#include <climits>
#include <cstddef>

namespace gradsync::impl {

#ifdef GRADSYNC_TEST_HOOKS
// Largest element count handed to one MPI call; larger buffers are split.
inline std::size_t& mpi_max_count() {
  static std::size_t n = std::size_t(INT_MAX);
  return n;
}
// Largest element count of one fused chunk, whatever the threshold.
inline std::size_t& max_chunk_elements() {
  static std::size_t n = std::size_t(INT_MAX);
  return n;
}
// Ranks per node as MpiBackend sees them: 0 asks MPI which ranks share memory; k > 0 puts ranks r
// with the same r / k on one "node", so one machine can stand for several. Read when a backend is built.
inline int& mpi_ranks_per_node_override() {
  static int k = 0;
  return k;
}
// Seconds a watched wait (impl::Control) goes on listening to the side channel after its
// collective completed on this rank: makes a peer's notice arrive first, a race otherwise rare.
inline double& completed_wait_delay_s() {
  static double s = 0;
  return s;
}
#else
// One MPI call takes an int count; one fused chunk is one backend call.
constexpr std::size_t mpi_max_count() { return std::size_t(INT_MAX); }
constexpr std::size_t max_chunk_elements() { return std::size_t(INT_MAX); }
// MPI tells which ranks share memory.
constexpr int mpi_ranks_per_node_override() { return 0; }
constexpr double completed_wait_delay_s() { return 0; }
#endif

}  // namespace gradsync::impl
