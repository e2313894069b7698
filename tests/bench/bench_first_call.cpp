// gradsync benchmark: the one-time costs of a sync's first call, and how much of them prepare()
// moves ahead of training. Not a test: it prints a Markdown section (tests/bench/first_call.sh
// writes it to tests/bench/first_call.md, which docs/BENCHMARKS.md includes).
//
//   mpirun -np 2 bench_first_call <models_dir> [reps] [big_copies] [big_reps]
//
// Per model and repetition, each case on freshly allocated and written gradients (as backward
// leaves them: on the 4 KiB pages the program's allocator gave) and a new GradientSync:
//   first call     synchronize() without prepare(), against the median of the 5 calls after it
//   prepare        prepare() with the defaults (consistency check, plan, buffers, huge-page move),
//                  then the first synchronize() after it
//   no huge pages  prepare() with huge_pages = false: the move is the difference
//   auto           fusion_threshold_auto: the steps spent timing candidates, against as many steps of
//                  the chosen size (the excess is what tuning costs)
// Times are the slowest rank's; each figure is the median over repetitions. Tensors of 128 KiB and
// more are on fresh pages in every case (mallopt), as in a program that allocates them once.
#include <gradsync/gradsync.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

using Grad = Kokkos::View<float*, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Grad>;
struct Layers {};

// One allocation per tensor, written once (the first touch backward would do).
std::vector<Grad> make_grads(const bench::Model& m) {
  std::vector<Grad> g;
  for (std::size_t i = 0; i < m.numel.size(); ++i) {
    g.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "g"), m.numel[i]);
    Kokkos::deep_copy(g.back(), 1e-3f * float(bench::rank() + 1));
  }
  return g;
}

// Seconds of f() on the slowest rank.
template <class F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  f();
  double dt = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

double steady(Sync& s, int n = 5) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) t.push_back(timed([&] { (void)s.synchronize(); }));
  return bench::median(t);
}

struct Sample {
  double first = 0, steady = 0;                         // no prepare()
  double prepare = 0, after_prepare = 0, steady_p = 0;  // prepare(), defaults
  double prepare_4k = 0;                                // prepare(), huge_pages = false
  double tuning = 0, tuning_steady = 0;                 // fusion_threshold_auto
  int tuning_steps = 0;
  std::size_t chosen = 0, huge_bytes = 0, builds_after_prepare = 0;
};

