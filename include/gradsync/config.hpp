// gradsync: version, macros and the small Kokkos compatibility layer.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

#define GRADSYNC_VERSION_MAJOR 0
#define GRADSYNC_VERSION_MINOR 1
#define GRADSYNC_VERSION_PATCH 0
#define GRADSYNC_VERSION (GRADSYNC_VERSION_MAJOR * 10000 + GRADSYNC_VERSION_MINOR * 100 + GRADSYNC_VERSION_PATCH)

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
#define GRADSYNC_LABEL(name, text)           \
  inline const std::string& label_##name() { \
    static const std::string s(text);        \
    return s;                                \
  }
GRADSYNC_LABEL(pack, "gradsync::pack")
GRADSYNC_LABEL(unpack, "gradsync::unpack")
GRADSYNC_LABEL(local, "gradsync::local")
GRADSYNC_LABEL(sgd, "gradsync::sgd_step")
GRADSYNC_LABEL(adam, "gradsync::adam_step")
GRADSYNC_LABEL(norm, "gradsync::squared_norm")
GRADSYNC_LABEL(clip, "gradsync::clip_grad_norm")
GRADSYNC_LABEL(check_finite, "gradsync::check_finite")
GRADSYNC_LABEL(process_set_scale, "gradsync::process_set_scale")
GRADSYNC_LABEL(row_sparse_scale, "gradsync::row_sparse_scale")
GRADSYNC_LABEL(row_sparse_check, "gradsync::row_sparse_check")
GRADSYNC_LABEL(row_sparse_indices, "gradsync::row_sparse_indices")
GRADSYNC_LABEL(row_sparse_values, "gradsync::row_sparse_values")
GRADSYNC_LABEL(row_sparse_merge, "gradsync::row_sparse_merge")
GRADSYNC_LABEL(row_sparse_zero, "gradsync::row_sparse_zero")
GRADSYNC_LABEL(row_sparse_scatter, "gradsync::row_sparse_scatter")
GRADSYNC_LABEL(row_sparse_compact, "gradsync::row_sparse_compact")

// Fence labels fit std::string's small buffer (15 characters with libstdc++ and libc++): Kokkos 4
// copies the label at every fence (Tools::beginFence takes it by value), so a longer one would
// allocate on the heap at every step.
#define GRADSYNC_FENCE_LABEL(name, text)                                                         \
  static_assert(sizeof(text) <= 16, "gradsync: fence label " text " longer than 15 characters"); \
  GRADSYNC_LABEL(name, text)
GRADSYNC_FENCE_LABEL(fence_pack, "gradsync:packed")
GRADSYNC_FENCE_LABEL(fence_sync, "gradsync:synced")
GRADSYNC_FENCE_LABEL(fence_optimizer, "gradsync:update")
GRADSYNC_FENCE_LABEL(fence_clip, "gradsync:clip")
GRADSYNC_FENCE_LABEL(fence_reduce, "gradsync:reduce")
GRADSYNC_FENCE_LABEL(fence_copy, "gradsync:copy")
#undef GRADSYNC_FENCE_LABEL
#undef GRADSYNC_LABEL

// A host scalar as a View, for deep_copy on an execution space instance: Kokkos::deep_copy with a
// plain scalar fences with long labels of its own (a heap allocation per call on Kokkos 4); the
// caller fences, with a short label, before reading the value.
template <class T>
using HostScalar = Kokkos::View<T, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

}  // namespace gradsync::impl
