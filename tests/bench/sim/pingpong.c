/* The calibration of tests/bench/sim (docs/SCALING.md): a one-way ping-pong between ranks 0 and 1,
 * 8 B to 64 MiB, each iteration at a new offset of a 512 MiB region so that the data comes from
 * memory (a sync streams 100 MB through it), not from cache; then the cost of one MPI_Test on a
 * pending request. The same source runs on real ranks (mpicc) and simulated ones (smpicc): the
 * platform's bandwidth factors are fitted until the two agree. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void exchange(int rank, char* buf, size_t bytes) {
  if (rank == 0) {
    MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
    MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else if (rank == 1) {
    MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const size_t largest = (size_t)64 << 20, region = (size_t)512 << 20;
  char* big = (char*)malloc(region);
  memset(big, 1, region);
  for (size_t s = 8; s <= largest; s *= s >= ((size_t)1 << 20) ? 2 : 4) {
    const int iterations = s <= 65536 ? 200 : s <= ((size_t)1 << 20) ? 50 : 10;
    exchange(rank, big, s); /* warm-up */
    exchange(rank, big, s);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iterations; ++i) exchange(rank, big + ((size_t)i * s * 2) % (region - largest), s);
    const double one_way = (MPI_Wtime() - t0) / iterations / 2;
    if (rank == 0) printf("PINGPONG %zu bytes %.3f us %.1f MB/s\n", s, one_way * 1e6, (double)s / one_way / 1e6);
  }
  if (rank == 0) { /* MPI_Test on a receive that is not there yet */
    MPI_Request q;
    int flag = 0;
    MPI_Irecv(big, 8, MPI_BYTE, 1, 7, MPI_COMM_WORLD, &q);
    const int n = 200000;
    const double t0 = MPI_Wtime();
    for (int i = 0; i < n; ++i) MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
    printf("TEST %.3f us per MPI_Test (pending)\n", (MPI_Wtime() - t0) / n * 1e6);
    MPI_Send(big, 1, MPI_BYTE, 1, 8, MPI_COMM_WORLD);
    MPI_Wait(&q, MPI_STATUS_IGNORE);
  } else if (rank == 1) {
    MPI_Recv(big, 1, MPI_BYTE, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(big, 8, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
  }
  free(big);
  MPI_Finalize();
  return 0;
}