Sample run_once(const bench::Model& m, bool tune) {
  Sample s;
  gradsync::Options quiet;
  quiet.tuning.read_environment = false;
  auto make_sync = [&](const gradsync::Options& o, std::vector<Grad>& g) {
    auto sync = std::make_unique<Sync>(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    for (const Grad& x : g) sync->add<Layers>(x);
    return sync;
  };
  // Untimed: the first case after another size's memory was freed paid up to 2 s more for the move
  // (the kernel gathering free 2 MiB blocks), whichever case it was. So every timed case follows one
  // that allocated, moved and freed as much.
  {
    auto g = make_grads(m);
    make_sync(quiet, g)->prepare();
  }
  {
    auto g = make_grads(m);
    auto sync = make_sync(quiet, g);
    s.first = timed([&] { (void)sync->synchronize(); });
    s.steady = steady(*sync);
  }
  {
    auto g = make_grads(m);
    auto sync = make_sync(quiet, g);
    s.prepare = timed([&] { sync->prepare(); });
    s.huge_bytes = sync->stats().bytes_on_huge_pages;
    s.after_prepare = timed([&] { (void)sync->synchronize(); });
    s.builds_after_prepare = sync->stats().plan_builds;  // 1: the first synchronize() built nothing
    s.steady_p = steady(*sync);
  }
  {
    gradsync::Options o = quiet;
    o.tuning.huge_pages = false;
    auto g = make_grads(m);
    auto sync = make_sync(o, g);
    s.prepare_4k = timed([&] { sync->prepare(); });
  }
  if (tune) {
    gradsync::Options o = quiet;
    o.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_auto;
    auto g = make_grads(m);
    auto sync = make_sync(o, g);
    sync->prepare();
    while (sync->summary().tuning) {
      s.tuning += timed([&] { (void)sync->synchronize(); });
      ++s.tuning_steps;
    }
    s.chosen = sync->fusion_threshold_bytes();
    s.tuning_steady = steady(*sync);
  }
  return s;
}

template <class F>
double med(const std::vector<Sample>& v, F f) {
  std::vector<double> x;
  for (const Sample& s : v) x.push_back(double(f(s)));
  return bench::median(x);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
#if defined(__GLIBC__)
  // Every tensor of 128 KiB and more on fresh pages, as in a program that allocates its gradients
  // once: glibc would otherwise raise its mmap threshold after the first free and hand the next
  // repetition memory an earlier one already moved onto huge pages.
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    if (argc < 2) throw std::runtime_error("usage: bench_first_call <models_dir> [reps] [big_copies] [big_reps]");
    const std::string dir = argv[1];
    const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
    const int copies = argc > 3 ? std::atoi(argv[3]) : 12;
    const int big_reps = argc > 4 ? std::atoi(argv[4]) : 3;
    std::vector<std::pair<bench::Model, int>> models = {
        {bench::read_csv_model(dir + "/resnet50.csv", "ResNet-50"), reps},
        {bench::read_csv_model(dir + "/vit_b_16.csv", "ViT-B/16"), reps}};
    // A multi-GB model with a real mix of sizes: ViT-B/16's tensors, `copies` times over.
    bench::Model big = models[1].first;
    big.name = "ViT-B/16 x " + std::to_string(copies);
    for (int c = 1; c < copies; ++c) {
      big.numel.insert(big.numel.end(), models[1].first.numel.begin(), models[1].first.numel.end());
      big.local.insert(big.local.end(), models[1].first.local.begin(), models[1].first.local.end());
    }
    models.push_back({big, big_reps});

    // The process's own first exchange (MPI's shared-memory setup) is not a sync's: one untimed round.
    run_once(models[0].first, false);
    const bool root = bench::rank() == 0;
    if (root)
      std::printf(
          "| model | MiB | tensors | first synchronize() ms | steady ms | first-call overhead ms | prepare() ms | "
          "of which huge-page move ms (MiB moved) | first synchronize() after prepare() ms | auto-tuning steps | "
          "tuning excess ms (chosen chunk) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const auto& [m, r] : models) {
      std::vector<Sample> v;
      for (int i = 0; i < r; ++i) v.push_back(run_once(m, true));
      const double mib = double(m.dp_elements()) * 4 / double(1 << 20);
      const double first = med(v, [](const Sample& s) { return s.first; });
      const double st = med(v, [](const Sample& s) { return s.steady; });
      const double prep = med(v, [](const Sample& s) { return s.prepare; });
      const double prep4k = med(v, [](const Sample& s) { return s.prepare_4k; });
      const double after = med(v, [](const Sample& s) { return s.after_prepare; });
      const double moved = med(v, [](const Sample& s) { return double(s.huge_bytes) / double(1 << 20); });
      const double excess = med(v, [](const Sample& s) { return s.tuning - s.tuning_steps * s.tuning_steady; });
      const double chosen = med(v, [](const Sample& s) { return double(s.chosen) / double(1 << 20); });
      bool built_once = true;
      for (const Sample& s : v) built_once = built_once && s.builds_after_prepare == 1;
      if (!built_once) throw std::runtime_error(m.name + ": the first synchronize() after prepare() rebuilt the plan");
      if (root)
        std::printf("| %s | %.0f | %zu | %.0f | %.0f | %.0f | %.0f | %.0f (%.0f) | %.0f | %d | %.0f (%g MiB) |\n",
                    m.name.c_str(), mib, m.numel.size(), first * 1e3, st * 1e3, (first - st) * 1e3, prep * 1e3,
                    (prep - prep4k) * 1e3, moved, after * 1e3, v[0].tuning_steps, excess * 1e3, chosen);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_first_call (rank %d): %s\n", bench::rank(), e.what());
    rc = 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
