// online_closure: a Kokkos simulation that trains its own closure model online, over MPI ranks.
//
//   mpirun -np 4 online_closure                       # train; the corrected solver's error falls
//   mpirun -np 4 online_closure --plot closure.png    # ... and plot the field and the error curves
//   mpirun -np 4 online_closure --check               # prove: n ranks == 1 process, to 1e-10
//   mpirun -np 4 online_closure --check --local-scale none   # the bug local groups prevent: factor n
//   mpirun -np 4 online_closure --check --select-steep 0.7   # uneven samples per rank: set_samples()
//   ... --select-steep 0.7 --sample-weights off              # the plain average instead: fails
//
// Viscous Burgers on a periodic domain, finite volumes, decomposed over the ranks with halo
// exchange. A coarse solver runs next to a fine one (the reference, computed on the fly); a small
// network corrects each coarse step and is trained online, every solver step a backward pass,
// `--passes` passes per optimizer step (backward_passes_per_step). Its trunk is data-parallel; each
// subdomain's head is a gradsync local group. See simulation.hpp and docs/ONLINE_CLOSURE.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <gradsync/gradsync.hpp>
#include <limits>
#include <string>
#include <vector>

#include "config.hpp"
#include "simulation.hpp"

// The heads' group. --local-scale picks one at run time; the policy is a compile-time trait.
struct Heads {};
struct HeadsUnscaled {};
template <>
struct gradsync::LocalVarPolicy<Heads> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<HeadsUnscaled> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

#ifndef ONLINE_CLOSURE_PLOT_SCRIPT
#define ONLINE_CLOSURE_PLOT_SCRIPT "plot_closure.py"
#endif

