// gradsync internals: impl::SyncAccess, the one door into a GradientSync's private members.
#pragma once

#include <cstdint>
#include <utility>

namespace gradsync::impl {

// What a registration is to a checkpoint: replicated on every rank, this rank's own, or replicated
// over the ranks of a process set (ReduceOver).
enum class RegistrationKind { data_parallel, local, process_set };

// What gradsync's own helpers (DistributedOptimizer, GlobalNorm, broadcast_set_parameter) and its
// tests use of a GradientSync beyond the public API: the deferred local scale and the watched
// collectives. Each forwards to the private member it names (gradient_sync.hpp documents them).
struct SyncAccess {
  template <class S, class U>
  static void defer_local_scale(S& s, const U& t, bool defer = true) {
    s.defer_local_scale(t, defer);
  }
  template <class S, class U>
  static auto local_scale_of(const S& s, const U& t) {
    return s.local_scale_of(t);
  }
  template <class S, class U>
  static auto pending_scale(const S& s, const U& t) {
    return s.pending_scale(t);
  }
  template <class S>
  static bool local_scale_pending(const S& s) {
    return s.local_scale_pending();
  }
  template <class S>
  static void apply_local_scale(S& s) {
    s.apply_local_scale();
  }
  template <class S, class F>
  static void for_each_gradient(const S& s, F&& f) {
    s.for_each_gradient(std::forward<F>(f));
  }
  // `call` is a string literal (kept by address in reports); `world`: false for a call over a
  // process set's members only.
  template <class S, class F>
  static decltype(auto) collective(S& s, const char* call, const char* what, F&& run, bool world = true) {
    return s.helper_collective(call, what, std::forward<F>(run), world);
  }
  template <class S, class Done>
  static void watch_program(S& s, const char* what, Done&& done) {
    s.watch_program(what, std::forward<Done>(done));
  }
  template <class S>
  static void check_samples(const S& s, std::int64_t n) {
    s.check_samples(n);
  }
  template <class S>
  static void require_between_steps(const S& s, const char* call) {
    s.require_between_steps(call);
  }
  template <class S, class F>
  static void for_each_registration(const S& s, F&& f) {
    s.for_each_registration(std::forward<F>(f));
  }
  template <class S>
  static auto residual_state(S& s) {
    return s.residual_state();
  }
  template <class S>
  static int passes_into_cycle(const S& s) {
    return s.passes_into_cycle();
  }
  template <class S>
  static const auto& process_sets(const S& s) {
    return s.process_sets();
  }
  template <class S>
  static const auto& row_sparse(const S& s) {
    return s.row_sparse();
  }
  template <class S, class W>
  static void connect_process_sets(S& s, const W& world) {
    s.connect_process_sets(world);
  }
  template <class Group, class S, class T>
  static void withdraw_last(S& s, const T* data) {
    s.template withdraw_last<Group>(data);
  }
};

}  // namespace gradsync::impl
