// NcclBackend against analytic values on device memory, every collective, float and double, when
// every rank has its own CUDA device. On a machine without one (CI), the same program checks that
// building the backend fails with a gradsync::Error on every rank, naming them, and that none hangs.
// Compiled by the host compiler: the backend itself needs no nvcc. Built against a Kokkos with CUDA
// (tests/gpu/run.sh), it also runs a DistributedOptimizer over NCCL on Kokkos::CudaSpace views.
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "gradsync_test.hpp"

#if !defined(GRADSYNC_HAVE_NCCL)
#error "link GradSync::nccl"
#endif

using gradsync_test::DeviceArray;
using gradsync_test::gpu_setup;
using gradsync_test::world_rank;
using gradsync_test::world_size;

static_assert(std::is_copy_constructible_v<gradsync::NcclBackend>);
// The failure path can abandon NCCL's collectives (impl::abort_collectives); MPI's it cannot.
static_assert(gradsync::impl::has_abort<gradsync::NcclBackend>::value);
static_assert(!gradsync::impl::has_abort<gradsync::MpiBackend>::value);
static_assert(!gradsync::impl::reads_memory_space<gradsync::NcclBackend, Kokkos::HostSpace>::value);
static_assert(gradsync::impl::reads_memory_space<gradsync::NcclBackend, gradsync::CudaDeviceSpace>::value);
static_assert(gradsync::impl::reads_memory_space<gradsync::MpiBackend, Kokkos::HostSpace>::value);
// The helpers' collectives (broadcast_parameters, the norm, the row-sparse exchange) have
// nonblocking forms, so impl::Watched waits for them under the stall watchdog instead of in
// cudaStreamSynchronize.
static_assert(gradsync::impl::has_ibroadcast<gradsync::NcclBackend>::value);
static_assert(gradsync::impl::has_iallreduce_min<gradsync::NcclBackend>::value);
static_assert(gradsync::impl::has_iallgather<gradsync::NcclBackend>::value);

TEST_CASE("NcclBackend without a usable CUDA device: gradsync::Error on every rank, no hang") {
  if (gpu_setup().devices > 0) {
    MESSAGE("CUDA devices present: the collective tests below cover construction");
    return;
  }
  std::string what;
  try {
    gradsync::NcclBackend b(MPI_COMM_WORLD);
  } catch (const gradsync::Error& e) {
    what = e.what();
  }
  CAPTURE(what);
  std::string all_ranks = "rank(s) 0";
  for (int r = 1; r < world_size(); ++r) all_ranks += ", " + std::to_string(r);
  GRADSYNC_CHECK_ALL(what.find("no usable CUDA device on " + all_ranks) != std::string::npos);
  GRADSYNC_CHECK_ALL(what.find("on rank " + std::to_string(world_rank())) != std::string::npos);
}

