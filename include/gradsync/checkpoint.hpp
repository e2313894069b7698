// gradsync: checkpoint and restart of a hybrid model in one parallel HDF5 file.
//
// Optional: include it (gradsync.hpp includes it only where GradSync::hdf5 is linked) and link
// GradSync::hdf5, which brings a parallel HDF5 (Debian: libhdf5-openmpi-dev):
//   find_package(GradSync CONFIG REQUIRED COMPONENTS hdf5)
//   target_link_libraries(app PRIVATE GradSync::hdf5)
//
//   gradsync::save_checkpoint(dopt, "run.h5");         // collective: parameters and optimizer state
//   ...                                                // a new job, the same model registered again
//   gradsync::load_checkpoint(dopt, "run.h5");         // on as many ranks or another count
//   gradsync::save_checkpoint(sync, "run.h5", state);  // a program that updates parameters itself
//
// The file holds the data-parallel parameters and their optimizer state once (rank 0's copy), every
// local parameter under its registered name (a process set's replicas once), each row-sharded table
// whole, at its rows, the program's own state (CheckpointState), gradsync's version, the rank count
// and a format version; docs/CHECKPOINT.md shows the layout. It is written under `path + ".partial"`
// and renamed to `path` after its completion record: a job killed while writing leaves no file that
// loads. Each dataset carries a checksum (FNV-1a over its 64-bit words in 4 lanes; a sharded
// table's: the sum of its rows'), verified on load.
//
// This file holds the entry points; the parts live beside it: checkpoint_state.hpp (the public
// types), impl/checkpoint_job.hpp (a rank's items), impl/checkpoint_catalog.hpp (what every rank
// knows of the file), impl/checkpoint_save.hpp and impl/checkpoint_load.hpp (the file's writing and
// reading), impl/checkpoint_values.hpp and impl/checkpoint_hdf5.hpp (values and HDF5 pieces).
#pragma once

#if !defined(GRADSYNC_HAVE_HDF5)
#error \
    "gradsync/checkpoint.hpp needs parallel HDF5: link GradSync::hdf5 (find_package(GradSync COMPONENTS hdf5)); this gradsync was configured without it or the target is not linked"
#endif

#include <hdf5.h>
#include <mpi.h>

#if !defined(H5_HAVE_PARALLEL)
#error \
    "gradsync/checkpoint.hpp: this hdf5.h is a serial HDF5; checkpoints are written with MPI-IO and need a parallel HDF5 (Debian: libhdf5-openmpi-dev)"
#endif

#include <string>
#include <type_traits>

#include "checkpoint_state.hpp"
#include "distributed_optimizer.hpp"
#include "gradient_sync.hpp"
#include "impl/checkpoint_catalog.hpp"
#include "impl/checkpoint_job.hpp"
#include "impl/checkpoint_load.hpp"
#include "impl/checkpoint_save.hpp"
#include "impl/sync_access.hpp"

