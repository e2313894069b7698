/** \file gradsync_c.h
 * gradsync: the C interface (and, through fortran/gradsync_mod.f90, the Fortran one).
 *
 * gradsync itself is a header-only C++ library; these entry points live in one translation unit,
 * src/gradsync_c.cpp, which the optional CMake target GradSync::c compiles into a static library:
 *   find_package(GradSync CONFIG REQUIRED COMPONENTS c)
 *   target_link_libraries(app PRIVATE GradSync::c)
 *
 * Gradients are host memory (float or double arrays the caller owns and keeps at a fixed address
 * while registered). Every call returns a gradsync_status; GRADSYNC_OK is 0. On failure
 * gradsync_last_error() returns the message (per thread). No C++ exception crosses this boundary.
 *
 * Collective calls (create, synchronize) must be made by every rank of the communicator, in the
 * same order; destroy too, on every rank. A rank that fails a local check in gradsync_synchronize
 * (a registration mismatch, a non-finite gradient) makes every rank fail it with the same status:
 * none hangs. After a failed synchronize the handle is failed on every rank: later synchronize and
 * add calls fail at once; destroy it. */
#ifndef GRADSYNC_C_H
#define GRADSYNC_C_H

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Return codes. */
typedef enum gradsync_status {
  GRADSYNC_OK = 0,
  GRADSYNC_ERR_INVALID_HANDLE = 1,   /**< NULL, destroyed or never-created handle */
  GRADSYNC_ERR_INVALID_ARGUMENT = 2, /**< NULL pointer, unknown dtype or kind, negative count, ... */
  GRADSYNC_ERR_MISMATCH = 3,         /**< ranks disagree on the data-parallel registrations or options */
  GRADSYNC_ERR_STALL = 4,            /**< a collective did not complete within the stall timeout */
  GRADSYNC_ERR_CONFIG = 5,           /**< a bad option or GRADSYNC_* environment variable */
  GRADSYNC_ERR_RUNTIME = 6,          /**< any other gradsync error (overlapping buffers, non-finite gradient, MPI) */
  GRADSYNC_ERR_INTERNAL = 7          /**< an unexpected C++ exception (a bug: please report it) */
} gradsync_status;

/** Value type of a registered buffer. */
typedef enum gradsync_dtype { GRADSYNC_FLOAT = 1, GRADSYNC_DOUBLE = 2 } gradsync_dtype;

/** How a buffer is synchronized (see docs/C_FORTRAN.md). */
typedef enum gradsync_kind {
  GRADSYNC_DATA_PARALLEL = 0, /**< averaged (or summed) across ranks */
  GRADSYNC_LOCAL_SCALED = 1,  /**< local to this rank, divided by the world size (a sharded parameter) */
  GRADSYNC_LOCAL = 2          /**< local to this rank, left as is */
} gradsync_kind;

/** Reduction of data-parallel buffers. */
typedef enum gradsync_op { GRADSYNC_AVERAGE = 0, GRADSYNC_SUM = 1 } gradsync_op;

/** Options; gradsync_options_init fills in the C++ defaults. Extend only at the end. */
typedef struct gradsync_options {
  int32_t op;                           /**< gradsync_op; default GRADSYNC_AVERAGE */
  int32_t backward_passes_per_step;     /**< >= 1; default 1 */
  int32_t average_aggregated_gradients; /**< 0 or 1; default 0 */
  int32_t read_environment;             /**< 0 or 1: honour GRADSYNC_* variables; default 1 */
  double prescale_factor;               /**< default 1 */
  double postscale_factor;              /**< default 1 */
} gradsync_options;

/** Cumulative counters (both value types together). */
typedef struct gradsync_stats {
  uint64_t bytes_allreduced; /**< bytes handed to the allreduce */
  uint64_t allreduce_calls;  /**< allreduce calls (one per fused chunk) */
  uint64_t passes;           /**< synchronize calls */
  uint64_t steps;            /**< synchronize calls that completed a step */
} gradsync_stats;

/** Opaque handle. */
typedef struct gradsync_sync* gradsync_handle;

/** Fills `options` with the C++ defaults. Local; allocates nothing. */
int gradsync_options_init(gradsync_options* options);

/** Collective over `comm` (a Fortran or C communicator converted with MPI_Comm_c2f; gradsync works
 *  on a duplicate). `options` may be NULL for the defaults. On success *out is a new handle.
 *  Needs MPI initialized (initializes Kokkos if nobody did); allocates the handle, not the buffers. */
int gradsync_create(MPI_Fint comm, const gradsync_options* options, gradsync_handle* out);

/** Registers `count` values of `dtype` at `data` (host memory, fixed address while registered).
 *  `name` (may be NULL) appears in error messages. Data-parallel buffers must be added in the same
 *  order with the same sizes and types on every rank; local ones may differ from rank to rank.
 *  Local; between steps only (not between the passes of an aggregation cycle). The ranks compare
 *  the registrations at the next synchronize, which rebuilds the plan and its buffers. */
int gradsync_add(gradsync_handle h, void* data, int64_t count, int32_t dtype, int32_t kind, const char* name);

/** Collective. Call after each backward pass; *step_completed (may be NULL) is set to 1 when the
 *  buffers hold synchronized values (every backward_passes_per_step-th call), else 0. Allocates the
 *  fusion buffers at the first call and after registrations change; a steady step allocates
 *  nothing. A failure leaves the handle failed on every rank. */
int gradsync_synchronize(gradsync_handle h, int32_t* step_completed);

/** This rank's cumulative counters. Local; legal at any time, failed handles included. */
int gradsync_get_stats(gradsync_handle h, gradsync_stats* out);

/** World size of the handle's communicator. Local; legal at any time. */
int gradsync_size(gradsync_handle h, int32_t* size);
/** This rank in the handle's communicator. Local; legal at any time. */
int gradsync_rank(gradsync_handle h, int32_t* rank);

/** Frees the handle (its buffers and communicator) and sets *h to NULL. Not collective, but call it
 *  on every rank before MPI_Finalize; legal at any time, failed handles included. */
int gradsync_destroy(gradsync_handle* h);

/** The message of this thread's last failed call ("" if none). Valid until the next failing call.
 *  Local. */
const char* gradsync_last_error(void);

/** A constant string naming a status ("GRADSYNC_ERR_MISMATCH"). */
const char* gradsync_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* GRADSYNC_C_H */
