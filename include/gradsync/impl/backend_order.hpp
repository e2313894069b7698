// gradsync internals: whether a backend's collectives are ordered after earlier work on an
// execution space instance without the host waiting for it.
//
// A backend that enqueues its collectives on a stream (NcclBackend) says so with
//   bool ordered_on(const ExecutionSpace& exec) const;
// returning true when it uses exec's own stream: GradientSync then hands it a freshly packed chunk
// without fencing first, and the GPU runs pack, allreduce and unpack back to back. Every other
// backend reads the buffer from the host, after a fence.
#pragma once

#include "../backend.hpp"

namespace gradsync::impl {

template <class Backend, class ExecutionSpace>
bool ordered_on(const Backend& b, const ExecutionSpace& exec) {
  if constexpr (has_ordered_on<Backend, ExecutionSpace>::value)
    return b.ordered_on(exec);
  else
    return false;
}

}  // namespace gradsync::impl
