// What "never hang, never silently wrong" costs: the consistency check (one fixed-size allreduce
// when the registrations change; every step in CheckMode::every_step), the stall deadline against
// none (stall_timeout = 0: the same arrival check and polling wait, without a deadline; before
// issue 24 it skipped both), and the NaN/Inf scan (check_finite), on a real model's
// gradient list. Usage: mpirun -np 2 bench_checks [models_dir/resnet50.csv | tiny] [steps] [samples]
// ("samples": only the default against set_samples(), two syncs alternated, so that neither always
// runs after the same other configuration: for small models, where that order shows).
#include <gradsync/gradsync.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

struct Dense {};

namespace {

std::vector<std::size_t> read_model(const std::string& path) {
  std::vector<std::size_t> numel;
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);  // header: name,shape,numel
  while (std::getline(f, line)) {
    const auto comma = line.rfind(',');
    if (comma != std::string::npos) numel.push_back(std::stoull(line.substr(comma + 1)));
  }
  return numel;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

// Host memory, whatever Kokkos' default space: the NaN/Inf scan below is timed on the host.
using View = Kokkos::View<float*, Kokkos::HostSpace>;

using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// Median seconds per synchronize() of each configuration. The syncs are built side by side and
// their steps interleaved (rotating order), so the noise of a shared machine hits all alike.
// Config `weighted` gives set_samples() counts (rank r: r + 1) before each of its steps.
std::vector<double> step_times(const std::vector<View>& grads, std::vector<gradsync::Options> configs, int steps,
                               std::size_t weighted = std::size_t(-1)) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<std::unique_ptr<Sync>> syncs;
  for (auto& o : configs) {
    o.tuning.read_environment = false;
    syncs.push_back(std::make_unique<Sync>(gradsync::MpiBackend(MPI_COMM_WORLD), o));
    for (const View& g : grads) syncs.back()->add<Dense>(g);
  }
  std::vector<std::vector<double>> t(configs.size());
  for (int s = 0; s < steps + 2; ++s)
    for (std::size_t k = 0; k < syncs.size(); ++k) {
      const std::size_t c = (k + std::size_t(s)) % syncs.size();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (c == weighted) syncs[c]->set_samples(rank + 1);
      (void)syncs[c]->synchronize();
      if (s >= 2) t[c].push_back(MPI_Wtime() - t0);
    }
  std::vector<double> out;
  for (auto& v : t) out.push_back(max_over_ranks(median(v)));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    const int rank = [] {
      int r;
      MPI_Comm_rank(MPI_COMM_WORLD, &r);
      return r;
    }();
    const int nranks = [] {
      int r;
      MPI_Comm_size(MPI_COMM_WORLD, &r);
      return r;
    }();
    const std::string path = argc > 1 && *argv[1] ? argv[1] : std::string(GRADSYNC_BENCH_MODELS_DIR) + "/resnet50.csv";
    const int steps = argc > 2 ? std::atoi(argv[2]) : 15;
    // "tiny": 161 tensors of 16 values, where a step is all latency and any overhead shows.
    const std::vector<std::size_t> numel = path == "tiny" ? std::vector<std::size_t>(161, 16) : read_model(path);
    std::size_t total = 0;
    std::vector<View> grads;
    for (std::size_t n : numel) {
      grads.emplace_back("g", n);
      Kokkos::deep_copy(grads.back(), 0.5f);
      total += n;
    }
    if (rank == 0)
      std::printf("model %s: %zu tensors, %.1f MiB of float, %d ranks, median of %d interleaved steps\n", path.c_str(),
                  numel.size(), double(total) * 4 / (1 << 20), nranks, steps);

