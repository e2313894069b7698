// gradsync internals: set_samples()' factors (DESIGN.md, "Uneven data").
#pragma once

#include "../local_var_policy.hpp"
#include "../process_set.hpp"

namespace gradsync::impl {

// How a weighted sync scales a tensor that does not go through the fused exchange. `own`: this
// rank's samples in the pass, applied before any sum (per pass when aggregating); `total`: 1 / the
// step's samples over every rank, applied once at the step's end.
enum class SampleWeighting {
  none,       // as unweighted: LocalScale::none, SetScale::samples (its set divides, after the sum)
  own_total,  // own / total: LocalScale::world_size, runtime local vars with scale_local_gradients
  total,      // 1 / total: LocalScale::samples (the tensor already sums every sample's contribution)
  own,        // own, before its set's sum (which then divides by the total): SetScale::world_size
};
inline constexpr int sample_weightings = 3;  // the kinds besides none, each with its own segment list

// A group's weighting, from its policy (a data-parallel group's: none, the fused exchange weighs it).
template <class Group>
constexpr SampleWeighting sample_weighting_of() {
  if constexpr (is_set_reduced_v<Group>)
    return LocalVarPolicy<Group>::set_scale == SetScale::world_size ? SampleWeighting::own : SampleWeighting::none;
  else if constexpr (!is_local_v<Group>)
    return SampleWeighting::none;
  else
    return local_scale_v<Group> == LocalScale::world_size ? SampleWeighting::own_total
           : local_scale_v<Group> == LocalScale::samples  ? SampleWeighting::total
                                                          : SampleWeighting::none;
}

// Whether a group's policy divides by the step's samples, which only set_samples() gives.
template <class Group>
constexpr bool needs_samples() {
  if constexpr (is_set_reduced_v<Group>)
    return LocalVarPolicy<Group>::set_scale == SetScale::samples;
  else
    return is_local_v<Group> && local_scale_v<Group> == LocalScale::samples;
}

// One pass's factors. Unweighted: both 1.
template <class T>
struct SampleWeights {
  bool weighted = false;
  T own = T(1);    // this rank's samples in the pass
  T total = T(1);  // 1 / the step's samples over every rank (0 when there are none)

  // The weight before a sum and the factor after it, for a tensor weighted `w`.
  T before(SampleWeighting w) const {
    return weighted && (w == SampleWeighting::own_total || w == SampleWeighting::own) ? own : T(1);
  }
  T after(SampleWeighting w) const {
    return weighted && (w == SampleWeighting::own_total || w == SampleWeighting::total) ? total : T(1);
  }
};

}  // namespace gradsync::impl
