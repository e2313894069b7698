// Options::tuning.huge_pages: gradients reduced in place move onto 2 MiB pages where every 4 KiB page
// holds gradient bytes, nowhere else, with their values kept and the averages exact. Checked
// against the kernel's own accounts (/proc/self/smaps, mincore), not the library's.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <gradsync/gradsync.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::world_rank;
using gradsync_test::world_size;
using gradsync_test::worst_vs_rank_average;

namespace {
struct Dense {};
using View = Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
constexpr std::uintptr_t KiB4 = 4096, MiB2 = std::uintptr_t(2) << 20;
constexpr std::size_t map_bytes = 6 * MiB2;

double grad_value(std::size_t k, std::size_t i, int r) { return (r + 1) * 0.25 + double(k) + double(i % 1013) * 1e-3; }

std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  const auto a = s.find('['), b = s.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : s.substr(a + 1, b - a - 1);
}

// Whether this kernel collapses touched anonymous memory in place (MADV_COLLAPSE, Linux 6.1+).
bool kernel_collapses() {
  if (thp_mode() != "always" && thp_mode() != "madvise") return false;
  void* m = mmap(nullptr, 2 * MiB2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  const std::uintptr_t a = (reinterpret_cast<std::uintptr_t>(m) + MiB2 - 1) / MiB2 * MiB2;
  std::memset(reinterpret_cast<void*>(a), 1, MiB2);
  const bool ok = madvise(reinterpret_cast<void*>(a), MiB2, 25 /* MADV_COLLAPSE */) == 0;
  munmap(m, 2 * MiB2);
  return ok;
}

// AnonHugePages, in bytes, of the mapping that contains address `p` (/proc/self/smaps).
std::size_t anon_huge_bytes_at(std::uintptr_t p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= p && p < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stoul(line.substr(14)) * 1024;
  }
  return 0;
}

bool resident(std::uintptr_t page) {
  unsigned char v = 0;
  return mincore(reinterpret_cast<void*>(page), KiB4, &v) == 0 && (v & 1);
}
}  // namespace

TEST_CASE("huge_pages: gradients move onto 2 MiB pages only where every 4 KiB page holds gradients") {
  const int rank = world_rank(), n = world_size();
  const bool collapses = kernel_collapses();
  const bool exact_thp = thp_mode() == "madvise";  // "always" may also give huge pages at first touch
  CAPTURE(collapses);
  CAPTURE(thp_mode());
  for (bool on : {true, false}) {
    CAPTURE(on);
    // One 12 MiB mapping of 4 KiB pages, A a 2 MiB boundary 2 to 4 MiB into it. Tensors:
    //   g0 [A - 1000 B, A + 2 MiB + 3000 B)          covers huge page [A, A + 2M)
    //   g1 [A + 2 MiB + 3104 B, A + 4 MiB + 8 B)      with g0 covers [A + 2M, A + 4M): their gap is
    //                                                  inside one 4 KiB page
    //   g2 [A + 4 MiB + 8192 + 16 B, A + 6 MiB + 4 KiB) leaves [A + 4M + 4K, A + 4M + 8K) without
    //                                                  gradients: [A + 4M, A + 6M) stays on 4 KiB pages
    void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    const std::uintptr_t A = (reinterpret_cast<std::uintptr_t>(m) + 2 * MiB2) / MiB2 * MiB2;
    const std::uintptr_t bounds[3][2] = {{A - 1000, A + MiB2 + 3000},
                                         {A + MiB2 + 3104, A + 2 * MiB2 + 8},
                                         {A + 2 * MiB2 + 2 * KiB4 + 16, A + 3 * MiB2 + KiB4}};
    std::vector<View> g;
    for (const auto& b : bounds) g.emplace_back(reinterpret_cast<double*>(b[0]), (b[1] - b[0]) / sizeof(double));
    const std::uintptr_t untouched = A + 2 * MiB2 + KiB4;
    gradsync::Options opt;
    opt.tuning.huge_pages = on;
    opt.tuning.read_environment = false;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    for (auto& v : g) sync.add<Dense>(v);
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k](i) = grad_value(k, i, rank);
    CHECK(sync.synchronize());  // builds the plan: the collapse happens here, before any exchange
    const double worst =
        worst_vs_rank_average(g, n, [](std::size_t k, std::size_t i, int r) { return grad_value(k, i, r); });
    CAPTURE(worst);
    GRADSYNC_CHECK_ALL(worst <= 1e-15);
    const std::size_t expect = on && collapses ? 2 * MiB2 : 0;
    CHECK(sync.stats().bytes_on_huge_pages == expect);
    if (exact_thp) {
      CHECK(anon_huge_bytes_at(A) == expect);
      CHECK_FALSE(resident(untouched));  // nothing populated outside the gradients
    } else if (on && collapses) {
      CHECK(anon_huge_bytes_at(A) >= expect);
    }
    // A second step on the same pages: still exact.
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i) g[k](i) = grad_value(k + 1, i, rank);
    CHECK(sync.synchronize());
    const double worst2 =
        worst_vs_rank_average(g, n, [](std::size_t k, std::size_t i, int r) { return grad_value(k + 1, i, r); });
    GRADSYNC_CHECK_ALL(worst2 <= 1e-15);
    munmap(m, map_bytes);
  }
}

TEST_CASE("GRADSYNC_HUGE_PAGES overrides Options::tuning.huge_pages") {
  gradsync::Options o;
  setenv("GRADSYNC_HUGE_PAGES", "off", 1);
  CHECK_FALSE(gradsync::apply_env(o).tuning.huge_pages);
  setenv("GRADSYNC_HUGE_PAGES", "1", 1);
  o.tuning.huge_pages = false;
  CHECK(gradsync::apply_env(o).tuning.huge_pages);
  setenv("GRADSYNC_HUGE_PAGES", "sometimes", 1);
  const std::string what = gradsync_test::error_of<gradsync::ConfigError>([&] { gradsync::apply_env(o); });
  CHECK(what.find("GRADSYNC_HUGE_PAGES") != std::string::npos);
  unsetenv("GRADSYNC_HUGE_PAGES");
}
