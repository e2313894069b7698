// online_closure: one process's share of the simulation and of the closure's training.
//
// The periodic domain [0, 2 pi) has N = `cells` coarse cells; subdomain p of P (P = the number of
// ranks) holds cells [N p / P, N (p + 1) / P). Rank r holds subdomain r: its coarse cells, the
// `refine` fine cells under each, halos of width 2 (coarse) and 1 (fine) exchanged with its two
// neighbours over MPI. Each step:
//
//   1. coarse state u = the fine state restricted (cell averages); halo exchange;
//   2. plain coarse step ustar = u + dt * Burgers(u) on the coarse grid (under-resolved);
//   3. the fine solver advances `substeps` steps (a halo exchange before each): the reference;
//   4. target = the new fine state restricted; the closure adds a subgrid flux at every face,
//      pred_i = ustar_i + dt/dx (G_p(i) - G_p(i+1)), G_p(f) = v_p . trunk(u[f-2 .. f+1]), p the
//      subdomain of cell i (kernels.hpp);
//   5. loss L = (1/N) sum over all N cells of (pred_i - target_i)^2 / 2: backward, synchronize().
//
// The trunk is data-parallel (its gradients averaged by GradientSync); the head v_p of
// subdomain p lives on rank p only, a local group. Rank r differentiates L_r = (n/N) sum over its
// cells, so L = (1/n) sum_r L_r: the trunk's average is dL/dW, and the head's gradient dL_r/dv_r =
// n dL/dv_r is exact after KeepLocal<LocalScale::world_size> divides it by n.
//
// With --select-steep F the samples are the steep cells only, |u_{i+1} - u_{i-1}| >= F times its
// max over the whole domain: n_r of them on rank r, a number that changes every step (0 on some
// ranks). Rank r differentiates its own mean, (1/n_r) sum over its selected cells (zero with
// none), and gives n_r to set_samples(): the sync weighs each rank's gradient by n_r / N, which
// is the mean over every selected cell of the step (N = the sum over ranks and passes).
//
// The same class is the single-process reference: one process holding all P subdomains (and all
// P heads) with SelfBackend and a halo that wraps around in memory.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config.hpp"
#include "kernels.hpp"

namespace closure {

/// The data-parallel group: the trunk's parameters.
struct Trunk {};

/// Halo exchange on a periodic ring of processes, staged through host mirrors (no-ops on a host
/// build) so that it needs no CUDA-aware MPI. One process: its own other end, in a kernel.
class Halo {
 public:
  Halo(MPI_Comm comm, int width, const std::string& name) : comm_(comm), width_(width) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    left_ = (rank_ + size_ - 1) % size_;
    right_ = (rank_ + 1) % size_;
    send_ = View1(name + ".send", 2 * std::size_t(width));
    recv_ = View1(name + ".recv", 2 * std::size_t(width));
    send_h_ = Kokkos::create_mirror_view(send_);
    recv_h_ = Kokkos::create_mirror_view(recv_);
  }

  /// Fills the halo of `u` (n interior cells). The messages are waited under `sync`'s stall
  /// watchdog (gradsync::wait_all): a stopped or failed neighbour ends this rank's wait with an error
  /// naming the exchange, at the deadline or at once, instead of hanging it.
  template <class Sync>
  void exchange(const View1& u, Index n, Sync& sync) {
    if (size_ == 1) {
      Kokkos::parallel_for("closure::periodic_halo", range(width_), PeriodicHalo{u, n, width_});
      return;
    }
    Kokkos::parallel_for("closure::pack_halo", range(width_), PackHalo{u, send_, n, width_});
    Kokkos::deep_copy(send_h_, send_);  // fences: the packed values are complete before MPI reads them
    // My last cells go right while the left neighbour's last cells arrive, and the reverse.
    MPI_Request req[4];
    MPI_Irecv(recv_h_.data(), width_, MPI_DOUBLE, left_, 0, comm_, &req[0]);
    MPI_Irecv(recv_h_.data() + width_, width_, MPI_DOUBLE, right_, 1, comm_, &req[1]);
    MPI_Isend(send_h_.data() + width_, width_, MPI_DOUBLE, right_, 0, comm_, &req[2]);
    MPI_Isend(send_h_.data(), width_, MPI_DOUBLE, left_, 1, comm_, &req[3]);
    gradsync::wait_all(sync, 4, req, "halo exchange");
    Kokkos::deep_copy(recv_, recv_h_);
    Kokkos::parallel_for("closure::unpack_halo", range(width_), UnpackHalo{u, recv_, n, width_});
    bytes_ += 2 * std::uint64_t(width_) * sizeof(Real);
  }

