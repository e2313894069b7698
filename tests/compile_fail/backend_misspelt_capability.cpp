// A backend that declares a capability whose member is misspelt: GradientSync names the capability.
#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <vector>

struct MisspeltSplitBackend {
  struct Request {};
  static const char* name() { return "misspelt"; }
  using capabilities = gradsync::Capabilities<gradsync::Capability::split>;
  int rank() const { return 0; }
  int size() const { return 1; }
  // Meant as split(color, key): the misspelling would have turned process sets off, silently.
  MisspeltSplitBackend splitt(int, int) const { return *this; }
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

int main() { gradsync::GradientSync<MisspeltSplitBackend, std::vector<double>> s(MisspeltSplitBackend{}); }
