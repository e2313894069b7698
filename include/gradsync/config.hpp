// gradsync: version, macros and the small Kokkos compatibility layer.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

#define GRADSYNC_VERSION_MAJOR 0
#define GRADSYNC_VERSION_MINOR 1
#define GRADSYNC_VERSION_PATCH 0
#define GRADSYNC_VERSION \
  (GRADSYNC_VERSION_MAJOR * 10000 + GRADSYNC_VERSION_MINOR * 100 + GRADSYNC_VERSION_PATCH)

#if !defined(KOKKOS_VERSION) || KOKKOS_VERSION < 30400
#error "gradsync needs Kokkos 3.4 or newer"
#endif

namespace gradsync::impl {

// Kokkos::fence(label) and ExecSpace::fence(label) appeared in 3.5; 3.4 has the unlabelled form.
// Labels are static strings: the hot path builds no std::string (no heap allocation).
template <class ExecutionSpace>
void fence(const ExecutionSpace& exec, [[maybe_unused]] const std::string& label) {
#if KOKKOS_VERSION >= 30500
  exec.fence(label);
#else
  exec.fence();
#endif
}

// Kernel and fence labels, built once.
#define GRADSYNC_LABEL(name, text)                 \
  inline const std::string& label_##name() {       \
    static const std::string s(text);              \
    return s;                                      \
  }
GRADSYNC_LABEL(pack, "gradsync::pack")
GRADSYNC_LABEL(unpack, "gradsync::unpack")
GRADSYNC_LABEL(local, "gradsync::local")
GRADSYNC_LABEL(fence_pack, "gradsync::fence_before_backend")
GRADSYNC_LABEL(fence_sync, "gradsync::synchronize")
#undef GRADSYNC_LABEL

}  // namespace gradsync::impl
