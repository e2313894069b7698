// gradsync: optimizers as Kokkos kernels: Sgd (momentum, Nesterov, weight decay), Adam and AdamW.
//
// Their update rules are PyTorch 1.13's torch.optim.SGD, Adam and AdamW (the single-tensor code
// path), step by step: tests/test_optimizer.cpp compares them with trajectories PyTorch produced.
//
// The optimizer interface (what DistributedOptimizer wraps; any type providing it can be wrapped):
//
//   std::size_t add(const P& param, const G& grad);
//       Registers a parameter and its gradient (tensors gradsync knows, same size) and allocates the
//       parameter's state once, in the parameter's memory space. Returns the pair's slot number.
//   void step();
//       Updates every registered parameter from its gradient.
//   void step_slots(std::size_t first, std::size_t last);                     (optional)
//       The same for slots [first, last) only (each slot stepped once per step() of the others).
//       A sharded DistributedOptimizer updates its slices chunk by chunk with it, and each chunk's
//       allgather starts as soon as its slices are updated.
//   template <class F> void for_each_state(std::size_t slot, F&& f);          (optional)
//       Calls f(value_type* data, std::size_t n) for each state buffer of a slot (memory space of the
//       parameters) and f(std::int64_t* data, std::size_t n) for its host-side counters (the step
//       count). broadcast_parameters() uses it to send the optimizer state along with parameters.
//   void set_grad_scale(std::size_t slot, value_type factor);                  (optional)
//       The slot's gradient is read as factor * grad by the next step()s. DistributedOptimizer hands
//       it the local groups' 1/world_size this way (GradientSync::defer_local_scale) instead of a
//       pass of its own; factor * grad is rounded as the pass would round it, so the update is the
//       same to the last bit (with FMA contraction of the kernel, as on GPUs, within 1 ulp).
//
// One kernel launch updates every parameter whose step count is the same (all of them, except
// after a broadcast gave local and data-parallel parameters different counts): a team per segment
// of at most 2^20 values, as in the fusion kernels. Parameters hold their new values when step()
// returns.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "impl/fusion_kernels.hpp"
#include "impl/range_index.hpp"
#include "impl/segment_table.hpp"
#include "tensor_traits.hpp"

