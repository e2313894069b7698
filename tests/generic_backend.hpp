// A test backend: MpiBackend seen only through the backend interface's generic members (no comm(),
// no sums of wire types), as gradsync sees a backend it does not know.
#pragma once

#include <gradsync/gradsync.hpp>

namespace gradsync_test {

/// Name: a type with `static constexpr const char* value`, the backend's name().
template <class Name>
class GenericMpiBackend : private gradsync::MpiBackend {
 public:
  using MpiBackend::MpiBackend;
  using MpiBackend::Request;
  static constexpr const char* name() { return Name::value; }
  using MpiBackend::allgather;
  using MpiBackend::allreduce_max;
  using MpiBackend::allreduce_min;
  using MpiBackend::allreduce_sum;
  using MpiBackend::can_access;
  using MpiBackend::iallreduce_sum;
  using MpiBackend::rank;
  using MpiBackend::size;
  using MpiBackend::test;
  using MpiBackend::wait;
};

}  // namespace gradsync_test
