// Built against an installed gradsync: averages one data-parallel gradient and scales one local
// gradient, and exits non-zero on any rank unless every value is right on every rank.
#include <gradsync/gradsync.hpp>

#include <cstdio>

struct Dense {};
struct Table {};
template <>
struct gradsync::LocalVarPolicy<Table> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  Kokkos::initialize(argc, argv);
  {
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<double*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    const int r = sync.backend().rank(), n = sync.backend().size();
    Kokkos::View<double*> w("w", 100), t("t", 10 + r);
    Kokkos::deep_copy(w, double(r + 1));
    Kokkos::deep_copy(t, double(n));
    sync.add<Dense>(w);
    sync.add<Table>(t);
    const bool stepped = sync.synchronize();
    // Read on the host (the Views are in device memory on a Kokkos build with CUDA).
    const auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
    const auto th = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t);
    bad = !stepped || wh(99) != (n + 1) / 2.0 || th(9) != 1.0 || sync.stats().bytes_allreduced != 100 * sizeof(double);
#if defined(GRADSYNC_HAVE_HDF5)
    {  // GradSync::hdf5: a checkpoint saved and loaded back through the installed headers and library
      gradsync::DistributedOptimizer dopt(
          gradsync::Sgd<Kokkos::View<double*>>(),
          gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<double*>>(gradsync::MpiBackend(MPI_COMM_WORLD)));
      Kokkos::View<double*> p("p", 3), g("g", 3);
      Kokkos::deep_copy(p, 2.5);
      dopt.add<Dense>(p, g, "p");
      gradsync::save_checkpoint(dopt, "consumer_checkpoint.h5");
      Kokkos::deep_copy(p, 0.0);
      gradsync::load_checkpoint(dopt, "consumer_checkpoint.h5");
      const auto ph = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p);
      bad = bad || ph(2) != 2.5;
    }
#endif
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const char* parts = "";
#if defined(GRADSYNC_HAVE_NCCL)
    parts = " (with GradSync::cuda and GradSync::nccl)";
#elif defined(GRADSYNC_HAVE_CUDA)
    parts = " (with GradSync::cuda)";
#endif
#if defined(GRADSYNC_HAVE_HDF5)
    if (!*parts) parts = " (with GradSync::hdf5)";
#endif
    if (r == 0) std::printf("consumer: compiled as C++ %ld against Kokkos %d\n", long(__cplusplus), KOKKOS_VERSION);
    if (r == 0) std::printf("consumer: %s on %d ranks%s\n", bad ? "FAILED" : "ok", n, parts);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return bad;
}
