// The sanitizer pass's proof that leak detection is on: a sync's normal life, then 64 bytes leaked
// on purpose. ctest expects LeakSanitizer to fail the run and name them (tests/CMakeLists.txt).
#include <gradsync/gradsync.hpp>

#include <cstdio>

struct Dense {};

namespace {
[[gnu::noinline]] void leak_64_bytes_on_purpose() {
  char* p = new char[64];
  std::snprintf(p, 64, "64 bytes leaked on purpose");
  std::printf("%s\n", p);  // used; its only pointer ends with this frame: a leak
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    Kokkos::View<double*> g("g", 16);
    gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<double*>> sync(gradsync::MpiBackend(MPI_COMM_WORLD));
    sync.add<Dense>(g, "g");
    Kokkos::deep_copy(g, 1.0);
    if (!sync.synchronize()) std::printf("unexpected: synchronize() returned false\n");
    leak_64_bytes_on_purpose();
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
