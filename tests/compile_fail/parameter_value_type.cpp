#include <gradsync/gradsync.hpp>
struct Dense {};
int main() {
  using View = Kokkos::View<double*>;
  gradsync::DistributedOptimizer d(gradsync::Sgd<View>(),
                                   gradsync::GradientSync<gradsync::SelfBackend, View>(gradsync::SelfBackend{}));
  Kokkos::View<float*> p("p", 4);
  View g("g", 4);
  d.add<Dense>(p, g);
}
