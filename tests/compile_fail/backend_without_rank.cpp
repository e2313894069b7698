// A backend without one of the members backend.hpp requires: GradientSync names it.
#include <gradsync/gradsync.hpp>

#include <vector>

#include "backend_collectives.hpp"

struct NoRankBackend : BackendCollectives {
  static const char* name() { return "no-rank"; }
  int size() const { return 1; }
};

int main() { gradsync::GradientSync<NoRankBackend, std::vector<double>> s(NoRankBackend{}); }
