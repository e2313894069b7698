// gradsync/torch.hpp: LibTorch tensors as gradients (float and double), refused tensors named,
// add_parameters' grouping, names and checks, and a registration mismatch across ranks. Values
// against analytic per-rank ones. (examples/torch_hybrid compares whole training runs with PyTorch.)
#include <torch/torch.h>

#include <gradsync/gradsync.hpp>
#include <gradsync/torch.hpp>

#include "gradsync_test.hpp"

using namespace gradsync_test;

namespace {
struct Dense {};
struct Local {};
struct Unscaled {};
}  // namespace
template <>
struct gradsync::LocalVarPolicy<Local> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Unscaled> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

namespace {
using FloatSync = gradsync::GradientSync<gradsync::MpiBackend, torch::Tensor>;
using DoubleSync = gradsync::GradientSync<gradsync::MpiBackend, gradsync::TorchTensor<double>>;

FloatSync float_sync() { return FloatSync(gradsync::MpiBackend(MPI_COMM_WORLD)); }
DoubleSync double_sync() { return DoubleSync(gradsync::MpiBackend(MPI_COMM_WORLD)); }

struct TwoLayerImpl : torch::nn::Module {
  torch::nn::Linear body{nullptr}, head{nullptr};
  TwoLayerImpl(int in, int hidden) {
    body = register_module("body", torch::nn::Linear(in, hidden));
    head = register_module("head", torch::nn::Linear(hidden, 2));
  }
};
TORCH_MODULE(TwoLayer);
}  // namespace

TEST_CASE("float and double tensors of any shape: averaged, scaled and kept as the groups say") {
  const int r = world_rank(), n = world_size();
  FloatSync fs = float_sync();
  DoubleSync ds = double_sync();
  torch::Tensor a = torch::full({2, 3}, float(r + 1));
  torch::Tensor b = torch::arange(4, torch::kFloat) * float(r + 1);
  torch::Tensor c = torch::full({5}, 2.0 * (r + 1), torch::kDouble);
  torch::Tensor d = torch::full({3, 1, 2}, 3.0 * (r + 1), torch::kDouble);
  fs.add<Dense>(a, "a");
  fs.add<Local>(b, "b");
  ds.add<Dense>(gradsync::TorchTensor<double>(c), "c");
  ds.add<Unscaled>(gradsync::TorchTensor<double>(d), "d");
  const float* a_data = a.data_ptr<float>();
  CHECK(fs.synchronize());
  CHECK(ds.synchronize());
  CHECK(a.data_ptr<float>() == a_data);  // reduced in place
  const double mean = (n + 1) / 2.0;
  double e = 0;
  e = std::max(e, (a - float(mean)).abs().max().item<double>());
  e = std::max(e, (b - torch::arange(4, torch::kFloat) * float(r + 1) / float(n)).abs().max().item<double>());
  e = std::max(e, (c - 2.0 * mean).abs().max().item<double>());
  e = std::max(e, (d - 3.0 * (r + 1)).abs().max().item<double>());
  CHECK(all_ranks(e < 1e-6));
  CHECK(fs.stats().bytes_allreduced == (n > 1 ? 6 * sizeof(float) : fs.stats().bytes_allreduced));
}

TEST_CASE("tensors gradsync cannot reduce in place are refused, naming the tensor") {
  FloatSync fs = float_sync();
  DoubleSync ds = double_sync();
  torch::Tensor m = torch::zeros({3, 4});
  std::string msg = error_of([&] { fs.add<Dense>(m.t(), "transposed"); });
  CHECK(has(msg, "'transposed'"));
  CHECK(has(msg, "not contiguous"));
  msg = error_of([&] { fs.add<Dense>(torch::zeros({3}, torch::kDouble), "w"); });
  CHECK(has(msg, "Double tensor of shape [3]"));
  CHECK(has(msg, "float"));
  msg = error_of([&] { ds.add<Dense>(gradsync::TorchTensor<double>(torch::zeros({2, 2}))); });
  CHECK(has(msg, "Float tensor of shape [2, 2]"));
  CHECK(has(msg, "double"));
  msg = error_of([&] { fs.add<Dense>(torch::zeros({4}, torch::kInt)); });
  CHECK(has(msg, "Int tensor"));
  msg = error_of([&] { fs.add<Dense>(torch::Tensor()); });
  CHECK(has(msg, "undefined"));
  // none of them was registered: a sync with nothing in it still works
  CHECK(fs.synchronize());
}

