// A backend that declares a capability whose member is misspelt: GradientSync names the capability.
#include <gradsync/gradsync.hpp>

#include <vector>

#include "backend_collectives.hpp"

struct MisspeltSplitBackend : BackendCollectives {
  static const char* name() { return "misspelt"; }
  using capabilities = gradsync::Capabilities<gradsync::Capability::split>;
  int rank() const { return 0; }
  int size() const { return 1; }
  // Meant as split(color, key): the misspelling would have turned process sets off, silently.
  MisspeltSplitBackend splitt(int, int) const { return *this; }
};

int main() { gradsync::GradientSync<MisspeltSplitBackend, std::vector<double>> s(MisspeltSplitBackend{}); }
