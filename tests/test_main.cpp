// The MPI-aware doctest main of every gradsync test program.
//
// Every rank runs every test. Rank 0 prints the full report; other ranks print only their
// failures. The exit status is agreed with one allreduce, so a failure on any rank fails the run
// on all of them and no rank is left waiting in a collective. A run whose world size is not the
// one ctest launched it for fails at once (launch_check.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "launch_check.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!gradsync_test::launched_world_size_ok()) {
    MPI_Finalize();
    return 2;
  }
  int result = 0;
  Kokkos::initialize(argc, argv);
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
  Kokkos::finalize();
  int any = result != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
