// gradsync internals: the graveyard, memory an abandoned collective may still write into.
//
// A collective that never completed on this rank may complete on its peers, whose contributions
// then land in its buffers; freeing them would turn a caught StallError into a use-after-free inside
// MPI. So the failure paths move such memory here, where it is kept for the process's lifetime.
#pragma once

#include <memory>
#include <vector>

namespace gradsync::impl {

// Memory a collective that never completed may still write into (the peers' late contributions
// land there). Moved here on a stall or peer failure and never freed, so destroying the
// GradientSync after catching the error cannot turn into a use-after-free inside MPI.
inline std::vector<std::shared_ptr<void>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<void>>();  // intentionally leaked
  return *g;
}

}  // namespace gradsync::impl
