// gradsync internals: a launcher that started more processes than MPI_COMM_WORLD holds.
//
// srun with a PMI the MPI library cannot use (MPICH under --mpi=pmix), or the mpirun of another MPI
// than the program's, starts n processes that never meet: each is a 1-rank job, every sync
// "succeeds" with n = 1, and nothing fails. The launchers say how many they started; more than
// MPI_COMM_WORLD holds is worth one warning per process, before the first sync's plan.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../error.hpp"

namespace gradsync::impl {

// The warning for a world of `world` processes, given the environment (`get`, as std::getenv), or
// "" when no launcher says it started more.
template <class Get>
std::string launcher_size_warning(Get&& get, int world) {
  struct Source {
    const char* var;
    const char* launcher;
  };
  // Slurm's step size (srun), the PMI size (MPICH's Hydra, srun --mpi=pmi2), Open MPI's mpirun.
  const Source sources[] = {{"SLURM_STEP_NUM_TASKS", "srun"},
                            {"PMI_SIZE", "the PMI launcher (Hydra's mpiexec, srun --mpi=pmi2)"},
                            {"OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"}};
  for (const Source& s : sources) {
    const char* v = get(s.var);
    const long n = v && *v ? std::strtol(v, nullptr, 10) : 0;
    if (n > world)
      return cat("gradsync: warning: ", s.launcher, " started ", n, " processes (", s.var, "=", v,
                 ") but MPI_COMM_WORLD holds ", world,
                 ": they did not meet and each trains alone. The launcher must belong to the MPI this program "
                 "was built with (Slurm: srun --mpi=pmix for Open MPI, --mpi=pmi2 for MPICH)");
  }
  return {};
}

// Once per process (tests reset it).
inline bool& launcher_size_warned() {
  static bool warned = false;
  return warned;
}

// At the first plan build of any GradientSync, on MPI_COMM_WORLD's rank 0 (each of the lone
// processes is one).
inline void warn_launcher_size_once() {
  if (launcher_size_warned()) return;
  launcher_size_warned() = true;
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (!up || down) return;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  const std::string w = launcher_size_warning([](const char* n) { return std::getenv(n); }, world);
  if (w.empty()) return;
  std::fprintf(stderr, "%s\n", w.c_str());
  std::fflush(stderr);
}

}  // namespace gradsync::impl
