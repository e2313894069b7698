// gradsync: a program's own exchanges under a sync's stall watchdog.
//
// A hybrid program exchanges more than gradients: an embedding all-to-all, a halo exchange. Left to
// plain blocking MPI, one stopped or failed rank hangs every other one there forever, out of reach
// of the sync's deadline. gradsync::wait_all waits for the program's own MPI requests as the sync
// waits for its collectives: past Options::stall_timeout the ranks that have not arrived at the same
// exchange are named and a StallError thrown (or the job aborted, Options::tuning.stall_action), a
// peer whose sync failed or was unwound by an error ends the wait at once, and a stall here fails
// the sync like one of its own (its peers are told). gradsync::alltoallv is MPI_Alltoallv so waited.
#pragma once

#include <mpi.h>

#include "error.hpp"
#include "impl/sync_access.hpp"
#include "mpi_backend.hpp"

namespace gradsync {

/// Waits for `count` MPI requests the program started (on any communicator) under `sync`'s stall
/// watchdog; `what` (a string literal: "halo exchange") names the exchange in reports. Collective in
/// the program's own sense: the peers of the exchange call it for their side of it; a rank that does
/// not is named at the deadline. Legal in every state of the sync but failed (also while a step is
/// open: an exchange during backward); a StallError or a peer's failure leaves the sync failed, and
/// the requests still pending: their buffers must outlive them (the job is typically ended).
/// Allocates nothing.
template <class Sync>
void wait_all(Sync& sync, int count, MPI_Request* requests, const char* what) {
  impl::SyncAccess::watch_program(sync, what, [&] {
    int done = 0;
    impl::mpi_check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    return done != 0;
  });
}

/// MPI_Alltoallv over `comm` (any communicator of the program's), waited with wait_all(). The counts
/// and displacements are in elements of T (float, double, int, std::int64_t, ...).
template <class Sync, class T>
void alltoallv(Sync& sync, const T* send, const int* send_counts, const int* send_displs, T* recv,
               const int* recv_counts, const int* recv_displs, MPI_Comm comm, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  impl::mpi_check(MPI_Ialltoallv(send, send_counts, send_displs, impl::mpi_type<T>(), recv, recv_counts, recv_displs,
                                 impl::mpi_type<T>(), comm, &r),
                  "MPI_Ialltoallv");
  wait_all(sync, 1, &r, what);
}

}  // namespace gradsync
