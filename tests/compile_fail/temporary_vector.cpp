// A temporary std::vector registered by reference would dangle at the next synchronize().
#include <gradsync/gradsync.hpp>

#include <vector>
struct Dense {};
std::vector<double> make_grad() { return std::vector<double>(4); }
int main() {
  gradsync::GradientSync<gradsync::SelfBackend, std::vector<double>> s(gradsync::SelfBackend{});
  std::vector<double> kept(4);
  s.add<Dense>(kept);                                        // an lvalue: accepted
  s.add<Dense>(gradsync::Span<double>(kept.data() + 0, 0));  // a handle, even temporary: accepted
  s.add<Dense>(make_grad());                                 // refused
}
