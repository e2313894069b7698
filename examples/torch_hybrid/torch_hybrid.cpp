// A LibTorch model trained hybrid-parallel with gradsync, checked against PyTorch after every step.
//
// Each rank holds a shared trunk (tanh(Linear(4, 8)), data-parallel) and its own head
// (Linear(8, 1), local: only this rank's samples reach it). The global batch of 12 samples is split
// into n contiguous blocks; rank r trains on block r with the mean squared error of its block.
// gradsync averages the trunk's gradients and divides the head's by n (LocalScale::world_size), so
// both are exact gradients of the global batch's loss, and n ranks train the same model as one
// PyTorch process holding the trunk and all n heads (make_reference.py wrote its trajectory to
// reference.hpp, with the inputs and initial values). Every parameter is compared after each step.
//
//   mpirun -n 3 ./torch_hybrid      prints "check PASSED" (exit 0) or "check FAILED" (exit 1)
//   mpirun -n 3 ./torch_hybrid --head-scale none     heads not divided by n: must fail for n > 1
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <gradsync/gradsync.hpp>
#include <gradsync/torch.hpp>

#include "reference.hpp"

namespace ref = torch_hybrid_ref;

struct Trunk {};
struct Head {};
struct UnscaledHead {};  // --head-scale none: what a hybrid code gets wrong without the 1/n
template <>
struct gradsync::LocalVarPolicy<Head> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<UnscaledHead> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

struct NetImpl : torch::nn::Module {
  torch::nn::Linear trunk{nullptr}, head{nullptr};
  NetImpl() {
    trunk = register_module("trunk", torch::nn::Linear(ref::D, ref::H));
    head = register_module("head", torch::nn::Linear(ref::H, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(trunk(x))); }
};
TORCH_MODULE(Net);

namespace {
// A tensor of `shape` holding a copy of the reference's floats at p.
torch::Tensor from_ref(const float* p, std::vector<int64_t> shape) {
  return torch::from_blob(const_cast<float*>(p), shape, torch::kFloat).clone();
}

// Largest |a - b| / max(|b|, 1) over a tensor and the reference's floats at b.
double err(const torch::Tensor& a, const float* b) {
  const torch::Tensor c = a.detach().contiguous();
  double e = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    const double x = c.data_ptr<float>()[i], y = b[i];
    e = std::max(e, std::abs(x - y) / std::max(std::abs(y), 1.0));
  }
  return e;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n > ref::MAX_RANKS || ref::B % n != 0) {
    if (rank == 0) std::printf("torch_hybrid: the reference covers 1 to %d ranks\n", ref::MAX_RANKS);
    MPI_Finalize();
    return 2;
  }
  int failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    torch::set_num_threads(1);  // n ranks share the cores
    const int m = ref::B / n;

    Net net;
    {
      torch::NoGradGuard no_grad;
      net->trunk->weight.copy_(from_ref(ref::trunk_w0, {ref::H, ref::D}));
      net->trunk->bias.copy_(from_ref(ref::trunk_b0, {ref::H}));
      net->head->weight.copy_(from_ref(ref::head_w0 + rank * ref::H, {1, ref::H}));
      net->head->bias.copy_(from_ref(ref::head_b0 + rank, {1}));
    }

    // Every parameter in one call: "head.*" local to this rank, the rest data-parallel.
    gradsync::GradientSync<gradsync::MpiBackend, torch::Tensor> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    const auto is_head = [](const std::string& name) { return name.rfind("head.", 0) == 0; };
    const bool unscaled = argc > 2 && std::string(argv[1]) == "--head-scale" && std::string(argv[2]) == "none";
    const gradsync::TorchParameters params = unscaled
                                                 ? gradsync::add_parameters<Trunk, UnscaledHead>(sync, *net, is_head)
                                                 : gradsync::add_parameters<Trunk, Head>(sync, *net, is_head);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(ref::LR));

    double worst = 0, loss_err = 0;
    float first_loss = 0, last_loss = 0;
    for (int s = 0; s < ref::STEPS; ++s) {
      opt.zero_grad();  // in place: the registered gradients keep their storage
      const torch::Tensor x = from_ref(ref::x + (s * ref::B + rank * m) * ref::D, {m, ref::D});
      const torch::Tensor t = from_ref(ref::t + s * ref::B + rank * m, {m, 1});
      torch::Tensor loss = torch::mse_loss(net->forward(x), t);
      loss.backward();
      params.check();
      if (sync.synchronize()) opt.step();  // false while accumulating (backward_passes_per_step > 1)

      worst = std::max({worst, err(net->trunk->weight, ref::trunk_w[n - 1][s]),
                        err(net->trunk->bias, ref::trunk_b[n - 1][s]),
                        err(net->head->weight, ref::head_w[n - 1][s] + rank * ref::H),
                        err(net->head->bias, ref::head_b[n - 1][s] + rank)});
      // the global batch's loss is the mean of the ranks' losses (equal blocks)
      float l = loss.item<float>() / float(n);
      MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      loss_err = std::max(loss_err, double(std::abs(l - ref::loss[n - 1][s][0])));
      if (s == 0) first_loss = l;
      last_loss = l;
    }
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const gradsync::Stats st = sync.stats();
    // float rounding only: the n-rank sums add the batch in another order than PyTorch's one process
    const double tol = 2e-6;
    failed =
        !(worst < tol && loss_err < tol && last_loss < first_loss && params.size() == 4 && params.local_count() == 2);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf(
          "torch_hybrid: %d ranks, %d steps, loss %.5f -> %.5f; largest difference from PyTorch's single-process "
          "model %.2e (parameters), %.2e (loss); tolerance %.0e\n",
          n, ref::STEPS, first_loss, last_loss, worst, loss_err, tol);
      std::printf("torch_hybrid: %zu parameters registered (%zu local); rank 0 allreduced %llu bytes in %llu calls\n",
                  params.size(), params.local_count(), (unsigned long long)st.bytes_allreduced,
                  (unsigned long long)st.allreduce_calls);
      std::printf("torch_hybrid: check %s\n", failed ? "FAILED" : "PASSED");
    }
  }
  std::fflush(stdout);  // out before MPI_Finalize: a rank exiting 1 lets mpirun kill the others
  MPI_Finalize();
  return failed ? 1 : 0;
}
