// GPU benchmark of gradsync's device path over a real model's gradients (a torchvision CSV: name,
// shape, numel), float32, raw CUDA device memory (gradsync::Span<float, gradsync::CudaDeviceSpace>):
//
//   memcpy      one cudaMemcpyAsync device-to-device of all gradient bytes (the reference)
//               (memcpy and the kernels: device time per call over back-to-back calls, best of 3;
//               the rest: wall-clock median of synchronize() calls, each ending synchronized)
//   pack        one launch of gradsync's pack kernel, every tensor into the fusion buffer
//   unpack      one launch of the unpack kernel (with a scale), buffer back into every tensor
//   sync/self   GradientSync<SelfBackend>::synchronize(): pack + unpack per chunk, no network
//   nccl        one ncclAllReduce of the whole fusion buffer (the reference for the next rows)
//   sync/nccl   GradientSync<NcclBackend>::synchronize() at two fusion thresholds
//   sync/mpi    GradientSync<MpiBackend>, staged through pinned host memory (MPI not CUDA-aware)
//
// Every timed result is checked once against the expected values first. Rank 0 prints one table;
// the "vs ref" column is reference time / measured time (pack and unpack: >= 80% is the target).
//   mpirun -np 1 bench_gpu [model.csv] [repetitions]
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu: %s: %s\n", what, cudaGetErrorString(rc));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

