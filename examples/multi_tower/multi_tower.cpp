// gradsync multi_tower: a shared data-parallel trunk under one tower per rank.
//
//   z = W x                      trunk W (3 x 6): data-parallel, averaged over ranks
//   pred = v_r . tanh(U_r z)     tower of rank r, 2 + r units wide: a local group, never sent
//
// Rank r's task is its own teacher tower on the shared teacher trunk, so the trunk must serve every
// task at once. The loss is the global mean over all ranks' samples; gradsync averages dL/dW and
// scales the tower gradients by 1/world_size, so both are exact gradients of that one loss, and
// the global norm used for clipping counts the trunk once and each tower once.
//
//   mpirun -np 4 ./multi_tower [steps]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gradsync/gradsync.hpp>
#include <random>
#include <string>
#include <vector>

struct Trunk {};
struct TowerGroup {};
template <>
struct gradsync::LocalVarPolicy<TowerGroup> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

// Host memory on purpose: the forward and backward passes below are plain host loops, so the
// example runs unchanged whatever Kokkos's default (device) space is.
using View = Kokkos::View<double*, Kokkos::HostSpace>;
constexpr int in_dim = 6, hidden = 3, samples = 64;

struct Model {
  View w, u, v;  // trunk (hidden x in_dim), tower (width x hidden), head (width)
  int width;
  Model(int width_, const char* tag)
      : w(std::string(tag) + "_w", hidden * in_dim),
        u(std::string(tag) + "_u", std::size_t(width_ * hidden)),
        v(std::string(tag) + "_v", std::size_t(width_)),
        width(width_) {}
};

void randomize(View x, std::mt19937& rng, double scale) {
  std::uniform_real_distribution<double> d(-scale, scale);
  for (std::size_t i = 0; i < x.size(); ++i) x(i) = d(rng);
}

