// A backend with an optional member it does not declare: GradientSync names the capability.
#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <vector>

struct UndeclaredAbortBackend {
  struct Request {};
  static const char* name() { return "undeclared"; }
  int rank() const { return 0; }
  int size() const { return 1; }
  // An optional member the capabilities do not list: the sync would never call it.
  void abort() const noexcept {}
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

int main() { gradsync::GradientSync<UndeclaredAbortBackend, std::vector<double>> s(UndeclaredAbortBackend{}); }
