// gradsync quickstart: a hybrid linear model trained on every rank.
//
//   y = w . x + c[rank]     w: shared weights (data-parallel, averaged over ranks)
//                          c: this rank's own correction term (local, never communicated)
//
// Each rank fits its own shard of a global data set with a planted answer. The loss is the global
// mean over all ranks' samples; gradsync averages dL/dw and scales dL/dc by 1/world_size, so both
// are exact gradients of that one global loss.
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

struct Shared {};
struct Correction {};
template <>
struct gradsync::LocalVarPolicy<Correction> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int status = 0;
  {
    // Host memory on purpose: the model below is plain host loops, so the example runs unchanged
    // whatever Kokkos's default (device) memory space is.
    using View = Kokkos::View<double*, Kokkos::HostSpace>;
    gradsync::Options opt;  // average over ranks, 4 MiB fusion chunks
    gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    const int rank = sync.backend().rank(), size = sync.backend().size();
    const int dim = 8, samples = 256, steps = argc > 1 ? std::atoi(argv[1]) : 300;

    View w("w", dim), c("c", 1), gw("grad_w", dim), gc("grad_c", 1);
    sync.add<Shared>(gw, "grad_w");
    sync.add<Correction>(gc, "grad_c");
    sync.prepare();  // optional: the consistency check, plan and buffers now, not in the first step
    if (rank == 0) std::printf("%s\n", gradsync::describe(sync).c_str());

    // This rank's shard: y = w* . x + c*_rank with w*_j = 0.5 (j+1) and c*_rank = rank.
    Kokkos::View<double**, Kokkos::HostSpace> x("x", samples, dim);
    View y("y", samples);
    std::srand(unsigned(17 + rank));
    for (int s = 0; s < samples; ++s) {
      double t = rank;
      for (int j = 0; j < dim; ++j) {
        x(s, j) = 2.0 * std::rand() / RAND_MAX - 1.0;
        t += 0.5 * (j + 1) * x(s, j);
      }
      y(s) = t;
    }

    const double lr = 0.3;
    for (int step = 0; step <= steps; ++step) {
      // Local loss L_r = mean_s (pred - y)^2 / 2 and its gradient, on this rank's samples.
      double loss = 0;
      Kokkos::deep_copy(gw, 0.0);
      Kokkos::deep_copy(gc, 0.0);
      for (int s = 0; s < samples; ++s) {
        double pred = c(0);
        for (int j = 0; j < dim; ++j) pred += w(j) * x(s, j);
        const double e = pred - y(s);
        loss += 0.5 * e * e / samples;
        for (int j = 0; j < dim; ++j) gw(j) += e * x(s, j) / samples;
        gc(0) += e / samples;
      }
      MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      loss /= size;                       // the global mean loss
      if (!sync.synchronize()) continue;  // accumulating (backward_passes_per_step > 1): no update yet
      // c is seen by 1/size of the global samples: its exact global gradient is dL_r/dc / size,
      // so its effective step is lr/size. Scale the local learning rate back up to converge fast.
      for (int j = 0; j < dim; ++j) w(j) -= lr * gw(j);
      c(0) -= lr * size * gc(0);
      if (rank == 0 && step % 50 == 0)
        std::printf("step %4d  global loss %.3e  bytes on the wire per step %llu\n", step, loss,
                    (unsigned long long)(sync.stats().bytes_allreduced / sync.stats().steps));
    }
    // Every rank recovered the shared weights and its own correction term.
    double err = std::abs(c(0) - rank);
    for (int j = 0; j < dim; ++j) err = std::max(err, std::abs(w(j) - 0.5 * (j + 1)));
    MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("%d ranks: largest parameter error %.2e (%s); local gradient grad_c never left its rank\n", size, err,
                  err < 1e-4 ? "converged" : "NOT converged");
    status = err < 1e-4 ? 0 : 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