  std::uint64_t bytes_sent() const { return bytes_; }

 private:
  MPI_Comm comm_;
  int width_, rank_ = 0, size_ = 1, left_ = 0, right_ = 0;
  View1 send_, recv_;
  View1::HostMirror send_h_, recv_h_;
  std::uint64_t bytes_ = 0;
};

/// One step's global errors against the restricted fine solution (root mean square over all cells).
struct StepErrors {
  double corrected = 0, plain = 0;
};

/// A free-running evaluation window: the coarse solver with and without the closure, both started
/// from the restricted fine state `steps` steps earlier, against the restricted fine state now.
struct RolloutErrors {
  int end_step = 0;
  double corrected = 0, plain = 0, reference = 0;  // RMS errors, and the RMS of the reference itself
};

/// gradsync::Adam with a cosine learning-rate schedule, from lr down to lr / 100 over `updates`
/// steps (then constant): a closure that stops moving at the end of training runs free more
/// steadily. Any type with add() and step() (and for_each_state, for broadcast_parameters) can go
/// into a DistributedOptimizer.
class ScheduledAdam {
 public:
  ScheduledAdam(gradsync::AdamOptions o, int updates) : adam_(o), lr0_(o.lr), updates_(std::max(updates, 1)) {}

  template <class P, class G>
  std::size_t add(const P& param, const G& grad) {
    return adam_.add(param, grad);
  }
  void step() {
    const double x = std::min(1.0, double(done_++) / double(updates_));
    adam_.options().lr = lr0_ * (0.01 + 0.99 * 0.5 * (1 + std::cos(pi * x)));
    adam_.step();
  }
  template <class F>
  void for_each_state(std::size_t slot, F&& f) {
    adam_.for_each_state(slot, std::forward<F>(f));
  }
  double lr() const { return adam_.options().lr; }
  /// The schedule's length and position (updates), for checkpoints.
  std::int64_t& updates() { return updates_; }
  std::int64_t& done() { return done_; }

 private:
  gradsync::Adam<View1> adam_;
  double lr0_;
  std::int64_t updates_, done_ = 0;
};

template <class Backend, class HeadGroup>
class Simulation {
 public:
  using Sync = gradsync::GradientSync<Backend, View1>;
  using Optimizer = gradsync::DistributedOptimizer<ScheduledAdam, Sync>;

  /// The global problem split into `subdomains` parts; this process holds parts
  /// [first_sub, first_sub + num_sub) and exchanges halos over `halo_comm` (a ring of processes,
  /// one per part, or a single process holding every part).
  Simulation(const Config& c, Backend backend, MPI_Comm halo_comm, int subdomains, int first_sub, int num_sub)
      : cfg_(c),
        backend_(backend),
        comm_(halo_comm),
        opt_(ScheduledAdam(adam_options(c), (c.schedule > 0 ? c.schedule : c.steps) / c.passes),
             Sync(std::move(backend), sync_options(c))),
        chalo_(halo_comm, coarse_halo, "closure::coarse_halo"),
        fhalo_(halo_comm, 1, "closure::fine_halo"),
        P_(subdomains),
        p0_(first_sub),
        np_(num_sub),
        H_(c.hidden) {
    if (cfg_.cells / P_ < coarse_halo)
      throw std::runtime_error("--cells " + std::to_string(cfg_.cells) + " gives a subdomain fewer than " +
                               std::to_string(coarse_halo) + " cells on " + std::to_string(P_) + " ranks");
    lo_ = start(p0_);
    n_ = start(p0_ + np_) - lo_;
    nf_ = n_ * cfg_.refine;
    dxc_ = 2 * pi / cfg_.cells;
    dxf_ = dxc_ / cfg_.refine;
    // Rank r's loss L_r = (n/N) sum over its cells: the global mean is L = (1/n) sum_r L_r.
    weight_ = Real(backend_.size()) / Real(cfg_.cells);
    force_ = Forcing{{0.6, 0.4, 0.3}, {0.3, 1.1, 2.0}, {0.5, -0.7, 0.9}};
    allocate();
    initialise();
    opt_.template add<Trunk>(w1_, gw1_, "trunk.0.weight");
    opt_.template add<Trunk>(b1_, gb1_, "trunk.0.bias");
    opt_.template add<Trunk>(w2_, gw2_, "trunk.1.weight");
    opt_.template add<Trunk>(b2_, gb2_, "trunk.1.bias");
    opt_.template add<HeadGroup>(head_, ghead_, "head");  // this process's subdomain heads: local
  }

