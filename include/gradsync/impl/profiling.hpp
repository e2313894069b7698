// gradsync internals: Kokkos Tools regions around the phases of a step (gradsync::synchronize,
// gradsync::pack, gradsync::reduce, ...), so that any Kokkos Tools connector (space-time-stack,
// the NVTX connector for Nsight Systems, ...) shows gradsync's time beside the user's kernels.
//
// Free when no tool is loaded: one call to Kokkos::Tools::profileLibraryLoaded() and a branch; the
// std::string that pushRegion takes is built only when a tool is loaded. Kokkos::Tools'
// profileLibraryLoaded / pushRegion / popRegion exist from Kokkos 3.x to 5.x (Kokkos::Profiling's
// are the older aliases), so no version test is needed.
#pragma once

#include <Kokkos_Core.hpp>

namespace gradsync::impl {

/// A Kokkos Tools region from construction to destruction (popped during unwinding too, so the
/// regions nest when an exception leaves a phase). `name`: a string literal, `gradsync::...`;
/// `on = false` pushes nothing (a phase with nothing to do this step).
class ProfileRegion {
 public:
  explicit ProfileRegion(const char* name, bool on = true)
      : on_(on && Kokkos::Tools::profileLibraryLoaded()) {
    if (on_) push(name);
  }
  ~ProfileRegion() {
    if (on_) Kokkos::Tools::popRegion();
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

 private:
  // Out of line: the string's construction stays off the path taken without a tool.
  [[gnu::noinline, gnu::cold]] static void push(const char* name) { Kokkos::Tools::pushRegion(name); }

  bool on_;
};

}  // namespace gradsync::impl
