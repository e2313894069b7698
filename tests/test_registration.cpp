// Registration at scale (issue 29): 100,000 small tensors register in O(log n) each, and the checks
// that made add() quadratic (overlap with every registered tensor, the index in the group, the
// lookup of register_local_var) still refuse and name what they refused.
#include <gradsync/gradsync.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::fill_host;
using gradsync_test::host_copy;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Other {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

constexpr std::size_t n_tensors = 100000;
constexpr std::size_t width = 3, stride = 4;  // tensor k holds [4k, 4k+3); 4k+3 is a gap

auto piece(const View& big, std::size_t begin, std::size_t end) {
  return Kokkos::subview(big, std::make_pair(begin, end));
}

}  // namespace

TEST_CASE("100,000 small views of one View register, and a real overlap among them is still refused") {
  const int n = world_size(), rank = world_rank();
  View big("big", n_tensors * stride);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < n_tensors; ++k) {
    const auto v = piece(big, k * stride, k * stride + width);
    if (k % 2 == 0)
      sync.add<Dense>(v);
    else
      sync.add<Other>(v);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("registered " << n_tensors << " tensors in " << seconds << " s");  // measured, not asserted
  REQUIRE(sync.num_tensors() == n_tensors);

  // The indices in each group count that group's tensors only (default names).
  const std::string in_middle = error_of([&] { sync.add<Dense>(piece(big, 4 * 777 + 1, 4 * 777 + 2)); });
  CHECK(in_middle ==
        "gradsync: tensor 'Dense[50000]' (group Dense) overlaps tensor 'Other[388]' (group Other) "
        "already registered");
  // Across two registered tensors: the first registered one is named.
  const std::string across = error_of([&] { sync.add<Other>(piece(big, 4 * 4242 + 2, 4 * 4242 + 5), "across"); });
  CHECK(across ==
        "gradsync: tensor 'across' (group Other) overlaps tensor 'Dense[2121]' (group Dense) already "
        "registered");
  const std::string twice = error_of([&] { sync.add<Dense>(piece(big, 4 * 99999, 4 * 99999 + 3), "again"); });
  CHECK(twice ==
        "gradsync: tensor 'again' (group Dense) overlaps tensor 'Other[49999]' (group Other) already "
        "registered (the same tensor registered twice)");
  // The same start, a longer tensor: still "twice" (the start is shared), and the first one named.
  const std::string longer = error_of([&] { sync.add<Dense>(piece(big, 0, 8), "longer"); });
  CHECK(longer ==
        "gradsync: tensor 'longer' (group Dense) overlaps tensor 'Dense[0]' (group Dense) already "
        "registered (the same tensor registered twice)");
  // Starting in a gap, ending inside the next tensor (k = 11, the sixth of group Other).
  const std::string into = error_of([&] { sync.add<Dense>(piece(big, 4 * 10 + 3, 4 * 11 + 1), "into"); });
  CHECK(into == "gradsync: tensor 'into' (group Dense) overlaps tensor 'Other[5]' (group Other) already registered");
  // One tensor over all of them names the first registered.
  const std::string all = error_of([&] { sync.add<Other>(piece(big, 1, big.size()), "all"); });
  CHECK(all == "gradsync: tensor 'all' (group Other) overlaps tensor 'Dense[0]' (group Dense) already registered");
  REQUIRE(sync.num_tensors() == n_tensors);  // refused adds registered nothing

  // The gaps are free, and an empty tensor overlaps nothing, even inside a registered one.
  sync.add<Dense>(piece(big, 4 * 123 + 3, 4 * 123 + 4), "gap");
  sync.add<Dense>(piece(big, 4 * 124 + 1, 4 * 124 + 1), "empty inside");
  sync.add<Dense>(piece(big, 4 * 124 + 1, 4 * 124 + 1), "empty again");
  CHECK(sync.num_tensors() == n_tensors + 3);
  // The next default index in each group follows the refused adds (none counted) and the named ones.
  const std::string next = error_of([&] { sync.add<Other>(piece(big, 9, 10)); });
  CHECK(next ==
        "gradsync: tensor 'Other[50000]' (group Other) overlaps tensor 'Dense[1]' (group Dense) already "
        "registered");

  // The run-time local variable is found among 100,000 (and an unknown tensor is not).
  sync.register_local_var(piece(big, 4 * 60001, 4 * 60001 + 3));
  CHECK(sync.is_local(piece(big, 4 * 60001, 4 * 60001 + 3)));
  CHECK_FALSE(sync.is_local(piece(big, 4 * 60002, 4 * 60002 + 3)));
  const std::string unknown = error_of([&] { sync.register_local_var(piece(big, 4 * 60001, 4 * 60001 + 2)); });
  CHECK(unknown ==
        "gradsync: register_local_var: the tensor (2 elements) is not registered with add<Group>() on rank " +
            std::to_string(rank));

  // And the step is right: data-parallel tensors averaged, the local one scaled by 1/n, the gaps untouched.
  fill_host(big, [&](std::size_t i) { return double(rank + 1) * double(1 + i % 7); });
  REQUIRE(sync.synchronize());
  const auto h = host_copy(big);
  double worst = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const std::size_t k = i / stride;
    const double mine = double(rank + 1) * double(1 + i % 7);
    double expect = double(n + 1) / 2 * double(1 + i % 7);  // the average over ranks of (r+1)(1 + i%7)
    if (i % stride == width && k != 123) expect = mine;     // a gap: not registered
    if (k == 60001 && i % stride != width) expect = mine / n;
    worst = std::max(worst, rel_err(h(i), expect));
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst < 1e-14);
}