  /// Makes every rank's trunk rank 0's (they are equal here already: Horovod's workflow).
  void broadcast_parameters() { opt_.broadcast_parameters(0); }
  /// The sync's one-time costs (consistency check, plan, buffers) before the first step; collective.
  void prepare_sync() { opt_.sync().prepare(); }

  /// Advances both solvers by dt. With `train`, one backward pass of the corrected step's loss and
  /// synchronize(); returns true when the gradients hold synchronized values (every `passes`-th
  /// pass): call apply() then.
  bool step(bool train) {
    const Real t = Real(step_) * cfg_.dt;
    Kokkos::parallel_for("closure::restrict", range(n_), Restrict{fine_, coarse_, 1, coarse_halo, cfg_.refine});
    chalo_.exchange(coarse_, n_, opt_.sync());
    Kokkos::parallel_for("closure::coarse_step", range(n_),
                         BurgersStep{coarse_, ustar_, coarse_halo, 0, lo_, dxc_, cfg_.dt, cfg_.nu, t, force_});
    if (rollout_ > 0) advance_rollouts(t);

    const Real dtf = cfg_.fine_dt();
    for (int s = 0; s < cfg_.substeps; ++s) {
      fhalo_.exchange(fine_, nf_, opt_.sync());
      Kokkos::parallel_for(
          "closure::fine_step", range(nf_),
          BurgersStep{fine_, fine_next_, 1, 1, lo_ * cfg_.refine, dxf_, dtf, cfg_.nu, t + Real(s) * dtf, force_});
      std::swap(fine_, fine_next_);
    }
    Kokkos::parallel_for("closure::restrict", range(n_), Restrict{fine_, target_, 1, 0, cfg_.refine});

    forward(coarse_, ustar_, pred_);
    double sums[3] = {0, 0, 0};
    Kokkos::parallel_reduce("closure::error", range(n_), SquaredDistance{pred_, target_, 0, 0}, sums[0]);
    Kokkos::parallel_reduce("closure::error", range(n_), SquaredDistance{ustar_, target_, 0, 0}, sums[1]);
    bool synced = false;
    if (train) {
      if (cfg_.selecting()) select_samples();
      backward();
      Kokkos::fence();
      // This pass's count, before its synchronize(); weights off, each rank's mean counts the same.
      if (cfg_.selecting() && cfg_.sample_weights) opt_.set_samples(selected_);
      synced = opt_.synchronize();
    }
    sums[2] = double(train ? selected_ : 0);
    backend_.allreduce_sum(sums, 3);
    last_ = StepErrors{std::sqrt(sums[0] / cfg_.cells), std::sqrt(sums[1] / cfg_.cells)};
    loss_ = Real(0.5) * sums[0] / cfg_.cells;
    selected_total_ = Index(sums[2]);
    ++step_;
    if (rollout_ > 0 && --roll_left_ == 0) finish_rollout();
    return synced;
  }

