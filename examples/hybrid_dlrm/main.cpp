// hybrid_dlrm: gradsync's flagship example, a DLRM-style recommender trained hybrid-parallel.
//
//   mpirun -np 4 hybrid_dlrm                 # train, a progress line every 10 steps
//   mpirun -np 4 hybrid_dlrm --check         # prove: n ranks == 1 process, to 1e-10 (exit 1 if not)
//   mpirun -np 4 hybrid_dlrm --check --table-scale none   # the bug local groups prevent: factor n
//   mpirun -np 6 hybrid_dlrm --check --replicas 3 --clip 0.05   # 2-D, clipped by the global norm
//   mpirun -np 4 hybrid_dlrm --check --uneven    # uneven batches (rank 0 none), weighted by set_samples
//   mpirun -np 4 hybrid_dlrm --steps 50 --save run.h5; mpirun -np 2 hybrid_dlrm --load run.h5 --steps 50
//
// Embedding tables are model-parallel (whole tables spread over the ranks, a gradsync local group
// with KeepLocal<LocalScale::world_size>); the MLPs are data-parallel (a GradientSync group).
// See trainer.hpp for the data flow and docs/HYBRID.md for the numbers this program prints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <gradsync/gradsync.hpp>
#include <limits>
#include <string>
#include <vector>

#include "config.hpp"
#include "trainer.hpp"

// The table groups. The switch --table-scale picks one at run time; the policy is a compile-time
// trait of the group type.
struct Tables {};
struct TablesUnscaled {};
struct Replicas {};                // a kind of process set: the replicas of one table shard
struct TablesReplicated {};        // --replicas R: summed over the shard's replicas, / world size
struct TablesSummed {};            // --uneven: the owner's sum over every sample, / the batch's samples
struct TablesReplicatedSummed {};  // --uneven --replicas R: that, summed over the shard's replicas
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<TablesUnscaled> : gradsync::KeepLocal<gradsync::LocalScale::none> {};
template <>
struct gradsync::LocalVarPolicy<TablesReplicated> : gradsync::ReduceOver<Replicas> {};
template <>
struct gradsync::LocalVarPolicy<TablesSummed> : gradsync::KeepLocal<gradsync::LocalScale::samples> {};
template <>
struct gradsync::LocalVarPolicy<TablesReplicatedSummed> : gradsync::ReduceOver<Replicas, gradsync::SetScale::samples> {
};