namespace gradsync {

/// torch.optim.SGD's hyperparameters (PyTorch has no default learning rate; 0.01 here).
struct SgdOptions {
  double lr = 0.01;           ///< Learning rate (finite, >= 0).
  double momentum = 0.0;      ///< Momentum factor; 0: no momentum buffer.
  double dampening = 0.0;     ///< Dampening of the momentum (0 for Nesterov).
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient.
  bool nesterov = false;      ///< Nesterov momentum (needs momentum > 0 and dampening 0).
  bool maximize = false;      ///< Ascend the objective instead of descending it.
};

/// torch.optim.Adam's hyperparameters and defaults. weight_decay is L2 added to the gradient.
struct AdamOptions {
  double lr = 1e-3;           ///< Learning rate (finite, >= 0).
  double beta1 = 0.9;         ///< Decay of the first moment's running average, in [0, 1).
  double beta2 = 0.999;       ///< Decay of the second moment's running average, in [0, 1).
  double eps = 1e-8;          ///< Added to the denominator for numerical stability.
  double weight_decay = 0.0;  ///< L2 (Adam) or decoupled (AdamW) weight decay.
  bool amsgrad = false;       ///< Keep the maximum of the second moments (AMSGrad).
  bool maximize = false;      ///< Ascend the objective instead of descending it.
};

/// torch.optim.AdamW's defaults: as Adam's, with decoupled weight decay 1e-2.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

namespace impl {

// Kokkos::sqrt is 3.7+; 3.4 has it in Experimental (removed in 4.0).
template <class T>
KOKKOS_INLINE_FUNCTION T kokkos_sqrt(T x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::sqrt(x);
#else
  return Kokkos::Experimental::sqrt(x);
#endif
}

/// A piece of one parameter: `count` values of the parameter, its gradient and up to three state
/// buffers, from the same offset.
template <class T>
struct OptSegment {
  T* param = nullptr;
  const T* grad = nullptr;
  T* s0 = nullptr;
  T* s1 = nullptr;
  T* s2 = nullptr;
  std::int64_t count = 0;
  const T* grad_scale = nullptr;  // the slot's gradient factor (set_grad_scale), one value
};

template <class T, class MemorySpace>
using OptSegmentView = Kokkos::View<OptSegment<T>*, MemorySpace>;

// torch.optim.SGD, one element, in PyTorch's order of operations:
//   d = ±g (+ wd·p);  buf = first ? d : momentum·buf + (1 − dampening)·d;
//   d = nesterov ? d + momentum·buf : buf;  p += −lr·d
template <class T, class ExecutionSpace, class MemorySpace>
struct SgdKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  OptSegmentView<T, MemorySpace> segs;
  std::int64_t first_seg;
  T neg_lr, momentum, keep, weight_decay;  // keep = 1 - dampening
  bool use_momentum, first_step, nesterov, maximize;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const OptSegment<T> s = segs(first_seg + team.league_rank());
    const T gs = *s.grad_scale;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) { update(s, i, gs); });
  }

  KOKKOS_INLINE_FUNCTION void update(const OptSegment<T>& s, std::int64_t i, T gs) const {
    const T g = s.grad[i] * gs;  // exact when gs == 1
    T d = maximize ? -g : g;
    if (weight_decay != T(0)) d = d + weight_decay * s.param[i];
    if (use_momentum) {
      T b = first_step ? d : s.s0[i] * momentum + keep * d;
      s.s0[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    s.param[i] = s.param[i] + neg_lr * d;
  }
};

// torch.optim.Adam (decoupled = false) and AdamW (decoupled = true), one element:
//   g = ±g;  Adam: g += wd·p;  AdamW: p *= 1 − lr·wd;
//   m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g·g;  amsgrad: v̂ = max(v̂, v);
//   p += −(lr / (1 − β1^t)) · m / (sqrt(v or v̂) / sqrt(1 − β2^t) + eps)
template <class T, class ExecutionSpace, class MemorySpace>
struct AdamKernel {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  OptSegmentView<T, MemorySpace> segs;
  std::int64_t first_seg;
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  T weight_decay;   // Adam: L2 coefficient; unused by AdamW
  T decay_factor;   // AdamW: 1 - lr * weight_decay; 1 for Adam
  T neg_step_size;  // -lr / (1 - beta1^t)
  T bias_correction2_sqrt;
  bool decoupled, amsgrad, maximize;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const OptSegment<T> s = segs(first_seg + team.league_rank());
    const T gs = *s.grad_scale;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, s.count), [&](std::int64_t i) { update(s, i, gs); });
  }

  KOKKOS_INLINE_FUNCTION void update(const OptSegment<T>& s, std::int64_t i, T gs) const {
    const T g0 = s.grad[i] * gs;  // exact when gs == 1
    T g = maximize ? -g0 : g0;
    T p = s.param[i];
    if (decoupled)
      p = p * decay_factor;
    else if (weight_decay != T(0))
      g = g + weight_decay * p;
    const T m = s.s0[i] * beta1 + one_minus_beta1 * g;
    const T v = s.s1[i] * beta2 + one_minus_beta2 * g * g;
    s.s0[i] = m;
    s.s1[i] = v;
    T vv = v;
    if (amsgrad) {
      vv = s.s2[i] > v ? s.s2[i] : v;
      s.s2[i] = vv;
    }
    const T denom = kokkos_sqrt(vv) / bias_correction2_sqrt + eps;
    s.param[i] = p + neg_step_size * m / denom;
  }
};

/// What Sgd and Adam share: registered (parameter, gradient) slots, their state buffers, their
/// step counts, and the segment table the kernels read (built once, rebuilt when slots change).
template <class Tensor, int MaxState>
class OptimizerSlots {
  using traits = TensorTraits<Tensor>;
  static_assert(MaxState <= 3, "gradsync optimizers: OptSegment carries at most three state buffers");
  static_assert(is_tensor_v<Tensor>,
                "gradsync optimizers: Tensor must be a Kokkos::View, std::vector<T> or gradsync::Span<T, "
                "MemorySpace>, or have a gradsync::TensorTraits specialisation");

