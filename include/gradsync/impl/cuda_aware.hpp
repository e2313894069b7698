// gradsync internals: which memory an MPI library can be handed, and whether it is CUDA-aware.
//
// A CUDA-aware MPI reads and writes device pointers itself; any other MPI must only ever see host
// memory, so GradientSync stages device chunks through a host mirror. MPIs report their CUDA support
// at compile time (MPIX_CUDA_AWARE_SUPPORT in Open MPI's and MVAPICH2's mpi-ext.h) and at run time
// (MPIX_Query_cuda_support(), MPICH's MPIX_GPU_query_support()); both are wrong often enough (an MPI
// built with CUDA but run without its CUDA transport, a wrapper hiding mpi-ext.h) that the answer can
// be overridden by the program and by the environment variable GRADSYNC_CUDA_AWARE_MPI=0/1.
#pragma once

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "../config.hpp"
#include "../error.hpp"
#include "memory_access.hpp"

namespace gradsync {

/// Whether MpiBackend may hand CUDA device memory to MPI.
enum class CudaAwareMpi {
  detect,  ///< GRADSYNC_CUDA_AWARE_MPI if set, else what the MPI library reports, else no
  yes,     ///< the MPI is CUDA-aware, whatever it reports
  no,      ///< never hand device memory to MPI (stage through host)
};

namespace impl {

/// What the MPI library says about itself: 1 yes, 0 no, -1 it does not say.
struct CudaAwareProbe {
  int compile_time = -1;  ///< MPIX_CUDA_AWARE_SUPPORT
  int run_time = -1;      ///< MPIX_Query_cuda_support() / MPIX_GPU_query_support(CUDA)
};

/// Asks the MPI library in use. The run-time query needs MPI to be initialized.
inline CudaAwareProbe probe_cuda_aware_mpi() {
  CudaAwareProbe p;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  p.compile_time = 1;
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  p.compile_time = 0;
#endif
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  p.run_time = MPIX_Query_cuda_support() ? 1 : 0;
#elif defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000300
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS) p.run_time = supported ? 1 : 0;
#endif
  return p;
}

/// The value of a 0/1 switch from the environment: -1 when unset or empty, else 0 or 1.
/// Anything else is a ConfigError that names the variable and the value.
inline int parse_switch(const char* name, const char* value) {
  if (value == nullptr || value[0] == '\0') return -1;
  if (std::strcmp(value, "0") == 0) return 0;
  if (std::strcmp(value, "1") == 0) return 1;
  throw ConfigError(cat(name, "='", value, "' is malformed: use 1 (CUDA-aware) or 0 (stage through host)"));
}

inline const char* cuda_aware_env_name() { return "GRADSYNC_CUDA_AWARE_MPI"; }

/// The decision and what made it (for logs and error messages).
struct CudaAwareDecision {
  bool aware = false;
  const char* source = "default";
};

/// The program's choice, else the environment's, else the run-time query, else the compile-time
/// macro, else no. A pure function of its inputs, so it is tested without a GPU.
inline CudaAwareDecision decide_cuda_aware_mpi(CudaAwareMpi requested, const char* env_value, CudaAwareProbe probe) {
  switch (requested) {
    case CudaAwareMpi::yes:
      return {true, "requested by the program"};
    case CudaAwareMpi::no:
      return {false, "requested by the program"};
    case CudaAwareMpi::detect:
      break;
  }
  const int env = parse_switch(cuda_aware_env_name(), env_value);
  if (env >= 0) return {env == 1, "GRADSYNC_CUDA_AWARE_MPI"};
  if (probe.run_time >= 0) return {probe.run_time == 1, "the MPI library's run-time query"};
  if (probe.compile_time >= 0) return {probe.compile_time == 1, "MPIX_CUDA_AWARE_SUPPORT"};
  return {false, "default (the MPI library does not say)"};
}

inline CudaAwareDecision detect_cuda_aware_mpi(CudaAwareMpi requested) {
  if (requested != CudaAwareMpi::detect) return decide_cuda_aware_mpi(requested, nullptr, {});
  return decide_cuda_aware_mpi(requested, std::getenv(cuda_aware_env_name()), probe_cuda_aware_mpi());
}

}  // namespace impl
}  // namespace gradsync
