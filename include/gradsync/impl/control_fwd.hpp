// gradsync internals: impl::Control and impl::wait_for, declared for code that waits through them.
//
// Control (impl/stall.hpp) is MPI-specific: it owns an MPI side channel. The generic helpers that
// only hand it their waits (impl::Watched, the process sets) need its name, not its definition, so
// they include this and compile without MPI; whoever instantiates them includes impl/stall.hpp.
#pragma once

#include "../options.hpp"
#include "wait_site.hpp"

namespace gradsync::impl {

template <class Backend>
class Control;

/// Waits for a backend request under the stall watchdog (defined in impl/stall.hpp).
template <class Backend>
void wait_for(const Backend& backend, typename Backend::Request& request, Control<Backend>& ctl, const Options& o,
              const WaitSite& site);

}  // namespace gradsync::impl