 public:
  using tensor_type = Tensor;
  using value_type = typename traits::value_type;
  using memory_space = typename traits::memory_space;
  using execution_space = typename traits::execution_space;
  static_assert(std::is_floating_point_v<value_type>, "gradsync optimizers: parameters must be floating point");

  std::size_t num_params() const { return slots_.size(); }
  /// Steps taken by a slot's parameter (PyTorch's state['step']).
  std::int64_t step_count(std::size_t slot) const { return slots_.at(slot).step; }

  /// The optimizer interface's gradient factor: step() reads the slot's gradient as factor * grad
  /// (1 until set). Setting it allocates nothing; a changed value is copied at the next step().
  void set_grad_scale(std::size_t slot, value_type factor) {
    Slot& s = slots_.at(slot);
    if (s.grad_scale == factor) return;
    s.grad_scale = factor;
    scales_dirty_ = true;
  }
  value_type grad_scale(std::size_t slot) const { return slots_.at(slot).grad_scale; }

  /// The optimizer interface's state visitor (see the top of this file).
  template <class F>
  void for_each_state(std::size_t slot, F&& f) {
    Slot& s = slots_.at(slot);
    for (int k = 0; k < s.nstate; ++k) f(s.state[std::size_t(k)].data(), s.size);
    f(&s.step, std::size_t(1));
  }

 protected:
  using View = Kokkos::View<value_type*, memory_space>;
  using SegView = OptSegmentView<value_type, memory_space>;

  explicit OptimizerSlots(execution_space exec) : exec_(exec) {}

  struct Slot {
    value_type* param = nullptr;
    const value_type* grad = nullptr;
    std::size_t size = 0;
    int nstate = 0;
    std::array<View, MaxState> state;
    std::int64_t step = 0;
    value_type grad_scale = 1;
    std::int64_t seg_begin = 0, seg_end = 0;
    std::shared_ptr<void> keep_param, keep_grad;  // copies of registered Views keep them alive
  };

  // Registers a pair; `labels` names the `nstate` state buffers (allocated zeroed, as PyTorch's).
  template <class P, class G>
  std::size_t add_slot(const P& param, const G& grad, int nstate, const char* const* labels, const char* who) {
    using PT = TensorTraits<P>;
    using GT = TensorTraits<G>;
    static_assert(is_tensor_v<P> && is_tensor_v<G>, "gradsync optimizer add(param, grad): not tensors gradsync knows");
    static_assert(
        std::is_same_v<typename PT::value_type, value_type> && std::is_same_v<typename GT::value_type, value_type>,
        "gradsync optimizer add(param, grad): value types differ from the optimizer's");
    static_assert(std::is_same_v<typename PT::memory_space, memory_space> &&
                      std::is_same_v<typename GT::memory_space, memory_space>,
                  "gradsync optimizer add(param, grad): tensors live in another memory space than the optimizer's");
    static_assert(PT::is_writable, "gradsync optimizer add(param, grad): a parameter must be writable (not const)");
    Slot s;
    s.param = PT::data(param);
    s.grad = GT::data(grad);
    s.size = PT::size(param);
    const std::size_t index = slots_.size();
    if (GT::size(grad) != s.size)
      throw Error(impl::cat(who, " parameter #", index, ": ", s.size, " values but its gradient has ", GT::size(grad)));
    if (!PT::is_contiguous(param) || !GT::is_contiguous(grad))
      throw Error(impl::cat(who, " parameter #", index, ": parameter and gradient must be contiguous"));
    if (by_param_.first_overlap(s.param, s.size) != Params::npos)  // O(log n): models have 100,000 parameters
      throw Error(impl::cat(who, " parameter #", index, " overlaps a parameter already registered"));
    if constexpr (Kokkos::is_view<P>::value) s.keep_param = std::make_shared<P>(param);
    if constexpr (Kokkos::is_view<G>::value) s.keep_grad = std::make_shared<G>(grad);
    s.nstate = nstate;
    for (int k = 0; k < nstate; ++k) s.state[std::size_t(k)] = View(std::string(labels[k]), s.size);
    by_param_.insert(s.param, s.size, index);
    try {
      slots_.push_back(std::move(s));
    } catch (...) {
      by_param_.erase(PT::data(param), PT::size(param), index);
      throw;
    }
    dirty_ = true;
    return index;
  }

