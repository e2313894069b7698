// gradsync: the compile-time decision "is this parameter group data-parallel or local?".
#pragma once

namespace gradsync {

/// How a local (model-parallel) group's gradients are scaled at synchronize().
enum class LocalScale {
  none,        ///< left as computed: the gradient of this rank's own loss
  world_size,  ///< divided by the world size: the gradient of the global mean loss (DESIGN.md)
  samples,     ///< divided by the step's samples over every rank (set_samples(), which it needs): for a
               ///< gradient that already sums every sample's contribution, such as a table fed by an
               ///< all-to-all (DESIGN.md, "Uneven data")
};

/// Policy of a data-parallel group: gradients are averaged (or summed) over all ranks.
struct DataParallel {
  static constexpr bool is_local = false;                ///< Communicated.
  static constexpr LocalScale scale = LocalScale::none;  ///< Unused: Options (op, pre/postscale) scale the group.
};

/// Policy of a local group: gradients never leave the rank; `Scale` says how they are scaled.
template <LocalScale Scale = LocalScale::world_size>
struct KeepLocal {
  static constexpr bool is_local = true;      ///< Never communicated.
  static constexpr LocalScale scale = Scale;  ///< How synchronize() scales the group.
};

/// Specialise per group type; the primary template makes every group data-parallel.
///   template <> struct gradsync::LocalVarPolicy<Tables>
///       : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <class Group>
struct LocalVarPolicy : DataParallel {};

/// Whether Group's gradients stay on their rank (its LocalVarPolicy).
template <class Group>
inline constexpr bool is_local_v = LocalVarPolicy<Group>::is_local;

/// How Group's gradients are scaled when local (its LocalVarPolicy).
template <class Group>
inline constexpr LocalScale local_scale_v = LocalVarPolicy<Group>::scale;

}  // namespace gradsync
