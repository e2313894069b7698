// CUDA-aware MPI detection and its overrides, and the automatic choice of host staging, on a host
// without a GPU: the decision function against every input, the environment variable through a real
// MpiBackend, and a GradientSync whose backend cannot reach the gradients' memory staging through
// host memory (and refusing to when told never to), and a backend ordered on the execution space
// being handed chunks without a fence.
#include <gradsync/gradsync.hpp>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync::CudaAwareMpi;
using gradsync::impl::CudaAwareProbe;
using gradsync::impl::decide_cuda_aware_mpi;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {

// A memory space tag that host code cannot read but a CUDA-aware MPI could: the stand-in for
// device memory in a build without CUDA. Only the traits matter here.
struct FakeDeviceSpace {};
struct Dense {};

// Sets an environment variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// MpiBackend as it behaves for device memory with a non-CUDA-aware MPI: it cannot access the
// gradients' memory space (here host memory), so GradientSync must stage through host memory.
class UnreachableMpiBackend : public gradsync::MpiBackend {
 public:
  using MpiBackend::MpiBackend;
  template <class MemorySpace>
  bool can_access() const {
    return false;
  }
};

// A backend ordered on the execution space (as NcclBackend is on its own stream): it counts how
// often GradientSync asked, so the test sees the fence being skipped chunk by chunk.
class OrderedMpiBackend : public gradsync::MpiBackend {
 public:
  using MpiBackend::MpiBackend;
  using capabilities = MpiBackend::capabilities::with<gradsync::Capability::ordered_on>;
  bool ordered_on(const Kokkos::DefaultHostExecutionSpace&) const {
    ++*asked;
    return true;
  }
  std::shared_ptr<int> asked = std::make_shared<int>(0);
};

using HostView = Kokkos::View<double*, Kokkos::HostSpace>;

// One step of `sync` over g: rank r holds (r + 1) i, so every rank must end with the average
// (n + 1) / 2 i.
template <class Sync>
void step_and_check_average(Sync& sync, const HostView& g) {
  const int rank = world_rank(), n = world_size();
  for (std::size_t i = 0; i < g.size(); ++i) g(i) = double(rank + 1) * double(i);
  GRADSYNC_CHECK_ALL(sync.synchronize());
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, rel_err(g(i), (n + 1) / 2.0 * double(i)));
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst <= gradsync_test::tol<double>());
}

}  // namespace

template <>
struct gradsync::impl::host_accessible<FakeDeviceSpace> : std::false_type {};
template <>
struct gradsync::impl::is_cuda_memory<FakeDeviceSpace> : std::true_type {};

