#include <gradsync/gradsync.hpp>
struct Dense {};
int main() {
  gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{});
  Kokkos::View<float*> g("g", 4);
  s.add<Dense>(g);
}
