// Sharded optimizer state (Options::shard, docs/SHARDING.md): a whole training step (synchronize,
// Adam's update, and sharded the allgather of the parameters) of a model's parameter list in host
// memory, sharded against unsharded, beside raw MPI doing the same communication on one buffer of
// the same bytes (MPI_Reduce_scatter_block + MPI_Allgather, and MPI_Allreduce).
//
//   mpirun -np 2 bench_shard step <models_dir> <reps>     step times, medians, interleaved
//   mpirun -np P bench_shard memory <models_dir> <shard|none>   state bytes and peak resident memory
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <gradsync/gradsync.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace {

struct Dense {};
using View = Kokkos::View<float*, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
using Adam = gradsync::Adam<View>;
using Dopt = gradsync::DistributedOptimizer<Adam, Sync>;

// A model's parameters and gradients (one allocation each, as a framework holds them).
struct Net {
  std::vector<View> p, g;
  std::unique_ptr<Dopt> dopt;
  Net(const bench::Model& m, gradsync::Shard shard) {
    gradsync::Options o;
    o.tuning.read_environment = false;
    o.shard = shard;
    dopt = std::make_unique<Dopt>(Adam(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o));
    for (std::size_t k = 0; k < m.numel.size(); ++k) {
      if (m.local[k]) continue;
      p.emplace_back("p", m.numel[k]);
      g.emplace_back("g", m.numel[k]);
      Kokkos::deep_copy(p.back(), 0.01f);
      Kokkos::deep_copy(g.back(), 1e-3f * float(bench::rank() + 1));
      dopt->add<Dense>(p.back(), g.back());
    }
  }
  void step() { (void)dopt->step(); }
};

std::vector<bench::Model> models(const std::string& dir) {
  std::size_t mlp = 0;
  std::vector<bench::Model> ms{bench::read_csv_model(dir + "/resnet50.csv", "ResNet-50"),
                               bench::read_dlrm_model(dir + "/dlrm_criteo_kaggle.json", 100000, &mlp)};
  return ms;
}

void run_step(const std::string& dir, int reps) {
  for (const bench::Model& m : models(dir)) {
    Net plain(m, gradsync::Shard::none), sharded(m, gradsync::Shard::optimizer_state);
    const std::size_t n = m.dp_elements(), p = std::size_t(bench::size());
    std::vector<float> raw(n / p * p, 1e-3f);  // a multiple of p values: MPI_Reduce_scatter_block
    std::vector<float> slice(n / p);
    std::vector<bench::Method> ms;
    ms.push_back({"unsharded step (allreduce + Adam on all)", [&] { plain.step(); }, {}});
    ms.push_back({"sharded step (reduce-scatter + Adam on 1/p + allgather)", [&] { sharded.step(); }, {}});
    ms.push_back({"raw MPI_Allreduce",
                  [&] { MPI_Allreduce(MPI_IN_PLACE, raw.data(), int(raw.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
                  {}});
    ms.push_back({"raw MPI_Reduce_scatter_block + MPI_Allgather",
                  [&] {
                    MPI_Reduce_scatter_block(raw.data(), slice.data(), int(slice.size()), MPI_FLOAT, MPI_SUM,
                                             MPI_COMM_WORLD);
                    MPI_Allgather(slice.data(), int(slice.size()), MPI_FLOAT, raw.data(), int(slice.size()), MPI_FLOAT,
                                  MPI_COMM_WORLD);
                  },
                  {}});
    bench::measure(ms, 2, reps);
    if (bench::rank() == 0) {
      std::printf("%s, %zu floats (%.1f MiB), %d ranks, medians of %d interleaved steps:\n", m.name.c_str(), n,
                  double(n) * 4 / 1048576, bench::size(), reps);
      for (auto& x : ms) std::printf("  %-58s %8.3f ms\n", x.name.c_str(), 1e3 * bench::median(x.times));
      std::printf("  sharded / unsharded step: %.2fx\n", bench::median(ms[1].times) / bench::median(ms[0].times));
      std::printf("  state bytes on rank 0: unsharded %zu, sharded %zu (%.3f of 1/p)\n", plain.dopt->state_bytes(),
                  sharded.dopt->state_bytes(),
                  double(sharded.dopt->state_bytes()) / (double(plain.dopt->state_bytes()) / bench::size()));
    }
  }
}

long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

void run_memory(const std::string& dir, const std::string& mode) {
  const bench::Model m = models(dir).front();  // ResNet-50
  Net net(m, mode == "shard" ? gradsync::Shard::optimizer_state : gradsync::Shard::none);
  for (int s = 0; s < 3; ++s) net.step();
  double bytes[2] = {double(net.dopt->state_bytes()), double(peak_rss_kib())};
  double most[2];
  MPI_Reduce(bytes, most, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (bench::rank() == 0)
    std::printf("%s, %d ranks, shard %s: optimizer state %.1f MiB per rank (largest), peak resident %.1f MiB\n",
                m.name.c_str(), bench::size(), mode.c_str(), most[0] / 1048576, most[1] / 1024);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    const std::string mode = argc > 1 ? argv[1] : "step";
    const std::string dir = argc > 2 ? argv[2] : GRADSYNC_BENCH_MODELS_DIR;
    if (mode == "step")
      run_step(dir, argc > 3 ? std::stoi(argv[3]) : 20);
    else if (mode == "memory")
      run_memory(dir, argc > 3 ? argv[3] : "shard");
    else
      throw std::runtime_error("unknown mode " + mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_shard (rank %d): %s\n", bench::rank(), e.what());
    rc = 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