// Prediction for one sample; fills z and s (tanh of the tower's pre-activations) when given.
double forward(const Model& m, const double* x, double* z, double* s) {
  for (int k = 0; k < hidden; ++k) {
    z[k] = 0;
    for (int i = 0; i < in_dim; ++i) z[k] += m.w(std::size_t(k * in_dim + i)) * x[i];
  }
  double pred = 0;
  for (int j = 0; j < m.width; ++j) {
    double a = 0;
    for (int k = 0; k < hidden; ++k) a += m.u(std::size_t(j * hidden + k)) * z[k];
    s[j] = std::tanh(a);
    pred += m.v(std::size_t(j)) * s[j];
  }
  return pred;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int status = 0;
  {
    using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
    gradsync::AdamWOptions ao;
    ao.lr = 0.02;
    ao.weight_decay = 0;
    // Arguments: [steps] [--compression none|fp16|bf16] (the trunk's gradients on the wire).
    int steps = 400;
    gradsync::Options so;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--compression" && i + 1 < argc) {
        const std::string f = argv[++i];
        so.compression = f == "bf16"   ? gradsync::Compression::bf16
                         : f == "fp16" ? gradsync::Compression::fp16
                                       : gradsync::Compression::none;
      } else if (a.rfind("--kokkos", 0) != 0) {
        steps = std::atoi(argv[i]);
      }
    }
    gradsync::DistributedOptimizer dopt(gradsync::AdamW<View>(ao), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), so));
    const int rank = dopt.sync().backend().rank(), size = dopt.sync().backend().size();
    const int width = 2 + rank;  // every rank's tower has its own size

    // The planted answer: a teacher trunk shared by all ranks and a teacher tower per rank.
    Model teacher(width, "teacher"), model(width, "model"), grad(width, "grad");
    std::mt19937 shared_rng(7), own_rng(100 + unsigned(rank)), init_rng(1000 + unsigned(rank));
    randomize(teacher.w, shared_rng, 1.0);
    randomize(teacher.u, own_rng, 1.0);
    randomize(teacher.v, own_rng, 1.0);
    // Initial values differ per rank, the trunk included: broadcast_parameters() below makes the
    // trunk (and only the trunk) rank 0's everywhere, as Horovod's broadcast callback does.
    randomize(model.w, init_rng, 0.5);
    randomize(model.u, init_rng, 0.5);
    randomize(model.v, init_rng, 0.5);

    dopt.add<Trunk>(model.w, grad.w, "trunk_w");
    dopt.add<TowerGroup>(model.u, grad.u, "tower_u");
    dopt.add<TowerGroup>(model.v, grad.v, "tower_v");
    dopt.broadcast_parameters(0);
    dopt.sync().prepare();  // optional: the consistency check, plan and buffers before the first step
    if (rank == 0) std::printf("%s\n", gradsync::describe(dopt.sync()).c_str());

    std::vector<double> x(samples * in_dim), y(samples);
    std::uniform_real_distribution<double> ux(-1, 1);
    std::vector<double> z(hidden), s(width), dz(hidden);
    for (int n = 0; n < samples; ++n) {
      for (int i = 0; i < in_dim; ++i) x[std::size_t(n * in_dim + i)] = ux(own_rng);
      y[std::size_t(n)] = forward(teacher, &x[std::size_t(n * in_dim)], z.data(), s.data());
    }

    double first_loss = 0, loss = 0;
    for (int step = 0; step <= steps; ++step) {
      // Rank r's loss L_r = mean_n (pred - y)^2 / 2 and its gradient, by hand.
      Kokkos::deep_copy(grad.w, 0.0);
      Kokkos::deep_copy(grad.u, 0.0);
      Kokkos::deep_copy(grad.v, 0.0);
      loss = 0;
      for (int n = 0; n < samples; ++n) {
        const double* xn = &x[std::size_t(n * in_dim)];
        const double e = (forward(model, xn, z.data(), s.data()) - y[std::size_t(n)]) / samples;
        loss += 0.5 * e * e * samples;
        std::fill(dz.begin(), dz.end(), 0.0);
        for (int j = 0; j < width; ++j) {
          grad.v(std::size_t(j)) += e * s[std::size_t(j)];
          const double da = e * model.v(std::size_t(j)) * (1 - s[std::size_t(j)] * s[std::size_t(j)]);
          for (int k = 0; k < hidden; ++k) {
            grad.u(std::size_t(j * hidden + k)) += da * z[std::size_t(k)];
            dz[std::size_t(k)] += da * model.u(std::size_t(j * hidden + k));
          }
        }
        for (int k = 0; k < hidden; ++k)
          for (int i = 0; i < in_dim; ++i) grad.w(std::size_t(k * in_dim + i)) += dz[std::size_t(k)] * xn[i];
      }
      MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      loss /= size;  // the global mean loss
      if (step == 0) first_loss = loss;
      if (!dopt.synchronize()) continue;
      const double norm = dopt.clip_grad_norm(0.1);  // one allreduce of one double
      dopt.apply();
      const auto& st = dopt.sync().stats();
      if (rank == 0 && step % 50 == 0)
        std::printf("step %4d  global loss %.3e  grad norm %.3e  bytes on the wire per step %llu\n", step, loss, norm,
                    (unsigned long long)(st.bytes_allreduced / st.steps));
    }
    long tower_values = long(model.u.size() + model.v.size()), all_towers = tower_values;
    MPI_Allreduce(MPI_IN_PLACE, &all_towers, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    const bool fell = loss < 0.02 * first_loss;
    if (rank == 0) {
      std::printf("%d ranks: global loss %.3e -> %.3e (%s)\n", size, first_loss, loss,
                  fell ? "loss fell" : "did NOT fall");
      std::printf(
          "per step: %zu bytes of trunk gradient allreduced, plus 8 bytes for the global norm; the towers "
          "(%ld values over all ranks, %ld on rank 0) never left their ranks\n",
          dopt.sync().data_parallel_bytes(), all_towers, tower_values);
    }
    status = fell ? 0 : 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