TEST_CASE("the CUDA-aware decision: program, then environment, then run time, then compile time") {
  const CudaAwareProbe none{}, says_yes{1, 1}, built_not_running{1, 0}, only_compile{1, -1}, says_no{0, 0};
  // The program's choice wins over everything, including a malformed environment value.
  CHECK(decide_cuda_aware_mpi(CudaAwareMpi::yes, "0", says_no).aware);
  CHECK(!decide_cuda_aware_mpi(CudaAwareMpi::no, "1", says_yes).aware);
  CHECK(decide_cuda_aware_mpi(CudaAwareMpi::yes, "garbage", none).aware);
  // Then the environment, over what the library says.
  CHECK(decide_cuda_aware_mpi(CudaAwareMpi::detect, "1", says_no).aware);
  CHECK(!decide_cuda_aware_mpi(CudaAwareMpi::detect, "0", says_yes).aware);
  CHECK(std::string(decide_cuda_aware_mpi(CudaAwareMpi::detect, "1", none).source) == "GRADSYNC_CUDA_AWARE_MPI");
  // Unset or empty: the run-time query, which wins over the compile-time macro.
  CHECK(decide_cuda_aware_mpi(CudaAwareMpi::detect, nullptr, says_yes).aware);
  CHECK(!decide_cuda_aware_mpi(CudaAwareMpi::detect, "", built_not_running).aware);
  CHECK(decide_cuda_aware_mpi(CudaAwareMpi::detect, nullptr, only_compile).aware);
  CHECK(!decide_cuda_aware_mpi(CudaAwareMpi::detect, nullptr, says_no).aware);
  // A library that says nothing is taken as not CUDA-aware: staging is always correct.
  CHECK(!decide_cuda_aware_mpi(CudaAwareMpi::detect, nullptr, none).aware);
  // Malformed values name the variable and the value.
  for (const char* bad : {"yes", "true", "2", " 1", "1 ", "01", "-1"}) {
    CAPTURE(bad);
    try {
      decide_cuda_aware_mpi(CudaAwareMpi::detect, bad, says_yes);
      FAIL("no ConfigError");
    } catch (const gradsync::ConfigError& e) {
      const std::string what = e.what();
      CHECK(what.find("GRADSYNC_CUDA_AWARE_MPI") != std::string::npos);
      CHECK(what.find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
}

TEST_CASE("this MPI's own report matches its headers") {
  const CudaAwareProbe p = gradsync::impl::probe_cuda_aware_mpi();
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  CHECK(p.compile_time == (MPIX_CUDA_AWARE_SUPPORT ? 1 : 0));
  // Open MPI built without CUDA cannot report CUDA support at run time.
  if (p.compile_time == 0) CHECK(p.run_time != 1);
#else
  CHECK(p.compile_time == -1);
#endif
  ScopedEnv env("GRADSYNC_CUDA_AWARE_MPI", nullptr);
  gradsync::MpiBackend b(MPI_COMM_WORLD);
  CHECK(b.cuda_aware() == decide_cuda_aware_mpi(CudaAwareMpi::detect, nullptr, p).aware);
}

TEST_CASE("MpiBackend::can_access: host memory always, device memory only when CUDA-aware") {
  {
    ScopedEnv env("GRADSYNC_CUDA_AWARE_MPI", "1");
    gradsync::MpiBackend b(MPI_COMM_WORLD);
    GRADSYNC_CHECK_ALL(b.cuda_aware() && b.can_access<FakeDeviceSpace>() && b.can_access<Kokkos::HostSpace>());
    gradsync::MpiBackend forced_off(MPI_COMM_WORLD, CudaAwareMpi::no);
    GRADSYNC_CHECK_ALL(!forced_off.can_access<FakeDeviceSpace>() && forced_off.can_access<Kokkos::HostSpace>());
  }
  {
    ScopedEnv env("GRADSYNC_CUDA_AWARE_MPI", "0");
    gradsync::MpiBackend b(MPI_COMM_WORLD);
    GRADSYNC_CHECK_ALL(!b.cuda_aware() && !b.can_access<FakeDeviceSpace>() && b.can_access<Kokkos::HostSpace>());
    gradsync::MpiBackend forced_on(MPI_COMM_WORLD, CudaAwareMpi::yes);
    GRADSYNC_CHECK_ALL(forced_on.can_access<FakeDeviceSpace>());
    GRADSYNC_CHECK_ALL(std::string(forced_on.cuda_aware_source()) == "requested by the program");
  }
  {
    ScopedEnv env("GRADSYNC_CUDA_AWARE_MPI", "on");
    bool threw = false;
    try {
      gradsync::MpiBackend b(MPI_COMM_WORLD);
    } catch (const gradsync::ConfigError& e) {
      threw = std::string(e.what()).find("GRADSYNC_CUDA_AWARE_MPI='on'") != std::string::npos;
    }
    GRADSYNC_CHECK_ALL(threw);
  }
  // SelfBackend moves nothing, so it reaches everything.
  CHECK(gradsync::SelfBackend{}.can_access<FakeDeviceSpace>());
}

TEST_CASE("a backend that cannot reach the gradients stages through host memory, or refuses to") {
  using T = float;
  const int rank = world_rank(), n = world_size();
  const std::size_t sizes[] = {1000, 1, 3000};
  std::vector<Kokkos::View<T*>> g;
  for (std::size_t s : sizes) g.emplace_back("g", s);
  auto value = [&](std::size_t t, std::size_t i, int r, int p) { return T((r + 1) * 0.5 + i % 7 + t + p); };
  for (auto staging : {gradsync::HostStaging::automatic, gradsync::HostStaging::always}) {
    gradsync::Options opt;
    opt.tuning.host_staging = staging;
    opt.tuning.fusion_threshold_bytes = 1024;  // several chunks through the pipelined staging slots
    gradsync::GradientSync<UnreachableMpiBackend, Kokkos::View<T*>> sync(UnreachableMpiBackend(MPI_COMM_WORLD), opt);
    for (auto& v : g) sync.add<Dense>(v);
    for (int p = 0; p < 3; ++p) {
      for (std::size_t t = 0; t < g.size(); ++t)
        gradsync_test::fill_host(g[t], [&](std::size_t i) { return value(t, i, rank, p); });
      GRADSYNC_CHECK_ALL(sync.synchronize());
      double worst = 0;
      for (std::size_t t = 0; t < g.size(); ++t) {
        const auto h = gradsync_test::host_copy(g[t]);
        for (std::size_t i = 0; i < h.size(); ++i) {
          double expect = 0;
          for (int r = 0; r < n; ++r) expect += value(t, i, r, p);
          worst = std::max(worst, rel_err(h(i), expect / n));
        }
      }
      CAPTURE(worst);
      GRADSYNC_CHECK_ALL(worst <= gradsync_test::tol<T>());
    }
    // The staging mirror exists: the same sync over a reachable backend holds fewer bytes. Host
    // memory, which MpiBackend always reaches (the gradients themselves unless they are on a device).
    opt.tuning.host_staging = gradsync::HostStaging::automatic;
    using HostView = Kokkos::View<T*, Kokkos::HostSpace>;
    gradsync::GradientSync<gradsync::MpiBackend, HostView> reachable(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
    for (auto& v : g) reachable.add<Dense>(gradsync_test::host_copy(v));
    CHECK(reachable.synchronize());
    CAPTURE(sync.stats().buffer_bytes);
    CAPTURE(reachable.stats().buffer_bytes);
    GRADSYNC_CHECK_ALL(sync.stats().buffer_bytes == 2 * reachable.stats().buffer_bytes);
  }
  gradsync::Options never;
  never.tuning.host_staging = gradsync::HostStaging::never;
  gradsync::GradientSync<UnreachableMpiBackend, Kokkos::View<T*>> sync(UnreachableMpiBackend(MPI_COMM_WORLD), never);
  sync.add<Dense>(g[0]);
  bool threw = false;
  try {
    (void)sync.synchronize();
  } catch (const gradsync::ConfigError& e) {
    threw = std::string(e.what()).find("host_staging = never") != std::string::npos;
  }
  GRADSYNC_CHECK_ALL(threw);
}

// Host memory: the backend says it is ordered on the host execution space, which MPI calls are.
TEST_CASE("a backend ordered on the execution space is handed chunks without a fence, unless staged") {
  static_assert(!gradsync::impl::has_ordered_on<gradsync::MpiBackend, Kokkos::DefaultHostExecutionSpace>::value);
  static_assert(gradsync::impl::has_ordered_on<OrderedMpiBackend, Kokkos::DefaultHostExecutionSpace>::value);
  HostView g("g", 1000);
  for (auto staging : {gradsync::HostStaging::automatic, gradsync::HostStaging::always}) {
    gradsync::Options opt;
    opt.tuning.fusion_threshold_bytes = 1024;  // 128 values a chunk: 8 chunks
    opt.tuning.host_staging = staging;
    OrderedMpiBackend backend(MPI_COMM_WORLD);
    auto asked = backend.asked;
    gradsync::GradientSync<OrderedMpiBackend, HostView> sync(backend, opt);
    sync.add<Dense>(g);
    step_and_check_average(sync, g);
    // Asked once by the plan (its chunk size), then once per chunk; never per chunk when staging
    // (the host reads the mirror: always a fence).
    CAPTURE(*asked);
    GRADSYNC_CHECK_ALL(*asked == 1 + (staging == gradsync::HostStaging::always ? 0 : 8));
  }
}

// By topology the plan cuts 64 MiB chunks for a backend ordered on the sync's stream (pack,
// collective and unpack of every chunk run one after another there: smaller chunks overlap nothing)
// and 4 MiB for any other on one node; fusion_threshold_auto tries 64 MiB first for it; a size the
// program sets is kept. The sums are right either way.
TEST_CASE("a backend ordered on the sync's stream gets 64 MiB chunks by topology") {
  constexpr std::size_t mib = std::size_t(1) << 20;
  auto summary_of = [&](auto backend, std::size_t threshold) {
    gradsync::Options opt;
    opt.tuning.fusion_threshold_bytes = threshold;
    HostView g("g", 3000);
    gradsync::GradientSync<decltype(backend), HostView> sync(backend, opt);
    sync.template add<Dense>(g);
    for (int step = 0; step < 2; ++step) step_and_check_average(sync, g);
    return sync.summary();
  };
  const gradsync::SyncSummary ordered =
      summary_of(OrderedMpiBackend(MPI_COMM_WORLD), gradsync::fusion_threshold_by_topology);
  const gradsync::SyncSummary plain =
      summary_of(gradsync::MpiBackend(MPI_COMM_WORLD), gradsync::fusion_threshold_by_topology);
  CAPTURE(ordered.fusion_threshold_bytes);
  CAPTURE(plain.fusion_threshold_bytes);
  GRADSYNC_CHECK_ALL(ordered.fusion_threshold_bytes == 64 * mib && ordered.plan_candidates == 1);
  GRADSYNC_CHECK_ALL(plain.fusion_threshold_bytes == 4 * mib && plain.plan_candidates == 1);
  // auto: one more candidate, the largest, tried first (the first steps run it).
  const gradsync::SyncSummary ordered_auto =
      summary_of(OrderedMpiBackend(MPI_COMM_WORLD), gradsync::fusion_threshold_auto);
  const gradsync::SyncSummary plain_auto =
      summary_of(gradsync::MpiBackend(MPI_COMM_WORLD), gradsync::fusion_threshold_auto);
  const std::size_t candidates = gradsync::impl::chunk_candidates().size();
  GRADSYNC_CHECK_ALL(ordered_auto.plan_candidates == candidates + 1 && plain_auto.plan_candidates == candidates);
  GRADSYNC_CHECK_ALL(ordered_auto.tuning && ordered_auto.fusion_threshold_bytes == 64 * mib);
  GRADSYNC_CHECK_ALL(plain_auto.tuning && plain_auto.fusion_threshold_bytes == gradsync::impl::chunk_candidates()[0]);
  // A size the program sets wins.
  const gradsync::SyncSummary ordered_set = summary_of(OrderedMpiBackend(MPI_COMM_WORLD), std::size_t(2048));
  GRADSYNC_CHECK_ALL(ordered_set.fusion_threshold_bytes == 2048 && ordered_set.chunks == 12);
}
