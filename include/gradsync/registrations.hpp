// gradsync: Registrations, a read-only view of one GradientSync's registrations.
//
// What checkpoints and tools need to know of each registered gradient (its name, group, how it is
// reduced and how many values it holds) without its values or the sync's internals.
#pragma once

#include <cstddef>
#include <string>

namespace gradsync {

template <class Backend, class Tensor>
class GradientSync;

/// How a registered gradient is reduced, and so what a checkpoint keeps of it.
enum class RegistrationKind {
  data_parallel,  ///< summed over every rank: the same values on every rank
  local,          ///< never communicated (a local group, or register_local_var()): this rank's own
  process_set,    ///< summed over the ranks of a process set (a ReduceOver group, process_set.hpp)
};

/// A read-only view of one GradientSync's registrations, from GradientSync::registrations(). A
/// handle on the sync: cheap to copy, valid while the sync it came from lives and is not moved
/// from. Every member is local (no communication), legal in every state of the sync (failed
/// included) and allocates nothing. `Pipeline` is the sync's internal step type.
template <class Pipeline>
class Registrations {
 public:
  /// Calls f(name, group, kind, size) for every registration: the dense ones (add<Group>(tensor))
  /// first, then the row-sparse ones (add<Group>(RowSparse)), each in registration order. `name`
  /// and `group` are `const std::string&` (the default name when add() was given none), `kind` a
  /// RegistrationKind, `size` the number of values: a dense tensor's size, a row-sparse
  /// gradient's table (table rows x row width).
  template <class F>
  void for_each(F&& f) const {
    const auto& p = *pipe_;
    for (const auto& e : p.registry()) {
      bool in_set = false;
      if constexpr (Pipeline::SetsExchange::supported) in_set = p.sets().set_holding(e.data) != nullptr;
      f(e.name, e.group, kind(in_set, e.local()), e.size);
    }
    p.rows().for_each_registration([&](const std::string& name, const std::string& group, bool local, bool in_set,
                                       std::size_t n) { f(name, group, kind(in_set, local), n); });
  }

 private:
  template <class, class>
  friend class GradientSync;
  explicit Registrations(const Pipeline& pipe) : pipe_(&pipe) {}

  static RegistrationKind kind(bool in_set, bool local) {
    return in_set ? RegistrationKind::process_set : local ? RegistrationKind::local : RegistrationKind::data_parallel;
  }

  const Pipeline* pipe_;
};

}  // namespace gradsync