TEST_CASE("add_parameters: every parameter once, grouped by the predicate, under its name") {
  const int r = world_rank(), n = world_size();
  TwoLayer net(3, 4);
  net->body->bias.set_requires_grad(false);  // frozen: skipped
  FloatSync fs = float_sync();
  const gradsync::TorchParameters reg = gradsync::add_parameters<Dense, Local>(
      fs, *net, [](const std::string& name) { return name.rfind("head.", 0) == 0; });
  REQUIRE(reg.size() == 3);
  CHECK(reg.local_count() == 2);
  CHECK(reg.entries()[0].name == "body.weight");
  CHECK(!reg.entries()[0].local);
  CHECK(reg.entries()[1].name == "head.weight");
  CHECK(reg.entries()[1].local);
  CHECK(!net->body->bias.grad().defined());

  // a pass: gradients set by hand, as backward would (in place)
  {
    torch::NoGradGuard g;
    net->body->weight.mutable_grad().fill_(float(r + 1));
    net->head->weight.mutable_grad().fill_(float(2 * (r + 1)));
    net->head->bias.mutable_grad().fill_(float(r + 1));
  }
  reg.check();
  CHECK(fs.synchronize());
  double e = (net->body->weight.grad() - float((n + 1) / 2.0)).abs().max().item<double>();
  e = std::max(e, (net->head->weight.grad() - float(2 * (r + 1)) / float(n)).abs().max().item<double>());
  e = std::max(e, (net->head->bias.grad() - float(r + 1) / float(n)).abs().max().item<double>());
  CHECK(all_ranks(e < 1e-6));

  // the storage gradsync reduces must stay: set to None or reallocated is caught by check()
  net->head->bias.mutable_grad() = torch::Tensor();
  std::string msg = error_of([&] { reg.check(); });
  CHECK(has(msg, "'head.bias'"));
  CHECK(has(msg, "set to None"));
  net->head->bias.mutable_grad() = torch::zeros({2});
  msg = error_of([&] { reg.check(); });
  CHECK(has(msg, "reallocated"));
}

TEST_CASE("add_parameters: a parameter of the wrong type is named with its group") {
  TwoLayer net(2, 3);
  net->to(torch::kDouble);
  FloatSync fs = float_sync();
  const std::string msg = error_of([&] { gradsync::add_parameters<Dense>(fs, *net); });
  CHECK(has(msg, "parameter 'body.weight'"));
  CHECK(has(msg, "Dense"));
  CHECK(has(msg, "Double tensor of shape [3, 2]"));
  // the same module in a double sync is fine
  DoubleSync ds = double_sync();
  CHECK(gradsync::add_parameters<Dense>(ds, *net).size() == 4);
  CHECK(ds.synchronize());
}

TEST_CASE("a shared layer of another shape on one rank: every rank throws, naming the parameter") {
  const int r = world_rank(), n = world_size();
  GRADSYNC_SKIP_BELOW_RANKS(2, "a layer of another shape on one rank needs another rank");
  TwoLayer net(3, r == n - 1 ? 5 : 4);
  FloatSync fs = float_sync();
  gradsync::add_parameters<Dense, Local>(fs, *net, [](const std::string& name) { return name.rfind("head.", 0) == 0; });
  std::string msg;
  try {
    (void)fs.synchronize();
  } catch (const gradsync::MismatchError& e) {
    msg = e.what();
  }
  CHECK(all_ranks(has(msg, "body.weight")));
}
