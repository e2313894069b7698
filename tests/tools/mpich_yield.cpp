// Yield when idle for MPICH, in the tests only: preloaded (LD_PRELOAD) into the test programs that
// an MPICH build launches (cmake/GradSyncWarnings.cmake), it runs each blocking call that gradsync
// and its tests make as its nonblocking form, tested with a sched_yield() between fruitless tests.
// MPICH 4's blocking calls poll without ever yielding (ch4: no setting does; MPIR_CVAR_POLLS_BEFORE_YIELD
// is ch3's), so with more ranks than cores each one waited out time slices: an 8-byte MPI_Allreduce
// on 3 ranks, 2 cores, took 1-6 ms (Open MPI with mpi_yield_when_idle: 6 us). It is what Open MPI's
// mpi_yield_when_idle does inside its progress loop, done from outside through the PMPI interface.
// Same results (the MPI standard's nonblocking forms); gradsync's own waits yield by themselves
// (Tuning::spin_before_yield). Not for production: on cores of their own, spinning answers sooner.
#include <mpi.h>
#include <sched.h>

namespace {

int wait_yielding(MPI_Request* r, MPI_Status* status) {
  for (;;) {
    int done = 0;
    const int rc = PMPI_Test(r, &done, status);
    if (rc != MPI_SUCCESS || done) return rc;
    sched_yield();
  }
}

int finish(int rc, MPI_Request* r) { return rc != MPI_SUCCESS ? rc : wait_yielding(r, MPI_STATUS_IGNORE); }

}  // namespace

extern "C" {

int MPI_Wait(MPI_Request* r, MPI_Status* status) { return wait_yielding(r, status); }

int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Iallreduce(s, r, n, t, op, c, &q), &q);
}

int MPI_Reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Ireduce(s, r, n, t, op, root, c, &q), &q);
}

int MPI_Barrier(MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Ibarrier(c, &q), &q);
}

int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Ibcast(b, n, t, root, c, &q), &q);
}

int MPI_Allgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Iallgather(s, sn, st, r, rn, rt, c, &q), &q);
}

int MPI_Allgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int* rn, const int* displs, MPI_Datatype rt,
                   MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Iallgatherv(s, sn, st, r, rn, displs, rt, c, &q), &q);
}

int MPI_Gather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, int root, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Igather(s, sn, st, r, rn, rt, root, c, &q), &q);
}

int MPI_Alltoall(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c) {
  MPI_Request q;
  return finish(PMPI_Ialltoall(s, sn, st, r, rn, rt, c, &q), &q);
}

int MPI_Recv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status* status) {
  MPI_Request q;
  const int rc = PMPI_Irecv(b, n, t, src, tag, c, &q);
  return rc != MPI_SUCCESS ? rc : wait_yielding(&q, status);
}

}  // extern "C"
