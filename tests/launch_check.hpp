// The world size a test was launched for (GSYNC_TEST_RANKS, set by gradsync_add_mpi_test; not a
// GRADSYNC_ name, which the library would warn about as an unknown variable of its own)
// against MPI's: a launcher of another MPI than the program's starts N separate 1-rank processes,
// and a multi-rank test must fail then rather than pass with ranks that never met.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace gradsync_test {

// False (after saying why on stderr) when MPI's world size is not the one the test was launched for.
inline bool launched_world_size_ok() {
  const char* want = std::getenv("GSYNC_TEST_RANKS");
  if (!want || !*want) return true;  // run by hand: nothing to compare
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (std::atoi(want) == size) return true;
  std::fprintf(stderr,
               "gradsync test: launched for %s ranks (GSYNC_TEST_RANKS) but MPI_COMM_WORLD has %d (rank %d): "
               "the launcher belongs to another MPI than the one this program was built with, or it started "
               "separate processes\n",
               want, size, rank);
  return false;
}

}  // namespace gradsync_test