  // Calls launch(first_seg, nsegs, step) for each run of consecutive slots of [lo, hi) with the
  // same step count (one run in the normal case), then counts their step and fences.
  template <class Launch>
  void for_each_run(Launch&& launch, std::size_t lo = 0, std::size_t hi = std::size_t(-1)) {
    if (dirty_) build_table();
    if (scales_dirty_) upload_scales();
    hi = std::min(hi, slots_.size());
    if (lo > hi) throw Error(impl::cat("optimizer step_slots(", lo, ", ", hi, "): not a range of slots"));
    for (std::size_t a = lo; a < hi;) {
      std::size_t b = a + 1;
      while (b < hi && slots_[b].step == slots_[a].step) ++b;
      const std::int64_t first = slots_[a].seg_begin, n = slots_[b - 1].seg_end - first;
      if (n > 0) launch(first, n, slots_[a].step);
      a = b;
    }
    for (std::size_t a = lo; a < hi; ++a) ++slots_[a].step;
    impl::fence(exec_, impl::label_fence_optimizer());
  }

  std::vector<Slot> slots_;
  SegView segs_;
  execution_space exec_;

 private:
  void build_table() {
    scales_ = View(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("gradsync::optimizer_grad_scales")),
                   slots_.size());
    scales_host_ = Kokkos::create_mirror_view(scales_);
    upload_scales();
    std::vector<OptSegment<value_type>> host;
    for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
      Slot& s = slots_[slot];
      s.seg_begin = std::int64_t(host.size());
      const auto state = [&](int k, std::int64_t off) {
        return k < s.nstate ? s.state[std::size_t(k)].data() + off : nullptr;
      };
      for_each_segment(s.size, [&](std::int64_t off, std::int64_t count) {
        host.push_back(OptSegment<value_type>{s.param + off, s.grad + off, state(0, off), state(1, off), state(2, off),
                                              count, scales_.data() + slot});
      });
      s.seg_end = std::int64_t(host.size());
    }
    upload_segments(host, segs_, "gradsync::optimizer_segments");
    dirty_ = false;
  }

  void upload_scales() {
    for (std::size_t k = 0; k < slots_.size(); ++k) scales_host_(k) = slots_[k].grad_scale;
    if (scales_host_.data() != scales_.data()) Kokkos::deep_copy(scales_, scales_host_);
    scales_dirty_ = false;
  }

  using Params = RangeIndex<value_type>;
  Params by_param_;  // the non-empty parameters, by address
  bool dirty_ = true;
  bool scales_dirty_ = false;
  View scales_;  // per slot, the gradient factor the kernels read
  typename View::HostMirror scales_host_;
};

inline void check_finite_nonneg(const char* who, const char* what, double x) {
  if (!std::isfinite(x) || x < 0) throw ConfigError(impl::cat(who, ": ", what, " must be finite and >= 0, got ", x));
}

}  // namespace impl

/// torch.optim.SGD as a Kokkos kernel. `Tensor` fixes the value type and memory space, as in
/// GradientSync<Backend, Tensor>; parameters of any shape with those are accepted. The momentum
/// buffer (only when momentum != 0) is allocated at add() and, as in PyTorch, set to the first
/// step's update direction without dampening. Everything is rank-local: no communication (wrap it
/// in a DistributedOptimizer for that). Also has the optimizer interface's optional members
/// (top of this file): num_params(), step_count(slot), set_grad_scale(), for_each_state().
template <class Tensor>
class Sgd : public impl::OptimizerSlots<Tensor, 1> {
  using base = impl::OptimizerSlots<Tensor, 1>;