  /// The loss L of the last step's coarse state with the current parameters (with --select-steep,
  /// the mean over the last training pass's selected cells): the forward pass alone, for
  /// finite-difference checks of the backward pass. Collective.
  Real loss_now() {
    forward(coarse_, ustar_, pred_);
    Real s[2] = {0, Real(selected_)};
    if (cfg_.selecting())
      Kokkos::parallel_reduce("closure::error", range(n_), SelectedSquaredDistance{pred_, target_, selected_cells_},
                              s[0]);
    else
      Kokkos::parallel_reduce("closure::error", range(n_), SquaredDistance{pred_, target_, 0, 0}, s[0]);
    backend_.allreduce_sum(s, 2);
    if (!cfg_.selecting()) return Real(0.5) * s[0] / cfg_.cells;
    return s[1] > 0 ? Real(0.5) * s[0] / s[1] : Real(0);
  }

  /// Adds delta to value i of a parameter.
  static void nudge(const View1& param, Index i, Real delta) {
    Kokkos::parallel_for("closure::nudge", range(1), AddAt{param, i, delta});
    Kokkos::fence();
  }

  /// The optimizer step on the synchronized gradients.
  void apply() {
    opt_.apply();
    Kokkos::fence();
  }

  /// Runs free-running evaluation windows of `steps` steps back to back from the next step on
  /// (0: none). Collective.
  void enable_rollouts(int steps) {
    rollout_ = steps;
    roll_left_ = 0;
  }

  /// The sum of squares of every parameter of the global model (the trunk once, every head): per
  /// subdomain, then the trunk, added in a fixed order. Collective.
  double digest() const {
    std::vector<double> part(std::size_t(P_) + 1, 0.0);  // the last: the trunk (rank 0's)
    for (int p = p0_; p < p0_ + np_; ++p)
      for (Real x : examples::to_host(head(p, false))) part[std::size_t(p)] += double(x) * double(x);
    if (backend_.rank() == 0)
      for (const auto& [name, v] : trunk(false))
        for (Real x : examples::to_host(v)) part.back() += double(x) * double(x);
    backend_.allreduce_sum(part.data(), part.size());  // one nonzero term per entry
    double sum = 0;
    for (double x : part) sum += x;
    return sum;
  }

#if defined(GRADSYNC_HAVE_HDF5)
  /// Writes the closure's parameters with their Adam state and schedule, and the solver's state
  /// (its step, the fine field of this process's subdomains) to the checkpoint `path`. The heads
  /// are one table of P rows, this process's subdomains its rows. Between optimizer steps.
  void save(const std::string& path) {
    std::int64_t step = step_;
    gradsync::save_checkpoint(opt_, path, checkpoint_state(step));
  }
  /// Reads them back (the same subdomains per rank as the writer's).
  void load(const std::string& path) {
    std::int64_t step = 0;
    gradsync::load_checkpoint(opt_, path, checkpoint_state(step));
    step_ = int(step);
  }
#endif

  // ---- inspection ----
  int step_count() const { return step_; }
  Real loss() const { return loss_; }  // the global loss L of the last step (before its update)
  /// The training cells of the last pass (--select-steep; every cell without): this process's, all.
  Index selected() const { return selected_; }
  Index selected_total() const { return selected_total_; }
  const StepErrors& errors() const { return last_; }
  const std::vector<RolloutErrors>& rollouts() const { return windows_; }
  Index local_cells() const { return n_; }
  Index first_cell() const { return lo_; }
  int hidden() const { return H_; }
  const Optimizer& optimizer() const { return opt_; }
  const Sync& sync() const { return opt_.sync(); }
  std::uint64_t halo_bytes() const { return chalo_.bytes_sent() + fhalo_.bytes_sent(); }

  /// The trunk's parameters (grads = false) or gradients, by name, in registration order.
  /// --shard: this rank's slices of the trunk's gradients (where a sharded sync leaves the average).
  const auto& owned_slices() const { return opt_.sync().owned_slices(); }

