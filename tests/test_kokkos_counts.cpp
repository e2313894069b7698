// The test main's Kokkos counts (kokkos_counts.hpp, issue 34), which every test program's device-time
// budget is built on: each event counted exactly once, zero-byte allocations left out, and a case
// over budget failing its program (ctest kokkos_budget, which lowers the budget).
#include <gradsync/gradsync.hpp>

#include "gradsync_test.hpp"

using gradsync_test::kokkos_counts;

TEST_CASE("the test main counts each deep copy, launch and allocation once") {
  REQUIRE(gradsync_test::kokkos_counting());
  double sum = 0;  // a first reduction, before counting: Kokkos allocates its reduction scratch once
  Kokkos::parallel_reduce(
      "warm", Kokkos::RangePolicy<>(0, 8), KOKKOS_LAMBDA(int i, double& s) { s += i; }, sum);
  const auto before = kokkos_counts();
  Kokkos::View<double*> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("counted_view")), 8);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<>(0, 8), KOKKOS_LAMBDA(int i) { v(i) = i; });
  Kokkos::parallel_reduce(
      "sum", Kokkos::RangePolicy<>(0, 8), KOKKOS_LAMBDA(int i, double& s) { s += v(i); }, sum);
  double x = 0;
  Kokkos::deep_copy(x, Kokkos::subview(v, 3));  // one value
  const auto h = Kokkos::create_mirror_view(Kokkos::HostSpace(), v);
  Kokkos::deep_copy(h, v);  // 64 bytes: counted, not as one value (the same View on a host build)
  {
    const gradsync_test::DeepCopiesUncounted uncounted;
    Kokkos::deep_copy(x, Kokkos::subview(v, 4));
  }
  const auto d = kokkos_counts() - before;
  CAPTURE(d.deep_copies);
  CAPTURE(d.small_copies);
  CAPTURE(d.launches);
  CAPTURE(d.allocations);
  CHECK(sum == 28.0);
  CHECK(x == 4.0);
  CHECK(d.deep_copies == 2);
  CHECK(d.small_copies == 1);
  CHECK(d.launches == 2);
  // The 8 values, and on a device build their mirror.
  const bool mirror_allocated = h.data() != v.data();
  CHECK(d.allocations == (mirror_allocated ? 2 : 1));
  CHECK(gradsync_test::has(gradsync_test::last_kokkos_allocation(),
                           mirror_allocated ? "counted_view" : "'counted_view' 64 bytes"));
  CHECK(d.device_seconds() == doctest::Approx(2 * 25e-6 + 2 * 6e-6 + double(d.allocations) * 50e-6));
}

// Kokkos-CUDA reports a 0-byte TeamScratchMemory allocation at every team launch (kokkos_counts.cpp):
// those events are no allocation; a 1-byte one is.
TEST_CASE("zero-byte allocation events are not counted") {
  REQUIRE(gradsync_test::kokkos_counting());
  const auto space = Kokkos::Tools::make_space_handle("Cuda");
  const long before = kokkos_counts().allocations;
  Kokkos::Tools::allocateData(space, "Kokkos::CudaSpace::TeamScratchMemory", nullptr, 0);
  CHECK(kokkos_counts().allocations == before);
  Kokkos::Tools::allocateData(space, "one_byte", nullptr, 1);
  CHECK(kokkos_counts().allocations == before + 1);
  CHECK(gradsync_test::last_kokkos_allocation() == "Cuda 'one_byte' 1 bytes");
}

// Reads 2000 values one at a time: 0.05 s of estimated device time, which the default budget allows
// and ctest's kokkos_budget (budget 0.01 s) must refuse, naming this case.
TEST_CASE("values read one at a time") {
  Kokkos::View<double*> v("v", 2000);
  Kokkos::deep_copy(v, 1.0);
  double total = 0;
  for (int i = 0; i < 2000; ++i) total += gradsync_test::value_at(v, std::size_t(i));
  CHECK(total == 2000.0);
}