 public:
  using typename base::execution_space;
  using typename base::memory_space;
  using typename base::value_type;

  /// Kernels run on `exec`. Validates the options (ConfigError). Local; allocates nothing.
  explicit Sgd(SgdOptions options = {}, execution_space exec = {}) : base(exec), opt_(options) { validate(); }

  /// The hyperparameters; the learning rate and the others may change between steps (a schedule),
  /// but momentum cannot be switched on after parameters were added.
  SgdOptions& options() { return opt_; }
  /// \copydoc options()
  const SgdOptions& options() const { return opt_; }

  /// Registers a parameter and its gradient (same size, contiguous); returns the pair's slot.
  /// Local; allocates the momentum buffer (zeroed) when momentum != 0, and the kernels' table is
  /// rebuilt at the next step().
  template <class P, class G>
  std::size_t add(const P& param, const G& grad) {
    static const char* const labels[] = {"gradsync::sgd_momentum_buffer"};
    return this->add_slot(param, grad, opt_.momentum != 0 ? 1 : 0, labels, "Sgd::add:");
  }

  /// Updates every registered parameter from its gradient; they hold their new values on return.
  /// Local; validates the options first (ConfigError). Allocates the kernels' table at the first
  /// step after add(), nothing otherwise.
  void step() { step_slots(0, this->slots_.size()); }
  /// The same for slots [first, last) only (the optimizer interface's optional member).
  void step_slots(std::size_t first_slot, std::size_t end_slot) {
    validate();
    if (opt_.momentum != 0)
      for (const auto& s : this->slots_)
        if (s.nstate == 0)
          throw ConfigError("Sgd: momentum was switched on after parameters were added without a momentum buffer");
    using T = value_type;
    this->for_each_run(
        [&](std::int64_t first, std::int64_t n, std::int64_t step) {
          impl::SgdKernel<T, execution_space, memory_space> k;
          k.segs = this->segs_;
          k.first_seg = first;
          k.neg_lr = T(-opt_.lr);
          k.momentum = T(opt_.momentum);
          k.keep = T(1 - opt_.dampening);
          k.weight_decay = T(opt_.weight_decay);
          k.use_momentum = opt_.momentum != 0;
          k.first_step = step == 0;  // PyTorch's momentum buffer starts as the first direction
          k.nesterov = opt_.nesterov;
          k.maximize = opt_.maximize;
          impl::launch_per_segment(impl::label_sgd(), this->exec_, n, k);
        },
        first_slot, end_slot);
  }

 private:
  void validate() const {
    impl::check_finite_nonneg("Sgd", "lr", opt_.lr);
    impl::check_finite_nonneg("Sgd", "momentum", opt_.momentum);
    impl::check_finite_nonneg("Sgd", "weight_decay", opt_.weight_decay);
    if (!std::isfinite(opt_.dampening)) throw ConfigError("Sgd: dampening must be finite");
    if (opt_.nesterov && (opt_.momentum <= 0 || opt_.dampening != 0))
      throw ConfigError("Sgd: Nesterov momentum requires a momentum and zero dampening (as in PyTorch)");
  }

  SgdOptions opt_;
};

namespace impl {

/// Adam and AdamW: the same kernel, weight decay added to the gradient (Adam) or applied to the
/// parameter (AdamW). State: exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq.
template <class Tensor, bool Decoupled>
class AdamBase : public OptimizerSlots<Tensor, 3> {
  using base = OptimizerSlots<Tensor, 3>;

 public:
  using typename base::execution_space;
  using typename base::memory_space;
  using typename base::value_type;

  explicit AdamBase(AdamOptions options, execution_space exec) : base(exec), opt_(options) { validate(); }

  /// The hyperparameters; they may change between steps, but amsgrad cannot be switched on after
  /// parameters were added.
  AdamOptions& options() { return opt_; }
  const AdamOptions& options() const { return opt_; }