    gradsync::Options base;
    base.tuning.consistency_check = gradsync::CheckMode::on_change;
    gradsync::Options no_watch = base;
    no_watch.stall_timeout = 0;  // no deadline (the arrival check and the polling wait stay)
    gradsync::Options every = base;
    every.tuning.consistency_check = gradsync::CheckMode::every_step;
    gradsync::Options finite = base;
    finite.check_finite = true;
    if (argc > 3 && std::string(argv[3]) == "samples") {
      const std::vector<double> w = step_times(grads, {base, base}, steps, 1);
      if (rank == 0)
        std::printf("default %.4f ms/step, set_samples %.4f ms/step: %+.1f%%\n", w[0] * 1e3, w[1] * 1e3,
                    100 * (w[1] / w[0] - 1));
      Kokkos::finalize();
      MPI_Finalize();
      return 0;
    }
    const std::vector<double> t = step_times(grads, {base, no_watch, every, finite, base}, steps, 4);
    const double t_default = t[0], t_nowatch = t[1], t_every = t[2], t_finite = t[3], t_weighted = t[4];

    // One consistency check on its own (what on_change pays once per registration change).
    std::vector<gradsync::impl::RegDesc> regs;
    for (std::size_t i = 0; i < numel.size(); ++i)
      regs.push_back({"Dense", "Dense[" + std::to_string(i) + "]", numel[i], i});
    gradsync::MpiBackend backend(MPI_COMM_WORLD);
    gradsync::impl::Control<gradsync::MpiBackend> ctl(backend, base);
    std::vector<double> tc;
    for (int i = 0; i < 200; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      gradsync::impl::check_consistency(backend, ctl, base, regs, 4, 1, gradsync::impl::max_chunk_elements());
      tc.push_back(MPI_Wtime() - t0);
    }
    const double t_check = max_over_ranks(median(tc));

    // The NaN/Inf scan alone (what check_finite adds to every pass), over the same segments.
    std::vector<gradsync::impl::FusionPlan<float>::Tensor> ts;
    for (const View& g : grads) ts.push_back({g.data(), g.size()});
    const auto plan = gradsync::impl::FusionPlan<float>::build(ts, std::int64_t(1) << 20, false);
    gradsync::impl::SegmentView<float, Kokkos::HostSpace> segs("segs", plan.segments.size());
    std::copy(plan.segments.begin(), plan.segments.end(), segs.data());
    std::vector<double> tf;
    gradsync::impl::FiniteScratch<Kokkos::HostSpace> scratch;
    for (int i = 0; i < 20; ++i) {
      const double t0 = MPI_Wtime();
      const auto first = gradsync::impl::first_non_finite_segment<float, Kokkos::HostSpace>(
          Kokkos::DefaultHostExecutionSpace(), segs, std::int64_t(plan.segments.size()), scratch);
      tf.push_back(MPI_Wtime() - t0);
      if (first != std::numeric_limits<std::int64_t>::max()) std::printf("unexpected non-finite value\n");
    }
    const double t_scan = max_over_ranks(median(tf));

    if (rank == 0) {
      std::printf("NaN/Inf scan alone: %.3f ms for %.1f MiB (%.1f GB/s)\n", t_scan * 1e3, double(total) * 4 / (1 << 20),
                  double(total) * 4 / t_scan / 1e9);
      std::printf("%-52s %10s\n", "configuration", "ms/step");
      std::printf("%-52s %10.4f\n", "default (check on change, watchdog 300 s)", t_default * 1e3);
      std::printf("%-52s %10.4f\n", "no deadline (stall_timeout = 0)", t_nowatch * 1e3);
      std::printf("%-52s %10.4f\n", "consistency_check = every_step", t_every * 1e3);
      std::printf("%-52s %10.4f\n", "set_samples (weighted by samples)", t_weighted * 1e3);
      std::printf("%-52s %10.4f\n", "check_finite = true", t_finite * 1e3);
      std::printf("one consistency check alone (%zu tensors): %.1f us\n", numel.size(), t_check * 1e6);
      std::printf("deadline vs none: %+.1f%%; every_step: %+.1f%%; check_finite: %+.1f%%; set_samples: %+.1f%%\n",
                  100 * (t_default / t_nowatch - 1), 100 * (t_every / t_default - 1), 100 * (t_finite / t_default - 1),
                  100 * (t_weighted / t_default - 1));
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