namespace {

using closure::Config;
using closure::Real;
using closure::View1;

using examples::max_over_ranks;
using examples::sum_over_ranks;
using examples::to_host;
using examples::world_rank;
using examples::world_size;

template <class Group>
const char* scale_name() {
  return gradsync::local_scale_v<Group> == gradsync::LocalScale::world_size ? "LocalScale::world_size"
                                                                            : "LocalScale::none";
}

/// max|a - b| / max|b|: a whole tensor's error relative to its largest reference value.
double rel_diff(const std::vector<Real>& a, const std::vector<Real>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  if (ref == 0) return diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  return diff / ref;
}

struct Worst {
  double value = 0;
  std::string what;
  void add(double v, const std::string& w) {
    if (std::isnan(v)) v = std::numeric_limits<double>::infinity();  // NaN counts as worst
    if (v > value || what.empty()) value = std::max(v, value), what = w;
  }
};

/// The worst value over all ranks and its description, from the rank that holds it.
Worst worst_over_ranks(const Worst& mine) {
  struct {
    double value;
    int rank;
  } w{mine.value, world_rank()};
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  int len = int(mine.what.size());
  MPI_Bcast(&len, 1, MPI_INT, w.rank, MPI_COMM_WORLD);
  std::vector<char> name(std::size_t(len) + 1, '\0');
  if (w.rank == world_rank()) std::copy(mine.what.begin(), mine.what.end(), name.begin());
  MPI_Bcast(name.data(), len + 1, MPI_CHAR, w.rank, MPI_COMM_WORLD);
  return Worst{w.value, name.data()};
}

void print_problem(const Config& c, int n) {
  if (world_rank() != 0) return;
  std::printf(
      "online_closure: viscous Burgers on [0, 2 pi), periodic, nu %g, forced; %d rank%s, one subdomain each\n"
      "  coarse grid %d cells (dt %g), fine reference %d cells (%d steps of %g per coarse step)\n"
      "  closure: a subgrid flux at every face, trunk %d-%d-%d (tanh) data-parallel, one head (%d weights) per\n"
      "  subdomain local\n"
      "  training: Adam lr %g, backward_passes_per_step %d (one pass per solver step)\n",
      c.nu, n, n == 1 ? "" : "s", c.cells, c.dt, c.cells * c.refine, c.substeps, c.fine_dt(), closure::face_stencil,
      c.hidden, c.hidden, c.hidden, c.lr, c.passes);
  if (c.selecting())
    std::printf(
        "  samples: the cells with |du/dx| >= %g x its max over the domain, each rank's mean loss over its own;\n"
        "  %s\n",
        c.select_steep,
        c.sample_weights ? "set_samples(count) every pass: the sync weighs rank r by n_r / N"
                         : "--sample-weights off: no set_samples(), the plain average of the ranks' means");
}

/// The hand-written backward pass against central finite differences of the loss, on the
/// single-process model (one backward pass per update, so the synchronized gradients are dL/dθ
/// itself): a few values of every trunk tensor and of every subdomain's head. Returns the largest
/// |analytic - numeric| relative to the tensor's largest gradient.
template <class Group>
double gradient_check(Config c, int subdomains, std::string& worst) {
  c.passes = 1;
  c.sample_weights = true;
  closure::Simulation<gradsync::SelfBackend, Group> sim(c, gradsync::SelfBackend(), MPI_COMM_SELF, subdomains, 0,
                                                        subdomains);
  for (int k = 0; k < 3; ++k) sim.step(false);  // a state with some structure
  if (!sim.step(true)) throw std::runtime_error("gradient check: the gradients were not synchronized");
  std::vector<std::pair<std::string, std::pair<View1, View1>>> tensors;
  const auto params = sim.trunk(false), grads = sim.trunk(true);
  for (std::size_t t = 0; t < params.size(); ++t)
    tensors.push_back({params[t].first, {params[t].second, grads[t].second}});
  for (int p = 0; p < subdomains; ++p)
    tensors.push_back({"head " + std::to_string(p), {sim.head(p, false), sim.head(p, true)}});
  double worst_value = 0;
  int checked = 0;
  for (const auto& [name, pg] : tensors) {
    const auto g = to_host(pg.second), p = to_host(pg.first);
    double gmax = 0;
    for (Real v : g) gmax = std::max(gmax, std::abs(v));
    const std::size_t n = g.size();
    for (std::size_t i : {std::size_t(0), n / 3, n / 2, n - 1}) {
      const Real h = Real(1e-5) * std::max(Real(1), std::abs(p[i]));
      sim.nudge(pg.first, closure::Index(i), h);
      const Real up = sim.loss_now();
      sim.nudge(pg.first, closure::Index(i), -2 * h);
      const Real down = sim.loss_now();
      sim.nudge(pg.first, closure::Index(i), h);
      const double numeric = (up - down) / (2 * h);
      const double diff = gmax > 0 ? std::abs(g[i] - numeric) / gmax : std::abs(g[i] - numeric);
      if (!(diff <= worst_value)) {  // NaN counts as worst
        worst_value = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff;
        worst = name + "[" + std::to_string(i) + "]";
      }
      ++checked;
    }
  }
  if (world_rank() == 0)
    std::printf(
        "gradient check (1 process, %d subdomains): the backward pass against central finite differences of the\n"
        "  loss, %d values of %zu tensors: max |analytic - numeric| / max |gradient| = %.1e (worst: %s)\n",
        subdomains, checked, tensors.size(), worst_value, worst.c_str());
  return worst_value;
}

template <class Group>
int run_check(const Config& c) {
  using Dist = closure::Simulation<gradsync::MpiBackend, Group>;
  using Ref = closure::Simulation<gradsync::SelfBackend, Group>;
  const int n = world_size(), me = world_rank();
  Dist dist(c, gradsync::MpiBackend(MPI_COMM_WORLD), MPI_COMM_WORLD, n, me, 1);
  // The reference: every rank also runs the single-process model (the whole domain, all n
  // subdomains and their n heads, SelfBackend, no MPI) from the same seed, in this process. With
  // --select-steep it is always weighted: the mean over every selected cell, whatever the n ranks do.
  Config rc = c;
  rc.sample_weights = true;
  Ref ref(rc, gradsync::SelfBackend(), MPI_COMM_SELF, n, 0, n);
  print_problem(c, n);
  if (me == 0)
    std::printf(
        "check: %d ranks vs the single-process model on the same global problem, %d solver steps\n"
        "       (%d optimizer steps), heads %s; the loss and the fine state at every step, every\n"
        "       gradient and parameter at every optimizer step; tolerance 1e-10\n",
        n, c.steps, c.steps / c.passes, scale_name<Group>());
  // First, the backward pass itself (the n-rank vs 1-process comparison cannot see a wrong
  // derivative that both share).
  std::string fd_worst;
  const double fd = gradient_check<Group>(c, n, fd_worst);
  const double fd_tol = 1e-6;
  const double tol = 1e-10;
  double ratio0 = 1;
  bool have_ratio = false;
  Worst overall;
  long long fewest = std::numeric_limits<long long>::max(), most = 0, empty = 0;  // samples per rank and pass
  long long pass_min = std::numeric_limits<long long>::max(), pass_max = 0;       // ... over all ranks
  for (int step = 0; step < c.steps; ++step) {
    const bool synced_d = dist.step(true), synced_r = ref.step(true);
    Worst state, grads, params;
    state.add(std::abs(dist.loss() - ref.loss()) / std::abs(ref.loss()), "loss");
    {  // this rank's cells of the restricted fine state (the decomposed solver itself)
      const auto a = dist.field("target"), b = ref.field("target");
      const std::vector<Real> mine(b.begin() + dist.first_cell(), b.begin() + dist.first_cell() + dist.local_cells());
      state.add(rel_diff(a, mine), "fine state");
    }
    long long lo = 0, hi = 0;
    if (c.selecting()) {  // the same cells as the single process's, not only as many
      const auto a = dist.selection(), b = ref.selection();
      const bool same = std::equal(a.begin(), a.end(), b.begin() + dist.first_cell());
      state.add(same ? 0 : std::numeric_limits<double>::infinity(), "selected cells");
      long long v[3] = {dist.selected(), -dist.selected(), dist.selected() == 0};
      MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, v + 2, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      lo = v[0], hi = -v[1];
      fewest = std::min(fewest, lo), most = std::max(most, hi), empty += v[2];
      pass_min = std::min<long long>(pass_min, ref.selected_total());
      pass_max = std::max<long long>(pass_max, ref.selected_total());
    }
    if (synced_d != synced_r) state.add(std::numeric_limits<double>::infinity(), "synchronize() result");
    double ratio = 1;
    if (synced_d && synced_r) {
      for (const auto& [name, g] : dist.trunk(true))
        for (const auto& [rname, rg] : ref.trunk(true))
          if (name == rname) {
            std::vector<Real> a = to_host(g), b = to_host(rg);
            if (c.shard)  // sharded: the average is only in this rank's slices; compare those
              for (std::size_t i = 0; i < a.size(); ++i) {
                bool mine = false;
                for (const auto& [p, count] : dist.owned_slices())
                  mine = mine || (g.data() + i >= p && g.data() + i < p + count);
                if (!mine) a[i] = b[i];
              }
            grads.add(rel_diff(a, b), name + " gradient");
          }
      const auto a = to_host(dist.head(me, true)), b = to_host(ref.head(me, true));
      grads.add(rel_diff(a, b), "head " + std::to_string(me) + " gradient");
      double ab = 0, bb = 0;  // least-squares factor between the n-rank and 1-process head gradients
      for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) ab += a[i] * b[i], bb += b[i] * b[i];
      ab = sum_over_ranks(ab);
      bb = sum_over_ranks(bb);
      ratio = bb > 0 ? ab / bb : 1;
      if (!have_ratio) ratio0 = ratio, have_ratio = true;
      dist.apply();
      ref.apply();
      for (const auto& [name, p] : dist.trunk(false))
        for (const auto& [rname, rp] : ref.trunk(false))
          if (name == rname) params.add(rel_diff(to_host(p), to_host(rp)), name);
      params.add(rel_diff(to_host(dist.head(me, false)), to_host(ref.head(me, false))), "head " + std::to_string(me));
    }
    const double ms = max_over_ranks(state.value), mg = max_over_ranks(grads.value), mp = max_over_ranks(params.value);
    for (const Worst* w : {&state, &grads, &params})
      if (!w->what.empty()) overall.add(w->value, "step " + std::to_string(step) + ", " + w->what);
    if (me == 0) {
      std::printf("  step %2d  loss %.12e (1 process %.12e)  max rel diff: loss and state %.1e", step, dist.loss(),
                  ref.loss(), ms);
      if (synced_d)
        std::printf(", gradients %.1e (heads n-rank / 1-process = %.6f), parameters after the update %.1e", mg, ratio,
                    mp);
      if (c.selecting()) std::printf("; samples %lld, per rank %lld to %lld", (long long)ref.selected_total(), lo, hi);
      std::printf("\n");
    }
  }
  const Worst worst = worst_over_ranks(overall);
  const bool fd_ok = fd <= fd_tol;  // the same on every rank: the same computation
  const bool ok = worst.value <= tol && fd_ok;
  if (me == 0 && c.selecting())
    std::printf(
        "samples: %lld to %lld of %d cells per pass, %lld to %lld per rank and pass; %lld of %d (rank, pass) pairs "
        "had none\n",
        pass_min, pass_max, c.cells, fewest, most, empty, n * c.steps);
  if (me == 0) {
    if (!fd_ok)
      std::printf("check FAILED: the backward pass differs from finite differences by %.3e > %.0e (worst: %s)\n", fd,
                  fd_tol, fd_worst.c_str());
    if (worst.value <= tol)
      std::printf(
          "check %s: %d rank%s reproduce the single-process model, max relative difference %.1e <= %.0e "
          "(worst: %s)\n",
          ok ? "PASSED" : "FAILED", n, n == 1 ? "" : "s", worst.value, tol, worst.what.c_str());
    else {
      std::printf("check FAILED: max relative difference %.3e > %.0e (worst: %s)\n", worst.value, tol,
                  worst.what.c_str());
      if (c.selecting() && !c.sample_weights)
        std::printf(
            "  UNWEIGHTED: without set_samples() the plain average weighs every rank's mean gradient equally,\n"
            "  1/(n x passes) per rank and pass, whatever its sample count (here %lld to %lld, %lld of %d empty);\n"
            "  the mean over every selected cell of the step weighs rank r's pass k by n_rk / N\n",
            fewest, most, empty, n * c.steps);
      else if (std::abs(ratio0 - 1) > 1e-6)
        std::printf(
            "  MISMATCH: head gradients are %.6f x the single-process ones at the first update, factor n = %d ranks:\n"
            "  each rank differentiates its own subdomain's loss L_r = n x its share of the global mean loss;\n"
            "  KeepLocal<LocalScale::world_size> divides its head's gradient by n\n",
            ratio0, n);
    }
  }
  return ok ? 0 : 1;
}

