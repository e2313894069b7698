// gradsync internals: the notice communicator of a group of processes, for GONE notices.
//
// A sync that ends between steps tells its peers on a communicator that outlives it: its own side
// channel is freed with it, and MPI may give that context to the next communicator created; a
// notice still in flight on the freed one then reaches the new one with a message sequence number
// of the old, and Open MPI's matching waits forever for the new one's own first message (a sync
// built after another's end hung in its arrival check, 1 run in 3 at 3 ranks). So each group of
// processes (its ranks in MPI_COMM_WORLD) gets one duplicate, made by its first MpiBackend (whose
// construction is a blocking collective over the group, so every rank makes it at the same point,
// whatever later constructions of a GradientSync do) and kept until the process ends.
#pragma once

#include <mpi.h>

#include <map>
#include <mutex>
#include <numeric>
#include <vector>

namespace gradsync::impl {

// The ranks of `comm` as ranks of MPI_COMM_WORLD.
inline std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> ranks(static_cast<std::size_t>(n)), in_world(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Group_translate_ranks(group, n, ranks.data(), world, in_world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return in_world;
}

// The group's notice communicator, made now (collective over `comm`: MPI_Comm_dup) if this is the
// group's first call. MPI_COMM_NULL for one process (nobody to tell).
inline MPI_Comm group_notice_comm(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) return MPI_COMM_NULL;
  const std::vector<int> key = world_ranks_of(comm);
  static std::mutex m;
  static auto* comms = new std::map<std::vector<int>, MPI_Comm>();  // leaked: used until exit
  std::lock_guard<std::mutex> lock(m);
  auto it = comms->find(key);
  if (it != comms->end()) return it->second;
  MPI_Comm dup = MPI_COMM_NULL;
  if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS) return MPI_COMM_NULL;
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  comms->emplace(key, dup);
  return dup;
}

}  // namespace gradsync::impl
