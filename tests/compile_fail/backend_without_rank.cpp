// A backend without one of the members backend.hpp requires: GradientSync names it.
#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <vector>

struct NoRankBackend {
  struct Request {};
  static const char* name() { return "no-rank"; }
  int size() const { return 1; }
  template <class MemorySpace>
  bool can_access() const {
    return true;
  }
  template <class T>
  void allreduce_sum(T*, std::size_t) const {}
  template <class T>
  Request iallreduce_sum(T*, std::size_t) const {
    return {};
  }
  bool test(Request&) const { return true; }
  void wait(Request&) const {}
  template <class T>
  void allreduce_min(T*, std::size_t) const {}
  template <class T>
  void allgather(const T*, T*, std::size_t) const {}
};

int main() { gradsync::GradientSync<NoRankBackend, std::vector<double>> s(NoRankBackend{}); }