double mean(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i];
  return to > from ? s / double(to - from) : 0;
}

/// This rank's values of a field, gathered on rank 0 in global order.
std::vector<Real> gather(const std::vector<Real>& mine) {
  const int n = world_size();
  int count = int(mine.size());
  std::vector<int> counts(std::size_t(n), 0), displs(std::size_t(n), 0);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  for (int p = 1; p < n; ++p) displs[std::size_t(p)] = displs[std::size_t(p) - 1] + counts[std::size_t(p) - 1];
  std::vector<Real> all(world_rank() == 0 ? std::size_t(displs.back() + counts.back()) : 0);
  MPI_Gatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), displs.data(), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return all;
}

template <class Group>
int run_train(const Config& c) {
  const int n = world_size(), me = world_rank();
  closure::Simulation<gradsync::MpiBackend, Group> sim(c, gradsync::MpiBackend(MPI_COMM_WORLD), MPI_COMM_WORLD, n, me,
                                                       1);
  sim.broadcast_parameters();
#if defined(GRADSYNC_HAVE_HDF5)
  if (!c.load_path.empty()) {
    sim.load(c.load_path);
    if (me == 0) std::printf("loaded %s: continuing at solver step %d\n", c.load_path.c_str(), sim.step_count());
  }
#else
  if (!c.load_path.empty() || !c.save_path.empty())
    throw std::runtime_error("--save and --load need gradsync's hdf5 component (a parallel HDF5); this build has none");
#endif
  sim.prepare_sync();
  print_problem(c, n);
  if (me == 0) std::printf("%s\n", gradsync::describe(sim.sync()).c_str());
  if (me == 0)
    std::printf(
        "training %d solver steps, heads %s\n"
        "  one-step error: RMS over all cells of the coarse step against the fine solution restricted,\n"
        "  with the closure (corrected) and without (plain), averaged since the last line;\n"
        "  rollout: both coarse solvers running free for %d steps from the same restricted fine state\n",
        c.steps, scale_name<Group>(), c.rollout);
  sim.enable_rollouts(c.rollout);
  std::vector<double> corrected, plain;
  std::size_t logged = 0, windows_logged = 0;
  for (int step = 0; step < c.steps; ++step) {
    if (sim.step(true)) sim.apply();
    corrected.push_back(sim.errors().corrected);
    plain.push_back(sim.errors().plain);
    if ((step + 1) % c.log_every == 0 || step + 1 == c.steps) {
      const double ec = mean(corrected, logged, corrected.size()), ep = mean(plain, logged, plain.size());
      if (me == 0) {
        std::printf("step %5d  t %6.2f  one-step error: corrected %.3e, plain %.3e, ratio %.3f", sim.step_count(),
                    sim.step_count() * c.dt, ec, ep, ec / ep);
        if (sim.rollouts().size() > windows_logged) {
          const auto& w = sim.rollouts().back();
          std::printf("  | rollout: corrected %.3e, plain %.3e", w.corrected, w.plain);
        }
        std::printf("\n");
      }
      logged = corrected.size();
      windows_logged = sim.rollouts().size();
    }
  }
  // The checkpoint and digest of the trained closure, before the evaluation windows move the solver.
#if defined(GRADSYNC_HAVE_HDF5)
  if (!c.save_path.empty()) {
    sim.save(c.save_path);
    if (me == 0) std::printf("saved %s at solver step %d\n", c.save_path.c_str(), sim.step_count());
  }
#endif
  if (c.digest) {
    const double d = sim.digest();
    if (me == 0) std::printf("parameters digest: %.17g\n", d);
  }
  if (c.steps == 0) return 0;
  // First: the passes before the first update (the untrained closure); last: the last log_every.
  const std::size_t first = std::min<std::size_t>(std::size_t(c.passes), corrected.size());
  const std::size_t win = std::min<std::size_t>(std::size_t(c.log_every), corrected.size());
  const double c0 = mean(corrected, 0, first), p0 = mean(plain, 0, first);
  const double c1 = mean(corrected, corrected.size() - win, corrected.size()),
               p1 = mean(plain, plain.size() - win, plain.size());
  const double ratio = c1 / p1;
  const auto training_windows = sim.rollouts();

  // After training: `eval_windows` more free-running windows with the closure frozen; the fields
  // at the end of the last one are plotted.
  double eval_corrected = 0, eval_plain = 0, eval_reference = 0;
  if (c.rollout > 0 && c.eval_windows > 0) {
    sim.enable_rollouts(c.rollout);
    for (int k = 0; k < c.rollout * c.eval_windows; ++k) sim.step(false);
    const auto& all = sim.rollouts();
    for (std::size_t k = all.size() - std::size_t(c.eval_windows); k < all.size(); ++k) {
      eval_corrected += all[k].corrected / c.eval_windows;
      eval_plain += all[k].plain / c.eval_windows;
      eval_reference += all[k].reference / c.eval_windows;
    }
  }
  if (me == 0) {
    std::printf("summary (%d ranks, %d solver steps, %d optimizer steps):\n", n, c.steps, c.steps / c.passes);
    std::printf(
        "  one-step error of the corrected coarse solver against the fine reference: %.3e over the first %zu steps\n"
        "  (before the first update; plain coarse solver %.3e, ratio %.3f), %.3e over the last %zu steps\n"
        "  (plain %.3e, ratio %.3f)\n",
        c0, first, p0, c0 / p0, c1, win, p1, ratio);
    if (!training_windows.empty()) {
      const auto& f = training_windows.front();
      std::printf("  free-running error after %d steps, first window of training: corrected %.3e, plain %.3e\n",
                  c.rollout, f.corrected, f.plain);
    }
    if (c.rollout > 0 && c.eval_windows > 0)
      std::printf(
          "  free-running error after %d steps, closure frozen after training, mean of %d windows: corrected %.3e,\n"
          "  plain %.3e, ratio %.3f (RMS of the field itself %.3e)\n",
          c.rollout, c.eval_windows, eval_corrected, eval_plain, eval_corrected / eval_plain, eval_reference);
    std::printf(
        "  sent per optimizer step by each rank: gradient sync %zu bytes (trunk only, %llu allreduce calls in all);\n"
        "  the heads' gradients sent 0 bytes; halo exchange %.0f bytes per solver step (both grids, both\n"
        "  free-running solvers)\n",
        sim.sync().data_parallel_bytes(), (unsigned long long)sim.sync().stats().allreduce_calls,
        double(sim.halo_bytes()) / sim.step_count());
  }

  // Plot: rank 0 writes the CSV files and runs the plotting script.
  if (!c.plot.empty()) {
    const auto fine = gather(sim.field("fine")), target = gather(sim.field("target")), rp = gather(sim.field("plain")),
               rc = gather(sim.field("corrected"));
    if (me == 0) {
      const std::string base = c.plot.size() > 4 && c.plot.substr(c.plot.size() - 4) == ".png"
                                   ? c.plot.substr(0, c.plot.size() - 4)
                                   : c.plot;
      std::ofstream h(base + "_history.csv"), w(base + "_rollouts.csv"), f(base + "_field.csv"), ff(base + "_fine.csv");
      h << "step,time,corrected,plain\n";
      for (std::size_t k = 0; k < corrected.size(); ++k)
        h << k + 1 << "," << double(k + 1) * c.dt << "," << corrected[k] << "," << plain[k] << "\n";
      w << "end_step,corrected,plain,reference,after_training\n";
      for (const auto& r : sim.rollouts())
        w << r.end_step << "," << r.corrected << "," << r.plain << "," << r.reference << ","
          << (r.end_step > c.steps ? 1 : 0) << "\n";
      const double dxc = 2 * closure::pi / c.cells, dxf = dxc / c.refine;
      f << "x,reference,plain,corrected\n";
      for (std::size_t i = 0; i < target.size(); ++i)
        f << (double(i) + 0.5) * dxc << "," << target[i] << "," << rp[i] << "," << rc[i] << "\n";
      ff << "x,u\n";
      for (std::size_t i = 0; i < fine.size(); ++i) ff << (double(i) + 0.5) * dxf << "," << fine[i] << "\n";
      h.close(), w.close(), f.close(), ff.close();
      const char* py = std::getenv("PYTHON");
      const std::string cmd = std::string(py ? py : "python3") + " " + ONLINE_CLOSURE_PLOT_SCRIPT + " '" + base +
                              "' '" + c.plot + "' " + std::to_string(c.rollout) + " " + std::to_string(c.dt);
      std::printf("plot: %s\n", cmd.c_str());
      std::fflush(stdout);
      if (std::system(cmd.c_str()) != 0)
        std::printf(
            "plot: the command failed (it needs python3 with matplotlib: apt-get install python3-matplotlib;\n"
            "      PYTHON=/path/to/python3 picks the interpreter); the CSV files are %s_*.csv\n",
            base.c_str());
    }
  }

  if (c.max_ratio >= 0) {
    const bool ok = ratio <= c.max_ratio && std::isfinite(eval_corrected);
    if (me == 0)
      std::printf("%s: the corrected/plain one-step error ratio is %.3f over the last %zu steps (required <= %.3f)\n",
                  ok ? "error fell" : "FAILED", ratio, win, c.max_ratio);
    return ok ? 0 : 1;
  }
  return 0;
}

template <class Group>
int run(const Config& c) {
  return c.check ? run_check<Group>(c) : run_train<Group>(c);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  return examples::mpi_main(
      "online_closure", argc, argv, [&](bool print) { return closure::parse(c, argc, argv, print); },
      [&] { return c.scale_local ? run<Heads>(c) : run<HeadsUnscaled>(c); });
}