namespace gradsync {
namespace impl {

// A save or load, under the sync's stall watchdog: every collective of it (the agreement on the
// file, the catalog, the checksums, each agreement on a failure) is nonblocking and waited like the
// step's, so a rank that skips the call is named by the others at the deadline (StallError)
// instead of hanging them, and a peer's failure stops every rank at once; either fails the sync,
// as in any helper's collective (build a new one). A refusal the ranks agreed on (CheckpointError,
// the same on every rank) leaves the sync usable. HDF5's own collectives (the file's creation, its
// metadata, its close) cannot be watched: they start only after every rank agreed to go on, and
// no rank leaves them early.
template <class S, class Items>
void run_checkpoint(S& sync, bool save, const std::string& path, Items&& items) {
  const char* call = save ? "save_checkpoint" : "load_checkpoint";
  std::string refused;
  SyncAccess::collective(sync, save ? "save_checkpoint()" : "load_checkpoint()",
                         save ? "collectives of save_checkpoint()" : "collectives of load_checkpoint()",
                         [&](const auto& watched) {
                           const CkptComm<std::decay_t<decltype(watched)>> comm(watched);
                           try {
                             CkptJob job = checkpoint_job(sync, comm, call, path);
                             Kokkos::fence();  // pending kernels may still write parameters or state
                             items(job, comm);
                             if (save) {
                               save_job(job, comm, path);
                             } else {
                               load_job(job, comm, path);
                               for (auto& f : job.after_load) f();
                             }
                           } catch (const CheckpointError& e) {  // agreed: thrown alike on every rank
                             refused = e.what();
                           }
                         });
  if (!refused.empty()) throw CheckpointError(refused.rfind("gradsync: ", 0) == 0 ? refused.substr(10) : refused);
}

}  // namespace impl

/// Writes the optimizer's parameters and optimizer state, and `state`'s entries, to the parallel
/// HDF5 file `path`: the data-parallel ones once (rank 0's copy), every local one under its
/// registered name (unique across ranks, or held alike by the ranks of a process set: written by
/// the lowest), each row shard (CheckpointState::shard) at its rows of its table, with gradsync's
/// version, the rank count and the format version (docs/CHECKPOINT.md). Written as
/// `path + ".partial"`, renamed to `path` once complete; an existing `path` is replaced. Collective
/// over the sync's ranks (an MpiBackend's communicator); between steps, and not in the middle of an
/// aggregation cycle (gradients are not saved). Throws CheckpointError on every rank, with the same
/// message, when any rank fails; then `path` is untouched.
/// A sharded optimizer (Options::shard) writes the same file as an unsharded one would: each
/// parameter's state whole, summed from the ranks' slices (docs/SHARDING.md).
template <class Optimizer, class Sync>
void save_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path,
                     const CheckpointState& state = {}) {
  impl::CheckpointAccess::make_shards(dopt);
  impl::run_checkpoint(dopt.sync(), true, path,
                       [&](impl::CkptJob& job, const auto& comm) { impl::add_items_of(job, dopt, state, comm); });
}

/// The same for a program that updates its parameters itself: `state` names them
/// (CheckpointState::parameter, each under the name its gradient has in `sync`) and the program's
/// own state.
template <class Backend, class Tensor>
void save_checkpoint(GradientSync<Backend, Tensor>& sync, const std::string& path, const CheckpointState& state) {
  impl::run_checkpoint(sync, true, path,
                       [&](impl::CkptJob& job, const auto&) { impl::add_items_of(job, sync, state); });
}

/// Reads a checkpoint written by save_checkpoint() into the optimizer's parameters and optimizer
/// state, and `state`'s entries: each data-parallel one on every rank, each local one on the ranks
/// that register its name now, each row shard from its rows of its table. At the writer's rank
/// count the training continues bit for bit; at another, every name must still be held by some
/// rank and each table's shards must cover it. Collective over the sync's ranks; between steps.
/// All or nothing: a file that is missing, truncated, foreign, of an unknown format version or
/// incomplete, a parameter the file lacks or holds with another size, group, table shape or
/// optimizer state, a dataset whose checksum differs, a file of another model: CheckpointError on
/// every rank, with the same message naming the tensor, its group and the rank that found it, and
/// nothing was loaded anywhere. A sharded optimizer reads each parameter's whole state and keeps
/// its slices, whatever the rank count and shard setting of the save.
template <class Optimizer, class Sync>
void load_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path,
                     const CheckpointState& state = {}) {
  impl::CheckpointAccess::make_shards(dopt);
  impl::run_checkpoint(dopt.sync(), false, path,
                       [&](impl::CkptJob& job, const auto& comm) { impl::add_items_of(job, dopt, state, comm); });
}

/// The same for a program that updates its parameters itself (see save_checkpoint()).
template <class Backend, class Tensor>
void load_checkpoint(GradientSync<Backend, Tensor>& sync, const std::string& path, const CheckpointState& state) {
  impl::run_checkpoint(sync, false, path,
                       [&](impl::CkptJob& job, const auto&) { impl::add_items_of(job, sync, state); });
}

}  // namespace gradsync