TEST_CASE("row-sparse and dense registrations refuse each other's overlaps, by name") {
  View values("values", 40);
  Kokkos::View<int*> rows("rows", 10);
  gradsync::RowSparse<View, Kokkos::View<int*>> sparse(values, rows, 10, 4);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  sync.add<Dense>(sparse, "emb");
  const std::string dense_in_sparse = error_of([&] { sync.add<Dense>(piece(values, 8, 12), "inside"); });
  CHECK(dense_in_sparse ==
        "gradsync: tensor 'inside' (group Dense) overlaps row-sparse gradient 'emb' (group Dense) "
        "already registered");
  View other("other", 8);
  sync.add<Other>(other, "other");
  Kokkos::View<int*> two("two", 2);
  gradsync::RowSparse<View, Kokkos::View<int*>> over(View(piece(other, 0, 8)), two, 5);  // 2 rows of 4
  const std::string sparse_in_dense = error_of([&] { sync.add<Dense>(over, "over"); });
  CHECK(sparse_in_dense ==
        "gradsync: row-sparse gradient 'over' (group Dense) overlaps tensor 'other' (group Other) "
        "already registered");
  CHECK(sync.num_tensors() == 1);
}

TEST_CASE("handles may be temporaries, containers must be lvalues (a temporary vector is a compile error)") {
  const int n = world_size(), rank = world_rank();
  using VSync = gradsync::GradientSync<gradsync::MpiBackend, std::vector<double>>;
  VSync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  std::vector<double> kept(4, rank + 1.0), spanned(3, 2.0 * (rank + 1));
  sync.add<Dense>(kept);                                                    // an lvalue container
  sync.add<Dense>(gradsync::Span<double>(spanned.data(), spanned.size()));  // a temporary handle
  View v("v", 2);
  Sync vs(gradsync::MpiBackend(MPI_COMM_WORLD));
  vs.add<Dense>(Kokkos::subview(v, std::make_pair(0, 2)));  // a temporary View: a handle too
  // (tests/compile_fail/temporary_vector.cpp: sync.add<Dense>(std::vector<double>(4)) does not compile.)
  REQUIRE(sync.synchronize());
  const double mean = double(n + 1) / 2;
  GRADSYNC_CHECK_ALL(rel_err(kept[3], mean) < 1e-15 && rel_err(spanned[2], 2 * mean) < 1e-15);
}

TEST_CASE("100,000 parameters through DistributedOptimizer::add (its own, the sync's and Sgd's checks)") {
  const int n = world_size(), rank = world_rank();
  View params("params", n_tensors * stride), grads("grads", n_tensors * stride);
  gradsync::SgdOptions so;
  so.lr = 0.25;
  gradsync::DistributedOptimizer<gradsync::Sgd<View>, Sync> dopt(gradsync::Sgd<View>(so),
                                                                 Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < n_tensors; ++k)
    dopt.add<Dense>(piece(params, k * stride, k * stride + width), piece(grads, k * stride, k * stride + width));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("DistributedOptimizer: registered " << n_tensors << " parameters in " << seconds << " s");
  REQUIRE(dopt.num_params() == n_tensors);
  REQUIRE(dopt.sync().num_tensors() == n_tensors);
  REQUIRE(dopt.optimizer().num_params() == n_tensors);
  const std::string overlap = error_of([&] {
    dopt.add<Dense>(piece(params, 4 * 31337 + 2, 4 * 31337 + 3), piece(grads, 4 * 31337 + 3, 4 * 31337 + 4));
  });
  CHECK(overlap ==
        "gradsync: DistributedOptimizer::add: parameter 'Dense[100000]' (group Dense) overlaps parameter "
        "'Dense[31337]' already registered on rank " +
            std::to_string(rank));
  // The gradient in a gap, the parameter in a gap: accepted by everyone.
  dopt.add<Dense>(piece(params, 4 * 5 + 3, 4 * 5 + 4), piece(grads, 4 * 6 + 3, 4 * 6 + 4), "gaps");
  fill_host(params, [](std::size_t) { return 1.0; });
  fill_host(grads, [&](std::size_t i) { return double(rank + 1) * double(1 + i % 5); });
  REQUIRE(dopt.step());
  const auto h = host_copy(params);
  double worst = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double g = double(n + 1) / 2 * double(1 + i % 5);  // averaged
    const bool registered = i % stride != width || i == 4 * 5 + 3;
    // The parameter "gaps" at 4*5+3 steps with the gradient at 4*6+3.
    const double expect = !registered      ? 1.0
                          : i == 4 * 5 + 3 ? 1 - 0.25 * double(n + 1) / 2 * double(1 + (4 * 6 + 3) % 5)
                                           : 1 - 0.25 * g;
    worst = std::max(worst, rel_err(h(i), expect));
  }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst < 1e-14);
}
