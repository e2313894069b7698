// Latency of one small kernel launch and its wait, on the host's clock: what a test that launches
// tens of thousands of small kernels pays per launch. tests/gpu/gpu_procs.sh starts 1, 4, 8 and 16
// copies of it at once to measure how the latency grows with the processes sharing the GPU: without MPS,
// kernels of different processes (different CUDA contexts) never run together; the GPU switches
// between contexts, so a launch can wait for every other busy process's turn. The first H200 run
// (docs/GPU.md) ran the suite with 16 processes on one GPU, and its two programs with the most
// launches timed out at a cost of 1.3-1.8 ms per launch.
//
//   gpu_launch_latency [--seconds S] [--start-at UNIX_TIME]
//
// Phases of S seconds each (default 1), all copies in step from --start-at (default: now):
//   cuda          an empty one-warp kernel, cudaStreamSynchronize
//   kokkos-range  (Kokkos with CUDA) a 32-iteration RangePolicy parallel_for, fence of the instance
//   kokkos-team   (Kokkos with CUDA) a one-team TeamPolicy parallel_for (AUTO team size), fence
//   kokkos-copy1  (Kokkos with CUDA) deep_copy of one value device to host on the instance, fence
// One line per phase: "latency <phase> median_us M p90_us P n N".
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::system_clock;  // wall time: the copies agree on the phases' edges

__global__ void empty_kernel() {}

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "gpu_launch_latency: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(2);
  }
}

// Repeats op() from `begin` until `end` (op ends with its wait), then prints the median and 90th
// percentile of the single calls.
template <class Op>
void phase(const char* name, Clock::time_point begin, Clock::time_point end, Op&& op) {
  op();  // warm-up: the first launch loads the kernel
  std::this_thread::sleep_until(begin);
  std::vector<double> us;
  while (Clock::now() < end) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  if (us.empty()) us.push_back(0);
  std::sort(us.begin(), us.end());
  std::printf("latency %s median_us %.1f p90_us %.1f n %zu\n", name, us[us.size() / 2], us[us.size() * 9 / 10],
              us.size());
  std::fflush(stdout);
}

#if defined(KOKKOS_ENABLE_CUDA)
struct AddOne {
  Kokkos::View<float*, Kokkos::CudaSpace> v;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const { v(i) += 1; }
};
struct TeamAddOne {
  Kokkos::View<float*, Kokkos::CudaSpace> v;
  using member_type = Kokkos::TeamPolicy<Kokkos::Cuda>::member_type;
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, 32), [&](int i) { v(i) += 1; });
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1;
  double start_at = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seconds"))
      seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--start-at"))
      start_at = std::atof(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_launch_latency: no CUDA device\n");
    return 77;
  }
  Kokkos::initialize(argc, argv);
  {
    cudaStream_t s;
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    const auto slice = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    auto at =
        start_at > 0
            ? Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(start_at)))
            : Clock::now();
    auto next = [&] {
      const auto begin = at;
      at += slice;
      return begin;
    };
    auto b = next();
    phase("cuda", b, at, [&] {
      empty_kernel<<<1, 32, 0, s>>>();
      ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    });
#if defined(KOKKOS_ENABLE_CUDA)
    {  // the instance and views end before the stream does
      const Kokkos::Cuda exec(s);
      Kokkos::View<float*, Kokkos::CudaSpace> v("latency", 32);
      Kokkos::View<float, Kokkos::HostSpace> one("one");
      b = next();
      phase("kokkos-range", b, at, [&] {
        Kokkos::parallel_for("gs_latency_range", Kokkos::RangePolicy<Kokkos::Cuda>(exec, 0, 32), AddOne{v});
        exec.fence();
      });
      b = next();
      phase("kokkos-team", b, at, [&] {
        Kokkos::parallel_for("gs_latency_team", Kokkos::TeamPolicy<Kokkos::Cuda>(exec, 1, Kokkos::AUTO), TeamAddOne{v});
        exec.fence();
      });
      b = next();
      phase("kokkos-copy1", b, at, [&] {
        Kokkos::deep_copy(exec, one, Kokkos::subview(v, 0));
        exec.fence();
      });
    }
#endif
    ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  Kokkos::finalize();
  return 0;
}
