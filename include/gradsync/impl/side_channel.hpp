// gradsync internals: the side channel's communicator, its id and its reduction.
//
// Each GradientSync over MPI duplicates its backend's communicator into a side channel of its own
// (impl::Control's notices and small agreement collectives run there, never between the chunks'
// sums). Here is what that duplicate needs apart from the waits: an id the ranks agree on without
// talking, storage that survives a duplication still pending when the sync is gone, and the one
// user-defined reduction the agreement rounds use.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "hash.hpp"
#include "notice_comm.hpp"

namespace gradsync::impl {

// The id of a new side channel over `comm`, the same on every rank without communication: the k-th
// side channel over a group of processes (their ranks in MPI_COMM_WORLD) has id hash(group, k).
// Every rank counts alike because a sync's construction completes only once every rank of the
// group has started it (the MPI_Comm_idup), so the ranks build the syncs over one group in the
// same order. Notices carry the id and a side channel ignores (drains) those of another: MPI may
// give a freed side channel's context to a new one (MPICH does), and notices sent on the old one
// that nobody received would otherwise be read by the new sync. (A construction that failed on
// some ranks only leaves their counts apart, as it leaves their collectives.)
inline std::uint64_t next_side_channel_id(MPI_Comm comm) {
  const std::vector<int> in_world = world_ranks_of(comm);
  static std::mutex m;
  static auto* counts = new std::map<std::vector<int>, std::uint64_t>();  // leaked: used until exit
  std::uint64_t k = 0;
  {
    std::lock_guard<std::mutex> lock(m);
    k = ++(*counts)[in_world];
  }
  return fnv1a(&k, sizeof k, fnv1a(in_world.data(), in_world.size() * sizeof(int)));
}

// The reduction of Control::allreduce_min_sum: one element of Min + Sum int64 words, the first Min
// reduced by MIN, the others by SUM. MPI may hand the function several elements at once.
template <int Min, int Sum>
struct MinSumOp {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  MinSumOp() {
    MPI_Type_contiguous(Min + Sum, MPI_INT64_T, &type);
    MPI_Type_commit(&type);
    MPI_Op_create(&combine, 1, &op);
  }
  static void combine(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const std::int64_t*>(in);
    auto* b = static_cast<std::int64_t*>(inout);
    for (int e = 0; e < *len; ++e, a += Min + Sum, b += Min + Sum) {
      for (int i = 0; i < Min; ++i) b[i] = std::min(a[i], b[i]);
      for (int i = Min; i < Min + Sum; ++i) b[i] += a[i];
    }
  }
};

// The side channel's communicator, made by MPI_Comm_idup (the sync's constructor never blocks).
struct SideChannelComm {
  // On the heap: MPI_Comm_idup writes the handle when it completes, possibly after this object
  // is gone (a peer never built its GradientSync); then the handle is leaked, not written late.
  MPI_Comm* comm = new MPI_Comm(MPI_COMM_NULL);
  MPI_Request dup_req = MPI_REQUEST_NULL;
  bool dup_done = false;
  SideChannelComm() = default;
  SideChannelComm(const SideChannelComm&) = delete;
  SideChannelComm& operator=(const SideChannelComm&) = delete;
  ~SideChannelComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!dup_done && dup_req != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&dup_req, &flag, MPI_STATUS_IGNORE);
      if (!flag) return;  // still pending: leak the handle's storage
    }
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
    delete comm;
  }
};

}  // namespace gradsync::impl
