// gradsync internals: impl::SyncAccess, the one door into a GradientSync's step pipeline.
//
// What gradsync's own helpers (DistributedOptimizer, GlobalNorm, broadcast_set_parameter, watch.hpp,
// the checkpoints) and its tests use of a GradientSync beyond the public API, written here on the
// pipeline's parts (impl/step_pipeline.hpp) so that GradientSync itself keeps the user's API. What
// a public query answers (registrations(), passes_into_cycle(), is_local(), stats(), ...) is read
// there, not here. Grouped by who uses them:
//   - the deferred local scale (DistributedOptimizer owns it, GlobalNorm reads it);
//   - DistributedOptimizer's checks and rollback of the public calls it wraps;
//   - the watched collectives (every helper that communicates, and wait_all);
//   - the process sets and row-sparse registrations the helpers reduce over;
//   - the checkpoints' error-feedback residuals.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "../tensor_traits.hpp"
#include "step_pipeline.hpp"

namespace gradsync::impl {

struct SyncAccess {
  // ---- The deferred local scale: DistributedOptimizer, GlobalNorm ----
  // Why not public: a factor the sync hands to whoever updates the parameters; a program that
  // deferred it and forgot it would apply unscaled gradients.

  // Leaves the local scale of this tensor (1/world_size and 1/N) to the caller instead of a pass of
  // its own: after synchronize() returns true the tensor holds the unscaled sum and, while
  // local_scale_pending(), for_each_gradient's `deferred` is the factor the caller must apply.
  // Takes effect only while the tensor is local; rank-local (the ranks need not agree). Legal
  // between steps only.
  template <class S, class U>
  static void defer_local_scale(S& s, const U& t, bool defer = true) {
    auto& p = s.pipe_;
    auto& e = p.registry().at(TensorTraits<U>::data(t), TensorTraits<U>::size(t), "defer_local_scale", s.rank());
    if (e.defer_scale == defer) return;
    p.step().require_between_steps(cat("defer_local_scale('", e.name, "', group ", e.group, ")"),
                                   p.options().backward_passes_per_step);
    e.defer_scale = defer;
    p.sync_plan().invalidate();  // the local segments change; nothing the ranks compare does
  }
  // Whether synchronize() left deferred factors to apply (until apply_local_scale()).
  template <class S>
  static bool local_scale_pending(const S& s) {
    return s.pipe_.step().pending;
  }
  // Applies the pending deferred scales in place, after which nothing is pending. Local; legal in
  // every state but failed.
  template <class S>
  static void apply_local_scale(S& s) {
    auto& p = s.pipe_;
    OneThread::Scope one(p.one_thread(), "apply_local_scale()", s.rank());
    p.step().require_usable("apply_local_scale()");
    if (!p.step().pending) return;
    auto cx = p.ctx();
    p.dense().apply_deferred(cx);
    fence(p.exec(), label_fence_sync());
    p.step().pending = false;
  }
  // f(data, size, is_local, deferred) for every registered gradient in registration order;
  // `deferred` is the factor its values need while local_scale_pending() (1 when not deferred).
  template <class S, class F>
  static void for_each_gradient(const S& s, F&& f) {
    const auto& p = s.pipe_;
    for (const auto& e : p.registry())
      f(e.data, e.size, e.local(), p.registry().deferred_factor(e, p.options(), p.backend().size()));
  }

  // ---- The public calls DistributedOptimizer wraps ----
  // Why not public: the optimizer checks and undoes the sync's own calls in the sync's terms.

  // set_samples()' rules (DistributedOptimizer::set_samples runs them before it turns its fold off:
  // its errors name set_samples, never an internal call).
  template <class S>
  static void check_samples(const S& s, std::int64_t n) {
    const auto& p = s.pipe_;
    p.step().check_samples(n, s.rank(), p.stats().passes, p.weighted());
  }
  // DistributedOptimizer::add's rollback when its optimizer refuses the parameter: forgets the
  // tensor at `data` that add<Group>() registered last. The plan and the checks stay marked changed
  // (at worst a redundant rebuild and comparison).
  template <class Group, class S, class T>
  static void withdraw_last(S& s, const T* data) {
    auto& registry = s.pipe_.registry();
    if (registry.size() == 0 || registry.back().data != data) return;
    if constexpr (is_set_reduced_v<Group>)
      s.pipe_.sets().withdraw(type_name<typename LocalVarPolicy<Group>::set_tag>(), data);
    registry.pop_back();
  }

  // ---- The watched collectives: every helper that communicates, and wait_all ----
  // Why not public: a helper's collective fails the sync, counts in the ledger of calls and waits
  // under the watchdog like the step's own; a program's own exchange has wait_all (watch.hpp).

