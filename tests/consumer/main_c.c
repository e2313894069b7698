/* The installed C interface from a C program: one data-parallel buffer averaged over the ranks. */
#include <gradsync/gradsync_c.h>
#include <stdio.h>

int main(int argc, char** argv) {
  int rank = 0, size = 1, ok = 1;
  int32_t done = 0;
  double g[3];
  gradsync_handle h = NULL;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int k = 0; k < 3; ++k) g[k] = rank + k;
  ok = gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, &h) == GRADSYNC_OK &&
       gradsync_add(h, g, 3, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "g") == GRADSYNC_OK &&
       gradsync_synchronize(h, &done) == GRADSYNC_OK && done == 1;
  for (int k = 0; k < 3; ++k) ok = ok && g[k] == (size - 1) / 2.0 + k;
  ok = ok && gradsync_destroy(&h) == GRADSYNC_OK;
  if (!ok) fprintf(stderr, "consumer_c: rank %d failed: %s\n", rank, gradsync_last_error());
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (rank == 0 && ok) printf("consumer_c: ok on %d ranks\n", size);
  MPI_Finalize();
  return ok ? 0 : 1;
}
