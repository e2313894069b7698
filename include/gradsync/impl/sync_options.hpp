// gradsync internals: the options a GradientSync runs with, and their validation.
//
// The environment's overrides (GRADSYNC_*) are applied, then every option is validated, before
// anything collective starts. A rank whose options are refused still joins the side channel's
// creation, to tell its peers (which have built their syncs) before it throws: their first
// collective call then fails at once, naming it.
#pragma once

#include <cmath>
#include <exception>

#include "../backend.hpp"
#include "../env.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "stall.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

inline void validate_options(const Options& o) {
  if (o.backward_passes_per_step < 1)
    throw ConfigError(cat("backward_passes_per_step must be >= 1, got ", o.backward_passes_per_step));
  auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
  if (bad(o.prescale_factor))
    throw ConfigError(cat("prescale_factor must be finite and >= 0, got ", o.prescale_factor));
  if (o.tuning.max_chunks_in_flight < 0)
    throw ConfigError(cat("max_chunks_in_flight must be >= 0 (0: by topology), got ", o.tuning.max_chunks_in_flight));
  if (std::isnan(o.tuning.in_place_min_fraction) || o.tuning.in_place_min_fraction < 0)
    throw ConfigError(cat("in_place_min_fraction must be >= 0, got ", o.tuning.in_place_min_fraction));
  if (bad(o.postscale_factor))
    throw ConfigError(cat("postscale_factor must be finite and >= 0, got ", o.postscale_factor));
  if (bad(o.stall_timeout))
    throw ConfigError(cat("stall_timeout must be finite and >= 0 seconds (0 waits forever), got ", o.stall_timeout));
  if (bad(o.tuning.stall_warning))
    throw ConfigError(
        cat("stall_warning must be finite and >= 0 seconds (0: no warning), got ", o.tuning.stall_warning));
  if (o.shard == Shard::optimizer_state) {  // what a sharded step cannot do yet, each named
    if (o.tuning.collectives == Collectives::blocking)
      throw ConfigError(
          "shard = optimizer_state needs nonblocking collectives (its reduce-scatter and allgather "
          "are two halves of a ring): collectives = blocking is refused");
    if (o.tuning.algorithm == Algorithm::hierarchical)
      throw ConfigError("shard = optimizer_state with algorithm = hierarchical: not supported yet (use flat)");
    if (o.tuning.fusion_threshold_bytes == fusion_threshold_auto)
      throw ConfigError(
          "shard = optimizer_state with fusion_threshold_auto: the slices follow the chunks, which "
          "the tuner moves; set a fusion_threshold_bytes");
  }
  if (bad(o.tuning.spin_before_yield) && o.tuning.spin_before_yield != spin_before_yield_auto)
    throw ConfigError(cat("spin_before_yield must be finite and >= 0 seconds, or spin_before_yield_auto, got ",
                          o.tuning.spin_before_yield));
}

template <class Backend>
Options prepare_options(const Options& given, const Backend& backend) {
  try {
    Options o = given.tuning.read_environment ? apply_env(given) : given;
    o.tuning.timeline = keep_timeline_path(o.tuning.timeline);
    validate_options(o);
    if (o.shard != Shard::none && !has_shard_sums<Backend>::value)
      throw ConfigError(
          cat("shard = optimizer_state needs a backend with Capability::shard_sums (a reduce-scatter "
              "and an allgather); backend '",
              Backend::name(), "' does not declare it"));
    if (o.shard != Shard::none && o.compression != Compression::none && backend.size() > 1 &&
        !has_wire_shard<Backend>::value)
      throw ConfigError(
          cat("shard = optimizer_state with compression needs a backend with Capability::wire_shard "
              "(a compressed reduce-scatter); backend '",
              Backend::name(), "' does not declare it"));
    return o;
  } catch (const std::exception& e) {
    tell_peers_at_construction(backend, given, kind_of(e),
                               cat(e.what(), " (in the GradientSync constructor on rank ", backend.rank(), ")"));
    throw;
  }
}

}  // namespace gradsync::impl
