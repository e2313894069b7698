// gradsync internals: Kokkos Tools regions around the phases of a step (gradsync::synchronize,
// gradsync::pack, gradsync::reduce, ...), so that any Kokkos Tools connector (space-time-stack,
// the NVTX connector for Nsight Systems, ...) shows gradsync's time beside the user's kernels.
//
// Without a tool a region costs a call to Kokkos::Tools::profileLibraryLoaded() and a branch. With
// one (or with any Kokkos Tools callback set, e.g. an allocation counter) it allocates nothing
// either: pushRegion takes a std::string, and the names are built once, when the first GradientSync
// is constructed (region_names()). Kokkos::Tools' profileLibraryLoaded / pushRegion / popRegion
// exist from Kokkos 3.x to 5.x (Kokkos::Profiling's are the older aliases): no version test.
#pragma once

#include <string>

#include <Kokkos_Core.hpp>

namespace gradsync::impl {

/// The phases shown as regions; the names are region_names()'s, in this order.
enum class Region : int {
  synchronize,
  prepare,
  mark_ready,
  progress,
  arrival_check,
  consistency_check,
  plan_build,
  accumulate,
  pack,
  reduce,
  unpack,
  local_scale,
  global_norm,
  clip,
  optimizer_update,
  broadcast_parameters,
  count
};

/// The regions' names (built at the first call: GradientSync's constructor makes it).
inline const std::string* region_names() {
  static const std::string names[] = {"gradsync::synchronize",
                                      "gradsync::prepare",
                                      "gradsync::mark_ready",
                                      "gradsync::progress",
                                      "gradsync::arrival_check",
                                      "gradsync::consistency_check",
                                      "gradsync::plan_build",
                                      "gradsync::accumulate",
                                      "gradsync::pack",
                                      "gradsync::reduce",
                                      "gradsync::unpack",
                                      "gradsync::local_scale",
                                      "gradsync::global_norm",
                                      "gradsync::clip",
                                      "gradsync::optimizer_update",
                                      "gradsync::broadcast_parameters"};
  static_assert(sizeof(names) / sizeof(names[0]) == std::size_t(Region::count), "a Region without a name");
  return names;
}

/// A Kokkos Tools region from construction to destruction (popped during unwinding too, so the
/// regions nest when an exception leaves a phase). `on = false` pushes nothing (a phase with
/// nothing to do this step).
class ProfileRegion {
 public:
  explicit ProfileRegion(Region r, bool on = true) : on_(on && Kokkos::Tools::profileLibraryLoaded()) {
    if (on_) Kokkos::Tools::pushRegion(region_names()[int(r)]);
  }
  ~ProfileRegion() {
    if (on_) Kokkos::Tools::popRegion();
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

 private:
  bool on_;
};

}  // namespace gradsync::impl
