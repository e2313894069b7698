// The doctest main of the CUDA test programs: test_main.cpp's MPI-aware main, plus
// --skip-without-gpu: on a machine without a CUDA device every rank exits with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), instead of passing without having run anything.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_test_util.hpp"
#include "launch_check.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!gradsync_test::launched_world_size_ok()) {
    MPI_Finalize();
    return 2;
  }
  std::vector<char*> args;
  bool skip_without_gpu = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--skip-without-gpu") == 0)
      skip_without_gpu = true;
    else
      args.push_back(argv[i]);
  }
  int nargs = int(args.size());
  const auto& gpu = gradsync_test::gpu_setup();
  if (skip_without_gpu && gpu.devices == 0) {
    if (rank == 0) std::printf("skipped: %s\n", gpu.why.c_str());
    MPI_Finalize();
    return 77;
  }
  int result = 0;
  Kokkos::initialize(nargs, args.data());
  {
    doctest::Context ctx(nargs, args.data());
    if (rank != 0) ctx.setOption("minimal", true);
    result = ctx.run();
  }
  Kokkos::finalize();
  int any = result != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
