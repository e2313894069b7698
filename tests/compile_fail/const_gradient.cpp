#include <gradsync/gradsync.hpp>
struct Dense {};
int main() {
  gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<double*>> s(gradsync::SelfBackend{});
  Kokkos::View<const double*> g = Kokkos::View<double*>("g", 4);
  s.add<Dense>(g);
}