  template <class P, class G>
  std::size_t add(const P& param, const G& grad) {
    static const char* const labels[] = {"gradsync::adam_exp_avg", "gradsync::adam_exp_avg_sq",
                                         "gradsync::adam_max_exp_avg_sq"};
    return this->add_slot(param, grad, opt_.amsgrad ? 3 : 2, labels, Decoupled ? "AdamW::add:" : "Adam::add:");
  }

  void step() { step_slots(0, this->slots_.size()); }
  void step_slots(std::size_t first_slot, std::size_t end_slot) {
    validate();
    if (opt_.amsgrad)
      for (const auto& s : this->slots_)
        if (s.nstate < 3)
          throw ConfigError(impl::cat(name(), ": amsgrad was switched on after parameters were added without it"));
    using T = value_type;
    this->for_each_run(
        [&](std::int64_t first, std::int64_t n, std::int64_t done) {
          // Host scalars in double, as PyTorch computes them in Python before the tensor kernels.
          const double t = double(done + 1);
          const double bias_correction1 = 1 - std::pow(opt_.beta1, t);
          const double bias_correction2 = 1 - std::pow(opt_.beta2, t);
          AdamKernel<T, execution_space, memory_space> k;
          k.segs = this->segs_;
          k.first_seg = first;
          k.beta1 = T(opt_.beta1);
          k.one_minus_beta1 = T(1 - opt_.beta1);
          k.beta2 = T(opt_.beta2);
          k.one_minus_beta2 = T(1 - opt_.beta2);
          k.eps = T(opt_.eps);
          k.weight_decay = T(opt_.weight_decay);
          k.decay_factor = T(Decoupled ? 1 - opt_.lr * opt_.weight_decay : 1.0);
          k.neg_step_size = T(-(opt_.lr / bias_correction1));
          k.bias_correction2_sqrt = T(std::sqrt(bias_correction2));
          k.decoupled = Decoupled;
          k.amsgrad = opt_.amsgrad;
          k.maximize = opt_.maximize;
          launch_per_segment(label_adam(), this->exec_, n, k);
        },
        first_slot, end_slot);
  }

 private:
  static const char* name() { return Decoupled ? "AdamW" : "Adam"; }
  void validate() const {
    check_finite_nonneg(name(), "lr", opt_.lr);
    check_finite_nonneg(name(), "eps", opt_.eps);
    check_finite_nonneg(name(), "weight_decay", opt_.weight_decay);
    for (double b : {opt_.beta1, opt_.beta2})
      if (!(b >= 0 && b < 1)) throw ConfigError(impl::cat(name(), ": betas must lie in [0, 1), got ", b));
  }

  AdamOptions opt_;
};

}  // namespace impl

/// torch.optim.Adam as a Kokkos kernel (L2 weight decay added to the gradient). Rank-local, with
/// Sgd's interface: options() (may change between steps; amsgrad not after add()), add(param, grad)
/// (allocates exp_avg, exp_avg_sq and with amsgrad max_exp_avg_sq, zeroed), step() (allocates the
/// kernels' table at the first step after add(), nothing otherwise), and the optional members.
template <class Tensor>
class Adam : public impl::AdamBase<Tensor, false> {
 public:
  /// Where the update kernels run (the tensor type's execution space).
  using execution_space = typename impl::AdamBase<Tensor, false>::execution_space;
  /// Kernels run on `exec`. Validates the options (ConfigError). Local; allocates nothing.
  explicit Adam(AdamOptions options = {}, execution_space exec = {}) : impl::AdamBase<Tensor, false>(options, exec) {}
};

/// torch.optim.AdamW as a Kokkos kernel (decoupled weight decay, default 1e-2). Rank-local, with
/// Adam's interface and allocations.
template <class Tensor>
class AdamW : public impl::AdamBase<Tensor, true> {
 public:
  /// Where the update kernels run (the tensor type's execution space).
  using execution_space = typename impl::AdamBase<Tensor, true>::execution_space;
  /// Kernels run on `exec`. Validates the options (ConfigError). Local; allocates nothing.
  explicit AdamW(AdamWOptions options = {}, execution_space exec = {}) : impl::AdamBase<Tensor, true>(options, exec) {}
};

}  // namespace gradsync
