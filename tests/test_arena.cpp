// GradientArena: carving, ownership, misuse, and a model carved from one arena synchronized as one
// region in place (few calls, no copy), with the analytic averages.
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::host_copy;
using gradsync_test::world_rank;
using gradsync_test::world_size;
using gradsync_test::worst_vs_rank_average;

namespace {
struct Dense {};
using View = Kokkos::View<double*>;
using Arena = gradsync::GradientArena<double>;
// Huge pages and in-place reduction by MpiBackend are properties of memory the host (and MPI)
// reaches: those tests use host memory explicitly (device memory would be staged and copied).
using HostView = Kokkos::View<double*, Kokkos::HostSpace>;
using HostArena = gradsync::GradientArena<double, Kokkos::HostSpace>;
using HostSync = gradsync::GradientSync<gradsync::MpiBackend, HostView>;

double grad_value(std::size_t i, int r, int p) { return (r + 1) * (i % 89 + 1) * 0.5 + 0.125 * p; }
}  // namespace

TEST_CASE("carves are neighbours in memory, of any rank, and run out with an Error naming the arena") {
  Arena arena("grads", 100);
  const View a = arena.carve(10);
  const auto w = arena.carve_as<Kokkos::View<double**, Kokkos::LayoutRight>>(4, 5);
  const View b = arena.carve(0), c = arena.carve(30);
  CHECK(a.data() == arena.storage().data());
  CHECK(w.data() == a.data() + 10);
  CHECK(w.extent(0) == 4);
  CHECK(w.extent(1) == 5);
  CHECK(c.data() == a.data() + 30);
  CHECK(b.size() == 0);
  CHECK(arena.used() == 60);
  CHECK(arena.capacity() == 100);
  const auto zero = host_copy(arena.storage());
  for (std::size_t i = 0; i < 100; ++i) CHECK(zero(i) == 0.0);  // zero-filled
  Kokkos::deep_copy(Kokkos::subview(w, 3, 4), 7.0);
  CHECK(gradsync_test::value_at(arena.storage(), 10 + 3 * 5 + 4) == 7.0);
  const std::string what = gradsync_test::error_of([&] { arena.carve(41); });
  CAPTURE(what);
  CHECK(what.find("gradient arena 'grads': 41 values asked for, 40 of 100 left") != std::string::npos);
  CHECK(arena.used() == 60);  // a refused carve takes nothing
  CHECK(arena.carve(40).size() == 40);
}

TEST_CASE("a host arena of 2 MiB or more starts on a huge-page boundary, zero-filled") {
  const std::size_t n = (std::size_t(5) << 20) / sizeof(double) + 3;  // 5 MiB and a bit
  HostArena arena("big", n);
  CHECK(reinterpret_cast<std::uintptr_t>(arena.storage().data()) % (std::size_t(2) << 20) == 0);
  CHECK(arena.capacity() == n);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < n; ++i) nonzero += arena.storage()(i) != 0.0;
  CHECK(nonzero == 0);
  const HostView a = arena.carve(n);
  a(n - 1) = 1;  // the last value is inside the allocation
  CHECK(arena.storage()(n - 1) == 1.0);
  HostArena plain("big, 4 KiB pages", n, /*huge_pages=*/false);
  CHECK(plain.capacity() == n);
  CHECK(plain.storage()(n - 1) == 0.0);
}

TEST_CASE("a one-dimensional carve keeps the allocation alive after the arena is gone") {
  View v;
  {
    Arena arena("short-lived", 8);
    arena.carve(3);
    v = arena.carve(5);
  }
  CHECK(v.use_count() == 1);
  gradsync_test::fill_host(v, [](std::size_t i) { return double(i); });
  CHECK(gradsync_test::value_at(v, 4) == 4.0);
}

TEST_CASE("a model carved from one arena is reduced in place as one region, with the analytic values") {
  const int rank = world_rank(), n = world_size();
  // Sizes of a small network: weights and biases, small and large.
  const std::size_t sizes[] = {3000, 40, 7, 2500, 1, 600};
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  for (bool from_arena : {true, false}) {
    CAPTURE(from_arena);
    HostArena arena("model", total);
    std::vector<HostView> g;
    for (std::size_t s : sizes) g.push_back(from_arena ? arena.carve(s) : HostView("g", s));
    gradsync::Options opt;
    opt.tuning.fusion_threshold_bytes = 1000 * sizeof(double);
    opt.tuning.in_place_min_bytes = 0;
    HostSync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    for (auto& v : g) sync.add<Dense>(v);
    for (int p = 0; p < 3; ++p) {
      for (auto& v : g)
        for (std::size_t i = 0; i < v.size(); ++i) v(i) = grad_value(i, rank, p);
      CHECK(sync.synchronize());
      const double worst =
          worst_vs_rank_average(g, n, [&](std::size_t, std::size_t i, int r) { return grad_value(i, r, p); });
      CAPTURE(worst);
      GRADSYNC_CHECK_ALL(worst <= 1e-13);
    }
    // One region of 6148 values in 7 pieces of at most 1000, no copy. Tensor by tensor:
    // 3 + 1 + 1 + 3 + 1 + 1 = 10 calls.
    CAPTURE(sync.stats().allreduce_calls);
    GRADSYNC_CHECK_ALL(sync.stats().allreduce_calls == 3u * (from_arena ? 7u : 10u));
    GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place == sync.stats().bytes_allreduced);
  }
}