  std::vector<std::pair<std::string, View1>> trunk(bool grads) const {
    return {{"trunk.0.weight", grads ? gw1_ : w1_},
            {"trunk.0.bias", grads ? gb1_ : b1_},
            {"trunk.1.weight", grads ? gw2_ : w2_},
            {"trunk.1.bias", grads ? gb2_ : b2_}};
  }
  /// Subdomain p's head (p among this process's parts): parameters or gradient, H values.
  View1 head(int p, bool grads) const {
    const Index h = H_, k = p - p0_;
    return Kokkos::subview(grads ? ghead_ : head_, std::make_pair(k * h, (k + 1) * h));
  }

#if defined(GRADSYNC_HAVE_HDF5)
  gradsync::CheckpointState checkpoint_state(std::int64_t& step) {
    gradsync::CheckpointState st;
    st.shard("head", gradsync::RowShard{std::uint64_t(p0_), std::uint64_t(P_), std::uint64_t(H_)});
    st.replicated(opt_.optimizer().updates(), "lr_schedule.updates");
    st.replicated(opt_.optimizer().done(), "lr_schedule.done");
    st.replicated(step, "solver.step");
    st.local(Kokkos::subview(fine_, std::make_pair(Index(1), Index(1) + nf_)),
             "solver.fine." + std::to_string(p0_) + "+" + std::to_string(np_));
    return st;
  }
#endif

