#include <gradsync/gradsync.hpp>
struct NotAnOptimizer {};
int main() {
  using View = Kokkos::View<double*>;
  gradsync::DistributedOptimizer<NotAnOptimizer, gradsync::GradientSync<gradsync::SelfBackend, View>> d(
      NotAnOptimizer{}, gradsync::GradientSync<gradsync::SelfBackend, View>(gradsync::SelfBackend{}));
}
