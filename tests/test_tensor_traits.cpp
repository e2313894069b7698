// Tensor traits and registration checks: Views of any rank and layout, std::vector, Span; every
// refusal is a gradsync::Error naming the tensor and group.
#include <gradsync/gradsync.hpp>

#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Emb {};
template <>
struct gradsync::LocalVarPolicy<Emb> : gradsync::KeepLocal<> {};

static_assert(gradsync::is_tensor_v<Kokkos::View<double***, Kokkos::LayoutLeft>>);
static_assert(gradsync::is_tensor_v<std::vector<float>>);
static_assert(gradsync::is_tensor_v<gradsync::Span<float>>);
static_assert(!gradsync::is_tensor_v<double>);
static_assert(gradsync::local_scale_v<Emb> == gradsync::LocalScale::world_size);

TEST_CASE("std::vector and Span gradients are averaged like Views") {
  const int n = world_size(), r = world_rank();
  const double mean_rank_plus_1 = (n + 1) / 2.0;
  std::vector<double> a(5, r + 1.0), b(3, 2.0 * (r + 1));
  gradsync::GradientSync<gradsync::MpiBackend, std::vector<double>> vs(gradsync::MpiBackend(MPI_COMM_WORLD));
  vs.add<Dense>(a);
  vs.add<Emb>(b);
  CHECK(vs.synchronize());
  GRADSYNC_CHECK_ALL(a[4] == mean_rank_plus_1 && b[0] == 2.0 * (r + 1) / n);

  std::vector<float> storage(7, float(r + 1));
  gradsync::GradientSync<gradsync::MpiBackend, gradsync::Span<float>> ss(gradsync::MpiBackend(MPI_COMM_WORLD));
  ss.add<Dense>(gradsync::Span<float>(storage.data(), 4), "first4");
  ss.add<Emb>(gradsync::Span<float>(storage.data() + 4, 3), "last3");
  CHECK(ss.synchronize());
  GRADSYNC_CHECK_ALL(storage[0] == float(mean_rank_plus_1) && storage[6] == float(r + 1) / float(n));
}

TEST_CASE("Views of rank 1 to 3, LayoutLeft and contiguous LayoutStride are accepted") {
  const int n = world_size(), r = world_rank();
  Kokkos::View<double***, Kokkos::LayoutLeft> a("a", 2, 3, 4);
  Kokkos::View<double**> b("b", 3, 2);
  Kokkos::LayoutStride contiguous(4, 1);
  Kokkos::View<double*, Kokkos::LayoutStride> c("c", contiguous);
  gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<double*>> s(gradsync::MpiBackend(MPI_COMM_WORLD));
  s.add<Dense>(a);
  s.add<Dense>(b);
  s.add<Dense>(c);
  Kokkos::deep_copy(a, r);
  Kokkos::deep_copy(b, 2 * r);
  Kokkos::deep_copy(c, 3 * r);
  CHECK(s.synchronize());
  const double mean = (n - 1) / 2.0;
  const auto ah = gradsync_test::host_copy(a);
  const auto bh = gradsync_test::host_copy(b);
  const auto ch = gradsync_test::host_copy(c);
  GRADSYNC_CHECK_ALL(ah(1, 2, 3) == mean && bh(2, 1) == 2 * mean && ch(3) == 3 * mean);
  GRADSYNC_CHECK_ALL(s.stats().bytes_allreduced == (24 + 6 + 4) * sizeof(double));
}

TEST_CASE("non-contiguous views are refused, naming the tensor and group") {
  // LayoutRight by name: Kokkos-CUDA defaults to LayoutLeft, where a column is contiguous.
  Kokkos::View<double**, Kokkos::LayoutRight> m("m", 4, 3);
  auto column = Kokkos::subview(m, Kokkos::ALL, 1);  // stride 3: not contiguous
  gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{});
  const std::string msg = error_of([&] { s.add<Dense>(column, "m.col1"); });
  CHECK(msg.find("m.col1") != std::string::npos);
  CHECK(msg.find("Dense") != std::string::npos);
  CHECK(msg.find("not contiguous") != std::string::npos);
}

TEST_CASE("duplicate, overlapping and unknown tensors are errors") {
  Kokkos::View<double*> a("a", 10);
  gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{});
  s.add<Dense>(a, "a");
  CHECK(error_of([&] { s.add<Emb>(a, "a again"); }).find("registered twice") != std::string::npos);
  auto tail = Kokkos::subview(a, std::make_pair(5, 10));
  const std::string overlap = error_of([&] { s.add<Dense>(tail, "tail"); });
  CHECK(overlap.find("'tail'") != std::string::npos);
  CHECK(overlap.find("overlaps tensor 'a'") != std::string::npos);
  Kokkos::View<double*> other("other", 3);
  CHECK(error_of([&] { s.register_local_var(other); }).find("not registered") != std::string::npos);
}

TEST_CASE("invalid options are ConfigErrors") {
  auto make = [](gradsync::Options o) {
    gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{}, o);
  };
  gradsync::Options o;
  o.backward_passes_per_step = 0;
  CHECK_THROWS_AS(make(o), gradsync::ConfigError);
  o = {};
  o.prescale_factor = -1;
  CHECK_THROWS_AS(make(o), gradsync::ConfigError);
  o = {};
  o.postscale_factor = std::nan("");
  CHECK_THROWS_AS(make(o), gradsync::ConfigError);
}

TEST_CASE("registrations cannot change inside an aggregation cycle") {
  Kokkos::View<double*> a("a", 4), b("b", 4);
  gradsync::Options o;
  o.backward_passes_per_step = 2;
  gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{}, o);
  s.add<Dense>(a);
  CHECK_FALSE(s.synchronize());
  CHECK_THROWS_AS(s.add<Dense>(b), gradsync::Error);
  CHECK(s.synchronize());
  s.add<Dense>(b);  // allowed again once the step completed
  CHECK(s.num_tensors() == 2);
}