TEST_CASE_TEMPLATE("NcclBackend collectives on device memory", T, float, double) {
  if (!gpu_setup().nccl_ok) {
    MESSAGE("skipped: " << gpu_setup().why);
    return;
  }
  const int rank = world_rank(), n = world_size();
  cudaStream_t stream;
  gradsync_test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  {
    gradsync::NcclBackend b(MPI_COMM_WORLD, stream);
    GRADSYNC_CHECK_ALL(b.rank() == rank && b.size() == n && b.stream() == stream);
    CHECK(b.can_access<gradsync::CudaDeviceSpace>());
    CHECK(!b.can_access<Kokkos::HostSpace>());
    const std::size_t m = 1000;
    auto value = [](int r, std::size_t i) { return T(r + 1) + T(i % 13); };
    std::vector<T> mine(m);
    for (std::size_t i = 0; i < m; ++i) mine[i] = value(rank, i);
    auto sum_of = [&](std::size_t i) {
      T s = 0;
      for (int r = 0; r < n; ++r) s += value(r, i);
      return s;
    };
    bool ok = true;
    {  // blocking sum
      DeviceArray<T> d(mine);
      b.allreduce_sum(d.data(), m);
      auto h = d.download();
      for (std::size_t i = 0; i < m; ++i) ok = ok && h[i] == sum_of(i);
    }
    GRADSYNC_CHECK_ALL(ok);
    {  // two nonblocking sums in flight, waited in reverse order, then test()
      DeviceArray<T> d1(mine), d2(mine);
      auto r1 = b.iallreduce_sum(d1.data(), m);
      auto r2 = b.iallreduce_sum(d2.data(), m);
      b.wait(r2);
      b.wait(r1);
      CHECK(b.test(r1));
      auto h1 = d1.download(), h2 = d2.download();
      for (std::size_t i = 0; i < m; ++i) ok = ok && h1[i] == sum_of(i) && h2[i] == sum_of(i);
      // More requests in flight than the backend made events for up front (16): each has an event
      // of its own (waiting for one never waits for a later collective), each completes, and
      // the events go back to the pool for the next ones.
      for (int round = 0; round < 2; ++round) {
        std::vector<gradsync::NcclBackend::Request> reqs;
        for (int k = 0; k < 40; ++k) reqs.push_back(b.iallreduce_sum(d1.data(), 1));
        std::set<cudaEvent_t> distinct;
        for (const auto& r : reqs) distinct.insert(r.event);
        ok = ok && distinct.size() == reqs.size() && distinct.count(nullptr) == 0;
        for (auto& r : reqs) b.wait(r);
        for (auto& r : reqs) ok = ok && r.event == nullptr && b.test(r);
      }
    }
    GRADSYNC_CHECK_ALL(ok);
    if constexpr (gradsync::NcclBackend::reduces_average) {
      DeviceArray<T> d(mine);
      b.allreduce_average(d.data(), m);
      auto h = d.download();
      for (std::size_t i = 0; i < m; ++i) ok = ok && gradsync_test::rel_err(h[i], sum_of(i) / T(n)) <= 1e-6;
      GRADSYNC_CHECK_ALL(ok);
    }
    {  // min / max
      DeviceArray<T> lo(mine), hi(mine);
      b.allreduce_min(lo.data(), m);
      b.allreduce_max(hi.data(), m);
      auto l = lo.download(), h = hi.download();
      for (std::size_t i = 0; i < m; ++i) ok = ok && l[i] == value(0, i) && h[i] == value(n - 1, i);
    }
    GRADSYNC_CHECK_ALL(ok);
    {  // the nonblocking forms, all three in flight at once, waited in reverse order
      DeviceArray<T> lo(mine), bc(mine), gs(mine), gr(std::size_t(n) * m);
      auto rl = b.iallreduce_min(lo.data(), m);
      auto rb = b.ibroadcast(bc.data(), m, n - 1);
      auto rg = b.iallgather(gs.data(), gr.data(), m);
      b.wait(rg);
      b.wait(rb);
      b.wait(rl);
      auto l = lo.download(), h = bc.download(), g = gr.download();
      for (std::size_t i = 0; i < m; ++i) {
        ok = ok && l[i] == value(0, i) && h[i] == value(n - 1, i);
        for (int q = 0; q < n; ++q) ok = ok && g[std::size_t(q) * m + i] == value(q, i);
      }
    }
    GRADSYNC_CHECK_ALL(ok);
    {  // broadcast from the last rank
      DeviceArray<T> d(mine);
      b.broadcast(d.data(), m, n - 1);
      auto h = d.download();
      for (std::size_t i = 0; i < m; ++i) ok = ok && h[i] == value(n - 1, i);
      for (int root : {-1, n}) {
        const std::string blocking = gradsync_test::error_of([&] { b.broadcast(d.data(), m, root); });
        const std::string nonblocking = gradsync_test::error_of([&] { (void)b.ibroadcast(d.data(), m, root); });
        const std::string expect = "gradsync: broadcast root " + std::to_string(root) + " is not a rank of this " +
                                   std::to_string(n) + "-rank NCCL communicator";
        CAPTURE(blocking);
        ok = ok && blocking == expect && nonblocking == expect;
      }
    }
    GRADSYNC_CHECK_ALL(ok);
    {  // allgather and alltoall: rank r's block for rank q holds r * 100 + q
      const std::size_t k = 5;
      std::vector<T> send(std::size_t(n) * k);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < k; ++i) send[std::size_t(q) * k + i] = T(rank * 100 + q) + T(i) / 8;
      DeviceArray<T> ds(send), dr(send.size()), dg(send.size());
      b.alltoall(ds.data(), dr.data(), k);
      b.allgather(ds.data(), dg.data(), k);  // everyone's first block
      auto r = dr.download(), g = dg.download();
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < k; ++i) {
          ok = ok && r[std::size_t(q) * k + i] == T(q * 100 + rank) + T(i) / 8;
          ok = ok && g[std::size_t(q) * k + i] == T(q * 100 + 0) + T(i) / 8;
        }
    }
    GRADSYNC_CHECK_ALL(ok);
    {  // alltoallv: rank r sends q + 1 values to rank q, each equal to r * 100 + q
      const std::size_t un = std::size_t(n);
      std::vector<int> sc(un), sd(un), rc(un), rd(un);
      int st = 0, rt = 0;
      for (int q = 0; q < n; ++q) {
        sc[std::size_t(q)] = q + 1, sd[std::size_t(q)] = st, st += q + 1;
        rc[std::size_t(q)] = rank + 1, rd[std::size_t(q)] = rt, rt += rank + 1;
      }
      std::vector<T> send(static_cast<std::size_t>(st));
      for (int q = 0; q < n; ++q)
        for (int i = 0; i <= q; ++i) send[std::size_t(sd[std::size_t(q)] + i)] = T(rank * 100 + q);
      DeviceArray<T> ds(send), dr(static_cast<std::size_t>(rt));
      b.alltoallv(ds.data(), sc.data(), sd.data(), dr.data(), rc.data(), rd.data());
      auto r = dr.download();
      for (int q = 0; q < n; ++q)
        for (int i = 0; i <= rank; ++i) ok = ok && r[std::size_t(rd[std::size_t(q)] + i)] == T(q * 100 + rank);
    }
    GRADSYNC_CHECK_ALL(ok);
    if constexpr (gradsync::impl::has_shard_sums<gradsync::NcclBackend>::value) {
      // The halves of a sharded step over two regions (m and 7 values) taken as one buffer: this
      // rank's slice (shard_slice) holds factor * the sum (pre first), then every slice everywhere.
      DeviceArray<T> a(mine), c(std::vector<T>(mine.begin(), mine.begin() + 7));
      const gradsync::SumRegion<T> regions[2] = {{a.data(), m}, {c.data(), 7}};
      const T factor = T(0.5), pre = T(rank + 1);
      auto rs = b.ireduce_scatter_sum_regions(regions, 2, factor, pre);
      b.wait(rs);
      auto ha = a.download(), hc = c.download();
      const auto [lo, hi] = gradsync::shard_slice(m + 7, n, rank);
      auto weighted_sum = [&](std::size_t i) {
        T s = 0;
        for (int r = 0; r < n; ++r) s += factor * T(r + 1) * value(r, i);
        return s;
      };
      for (std::size_t j = lo; j < hi; ++j) {
        const T got = j < m ? ha[j] : hc[j - m];
        ok = ok && gradsync_test::rel_err(got, weighted_sum(j < m ? j : j - m)) <= 1e-6;
      }
      GRADSYNC_CHECK_ALL(ok);
      // Each rank writes a mark into its slice; the allgather brings every rank's.
      for (std::size_t j = 0; j < m + 7; ++j) (j < m ? ha[j] : hc[j - m]) = T(-1);
      for (std::size_t j = lo; j < hi; ++j) (j < m ? ha[j] : hc[j - m]) = T(rank * 1000) + T(j % 10);
      DeviceArray<T> ga(ha), gc(hc);
      const gradsync::SumRegion<T> gathered[2] = {{ga.data(), m}, {gc.data(), 7}};
      auto rg = b.iallgather_regions(gathered, 2);
      b.wait(rg);
      ha = ga.download();
      hc = gc.download();
      for (int q = 0; q < n; ++q) {
        const auto [qlo, qhi] = gradsync::shard_slice(m + 7, n, q);
        for (std::size_t j = qlo; j < qhi; ++j) ok = ok && (j < m ? ha[j] : hc[j - m]) == T(q * 1000) + T(j % 10);
      }
      GRADSYNC_CHECK_ALL(ok);
    }
    b.barrier();
    // Copies share one communicator; the last one destroys it.
    gradsync::NcclBackend copy = b;
    GRADSYNC_CHECK_ALL(copy.nccl_comm() == b.nccl_comm());
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("NcclBackend::abort releases a stream that waits for a missing peer, and refuses what follows") {
  if (!gpu_setup().nccl_ok) {
    MESSAGE("skipped: " << gpu_setup().why);
    return;
  }
  const int rank = world_rank();
  cudaStream_t stream;
  gradsync_test::cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  {
    gradsync::NcclBackend b(MPI_COMM_WORLD, stream);
    gradsync::NcclBackend copy = b;
    DeviceArray<float> d(std::vector<float>(256, 1.0f));
    // Rank 0 alone starts a sum (with one rank it completes, with more it waits for peers that
    // never come, as after a stall): abort() terminates it, the stream drains.
    if (rank == 0) (void)b.iallreduce_sum(d.data(), 256);  // left unfinished: the request is dropped
    gradsync::impl::abort_collectives(b);
    gradsync::impl::abort_collectives(b);  // idempotent
    (void)cudaStreamSynchronize(stream);   // returns: nothing left enqueued that waits
    (void)cudaGetLastError();
    GRADSYNC_CHECK_ALL(b.aborted() && copy.aborted() && copy.nccl_comm() == nullptr);
    const std::string expect = "gradsync: NcclBackend on rank " + std::to_string(rank) +
                               ": the NCCL communicator was aborted (after a stall or a peer's failure); build a "
                               "new backend";
    const std::string sum = gradsync_test::error_of([&] { b.allreduce_sum(d.data(), 256); });
    const std::string nonblocking = gradsync_test::error_of([&] { (void)copy.iallreduce_sum(d.data(), 256); });
    const std::string barrier = gradsync_test::error_of([&] { b.barrier(); });
    CAPTURE(sum);
    GRADSYNC_CHECK_ALL(sum == expect && nonblocking == expect && barrier == expect);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStreamDestroy(stream);
}

#if defined(KOKKOS_ENABLE_CUDA)
struct Dense {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

// Horovod's GPU configuration: a DistributedOptimizer over NcclBackend on Kokkos::CudaSpace views.
// broadcast_parameters (its count agreement and broadcasts), the global norm and clipping (an
// allreduce of one value) run through the backend's nonblocking forms under the stall watchdog.
// Checked against analytic per-rank values. Built only against a Kokkos with CUDA (tests/gpu/run.sh).
TEST_CASE(
    "DistributedOptimizer over NcclBackend on Kokkos::CudaSpace views: broadcast, norm, clip, step, sharded too") {
  if (!gpu_setup().nccl_ok) {
    MESSAGE("skipped: " << gpu_setup().why);
    return;
  }
  // Sharded (Options::shard): the reduce-scatter and allgather are grouped ncclReduce / ncclBroadcast
  // of each rank's slice; SGD on the slices and the allgather give the same parameters.
  for (auto shard : {gradsync::Shard::none, gradsync::Shard::optimizer_state}) {
    CAPTURE(int(shard));
    gradsync::Options opts;
    opts.shard = shard;
    using V = Kokkos::View<double*, Kokkos::CudaSpace>;
    using Sync = gradsync::GradientSync<gradsync::NcclBackend, V>;
    const int rank = world_rank(), n = world_size(), root = n - 1;
    auto tower_size = [](int r) { return std::size_t(3 + r); };  // differs by rank
    const std::size_t m = 1000, k = tower_size(rank);
    Kokkos::Cuda exec;
    gradsync::SgdOptions so;
    so.lr = 0.5;
    gradsync::DistributedOptimizer dopt(gradsync::Sgd<V>(so),
                                        Sync(gradsync::NcclBackend(MPI_COMM_WORLD, exec), opts, exec));
    V w("w", m), gw("gw", m), t("tower", k), gt("gt", k);
    dopt.add<Dense>(w, gw, "w");
    dopt.add<Tower>(t, gt, "tower");
    auto w0 = [](int r, std::size_t i) { return 10.0 * r + double(i % 7); };
    auto t0 = [](int r, std::size_t j) { return r + 0.25 * double(j); };
    auto gw_of = [](int r, std::size_t i) { return r + 1.0 + double(i % 5) / 4; };
    auto gt_of = [](int r, std::size_t j) { return (r + 1.0) * double(j + 1) / 8; };
    gradsync_test::fill_host(w, [&](std::size_t i) { return w0(rank, i); });
    gradsync_test::fill_host(t, [&](std::size_t j) { return t0(rank, j); });
    dopt.broadcast_parameters(root);
    bool ok = true;
    {
      const auto hw = gradsync_test::host_values(w), ht = gradsync_test::host_values(t);
      for (std::size_t i = 0; i < m; ++i) ok = ok && hw[i] == w0(root, i);
      for (std::size_t j = 0; j < k; ++j) ok = ok && ht[j] == t0(rank, j);  // local: kept
    }
    GRADSYNC_CHECK_ALL(ok);

    gradsync_test::fill_host(gw, [&](std::size_t i) { return gw_of(rank, i); });
    gradsync_test::fill_host(gt, [&](std::size_t j) { return gt_of(rank, j); });
    GRADSYNC_CHECK_ALL(dopt.synchronize());
    // The single-process norm on the global batch: the average of the data-parallel gradient, and
    // every rank's tower gradient scaled by 1/n, each counted once.
    auto average = [&](std::size_t i) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += gw_of(r, i);
      return s / n;
    };
    double sq = 0;
    for (std::size_t i = 0; i < m; ++i) sq += average(i) * average(i);
    for (int r = 0; r < n; ++r)
      for (std::size_t j = 0; j < tower_size(r); ++j) sq += (gt_of(r, j) / n) * (gt_of(r, j) / n);
    const double norm = std::sqrt(sq), max_norm = norm / 2, coef = max_norm / (norm + 1e-6);
    const double got = dopt.clip_grad_norm(max_norm);
    CAPTURE(got);
    CAPTURE(norm);
    GRADSYNC_CHECK_ALL(gradsync_test::rel_err(got, norm) < 1e-12);
    dopt.apply();
    double err = 0;
    const auto hw = gradsync_test::host_values(w), ht = gradsync_test::host_values(t);
    for (std::size_t i = 0; i < m; ++i)
      err = std::max(err, gradsync_test::rel_err(hw[i], w0(root, i) - so.lr * coef * average(i)));
    for (std::size_t j = 0; j < k; ++j)
      err = std::max(err, gradsync_test::rel_err(ht[j], t0(rank, j) - so.lr * coef * gt_of(rank, j) / n));
    CAPTURE(err);
    GRADSYNC_CHECK_ALL(err < 1e-12);
  }
}
#endif

TEST_CASE("MpiBackend reaches gradsync::CudaDeviceSpace only when CUDA-aware") {
  gradsync::MpiBackend aware(MPI_COMM_WORLD, gradsync::CudaAwareMpi::yes);
  gradsync::MpiBackend not_aware(MPI_COMM_WORLD, gradsync::CudaAwareMpi::no);
  CHECK(aware.can_access<gradsync::CudaDeviceSpace>());
  CHECK(!not_aware.can_access<gradsync::CudaDeviceSpace>());
  CHECK(aware.can_access<gradsync::CudaPinnedHostSpace>());
  CHECK(not_aware.can_access<gradsync::CudaPinnedHostSpace>());
  static_assert(
      std::is_same_v<gradsync::impl::staging_space_t<gradsync::CudaDeviceSpace>, gradsync::CudaPinnedHostSpace>);
}
