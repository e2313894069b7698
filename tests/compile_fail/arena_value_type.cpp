#include <gradsync/gradsync.hpp>
int main() {
  gradsync::GradientArena<double> arena("grads", 16);
  auto w = arena.carve_as<Kokkos::View<float**>>(2, 2);  // float views over double storage
  (void)w;
}
