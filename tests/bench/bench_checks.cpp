// What "never hang, never silently wrong" costs: the consistency check (one fixed-size allreduce
// when the registrations change; every step in CheckMode::every_step), the stall watchdog's
// polling wait against a plain MPI_Wait, and the NaN/Inf scan (check_finite), on a real model's
// gradient list. Usage: mpirun -np 2 bench_checks [models_dir/resnet50.csv] [steps]
#include <gradsync/gradsync.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
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

using View = Kokkos::View<float*>;

// Median seconds per synchronize() over `steps` steps after two warm-up steps.
double step_time(const std::vector<View>& grads, gradsync::Options o, int steps) {
  o.read_environment = false;
  gradsync::GradientSync<gradsync::MpiBackend, View> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  for (const View& g : grads) sync.add<Dense>(g);
  std::vector<double> t;
  for (int s = 0; s < steps + 2; ++s) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    sync.synchronize();
    if (s >= 2) t.push_back(MPI_Wtime() - t0);
  }
  return max_over_ranks(median(t));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    const int rank = [] { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }();
    const int nranks = [] { int r; MPI_Comm_size(MPI_COMM_WORLD, &r); return r; }();
    const std::string path = argc > 1 ? argv[1] : std::string(GRADSYNC_BENCH_MODELS_DIR) + "/resnet50.csv";
    const int steps = argc > 2 ? std::atoi(argv[2]) : 15;
    const std::vector<std::size_t> numel = read_model(path);
    std::size_t total = 0;
    std::vector<View> grads;
    for (std::size_t n : numel) {
      grads.emplace_back("g", n);
      Kokkos::deep_copy(grads.back(), 0.5f);
      total += n;
    }
    if (rank == 0)
      std::printf("model %s: %zu tensors, %.1f MiB of float, %d ranks, median of %d steps\n", path.c_str(),
                  numel.size(), double(total) * 4 / (1 << 20), nranks, steps);

    gradsync::Options base;
    base.consistency_check = gradsync::CheckMode::on_change;
    const double t_default = step_time(grads, base, steps);
    gradsync::Options no_watch = base;
    no_watch.stall_timeout = 0;  // plain backend.wait(): no deadline, no polling
    const double t_nowatch = step_time(grads, no_watch, steps);
    gradsync::Options every = base;
    every.consistency_check = gradsync::CheckMode::every_step;
    const double t_every = step_time(grads, every, steps);
    gradsync::Options finite = base;
    finite.check_finite = true;
    const double t_finite = step_time(grads, finite, steps);

    // One consistency check on its own (what on_change pays once per registration change).
    std::vector<gradsync::impl::RegDesc> regs;
    for (std::size_t i = 0; i < numel.size(); ++i) regs.push_back({"Dense", "Dense[" + std::to_string(i) + "]", numel[i], i});
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

    if (rank == 0) {
      std::printf("%-52s %10s\n", "configuration", "ms/step");
      std::printf("%-52s %10.3f\n", "default (check on change, watchdog 300 s)", t_default * 1e3);
      std::printf("%-52s %10.3f\n", "no watchdog (stall_timeout = 0: MPI_Wait)", t_nowatch * 1e3);
      std::printf("%-52s %10.3f\n", "consistency_check = every_step", t_every * 1e3);
      std::printf("%-52s %10.3f\n", "check_finite = true", t_finite * 1e3);
      std::printf("one consistency check alone (%zu tensors): %.1f us\n", numel.size(), t_check * 1e6);
      std::printf("watchdog vs MPI_Wait: %+.1f%%; every_step: %+.1f%%; check_finite: %+.1f%%\n",
                  100 * (t_default / t_nowatch - 1), 100 * (t_every / t_default - 1), 100 * (t_finite / t_default - 1));
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
