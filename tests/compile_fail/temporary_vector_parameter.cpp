// The optimizer and the sync keep pointers into the vectors: a temporary one would dangle.
#include <gradsync/gradsync.hpp>

#include <vector>
struct Dense {};
int main() {
  using Vec = std::vector<double>;
  gradsync::DistributedOptimizer d(gradsync::Sgd<Vec>(),
                                   gradsync::GradientSync<gradsync::SelfBackend, Vec>(gradsync::SelfBackend{}));
  Vec p(4);
  d.add<Dense>(p, Vec(4));
}