std::vector<std::size_t> read_model(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::size_t> sizes;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const auto comma = line.rfind(',');
    if (comma != std::string::npos) sizes.push_back(std::stoull(line.substr(comma + 1)));
  }
  if (sizes.empty()) {
    std::fprintf(stderr, "bench_gpu: no tensors in %s\n", path.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return sizes;
}

struct Row {
  std::string what, note;
  double bytes, seconds, ref_seconds;  // ref_seconds <= 0: no reference
};

// Median of `reps` timings of f() (each ends synchronized).
template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  double m = t[t.size() / 2];
  MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// Device time of one `launch`: `reps` launches back to back between two events (so launch latency
// is hidden, as in a sync's stream of kernels), best of three such batches.
template <class F>
double event_seconds(cudaStream_t s, int reps, F&& launch) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  launch();  // warm-up
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    ok(cudaEventRecord(a, s), "cudaEventRecord");
    for (int r = 0; r < reps; ++r) launch();
    ok(cudaEventRecord(b, s), "cudaEventRecord");
    ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    best = std::min(best, ms * 1e-3 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

struct Dense {};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Kokkos::initialize(argc, argv);
  {
    const std::string model = argc > 1 ? argv[1] : "resnet50.csv";
    const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
    int devices = 0;
    ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    ok(cudaSetDevice(rank % devices), "cudaSetDevice");
    cudaStream_t s;
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");

    using T = float;
    const std::vector<std::size_t> sizes = read_model(model);
    std::size_t total = 0;
    for (std::size_t n : sizes) total += n;
    const double bytes = double(total * sizeof(T));
    // One allocation holding every gradient back to back (as a framework's flat grad buffer would),
    // each tensor a Span into it; plus a buffer of the same size for the references.
    T *grads = nullptr, *other = nullptr;
    ok(cudaMalloc(&grads, total * sizeof(T)), "cudaMalloc");
    ok(cudaMalloc(&other, total * sizeof(T)), "cudaMalloc");
    std::vector<T> host(total);
    for (std::size_t i = 0; i < total; ++i) host[i] = T(rank + 1) + T(i % 251) / 256;
    auto reset = [&] { ok(cudaMemcpy(grads, host.data(), total * sizeof(T), cudaMemcpyHostToDevice), "upload"); };
    reset();
    ok(cudaDeviceSynchronize(), "sync");
    std::vector<gradsync::Span<T, gradsync::CudaDeviceSpace>> spans;
    std::vector<gradsync::impl::FusionPlan<T>::Tensor> plan_in;
    for (std::size_t off = 0, k = 0; k < sizes.size(); off += sizes[k], ++k) {
      spans.emplace_back(grads + off, sizes[k]);
      plan_in.push_back({grads + off, sizes[k]});
    }
    // Checks the first and last value of every tensor, and a stride through the whole buffer.
    int failures = 0;
    auto expect = [&](const char* what, auto value_at) {
      std::vector<T> back(total);
      ok(cudaMemcpy(back.data(), grads, total * sizeof(T), cudaMemcpyDeviceToHost), "download");
      int bad = 0;
      for (std::size_t i = 0; i < total; i += 997)
        bad += std::abs(back[i] - value_at(i)) > 1e-5f * std::abs(value_at(i)) + 1e-6f;
      for (std::size_t off = 0, k = 0; k < sizes.size(); off += sizes[k], ++k)
        bad += std::abs(back[off] - value_at(off)) > 1e-5f * std::abs(value_at(off)) + 1e-6f;
      if (bad) std::fprintf(stderr, "bench_gpu: rank %d: %s: %d wrong values\n", rank, what, bad);
      failures += bad;
      reset();
      ok(cudaDeviceSynchronize(), "sync");
    };
    double sum_ranks = 0;  // sum over ranks of (r + 1)
    for (int r = 0; r < nranks; ++r) sum_ranks += r + 1;
    auto averaged = [&](std::size_t i) { return T(sum_ranks / nranks) + T(i % 251) / 256; };

    std::vector<Row> rows;
    // Reference: one device-to-device copy of every gradient byte.
    const double t_copy = event_seconds(s, reps, [&] {
      ok(cudaMemcpyAsync(other, grads, total * sizeof(T), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    });
    rows.push_back({"memcpy D2D", "reference", bytes, t_copy, -1});

    // The kernels alone: one launch over every segment, as a single-chunk sync issues them.
    {
      using namespace gradsync::impl;
      const auto plan = FusionPlan<T>::build(plan_in, std::int64_t(total), false);
      auto segs = MemoryOps<gradsync::CudaDeviceSpace>::allocate<Segment<T>>("segs", plan.segments.size());
      MemoryOps<gradsync::CudaDeviceSpace>::upload(segs, plan.segments.data(), plan.segments.size());
      auto buf = MemoryOps<gradsync::CudaDeviceSpace>::allocate<T>("buf", total);
      const gradsync::CudaStream exec(s);
      const std::int64_t nsegs = std::int64_t(plan.segments.size());
      const PackKernel<T, gradsync::CudaStream, gradsync::CudaDeviceSpace> pack{segs, buf, 0, 0, T(1), false};
      const UnpackKernel<T, gradsync::CudaStream, gradsync::CudaDeviceSpace> unpack{segs, buf, 0, 0, T(0.5)};
      launch_per_segment(label_pack(), exec, nsegs, pack);
      launch_per_segment(label_unpack(), exec, nsegs, unpack);
      exec.fence();
      expect("pack+unpack kernels", [&](std::size_t i) { return T(0.5) * host[i]; });
      const double t_pack = event_seconds(s, reps, [&] { launch_per_segment(label_pack(), exec, nsegs, pack); });
      const double t_unpack = event_seconds(s, reps, [&] { launch_per_segment(label_unpack(), exec, nsegs, unpack); });
      reset();  // the timed unpacks left 0.5 x the values in the gradients
      ok(cudaDeviceSynchronize(), "sync");
      const std::string note = std::to_string(sizes.size()) + " tensors, " + std::to_string(nsegs) + " segments";
      rows.push_back({"pack kernel", note, bytes, t_pack, t_copy});
      rows.push_back({"unpack kernel", note, bytes, t_unpack, t_copy});
    }

    auto time_sync = [&](auto make_backend, const char* name, std::size_t threshold, double ref,
                         gradsync::HostStaging staging, bool averages) {
      gradsync::Options o;
      o.tuning.fusion_threshold_bytes = threshold;
      o.tuning.host_staging = staging;
      gradsync::GradientSync<decltype(make_backend()), gradsync::Span<T, gradsync::CudaDeviceSpace>> sync(
          make_backend(), o, gradsync::CudaStream(s));
      for (const auto& sp : spans) sync.template add<Dense>(sp);
      (void)sync.synchronize();
      if (averages)
        expect(name, averaged);
      else
        expect(name, [&](std::size_t i) { return host[i]; });
      const double t = median_seconds(reps, [&] { (void)sync.synchronize(); });
      reset();
      const std::string note =
          std::to_string(threshold >> 20) + " MiB chunks, " +
          std::to_string(sync.stats().allreduce_calls / std::max<std::uint64_t>(1, sync.stats().steps)) + " calls";
      rows.push_back({name, note, bytes, t, ref});
    };
    const std::size_t whole = std::size_t(1) << 30;
    // Pack and unpack of every byte: the reference is two device-to-device copies.
    time_sync([] { return gradsync::SelfBackend{}; }, "sync/self", whole, 2 * t_copy, gradsync::HostStaging::automatic,
              false);
    time_sync([] { return gradsync::SelfBackend{}; }, "sync/self", std::size_t(4) << 20, 2 * t_copy,
              gradsync::HostStaging::automatic, false);

    int nccl_ok = 1;  // NCCL needs one device per rank
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    nccl_ok = local <= devices;
    MPI_Allreduce(MPI_IN_PLACE, &nccl_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (nccl_ok) {
      gradsync::NcclBackend nccl(MPI_COMM_WORLD, s);
      const double t_nccl = median_seconds(reps, [&] { nccl.allreduce_sum(other, total); });
      rows.push_back({"nccl allreduce", "reference: whole buffer, one call", bytes, t_nccl, -1});
      // The sync does the allreduce plus a pack and an unpack.
      const double ref = t_nccl + 2 * t_copy;
      time_sync([&] { return nccl; }, "sync/nccl", whole, ref, gradsync::HostStaging::automatic, true);
      time_sync([&] { return nccl; }, "sync/nccl", std::size_t(64) << 20, ref, gradsync::HostStaging::automatic, true);
      time_sync([&] { return nccl; }, "sync/nccl", std::size_t(4) << 20, ref, gradsync::HostStaging::automatic, true);
    } else if (rank == 0) {
      std::printf("bench_gpu: %d ranks share %d device(s): NCCL rows skipped\n", local, devices);
    }
    {
      gradsync::MpiBackend mpi(MPI_COMM_WORLD);
      const char* name = mpi.cuda_aware() ? "sync/mpi (CUDA-aware)" : "sync/mpi (staged)";
      const auto staging = gradsync::HostStaging::automatic;
      time_sync([] { return gradsync::MpiBackend(MPI_COMM_WORLD); }, name, std::size_t(64) << 20, -1, staging, true);
      time_sync([] { return gradsync::MpiBackend(MPI_COMM_WORLD); }, name, std::size_t(4) << 20, -1, staging, true);
    }

    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("\ngradsync GPU benchmark: %s, %zu tensors, %.1f MiB float32, %d rank(s), median of %d\n",
                  model.c_str(), sizes.size(), bytes / (1 << 20), nranks, reps);
      std::printf("%-22s %10s %10s %8s  %s\n", "what", "ms", "GB/s", "vs ref", "note");
      for (const Row& r : rows) {
        char vs[16] = "";
        if (r.ref_seconds > 0) std::snprintf(vs, sizeof vs, "%.0f%%", 100 * r.ref_seconds / r.seconds);
        std::printf("%-22s %10.3f %10.1f %8s  %s\n", r.what.c_str(), r.seconds * 1e3, r.bytes / r.seconds / 1e9, vs,
                    r.note.c_str());
      }
      std::printf("values checked: %s\n", failures ? "WRONG VALUES (see stderr)" : "all correct");
    }
    cudaFree(grads);
    cudaFree(other);
    cudaStreamDestroy(s);
    if (failures) {
      Kokkos::finalize();
      MPI_Finalize();
      return 1;
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
