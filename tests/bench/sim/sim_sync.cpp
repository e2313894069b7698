// gradsync under SimGrid SMPI: one model's data-parallel sync, timed in simulated time.
//   sim_sync <model.csv> [reps=3] [collectives: auto|blocking|nonblocking] [fusion_bytes: 0=topology]
//            [in_flight: 0=topology] [shared: 1|0] [algorithm: flat|hierarchical|automatic]
// Tensors are allocated with SMPI_SHARED_MALLOC (one physical copy for all simulated ranks, values
// garbage) and wrapped in unmanaged Kokkos Views of the benchmark's type.
#include <mpi.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#if !defined(SMPI_SHARED_MALLOC)  // built with mpicxx: the same program on real ranks (calibration)
#define SMPI_SHARED_MALLOC(n) std::malloc(n)
#define SMPI_SHARED_FREE(p) std::free(p)
#define GRADSYNC_SIM_REAL_MPI 1
#endif

#if !defined(GRADSYNC_SIM_REAL_MPI)
// --- Shims for SMPI 3.32, applied to gradsync's calls by renaming them (the program is a shared
// object that smpimain dlopens: a definition of a weak MPI_* symbol here loses to libsimgrid's). ---
//
// 1. A new communicator's id is broadcast by its rank 0 while the communicator's own id is still
//    MPI_UNDEFINED, which matches any communicator id (Request::match_common); the tag is the one of
//    every bcast. A rank that runs ahead (the root of a bcast never waits) can thus hand its peer a
//    message of another communicator as the new id: the ranks then disagree on the ids and the next
//    collective on the new communicator never completes. Barriers on the parent around each creation
//    keep the ranks together while ids are handed out.
static int sim_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  MPI_Barrier(comm);
  const int rc = MPI_Comm_dup(comm, newcomm);
  MPI_Barrier(comm);
  return rc;
}
static int sim_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  MPI_Barrier(comm);
  const int rc = MPI_Comm_split(comm, color, key, newcomm);
  MPI_Barrier(comm);
  return rc;
}
static int sim_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info, MPI_Comm* newcomm) {
  MPI_Barrier(comm);
  const int rc = MPI_Comm_split_type(comm, type, key, info, newcomm);
  MPI_Barrier(comm);
  return rc;
}
// 2. MPI_Comm_idup is declared but aborts ("Not yet implemented: PMPI_Comm_idup"): a blocking
//    duplicate whose request is complete at once (gradsync waits for it in the GradientSync constructor).
static int sim_Comm_idup(MPI_Comm comm, MPI_Comm* newcomm, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return sim_Comm_dup(comm, newcomm);
}
// 3. MPI_Test on MPI_REQUEST_NULL sets *flag = true only when a status is asked for; with
//    MPI_STATUS_IGNORE the flag is left as it was (0), and gradsync's wait loops spin forever.
static int sim_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (request && flag && *request == MPI_REQUEST_NULL) {
    *flag = 1;
    return MPI_SUCCESS;
  }
  return MPI_Test(request, flag, status);
}
// 4. SMPI's nonblocking collectives are naive: MPI_Iallreduce and MPI_Iallgather post a send of the
//    whole buffer to every other rank (p(p-1) messages at once), whose concurrent flows make the
//    network solver quadratic (the arrival check's 80-byte MPI_Iallreduce alone stalls 256 ranks for
//    minutes); MPI_Iallreduce also leaves a user-defined MPI_Op unapplied. gradsync waits for these
//    small side-channel collectives at once, so they run as the blocking collectives (SMPI's selected
//    algorithms), with a request that is complete on return.
static int sim_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request* q) {
  *q = MPI_REQUEST_NULL;
  return MPI_Allreduce(s, r, n, t, op, c);
}
static int sim_Iallgather(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt, MPI_Comm c,
                          MPI_Request* q) {
  *q = MPI_REQUEST_NULL;
  return MPI_Allgather(s, sn, st, r, rn, rt, c);
}
// 5. SMPI 3.32 keeps every detached send (an MPI_Isend under smpi/send-is-detached-thresh) in one
//    list of the whole simulation, which each detached send's completion scans (SimGrid 3.34 made it
//    a set). The notices gradsync sends and nobody receives (GONE, at destruction: p(p-1) of them)
//    stay in it: at 1024 ranks the teardown took 169 s of wall time. As MPI_Issend they are kept per
//    sender. Simulated times do not change: the notices are sent after the last timed sync.
static int sim_Isend(const void* b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c, MPI_Request* q) {
  if (tag == 0x6773) return MPI_Issend(b, n, t, dst, tag, c, q);  // gradsync::impl::kNoticeTag
  return MPI_Isend(b, n, t, dst, tag, c, q);
}
// 6. gradsync's own ring advances only when its wait loop polls (MPI_Testsome), and SMPI charges
//    each poll that finds nothing smpi/test of simulated time, one simulator event each: the
//    simulated sync then moves with that parameter (docs/SCALING.md), and at 1e-7 s a 16-rank
//    ResNet-50 sync did not finish in 10 minutes. A wait loop on a real machine polls every 0.1-0.3
//    us, so a poll that returns the moment a request completes models it: MPI_Waitsome. It blocks
//    only where gradsync's loop would spin anyway (every caller of MPI_Testsome is a wait for one of
//    these requests, in a program that marks nothing ready during backward). SIM_POLL=test keeps
//    MPI_Testsome (the calibrations of docs/SCALING.md were run so).
static int sim_Testsome(int n, MPI_Request* reqs, int* outcount, int* indices, MPI_Status* statuses) {
  static const bool test = [] {
    const char* e = std::getenv("SIM_POLL");
    return e && std::string(e) == "test";
  }();
  if (test) return MPI_Testsome(n, reqs, outcount, indices, statuses);
  const int rc = MPI_Waitsome(n, reqs, outcount, indices, statuses);
  if (*outcount == MPI_UNDEFINED) *outcount = 0;  // every request null: nothing was pending
  return rc;
}
#define MPI_Testsome sim_Testsome
#define MPI_Iallreduce sim_Iallreduce
#define MPI_Iallgather sim_Iallgather
#define MPI_Isend sim_Isend
#define MPI_Comm_dup sim_Comm_dup
#define MPI_Comm_split sim_Comm_split
#define MPI_Comm_split_type sim_Comm_split_type
#define MPI_Comm_idup sim_Comm_idup
#define MPI_Test sim_Test
#endif  // !GRADSYNC_SIM_REAL_MPI
#include <gradsync/gradsync.hpp>

