// gradsync: what the fused sync should know about a backend beyond its collectives.
#pragma once

#include <type_traits>

namespace gradsync {

class MpiBackend;

/// True when a backend's blocking allreduce of a chunk beats its nonblocking one in the sync's
/// pipeline. Open MPI's MPI_Iallreduce (libnbc) advances only inside MPI calls and uses other
/// algorithms than the tuned blocking MPI_Allreduce: measured on 2 ranks, ResNet-50's gradients
/// took 1.7x as long nonblocking (docs/BENCHMARKS.md). Backends that progress on their own (NCCL on
/// a stream) keep the default, false. Options::collectives overrides it.
/// (Backends derived from MpiBackend inherit its choice.)
template <class Backend>
struct prefers_blocking_allreduce : std::is_base_of<MpiBackend, Backend> {};

template <class Backend>
inline constexpr bool prefers_blocking_allreduce_v = prefers_blocking_allreduce<Backend>::value;

}  // namespace gradsync