  // Runs `run(watched)`, where `watched` (impl::Watched) has the backend's collectives, each waited
  // under the stall watchdog and listening for the peers' failures; `what` names them in reports.
  // An exception fails the sync like any collective phase. Collective; legal in every state but
  // open and failed. `call` is a string literal (kept by address in reports); `world`: false for a
  // call over a process set's members only, which the ledger of calls over every rank does not count.
  template <class S, class F>
  static decltype(auto) collective(S& s, const char* call, const char* what, F&& run, bool world = true) {
    auto& p = s.pipe_;
    OneThread::Scope one(p.one_thread(), call, s.rank());
    require_between_steps(s, call);
    const CallDone<std::decay_t<decltype(p.ctl())>> done{p.ctl(), world};
    return p.collective(call, [&]() -> decltype(auto) {
      return run(
          Watched<typename S::backend_type>(p.backend(), p.ctl(), p.options(), std::int64_t(p.stats().passes), what));
    });
  }
  // gradsync::wait_all (watch.hpp): the program's own requests waited under this sync's watchdog, in
  // any state but failed. Not a call of the ledger (the program's exchange may involve some ranks
  // only); a peer whose sync ended normally may still take part, so only an error ends the wait.
  template <class S, class Done>
  static void watch_program(S& s, const char* what, Done&& done) {
    auto& p = s.pipe_;
    OneThread::Scope one(p.one_thread(), "gradsync::wait_all()", s.rank());
    p.step().require_usable("gradsync::wait_all()");
    const char* outer = p.ctl().call_name();
    p.collective("gradsync::wait_all()", [&] {
      p.ctl().wait_for_program(done, p.options(), WaitSite{what, std::int64_t(p.stats().passes), -1, 0});
    });
    p.ctl().enter_call(outer);
  }
  // The state check of collective() on its own, without its failure path: GlobalNorm refuses an
  // open step before its kernel reads gradients that the step's exchange may still be writing.
  template <class S>
  static void require_between_steps(const S& s, const char* call) {
    s.pipe_.step().require_usable(call);
    if (s.pipe_.step().open())
      throw Error(cat(call,
                      " called while a step is open (mark_ready() started its exchange); call it after "
                      "synchronize() returned"));
  }

  // Options::shard: the allgather of every rank's slices (DistributedOptimizer::apply(), after its
  // update wrote them into the gradients' slices). Why not public: it sends gradient memory that
  // holds parameters, which only the optimizer means.
  template <class S>
  static void gather_slices(S& s, const char* call = "DistributedOptimizer::apply()") {
    gather_slices(s, call, [](auto&&) {});
  }
  // The same, with the update inside: update(through) updates the slices in owned() order and
  // calls through(end) once those of chunks [0, end) are in the gradients (owned_chunk_ends()),
  // so that their allgather starts while later slices are updated. One collective call.
  template <class S, class Update>
  static void gather_slices(S& s, const char* call, Update&& update) {
    collective(s, call, "allgather of the parameters' slices", [&](const auto&) {
      auto& p = s.pipe_;
      auto cx = p.ctx();
      auto& dense = p.dense();
      const auto& plan = p.sync_plan();
      dense.gather_begin();
      update([&](std::size_t end) { dense.gather_through(cx, plan, end); });
      dense.gather_end(cx, plan);
      p.sets_exchange().gather(cx);
    });
  }
  // Per slice of owned_slices() that is data-parallel: the end of its group of chunks.
  template <class S>
  static const std::vector<std::size_t>& owned_chunk_ends(const S& s) {
    return s.pipe_.sync_plan().owned_chunk_ends();
  }

  // ---- Process sets and row-sparse gradients: GlobalNorm, DistributedOptimizer,
  // broadcast_set_parameter ----
  // Why not public: the exchanges' own objects (their communicators, tensors and rows), which the
  // helpers reduce, broadcast or weigh over.

  template <class S>
  static const auto& process_sets(const S& s) {
    return s.pipe_.sets();
  }
  template <class S>
  static const auto& row_sparse(const S& s) {
    return s.pipe_.rows();
  }
  // The sets' communicators made now (collective over the sync's ranks, as at the next
  // synchronize(); validates the sets).
  template <class S, class W>
  static void connect_process_sets(S& s, const W& world) {
    s.pipe_.sets_exchange().connect(world);
    s.pipe_.refresh_owned();
  }

  // ---- The checkpoints ----
  // Why not public: the residuals are the plan's private buffer, in its fused layout.

  // This rank's error-feedback residuals (the plan's fused index space; empty without compression
  // and error_feedback, or before the plan), a signature of that space (the data-parallel tensors
  // in fused order, the chunks' ranges and formats), and the samples they were kept for. Builds the
  // plan if it is due: collective, as prepare().
  template <class V>
  struct ResidualState {
    V* data = nullptr;
    std::size_t size = 0;
    std::uint64_t layout = 0;
    std::int64_t* samples = nullptr;
  };
  template <class S>
  static auto residual_state(S& s) {
    auto& p = s.pipe_;
    if (p.options().error_feedback) s.prepare();
    ResidualState<typename S::value_type> r;
    r.data = p.dense().residual_data();
    r.size = r.data ? p.dense().residual_size() : 0;
    std::uint64_t h = fnv1a("residuals", 9);
    for (const std::string& n : p.registry().data_parallel_names_in_fused_order(p.options()))
      h = fnv1a(n.data(), n.size() + 1, h);
    for (const auto& c : p.sync_plan().chunks()) {
      const std::int64_t v[3] = {c.begin, c.end, c.kind};
      h = fnv1a(v, sizeof v, h);
    }
    r.layout = h;
    r.samples = &p.step().samples.residual;
    return r;
  }

 private:
  // Counts a helper's collective call in the ledger when it returns (not when it throws).
  template <class Control>
  struct CallDone {
    Control& ctl;
    bool counted = true;
    int unwinding = std::uncaught_exceptions();
    ~CallDone() {
      if (counted && std::uncaught_exceptions() == unwinding) ctl.call_done();
    }
  };
};

}  // namespace gradsync::impl
