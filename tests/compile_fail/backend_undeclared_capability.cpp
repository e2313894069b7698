// A backend with an optional member it does not declare: GradientSync names the capability.
#include <gradsync/gradsync.hpp>

#include <vector>

#include "backend_collectives.hpp"

struct UndeclaredAbortBackend : BackendCollectives {
  static const char* name() { return "undeclared"; }
  int rank() const { return 0; }
  int size() const { return 1; }
  // An optional member the capabilities do not list: the sync would never call it.
  void abort() const noexcept {}
};

int main() { gradsync::GradientSync<UndeclaredAbortBackend, std::vector<double>> s(UndeclaredAbortBackend{}); }