  /// This process's selected cells in the last training pass (1: a sample), on the host.
  std::vector<int> selection() const {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), selected_cells_);
    return std::vector<int>(h.data(), h.data() + h.size());
  }

  /// The interior of the named field on the host: "fine", "target" (the fine one restricted),
  /// "plain" and "corrected" (the rollouts).
  std::vector<Real> field(const std::string& which) const {
    const bool fine = which == "fine";
    const View1 src = fine ? fine_ : which == "target" ? target_ : which == "plain" ? roll_plain_ : roll_corr_;
    const int halo = fine ? 1 : which == "target" ? 0 : coarse_halo;
    const Index n = fine ? nf_ : n_;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
    return std::vector<Real>(h.data() + halo, h.data() + halo + n);
  }

 private:
  static gradsync::AdamOptions adam_options(const Config& c) {
    gradsync::AdamOptions o;
    o.lr = c.lr;
    return o;
  }
  static gradsync::Options sync_options(const Config& c) {
    gradsync::Options o;
    o.backward_passes_per_step = c.passes;  // the gradient of `passes` solver steps per update
    // Unweighted selection: the plain mean of the (rank, pass) means, 1/(n passes) each, the
    // counterpart of the weighted mean over every sample of the step (which covers the passes).
    o.average_aggregated_gradients = c.selecting() && !c.sample_weights;
    if (c.shard) o.shard = gradsync::Shard::optimizer_state;
    return o;
  }

  Index start(int p) const { return Index(cfg_.cells) * p / P_; }

  void allocate() {
    const std::size_t n = std::size_t(n_), H = std::size_t(H_), faces = n + 1;
    fine_ = View1("closure::fine", std::size_t(nf_) + 2);
    fine_next_ = View1("closure::fine_next", std::size_t(nf_) + 2);
    coarse_ = View1("closure::coarse", n + 2 * coarse_halo);
    ustar_ = View1("closure::ustar", n);
    target_ = View1("closure::target", n);
    pred_ = View1("closure::pred", n);
    dc_ = View1("closure::dc", n);
    roll_plain_ = View1("closure::rollout_plain", n + 2 * coarse_halo);
    roll_corr_ = View1("closure::rollout_corrected", n + 2 * coarse_halo);
    roll_tmp_ = View1("closure::rollout_step", n);
    roll_pred_ = View1("closure::rollout_pred", n);
    x_ = Matrix("closure::x", faces, std::size_t(face_stencil));
    a1_ = Matrix("closure::a1", faces, H);
    a2_ = Matrix("closure::a2", faces, H);
    dz1_ = Matrix("closure::dz1", faces, H);
    dz2_ = Matrix("closure::dz2", faces, H);
    w1_ = View1("trunk.0.weight", H * face_stencil);
    gw1_ = View1("trunk.0.weight.grad", H * face_stencil);
    b1_ = View1("trunk.0.bias", H);
    gb1_ = View1("trunk.0.bias.grad", H);
    w2_ = View1("trunk.1.weight", H * H);
    gw2_ = View1("trunk.1.weight.grad", H * H);
    b2_ = View1("trunk.1.bias", H);
    gb2_ = View1("trunk.1.bias.grad", H);
    head_ = View1("closure::head", std::size_t(np_) * H);
    ghead_ = View1("closure::head.grad", std::size_t(np_) * H);
    sub_ = Kokkos::View<int*, Kokkos::LayoutRight, Mem>("closure::subdomain", n);
    first_ = IndexView("closure::subdomain_first", std::size_t(np_) + 1);
    selected_cells_ = Mask("closure::selected", n);
  }

  void initialise() {
    // Which local part each cell belongs to, and where each part starts.
    auto sub = Kokkos::create_mirror_view(sub_);
    auto first = Kokkos::create_mirror_view(first_);
    for (int k = 0; k <= np_; ++k) first(k) = start(p0_ + k) - lo_;
    for (int k = 0; k < np_; ++k)
      for (Index i = first(k); i < first(k + 1); ++i) sub(i) = k;
    Kokkos::deep_copy(sub_, sub);
    Kokkos::deep_copy(first_, first);
    Kokkos::deep_copy(selected_cells_, 1);  // without --select-steep every cell is a sample
    selected_ = n_;

    Kokkos::parallel_for("closure::initial_state", range(nf_), InitialState{fine_, 1, lo_ * cfg_.refine, dxf_});
    // Glorot-uniform trunk, small heads: the untrained closure barely changes the coarse step.
    // Values come from (seed, tensor, global index): the same whichever process holds them.
    const std::uint64_t s = cfg_.seed;
    const double H = H_;
    auto init = [&](const View1& v, std::uint64_t tag, Index offset, double bound) {
      Kokkos::parallel_for("closure::init", range(Index(v.size())), InitUniform{v, s, tag, offset, Real(bound)});
    };
    init(w1_, 1, 0, std::sqrt(6.0 / (face_stencil + H)));
    init(b1_, 2, 0, 0.1);
    init(w2_, 3, 0, std::sqrt(6.0 / (2 * H)));
    init(b2_, 4, 0, 0.1);
    init(head_, 5, Index(p0_) * H_, 0.05);
    Kokkos::fence();
  }

  void forward(const View1& u, const View1& ustar, const View1& pred) {
    Kokkos::parallel_for("closure::trunk", range(n_ + 1), TrunkForward{u, w1_, b1_, w2_, b2_, x_, a1_, a2_, H_});
    Kokkos::parallel_for("closure::flux_correction", range(n_),
                         FluxCorrection{ustar, pred, head_, sub_, a2_, H_, cfg_.dt / dxc_});
  }

  // --select-steep: this step's training cells, the steep ones of the coarse state u (its halo
  // exchanged), and the weight of this process's mean loss over them. The max is the whole
  // domain's (over the halo ring: every rank, or the one process holding every subdomain).
  void select_samples() {
    const Steepness steep{coarse_, coarse_halo};
    Real max = 0;
    Kokkos::parallel_reduce("closure::steepest", range(n_), steep, Kokkos::Max<Real>(max));
    MPI_Allreduce(MPI_IN_PLACE, &max, 1, MPI_DOUBLE, MPI_MAX, comm_);
    Index count = 0;
    Kokkos::parallel_reduce("closure::select", range(n_),
                            SelectSteep{steep, selected_cells_, Real(cfg_.select_steep) * max}, count);
    selected_ = count;
    weight_ = count > 0 ? Real(1) / Real(count) : Real(0);  // none selected: zero gradients
  }

  // dL_proc / d(every parameter), L_proc = weight * sum over this process's selected cells of e^2 / 2.
  void backward() {
    const Index faces = n_ + 1;
    Kokkos::parallel_for("closure::loss_seed", range(n_),
                         LossSeed{pred_, target_, dc_, selected_cells_, weight_, cfg_.dt / dxc_});
    Kokkos::parallel_for("closure::head_gradient", range(Index(np_) * H_), HeadGradient{dc_, ghead_, a2_, first_, H_});
    Kokkos::parallel_for("closure::head_backward", range(faces * H_),
                         HeadBackward{dc_, head_, sub_, a2_, dz2_, n_, H_});
    Kokkos::parallel_for("closure::dense_gradient", range(Index(H_) * (H_ + 1)),
                         DenseWeightGradient{dz2_, a1_, gw2_, gb2_, H_, faces});
    Kokkos::parallel_for("closure::hidden_backward", range(faces * H_), HiddenBackward{dz2_, a1_, dz1_, w2_, H_});
    Kokkos::parallel_for("closure::dense_gradient", range(Index(H_) * (face_stencil + 1)),
                         DenseWeightGradient{dz1_, x_, gw1_, gb1_, face_stencil, faces});
  }

  // The two free-running coarse solvers, one step from t (before the training pass: they use the
  // forward's scratch).
  void advance_rollouts(Real t) {
    if (roll_left_ == 0) {  // a new window starts from the restricted fine state
      Kokkos::parallel_for("closure::rollout_start", range(n_),
                           CopyInterior{coarse_, roll_plain_, coarse_halo, coarse_halo});
      Kokkos::parallel_for("closure::rollout_start", range(n_),
                           CopyInterior{coarse_, roll_corr_, coarse_halo, coarse_halo});
      roll_left_ = rollout_;
    }
    for (View1* u : {&roll_plain_, &roll_corr_}) {
      chalo_.exchange(*u, n_, opt_.sync());
      Kokkos::parallel_for("closure::rollout_step", range(n_),
                           BurgersStep{*u, roll_tmp_, coarse_halo, 0, lo_, dxc_, cfg_.dt, cfg_.nu, t, force_});
      const View1 next = u == &roll_corr_ ? roll_pred_ : roll_tmp_;
      if (u == &roll_corr_) forward(roll_corr_, roll_tmp_, roll_pred_);
      Kokkos::parallel_for("closure::rollout_copy", range(n_), CopyInterior{next, *u, 0, coarse_halo});
    }
  }

  void finish_rollout() {
    double sums[3] = {0, 0, 0};
    Kokkos::parallel_reduce("closure::rollout_error", range(n_), SquaredDistance{roll_corr_, target_, coarse_halo, 0},
                            sums[0]);
    Kokkos::parallel_reduce("closure::rollout_error", range(n_), SquaredDistance{roll_plain_, target_, coarse_halo, 0},
                            sums[1]);
    Kokkos::parallel_reduce("closure::rollout_error", range(n_), SquaredNorm{target_, 0}, sums[2]);
    backend_.allreduce_sum(sums, 3);
    windows_.push_back(RolloutErrors{step_, std::sqrt(sums[0] / cfg_.cells), std::sqrt(sums[1] / cfg_.cells),
                                     std::sqrt(sums[2] / cfg_.cells)});
  }

  Config cfg_;
  Backend backend_;  // a copy for the error sums (MpiBackend copies share one communicator)
  MPI_Comm comm_;    // the halo ring: the selection's max
  Optimizer opt_;
  Halo chalo_, fhalo_;
  int P_, p0_, np_, H_;
  Index lo_ = 0, n_ = 0, nf_ = 0;
  Real dxc_ = 0, dxf_ = 0, weight_ = 1;
  Forcing force_{};

  View1 fine_, fine_next_, coarse_, ustar_, target_, pred_, dc_;
  View1 roll_plain_, roll_corr_, roll_tmp_, roll_pred_;
  Matrix x_, a1_, a2_, dz1_, dz2_;
  View1 w1_, b1_, w2_, b2_, head_, gw1_, gb1_, gw2_, gb2_, ghead_;
  Kokkos::View<int*, Kokkos::LayoutRight, Mem> sub_;
  IndexView first_;
  Mask selected_cells_;
  Index selected_ = 0, selected_total_ = 0;

  int step_ = 0, rollout_ = 0, roll_left_ = 0;
  Real loss_ = 0;
  StepErrors last_;
  std::vector<RolloutErrors> windows_;
};

}  // namespace closure