using Grad = Kokkos::View<float*, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Grad>;
struct Dense {};

static std::vector<std::size_t> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::size_t> n;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line))
    if (!line.empty()) n.push_back(std::stoull(line.substr(line.rfind(',') + 1)));
  return n;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    const std::string path = argc > 1 ? argv[1] : "resnet50.csv";
    const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
    const std::string coll = argc > 3 ? argv[3] : "auto";
    const std::size_t fusion = argc > 4 ? std::stoull(argv[4]) : 0;
    const int in_flight = argc > 5 ? std::atoi(argv[5]) : 0;
    const bool shared = argc > 6 ? std::atoi(argv[6]) != 0 : true;
    const std::string algorithm = argc > 7 ? argv[7] : "flat";
    const auto numel = read_csv(path);
    std::size_t total = 0;
    for (auto n : numel) total += n;

    gradsync::Options opt;
    opt.stall_timeout = 0;  // wall-clock deadline: meaningless in simulation
    opt.tuning.stall_warning = 0;
    opt.tuning.huge_pages = false;  // would copy the shared tensors onto private pages
    opt.tuning.read_environment = false;
    opt.tuning.spin_before_yield = 0;
    if (coll == "blocking") opt.tuning.collectives = gradsync::Collectives::blocking;
    if (coll == "nonblocking") opt.tuning.collectives = gradsync::Collectives::nonblocking;
    if (fusion) opt.tuning.fusion_threshold_bytes = fusion;
    opt.tuning.max_chunks_in_flight = in_flight;
    opt.tuning.algorithm = algorithm == "hierarchical" ? gradsync::Algorithm::hierarchical
                           : algorithm == "automatic"  ? gradsync::Algorithm::automatic
                                                       : gradsync::Algorithm::flat;

    // One allocation per rank for all tensors (SMPI folds a shared allocation onto its blocks with
    // one mmap per block and allocation: 161 allocations x 1024 ranks would pass vm.max_map_count),
    // carved with a 64-byte gap between tensors so that, as with separate allocations, no two are
    // adjacent in memory (gradsync merges adjacent tensors into one region).
    std::vector<std::size_t> off;
    std::size_t at = 0;
    for (auto n : numel) {
      off.push_back(at);
      at += (n + 15) / 16 * 16 + 16;  // floats: 64-byte aligned, then a 64-byte gap
    }
    float* base =
        static_cast<float*>(shared ? SMPI_SHARED_MALLOC(at * sizeof(float)) : std::malloc(at * sizeof(float)));
    if (!shared)
      for (std::size_t i = 0; i < at; ++i) base[i] = 1e-3f;
    std::vector<Grad> g;
    g.reserve(numel.size());
    for (std::size_t i = 0; i < numel.size(); ++i) g.emplace_back(base + off[i], numel[i]);  // unmanaged Views
    {
      const bool dbg = std::getenv("SIM_DEBUG") != nullptr;
      auto say = [&](const char* w) {
        if (dbg) {
          std::fprintf(stderr, "[rank %d t=%.6f] %s\n", rank, MPI_Wtime(), w);
        }
      };
      say("constructing");
      Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
      say("constructed");
      for (auto& t : g) s.add<Dense>(t);
      while (s.tuning()) (void)s.synchronize();
      say("tuned");
      (void)s.synchronize();  // warm-up
      say("warm");
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        (void)s.synchronize();
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t.push_back(dt);
      }
      // The arrival round's shape without gradsync (9 int64 words, one allreduce): what every
      // synchronize() pays before its chunks, to set beside a one-tensor model's sync.
      std::vector<double> raw;
      for (int r = 0; r < reps; ++r) {
        long long w[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, w, 9, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        raw.push_back(dt);
      }
      const gradsync::Stats& st = s.stats();
      if (rank == 0) {
        std::printf(
            "RESULT model=%s ranks=%d tensors=%zu bytes=%zu coll=%s fusion=%zu in_flight=%d algorithm=%s "
            "nodes=%zu plan_chunk=%zu plan_in_flight=%d plan_algorithm=%s sync_ms=",
            path.c_str(), size, numel.size(), total * sizeof(float), coll.c_str(), fusion, in_flight, algorithm.c_str(),
            std::size_t(st.nodes), std::size_t(st.chunk_bytes), int(st.chunks_in_flight),
            gradsync::to_string(st.algorithm));
        for (double x : t) std::printf("%.4f ", x * 1e3);
        std::printf("raw_72B_allreduce_ms=");
        for (double x : raw) std::printf("%.4f ", x * 1e3);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    // ~GradientSync tells the peers it is gone (small eager sends): SMPI aborts ("Actor pid=N is
    // gone??") when one is sent to a rank that already left MPI_Finalize, so all wait here first.
    MPI_Barrier(MPI_COMM_WORLD);
    g.clear();
    if (shared)
      SMPI_SHARED_FREE(base);
    else
      std::free(base);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
