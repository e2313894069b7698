// Every row of DESIGN.md's semantics table on CUDA device memory: GradientSync over
// gradsync::Span<T, gradsync::CudaDeviceSpace> (raw CUDA kernels on a stream, no Kokkos CUDA needed)
// with NcclBackend, MpiBackend staging through pinned host memory (automatic on an MPI that is not
// CUDA-aware, and forced), and SelfBackend; float and double; values against analytic per-rank sums.
// With Kokkos' CUDA backend, the same over Kokkos::View<T*, Kokkos::CudaSpace>.
// Built by nvcc in CI (it must compile and link there); runs only where there is a CUDA device.
#include <gradsync/gradsync.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "gradsync_test.hpp"

using gradsync_test::DeviceArray;
using gradsync_test::gpu_setup;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Tables {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

namespace {

enum class Kind { dense, runtime_local, table, tower };

double grad_value(int tag, std::size_t i, int r, int p) { return (r + 1) * (i % 1000 + 1) * 0.5 + 0.25 * p + tag; }

template <class T>
struct Tensor {
  Kind kind;
  int tag;
  DeviceArray<T> dev;
};

// Data-parallel tensors of mixed sizes (empty, one value, and one longer than a segment), local
// groups whose count and sizes differ per rank, one tensor made local at run time.
template <class T>
std::vector<Tensor<T>> make_model(int rank) {
  std::vector<Tensor<T>> m;
  auto one = [&](Kind k, int tag, std::size_t n) { m.push_back({k, tag, DeviceArray<T>(n)}); };
  one(Kind::dense, 0, 37);
  for (int j = 0; j <= rank; ++j) one(Kind::table, 100 + j, std::size_t(3 + 2 * rank + j));
  one(Kind::dense, 1, 0);
  one(Kind::tower, 200, std::size_t(5 + rank));
  one(Kind::dense, 2, 1);
  one(Kind::runtime_local, 300, 11);
  one(Kind::dense, 3, 70000);  // several segments
  one(Kind::dense, 4, 4096);
  return m;
}

template <class T>
using DevSpan = gradsync::Span<T, gradsync::CudaDeviceSpace>;

template <class Sync, class T>
void register_model(Sync& sync, std::vector<Tensor<T>>& m) {
  for (auto& t : m) {
    DevSpan<T> s(t.dev.data(), t.dev.size());
    switch (t.kind) {
      case Kind::dense:
      case Kind::runtime_local:
        sync.template add<Dense>(s);
        break;
      case Kind::table:
        sync.template add<Tables>(s);
        break;
      case Kind::tower:
        sync.template add<Tower>(s);
        break;
    }
  }
  for (auto& t : m)
    if (t.kind == Kind::runtime_local) sync.register_local_var(DevSpan<T>(t.dev.data(), t.dev.size()));
}

template <class T>
void fill(std::vector<Tensor<T>>& m, int rank, int pass) {
  for (auto& t : m) {
    std::vector<T> h(t.dev.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = T(grad_value(t.tag, i, rank, pass));
    t.dev.upload(h);
  }
}

// Sharded (Options::shard), a data-parallel value is specified only in this rank's slices.
template <class T>
bool owned_by(const std::vector<std::pair<T*, std::size_t>>& owned, const T* p) {
  for (const auto& [data, count] : owned)
    if (p >= data && p < data + count) return true;
  return false;
}

template <class T>
double max_error(const std::vector<Tensor<T>>& m, const gradsync::Options& o, int n, int rank, int last_pass,
                 const std::vector<std::pair<T*, std::size_t>>& owned = {}) {
  const int N = o.backward_passes_per_step;
  const double agg = o.average_aggregated_gradients ? N : 1;
  double worst = 0;
  for (const auto& t : m) {
    const std::vector<T> h = t.dev.download();
    for (std::size_t i = 0; i < h.size(); ++i) {
      auto cycle = [&](int r) {
        double s = 0;
        for (int p = last_pass - N + 1; p <= last_pass; ++p) s += grad_value(t.tag, i, r, p);
        return s;
      };
      double expect = 0;
      switch (t.kind) {
        case Kind::dense: {
          if (o.shard != gradsync::Shard::none && !owned_by(owned, t.dev.data() + i)) continue;
          double s = 0;  // a 1-rank backend (SelfBackend) holds this rank's values alone, at any world size
          if (n == 1)
            s = cycle(rank);
          else
            for (int r = 0; r < n; ++r) s += cycle(r);
          expect = s * o.prescale_factor * o.postscale_factor / agg / (o.op == gradsync::ReduceOp::average ? n : 1);
          break;
        }
        case Kind::table:
          expect = cycle(rank) / n / agg;
          break;
        case Kind::tower:
          expect = cycle(rank) / agg;
          break;
        case Kind::runtime_local:
          expect = cycle(rank) / agg / (o.scale_local_gradients ? n : 1.0);
          break;
      }
      worst = std::max(worst, rel_err(double(h[i]), expect));
    }
  }
  return worst;
}

// Every row: both ops, aggregation with and without averaging, scale factors, small and default
// fusion thresholds. `make` builds a fresh backend; `n` is the number of ranks it reduces over;
// `shard`: Options::shard, each rank's slices checked.
template <class T, class Backend, class Make>
void check_every_row(Make make, int n, gradsync::HostStaging staging, cudaStream_t stream,
                     gradsync::Shard shard = gradsync::Shard::none) {
  const int rank = world_rank();
  int config = 0;
  for (auto op : {gradsync::ReduceOp::sum, gradsync::ReduceOp::average})
    for (int N : {1, 3})
      for (bool avg_agg : {false, true}) {
        gradsync::Options o;
        o.op = op;
        o.backward_passes_per_step = N;
        o.average_aggregated_gradients = avg_agg;
        o.scale_local_gradients = config % 2 == 0;
        o.tuning.host_staging = staging;
        o.shard = shard;
        if (config % 3 == 1) o.prescale_factor = 0.5, o.postscale_factor = 3.0;
        o.tuning.fusion_threshold_bytes = config % 4 == 0 ? 256 : std::size_t(4) << 20;
        CAPTURE(config);
        ++config;
        auto m = make_model<T>(rank);
        gradsync::GradientSync<Backend, DevSpan<T>> sync(make(), o, gradsync::CudaStream(stream));
        register_model(sync, m);
        std::uint64_t allocations = 0;
        for (int p = 0; p < 6; ++p) {
          fill(m, rank, p);
          const bool ready = sync.synchronize();
          CAPTURE(p);
          GRADSYNC_CHECK_ALL(ready == ((p + 1) % N == 0));
          if (ready) {
            const double err = max_error(m, o, n, rank, p, sync.owned_slices());
            CAPTURE(err);
            GRADSYNC_CHECK_ALL(err <= gradsync_test::tol<T>());
          }
          if (p == 0) allocations = sync.stats().allocations;
        }
        GRADSYNC_CHECK_ALL(sync.stats().allocations == allocations && sync.stats().plan_builds == 1);
      }
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { gradsync_test::cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s); }
};

}  // namespace

TEST_CASE_TEMPLATE("semantics on device memory: NcclBackend", T, float, double) {
  if (!gpu_setup().nccl_ok) {
    MESSAGE("skipped: " << gpu_setup().why);
    return;
  }
  Stream st;
  gradsync::NcclBackend nccl(MPI_COMM_WORLD, st.s);  // one communicator, shared by every sync
  check_every_row<T, gradsync::NcclBackend>([&] { return nccl; }, world_size(), gradsync::HostStaging::automatic, st.s);
  // Sharded: the reduce-scatter of grouped ncclReduce calls, each rank's slices against the same sums.
  check_every_row<T, gradsync::NcclBackend>([&] { return nccl; }, world_size(), gradsync::HostStaging::automatic, st.s,
                                            gradsync::Shard::optimizer_state);
}

TEST_CASE_TEMPLATE("semantics on device memory: MpiBackend staging through pinned host memory", T, float, double) {
  Stream st;
  gradsync::MpiBackend probe(MPI_COMM_WORLD);
  // automatic stages only when this MPI is not CUDA-aware; always stages in any case.
  if (!probe.cuda_aware())
    check_every_row<T, gradsync::MpiBackend>([] { return gradsync::MpiBackend(MPI_COMM_WORLD); }, world_size(),
                                             gradsync::HostStaging::automatic, st.s);
  check_every_row<T, gradsync::MpiBackend>([] { return gradsync::MpiBackend(MPI_COMM_WORLD); }, world_size(),
                                           gradsync::HostStaging::always, st.s);
}

TEST_CASE("semantics on device memory: SelfBackend") {
  Stream st;
  check_every_row<double, gradsync::SelfBackend>([] { return gradsync::SelfBackend{}; }, 1,
                                                 gradsync::HostStaging::automatic, st.s);
}

TEST_CASE("never staging with an MPI that cannot reach device memory is a ConfigError") {
  Stream st;
  DeviceArray<float> g(10);
  gradsync::Options o;
  o.tuning.host_staging = gradsync::HostStaging::never;
  gradsync::GradientSync<gradsync::MpiBackend, DevSpan<float>> sync(
      gradsync::MpiBackend(MPI_COMM_WORLD, gradsync::CudaAwareMpi::no), o, gradsync::CudaStream(st.s));
  sync.add<Dense>(DevSpan<float>(g.data(), g.size()));
  bool threw = false;
  try {
    (void)sync.synchronize();
  } catch (const gradsync::ConfigError& e) {
    threw = std::string(e.what()).find("gradsync::CudaDeviceSpace") != std::string::npos;
  }
  GRADSYNC_CHECK_ALL(threw);
}

#if defined(KOKKOS_ENABLE_CUDA)
// Kokkos' own CUDA spaces: the fusion buffer in CudaSpace, packed by Kokkos team kernels on the
// execution space instance's stream, staged through CudaHostPinnedSpace for a non-CUDA-aware MPI.
TEST_CASE_TEMPLATE("Kokkos::CudaSpace views: NcclBackend and staged MpiBackend", T, float, double) {
  using View = Kokkos::View<T*, Kokkos::CudaSpace>;
  const int rank = world_rank(), n = world_size();
  Kokkos::Cuda exec;
  View a("a", 5000), b("b", 3);
  auto run = [&](auto backend, gradsync::HostStaging staging) {
    gradsync::Options o;
    o.tuning.host_staging = staging;
    o.tuning.fusion_threshold_bytes = 1024;
    gradsync::GradientSync<decltype(backend), View> sync(backend, o, exec);
    sync.template add<Dense>(a);
    sync.template add<Tables>(b);
    Kokkos::deep_copy(a, T(rank + 1));
    Kokkos::deep_copy(b, T(6));
    GRADSYNC_CHECK_ALL(sync.synchronize());
    auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
    auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
    const double expect = (n + 1) / 2.0;  // average of 1..n
    GRADSYNC_CHECK_ALL(rel_err(ha(4999), expect) <= gradsync_test::tol<T>() && rel_err(hb(0), 6.0 / n) <= 1e-6);
  };
  if (gpu_setup().nccl_ok) run(gradsync::NcclBackend(MPI_COMM_WORLD, exec), gradsync::HostStaging::automatic);
  run(gradsync::MpiBackend(MPI_COMM_WORLD), gradsync::HostStaging::always);
}
#endif

namespace {

// Wire compression on device memory (issue 19): values whose sums every 16-bit format holds exactly
// (multiples of 0.5 below 128, at most 8 significant bits), so the result must be exact; the pack and
// unpack run as raw CUDA kernels, the sum in NCCL (ncclBfloat16 / ncclFloat16) or, staged, on the host.
template <class T, class Backend, class Make>
void check_compressed(Make make, int n, cudaStream_t stream) {
  const int rank = world_rank();
  for (auto c : {gradsync::Compression::bf16, gradsync::Compression::fp16})
    for (bool feedback : {false, true}) {
      gradsync::Options o;
      o.op = gradsync::ReduceOp::sum;
      o.compression = c;
      o.error_feedback = feedback;
      o.tuning.read_environment = false;
      const std::size_t len = 70000;
      std::vector<T> host(len);
      for (std::size_t i = 0; i < len; ++i) host[i] = T(double(i % 32) * 0.5 + rank);
      DeviceArray<T> g(host);
      gradsync::GradientSync<Backend, DevSpan<T>> sync(make(), o, gradsync::CudaStream(stream));
      sync.template add<Dense>(DevSpan<T>(g.data(), g.size()));
      CHECK(sync.synchronize());
      const std::vector<T> got = g.download();
      bool exact = true;
      for (std::size_t i = 0; i < len; ++i)  // SelfBackend (n = 1): this rank's own values
        exact = exact && got[i] == (n == 1 ? host[i] : T(n * (double(i % 32) * 0.5) + n * (n - 1) / 2.0));
      GRADSYNC_CHECK_ALL(exact);
      GRADSYNC_CHECK_ALL(sync.stats().bytes_allreduced == 2 * len);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("compression on device memory: NcclBackend, staged MpiBackend, SelfBackend", T, float, double) {
  Stream st;
  if (gpu_setup().nccl_ok) {
    gradsync::NcclBackend nccl(MPI_COMM_WORLD, st.s);
    check_compressed<T, gradsync::NcclBackend>([&] { return nccl; }, world_size(), st.s);
  }
  check_compressed<T, gradsync::MpiBackend>([] { return gradsync::MpiBackend(MPI_COMM_WORLD); }, world_size(), st.s);
  check_compressed<T, gradsync::SelfBackend>([] { return gradsync::SelfBackend{}; }, 1, st.s);
}
