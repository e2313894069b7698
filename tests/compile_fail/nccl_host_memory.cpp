// NCCL reads device memory only: a sync of host tensors over NcclBackend is refused at compile time.
#include <gradsync/gradsync.hpp>
#include <gradsync/nccl_backend.hpp>

int main() {
  using Sync = gradsync::GradientSync<gradsync::NcclBackend, Kokkos::View<float*, Kokkos::HostSpace>>;
  Sync s(gradsync::NcclBackend(MPI_COMM_WORLD));
}