namespace {

using dlrm::Config;
using dlrm::Real;
using Clock = std::chrono::steady_clock;

using examples::max_over_ranks;
using examples::sum_over_ranks;
using examples::to_host;
using examples::world_rank;

std::string mib(double bytes) {
  char s[32];
  if (bytes < 1024.0 * 1024.0)
    std::snprintf(s, sizeof s, "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(s, sizeof s, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return s;
}

template <class Group>
const char* scale_name() {
  if constexpr (gradsync::is_set_reduced_v<Group>)
    return gradsync::LocalVarPolicy<Group>::set_scale == gradsync::SetScale::samples
               ? "ReduceOver<Replicas, SetScale::samples> (summed over each shard's replicas, / the batch's samples)"
               : "ReduceOver<Replicas> (summed over each shard's replicas, / world size)";
  else
    return gradsync::local_scale_v<Group> == gradsync::LocalScale::world_size ? "LocalScale::world_size"
           : gradsync::local_scale_v<Group> == gradsync::LocalScale::samples
               ? "LocalScale::samples (each owner's sum over every sample, / the batch's samples)"
               : "LocalScale::none";
}

// The distributed trainer: tables over every rank, or (--replicas R) sharded within groups of n/R
// consecutive ranks and replicated over the R groups; a shard's replicas form its process set.
template <class Group>
dlrm::Trainer<gradsync::MpiBackend, Group> make_trainer(const Config& c) {
  using Tr = dlrm::Trainer<gradsync::MpiBackend, Group>;
  if (c.replicas == 0) return Tr(c, gradsync::MpiBackend(MPI_COMM_WORLD));
  int n = 1, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (n % c.replicas != 0)
    throw std::runtime_error("--replicas " + std::to_string(c.replicas) + " does not divide the " + std::to_string(n) +
                             " ranks");
  const int m = n / c.replicas;
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r / m, r, &group);
  gradsync::MpiBackend group_backend(group);  // works on a duplicate
  MPI_Comm_free(&group);
  std::vector<int> shard_set;
  for (int q = 0; q < c.replicas; ++q) shard_set.push_back(q * m + r % m);
  return Tr(c, gradsync::MpiBackend(MPI_COMM_WORLD), group_backend, shard_set);
}

template <class T>
void print_model(const Config& c, const T& tr) {
  const int n = tr.size();
  std::vector<double> rows(static_cast<std::size_t>(n)), tables(static_cast<std::size_t>(n));
  rows[std::size_t(tr.rank())] = double(tr.owned_rows());
  tables[std::size_t(tr.rank())] = double(tr.owned_tables().size());
  MPI_Allreduce(MPI_IN_PLACE, rows.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, tables.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (tr.rank() != 0) return;
  std::int64_t total_rows = 0;
  for (int t = 0; t < c.num_tables(); ++t) total_rows += c.rows(t);
  auto join = [](const std::vector<int>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "-" : "") + std::to_string(v[i]);
    return s;
  };
  std::printf(
      "hybrid_dlrm: %d rank%s, global batch %d, %d tables x dim %d (rows capped at %lld: %lld rows, %.1f MiB)\n", n,
      n == 1 ? "" : "s", c.batch, c.num_tables(), c.dim, (long long)c.row_cap, (long long)total_rows,
      double(total_rows) * c.dim * sizeof(Real) / (1024.0 * 1024.0));
  std::printf("  bottom MLP %s, dot interaction (%d pairs), top MLP %s: %zu parameters, data-parallel\n",
              join(c.bottom).c_str(), c.num_pairs(), join(c.top).c_str(), tr.mlp_parameters());
  std::printf("  tables: model-parallel, whole tables balanced by rows:");
  for (int p = 0; p < n; ++p)
    std::printf("%s rank %d: %d tables, %.0f rows", p ? ";" : "", p, int(tables[std::size_t(p)]), rows[std::size_t(p)]);
  std::printf("\n");
}

/// max|a - b| / max|b|: the error of a whole tensor relative to its largest reference value, so a
/// near-zero element summed in another order does not count as a large error.
double rel_diff(const Real* a, const Real* b, std::size_t n) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
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

// Every gradient (or parameter) of `dist` against the same tensor of the single-process `ref`.
// `sharded` gradients hold the average only in this rank's slices: the rest compares as equal.
template <class D, class R>
void compare_mlps(const D& dist, const R& ref, bool grads, Worst& w, bool sharded = false) {
  const auto only_owned = [&](const auto& view, auto a, const auto& b) {
    if (sharded && grads)
      for (std::size_t i = 0; i < a.size(); ++i) {
        bool mine = false;
        for (const auto& [p, count] : dist.owned_slices())
          mine = mine || (view.data() + i >= p && view.data() + i < p + count);
        if (!mine) a[i] = b[i];
      }
    return a;
  };
  for (int part = 0; part < 2; ++part) {
    const auto& a = part == 0 ? dist.bottom() : dist.top();
    const auto& b = part == 0 ? ref.bottom() : ref.top();
    for (std::size_t l = 0; l < a.size(); ++l) {
      const auto bw = to_host(grads ? b[l].gw : b[l].w), bb = to_host(grads ? b[l].gb : b[l].b);
      const auto aw = only_owned(a[l].gw, to_host(grads ? a[l].gw : a[l].w), bw);
      const auto ab = only_owned(a[l].gb, to_host(grads ? a[l].gb : a[l].b), bb);
      w.add(rel_diff(aw.data(), bw.data(), aw.size()), a[l].name + ".weight");
      w.add(rel_diff(ab.data(), bb.data(), ab.size()), a[l].name + ".bias");
    }
  }
}

// The worst table of this rank against the same table of the single-process model.
template <class D, class R>
double tables_vs_reference(const D& dist, const R& ref) {
  double worst = 0;
  for (int t : dist.owned_tables()) {
    const auto a = dist.table_parameters(t), b = ref.table_parameters(t);
    worst = std::max(worst, rel_diff(a.data(), b.data(), a.size()));
  }
  return worst;
}

template <class Group>
int run_check(const Config& c) {
  using Dist = dlrm::Trainer<gradsync::MpiBackend, Group>;
  using Ref = dlrm::Trainer<gradsync::SelfBackend, Group>;
  Dist dist = make_trainer<Group>(c);
  // The reference: every rank also builds the single-process model (all tables, the whole global
  // batch, SelfBackend) from the same seed and trains it on the same batches, in this process.
  Ref ref(c, gradsync::SelfBackend());
  const int n = dist.size(), me = dist.rank();
  print_model(c, dist);
  if (me == 0)
    std::printf(
        "check: %d ranks vs the single-process model on the same %d global batch(es) of %d samples,\n"
        "       tables %s; every gradient and every parameter after each SGD step, tolerance 1e-10\n",
        n, c.steps, c.batch, scale_name<Group>());
  if (me == 0 && c.clip > 0)
    std::printf("       gradients clipped to a global norm of %g before each step (gradsync::GlobalNorm::clip)\n",
                c.clip);
  if (c.uneven) {
    std::vector<double> counts(static_cast<std::size_t>(n), 0.0);
    counts[std::size_t(me)] = double(dist.local_samples());
    MPI_Allreduce(MPI_IN_PLACE, counts.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    std::string list;
    for (int p = 0; p < n; ++p) list += (p ? ", " : "") + std::to_string(std::int64_t(counts[std::size_t(p)]));
    if (me == 0)
      std::printf("       uneven batches: samples per rank %s; each rank differentiates its own mean loss, %s\n",
                  list.c_str(), c.weights ? "weighted by set_samples()" : "averaged unweighted (--weights off)");
  }
  const double tol = 1e-10;
  Worst overall;
  if (c.replicas > 1) {
    // The replicas of each table shard start apart (replica group q adds q / 100 to its shards), so
    // the check holds only if broadcast_set_parameter makes them equal (to replica group 0's).
    dist.perturb_tables(Real(dist.replica()) / 100);
    const double before = max_over_ranks(tables_vs_reference(dist, ref));
    dist.broadcast_tables();
    const double after = max_over_ranks(tables_vs_reference(dist, ref));
    overall.add(after, "table parameters after broadcast_set_parameter");
    if (me == 0)
      std::printf(
          "  replicas: table shards perturbed by replica group, max rel diff to the single process %.1e before "
          "broadcast_set_parameter, %.1e after\n",
          before, after);
  }
  double ratio0 = 1;
  for (int step = 0; step < c.steps; ++step) {
    const Real loss_d = dist.compute_gradients(std::uint64_t(step));
    const Real loss_r = ref.compute_gradients(std::uint64_t(step));

    Worst mlp_g, tab_g, params;
    mlp_g.add(std::abs(loss_d - loss_r) / std::abs(loss_r), "loss");
    double norm_d = 0, norm_r = 0;
    if (c.clip > 0) {  // before the comparison: the gradients compared are the clipped ones
      norm_d = dist.clip_gradients(c.clip);
      norm_r = ref.clip_gradients(c.clip);
      mlp_g.add(std::abs(norm_d - norm_r) / std::abs(norm_r), "global norm");
    }
    compare_mlps(dist, ref, true, mlp_g, c.shard);
    double ab = 0, bb = 0;  // least-squares factor between the n-rank and 1-rank table gradients
    for (int t : dist.owned_tables()) {
      const auto a = dist.table_gradient(t), b = ref.table_gradient(t);
      if (a.first != b.first)
        tab_g.add(std::numeric_limits<double>::infinity(), "table " + std::to_string(t) + " rows");
      else
        tab_g.add(rel_diff(a.second.data(), b.second.data(), a.second.size()), "table " + std::to_string(t));
      for (std::size_t i = 0; i < a.second.size() && i < b.second.size(); ++i) {
        ab += a.second[i] * b.second[i];
        bb += b.second[i] * b.second[i];
      }
    }
    ab = sum_over_ranks(ab);
    bb = sum_over_ranks(bb);
    const double ratio = bb > 0 ? ab / bb : 1;
    if (step == 0) ratio0 = ratio;

    dist.apply_sgd();
    ref.apply_sgd();
    compare_mlps(dist, ref, false, params);
    for (int t : dist.owned_tables()) {
      const auto a = dist.table_parameters(t), b = ref.table_parameters(t);
      params.add(rel_diff(a.data(), b.data(), a.size()), "table " + std::to_string(t) + " parameters");
    }

    const double gm = max_over_ranks(mlp_g.value), gt = max_over_ranks(tab_g.value), pm = max_over_ranks(params.value);
    for (const Worst* w : {&mlp_g, &tab_g, &params})
      overall.add(w->value, "step " + std::to_string(step) + ", " + w->what);
    if (me == 0 && c.clip > 0)
      std::printf("  step %d  global norm %.12f (1 process %.12f), clipped to %g: %s\n", step, norm_d, norm_r, c.clip,
                  norm_r > c.clip ? "scaled" : "unchanged");
    if (me == 0)
      std::printf(
          "  step %d  loss %.12f (1 process %.12f)  max rel diff: MLP grads %.1e, table grads %.1e "
          "(n-rank / 1-process = %.6f), parameters after the step %.1e\n",
          step, loss_d, loss_r, gm, gt, ratio, pm);
  }
  // The worst tensor over all ranks, named by the rank that holds it.
  struct {
    double value;
    int rank;
  } worst{overall.value, me};
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  const double worst_all = worst.value;
  int len = int(overall.what.size());
  MPI_Bcast(&len, 1, MPI_INT, worst.rank, MPI_COMM_WORLD);
  std::vector<char> name(std::size_t(len) + 1, '\0');
  if (me == worst.rank) std::copy(overall.what.begin(), overall.what.end(), name.begin());
  MPI_Bcast(name.data(), len + 1, MPI_CHAR, worst.rank, MPI_COMM_WORLD);
  const std::string worst_what = name.data();
  const bool ok = worst_all <= tol;
  if (me == 0) {
    if (ok)
      std::printf(
          "check PASSED: %d rank%s reproduce the single-process model, max relative difference %.1e <= %.0e "
          "(worst: %s)\n",
          n, n == 1 ? "" : "s", worst_all, tol, worst_what.c_str());
    else {
      std::printf("check FAILED: max relative difference %.3e > %.0e (worst: %s)\n", worst_all, tol,
                  worst_what.c_str());
      if (c.uneven && !c.weights)
        std::printf(
            "  UNWEIGHTED: each rank differentiates its own mean loss and the sync averages the ranks with equal\n"
            "  weights 1/%d, whatever their share of the batch (the tables' owners likewise); set_samples(b_r)\n"
            "  weights them b_r / B (run without --weights off)\n",
            n);
      else if (std::abs(ratio0 - 1) > 1e-6)
        std::printf(
            "  MISMATCH: table gradients are %.6f x the single-process ones at step 0, factor n = %d ranks:\n"
            "  each owner sums dL_r/dE over all %d ranks (the gradient of n x the mean loss); "
            "KeepLocal<LocalScale::world_size> divides it by n\n",
            ratio0, n, n);
    }
  }
  return ok ? 0 : 1;
}

// Mean of the last k values.
double mean(const std::vector<double>& v, std::size_t k) {
  double s = 0;
  for (std::size_t i = v.size() - k; i < v.size(); ++i) s += v[i];
  return s / double(k);
}

template <class Group>
int run_train(const Config& c) {
  dlrm::Trainer<gradsync::MpiBackend, Group> tr = make_trainer<Group>(c);
  const int me = tr.rank();
  print_model(c, tr);
  std::int64_t first = 0;  // the first batch's index: 0, or where a checkpoint left off
#if defined(GRADSYNC_HAVE_HDF5)
  if (!c.load_path.empty()) {
    first = tr.load(c.load_path);
    if (me == 0) std::printf("loaded %s: continuing at step %lld\n", c.load_path.c_str(), (long long)first);
  }
#else
  if (!c.load_path.empty() || !c.save_path.empty())
    throw std::runtime_error("--save and --load need gradsync's hdf5 component (a parallel HDF5); this build has none");
#endif
  tr.prepare_sync();  // the first step then builds nothing
  if (me == 0) std::printf("%s\n", gradsync::describe(tr.sync()).c_str());
  if (me == 0)
    std::printf(
        "training %d steps, SGD lr %g, seed %llu, tables %s\n"
        "  (loss: this batch; avg: since the last line; teacher: the loss of the model that labels the data;\n"
        "   bytes: sent by one rank per step, the all-to-all's the largest over ranks)\n",
        c.steps, c.lr, (unsigned long long)c.seed, scale_name<Group>());
  std::vector<double> losses, floors, norms;
  const auto t0 = Clock::now();
  auto t_last = t0;
  std::uint64_t a2a_last = 0, sync_last = 0;
  int step_last = 0;
  for (int step = 0; step < c.steps; ++step) {
    losses.push_back(tr.compute_gradients(std::uint64_t(first + step)));
    floors.push_back(tr.teacher_loss());
    if (c.clip > 0) norms.push_back(tr.clip_gradients(c.clip));
    tr.apply_sgd();
    if ((step + 1) % c.log_every == 0 || step == 0 || step + 1 == c.steps) {
      MPI_Barrier(MPI_COMM_WORLD);  // time whole steps of every rank
      const auto now = Clock::now();
      const double dt = std::chrono::duration<double>(now - t_last).count();
      const int steps = step + 1 - step_last;
      const double a2a = max_over_ranks(double(tr.alltoall_stats().total() - a2a_last)) / steps;
      const double sync = double(tr.sync_stats().bytes_allreduced - sync_last) / steps;
      if (me == 0 && c.clip > 0)
        std::printf("step %5lld  global gradient norm %.4f (avg %.4f), clipped to %g\n", (long long)(first + step),
                    norms.back(), mean(norms, std::size_t(steps)), c.clip);
      if (me == 0)
        std::printf(
            "step %5lld  loss %.4f (avg %.4f, teacher %.4f)  %6.0f samples/s  sent/step: sync %s, all-to-all %s\n",
            (long long)(first + step), losses.back(), mean(losses, std::size_t(steps)),
            mean(floors, std::size_t(steps)), steps * double(c.batch) / dt, mib(sync).c_str(), mib(a2a).c_str());
      t_last = now;
      step_last = step + 1;
      a2a_last = tr.alltoall_stats().total();
      sync_last = tr.sync_stats().bytes_allreduced;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
#if defined(GRADSYNC_HAVE_HDF5)
  if (!c.save_path.empty()) {
    tr.save(c.save_path, first + c.steps);
    if (me == 0) std::printf("saved %s at step %lld\n", c.save_path.c_str(), (long long)(first + c.steps));
  }
#endif
  if (c.digest) {
    const double d = tr.digest();
    if (me == 0) std::printf("parameters digest: %.17g\n", d);
  }
  if (c.steps == 0) return 0;
  // Every batch is new data, so a step's loss (taken before its update) is a held-out loss.
  const std::size_t tail = std::min<std::size_t>(20, losses.size());
  const double last = mean(losses, tail);
  const double drop = 1 - last / losses.front();
  // The all-to-all volume differs by rank: report the busiest rank's, with its breakdown.
  const auto& a = tr.alltoall_stats();
  struct {
    double value;
    int rank;
  } busiest{double(a.total()), me};
  MPI_Allreduce(MPI_IN_PLACE, &busiest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  double parts[3] = {double(a.ids), double(a.embeddings), double(a.gradients)};
  MPI_Bcast(parts, 3, MPI_DOUBLE, busiest.rank, MPI_COMM_WORLD);
  if (me == 0) {
    std::printf("summary: %d steps of %d samples in %.2f s, %.0f samples/s on %d ranks\n", c.steps, c.batch, secs,
                double(c.steps) * c.batch / secs, tr.size());
    std::printf(
        "  loss %.4f at step 0, %.4f averaged over the last %zu steps: %.1f%% lower\n"
        "  (on those batches the teacher itself scores %.4f; always predicting the click rate, %.4f)\n",
        losses.front(), last, tail, 100 * drop, mean(floors, tail), tr.constant_loss());
    std::printf(
        "  sent per step by each rank: gradient sync %s (MLP gradients only, %llu allreduce calls in all;\n"
        "  the tables' gradients sent 0 bytes); all-to-all %s on the busiest rank, rank %d (ids %s, embeddings %s,\n"
        "  embedding gradients %s)\n",
        mib(double(tr.sync_stats().bytes_allreduced) / c.steps).c_str(),
        (unsigned long long)tr.sync_stats().allreduce_calls, mib(busiest.value / c.steps).c_str(), busiest.rank,
        mib(parts[0] / c.steps).c_str(), mib(parts[1] / c.steps).c_str(), mib(parts[2] / c.steps).c_str());
  }
  if (c.min_loss_drop >= 0 && !(drop >= c.min_loss_drop)) {
    if (me == 0)
      std::printf("FAILED: the loss fell by %.1f%%, less than the required %.1f%%\n", 100 * drop,
                  100 * c.min_loss_drop);
    return 1;
  }
  if (c.min_loss_drop >= 0 && me == 0)
    std::printf("loss fell by %.1f%% (required %.1f%%)\n", 100 * drop, 100 * c.min_loss_drop);
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
      "hybrid_dlrm", argc, argv, [&](bool print) { return dlrm::parse(c, argc, argv, print); },
      [&] {
        const bool summed = c.uneven && c.weights;  // tables fed each sample's own gradient
        if (c.replicas > 0) return summed ? run<TablesReplicatedSummed>(c) : run<TablesReplicated>(c);
        return summed ? run<TablesSummed>(c) : c.scale_tables ? run<Tables>(c) : run<TablesUnscaled>(c);
      });
}
