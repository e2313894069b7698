// gradsync benchmark (issue 33): saving the DLRM example's training state with
// gradsync::save_checkpoint against raw MPI-IO of the same bytes. The model is DLRM on Criteo Kaggle
// (data/models/dlrm_criteo_kaggle.json): its MLPs (bottom 13-512-256-64-16, top 367-512-256-1) are
// data-parallel, its 26 embedding tables (dimension 16, rows capped as examples/hybrid_dlrm caps them)
// are local parameters, each whole on one rank, balanced by rows as the example's assign_tables
// balances them; Adam, double, one step taken so that its moments and step counts are nonzero.
//
// Methods, each timed on the slowest rank after an MPI_Barrier, R repetitions in rotating order after
// one untimed round, the file deleted after each:
//   gradsync   gradsync::save_checkpoint(dopt, path): the payload is the data-parallel part once
//              (written by rank 0) and every local parameter once (by its rank).
//   raw        MPI_File_open, MPI_File_write_at_all, MPI_File_close of the same bytes: each rank writes
//              what gradsync's layout has it write (rank 0 the data-parallel part and its tables, the
//              others their tables) as one contiguous block at its offset.
//   raw indep  the same with MPI_File_write_at (independent I/O, as HDF5 writes gradsync's datasets).
//   whole copy every rank writes its whole copy (the data-parallel part and its tables) with
//              MPI_File_write_at_all: n copies of the replicated part.
// MiB/s is the checkpoint's payload (the gradsync/raw bytes) over the time, for every method.
//
//   bench_checkpoint [--dir D] [--reps R] [--rows CAP] [--config JSON] [--fsync] [--parts]
//     --dir     where the files go (default: checkpoint_bench/ in the build tree)
//     --reps    repetitions (default 5); the median and the minimum are printed
//     --rows    row cap per table (default 100000, the hybrid_dlrm example's: 102.6 MiB of tables)
//     --fsync   rank 0 fsync()s the file before the clock stops (every method): the disk, not
//               the page cache
//     --parts   also times, on each rank's share, the work save_checkpoint does besides I/O: the
//               host copies and the FNV-1a checksums
// Rank 0 prints the table and one markdown row for docs/BENCHMARKS.md (tests/bench/checkpoint.sh).
#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gradsync/checkpoint.hpp>
#include <gradsync/gradsync.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

struct Mlp {};
struct Tables {};
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;
using Opt = gradsync::Adam<View>;
using Dopt = gradsync::DistributedOptimizer<Opt, Sync>;

struct Args {
  std::string dir = GRADSYNC_BENCH_CHECKPOINT_DIR;
  std::string config = std::string(GRADSYNC_BENCH_MODELS_DIR) + "/dlrm_criteo_kaggle.json";
  int reps = 5;
  std::int64_t rows = 100000;
  bool fsync = false, parts = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--dir")
      a.dir = value();
    else if (k == "--reps")
      a.reps = std::stoi(value());
    else if (k == "--rows")
      a.rows = std::stoll(value());
    else if (k == "--config")
      a.config = value();
    else if (k == "--fsync")
      a.fsync = true;
    else if (k == "--parts")
      a.parts = true;
    else
      throw std::runtime_error(
          "unknown argument " + k +
          " (bench_checkpoint [--dir D] [--reps R] [--rows CAP] [--config JSON] [--fsync] [--parts])");
  }
  if (a.reps < 1 || a.rows < 1) throw std::runtime_error("--reps and --rows must be >= 1");
  return a;
}

// examples/hybrid_dlrm/trainer.hpp's assign_tables: largest first, each to the least loaded rank.
std::vector<int> assign_tables(const std::vector<std::int64_t>& rows, int ranks) {
  std::vector<int> order(rows.size()), owner(rows.size(), 0);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return rows[std::size_t(a)] > rows[std::size_t(b)]; });
  std::vector<std::int64_t> load(std::size_t(ranks), 0);
  for (int t : order) {
    const int p = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[std::size_t(t)] = p;
    load[std::size_t(p)] += rows[std::size_t(t)];
  }
  return owner;
}

// The file system under `dir`, as df -T names the common ones.
std::string fs_type(const std::string& dir) {
  struct statfs s;
  if (statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53UL:
      return "ext2/3/4";
    case 0x01021994UL:
      return "tmpfs";
    case 0x58465342UL:
      return "xfs";
    case 0x9123683EUL:
      return "btrfs";
    case 0x6969UL:
      return "nfs";
    case 0x0BD00BD0UL:
      return "lustre";
    case 0x47504653UL:
      return "gpfs";
    case 0x794C7630UL:
      return "overlayfs";
    default: {
      char b[32];
      std::snprintf(b, sizeof b, "0x%lx", static_cast<unsigned long>(s.f_type));
      return b;
    }
  }
}

struct Model {
  std::vector<View> params, grads;  // before dopt: they outlive its pointers
  Dopt dopt;
  std::size_t dp_tensors = 0, dp_values = 0, tables_here = 0, tables = 0, dim = 0;
  std::int64_t table_rows_here = 0;

  Model(const Args& a, std::int64_t* total_rows) : dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD))) {
    std::ifstream in(a.config);
    if (!in) throw std::runtime_error("cannot open " + a.config);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    dim = bench::json_int(text, "embedding_dim");
    for (const char* key : {"bottom_mlp", "top_mlp"}) {
      const auto l = bench::json_ints(text, key);
      for (std::size_t i = 0; i + 1 < l.size(); ++i) {
        const std::string name = std::string(key) + "." + std::to_string(i);
        add<Mlp>(name + ".weight", l[i] * l[i + 1]);
        add<Mlp>(name + ".bias", l[i + 1]);
        dp_tensors += 2;
        dp_values += l[i] * l[i + 1] + l[i + 1];
      }
    }
    std::vector<std::int64_t> rows;
    for (std::size_t r : bench::json_ints(text, "table_rows")) rows.push_back(std::min(std::int64_t(r), a.rows));
    tables = rows.size();
    *total_rows = std::accumulate(rows.begin(), rows.end(), std::int64_t(0));
    const std::vector<int> owner = assign_tables(rows, bench::size());
    for (std::size_t t = 0; t < rows.size(); ++t)
      if (owner[t] == bench::rank()) {
        add<Tables>("table " + std::to_string(t), std::size_t(rows[t]) * dim);
        ++tables_here;
        table_rows_here += rows[t];
      }
    dopt.broadcast_parameters(0);
    first_step();
  }

  // One step: Adam's moments and step counts are nonzero, as in a checkpoint of a training run. (A
  // member function, not the constructor: CUDA's extended lambdas need a parent whose address can
  // be taken.)
  void first_step() {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      View g = grads[k];
      Kokkos::parallel_for(
          "bench_checkpoint::grad", g.extent(0), KOKKOS_LAMBDA(std::size_t i) { g(i) = 0.01 * double(i % 97) - 0.3; });
    }
    Kokkos::fence();
    if (!dopt.step()) throw std::runtime_error("the step was skipped");
    Kokkos::fence();
  }

  template <class Group>
  void add(const std::string& name, std::size_t n) {
    params.emplace_back(name, n);
    grads.emplace_back("grad." + name, n);
    View p = params.back();
    const double s = double(params.size());
    Kokkos::parallel_for(
        "bench_checkpoint::init", n,
        KOKKOS_LAMBDA(std::size_t i) { p(i) = 0.001 * double(i % 1009) + 0.01 * s + 0.5; });
    Kokkos::fence();
    dopt.template add<Group>(params.back(), grads.back(), name);
  }

  // Slot k's bytes as save_checkpoint writes them: the parameter, then the state buffers, then the
  // step counters, appended to `out` (a host copy).
  void append_bytes(std::size_t k, std::vector<char>& out) {
    const auto put = [&](const auto* data, std::size_t n) {
      using S = std::remove_const_t<std::remove_pointer_t<decltype(data)>>;
      const std::size_t at = out.size();
      out.resize(at + n * sizeof(S));
      using U = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
      if constexpr (std::is_same_v<S, double>)
        Kokkos::deep_copy(Kokkos::View<S*, Kokkos::HostSpace, U>(reinterpret_cast<S*>(out.data() + at), n),
                          Kokkos::View<const S*, View::memory_space, U>(data, n));
      else
        std::memcpy(out.data() + at, data, n * sizeof(S));  // counters are host-side
    };
    put(params[k].data(), params[k].extent(0));
    dopt.optimizer().for_each_state(k, [&](auto* data, std::size_t n) { put(data, n); });
  }
};

// Writes `bytes` at `offset` of a new file, collectively or independently, in pieces MPI's int counts
// can hold; every rank makes as many write_at_all calls (some empty).
void write_file(const std::string& path, const char* p, std::size_t bytes, MPI_Offset offset, bool collective) {
  constexpr std::size_t piece = std::size_t(1) << 30;
  std::uint64_t calls = (bytes + piece - 1) / piece;
  MPI_Allreduce(MPI_IN_PLACE, &calls, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  MPI_File fh;
  if (MPI_File_open(MPI_COMM_WORLD, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh) != MPI_SUCCESS)
    throw std::runtime_error("MPI_File_open " + path + " failed");
  for (std::uint64_t c = 0; c < calls; ++c) {
    const std::size_t at = std::min(bytes, std::size_t(c) * piece);
    const int n = int(std::min(piece, bytes - at));
    MPI_Status st;
    const int rc = collective
                       ? MPI_File_write_at_all(fh, offset + MPI_Offset(at), p + at, n, MPI_BYTE, &st)
                       : (n ? MPI_File_write_at(fh, offset + MPI_Offset(at), p + at, n, MPI_BYTE, &st) : MPI_SUCCESS);
    if (rc != MPI_SUCCESS) throw std::runtime_error("writing " + path + " failed");
  }
  MPI_File_close(&fh);
}

// Rank 0 flushes the file's dirty pages (whoever wrote them) to the disk.
void fsync_file(const std::string& path) {
  if (bench::rank() != 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("fsync " + path + " failed");
  ::close(fd);
}

void remove_file(const std::string& path) {
  if (bench::rank() == 0) {
    std::remove(path.c_str());
    std::remove((path + ".partial").c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

long file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? long(in.tellg()) : -1;
}

struct Timed {
  std::string name, file;
  std::function<void()> run;
  std::vector<double> times;
};

// What save_checkpoint does to each dataset besides writing it: in format version 1 a fresh host
// vector and a deep copy, then the byte-wise 64-bit FNV-1a; in version 2 (now) no copy of host memory
// and the 4-lane word checksum (gradsync::impl::checksum_words).
std::vector<double> host_copy(const double* p, std::size_t n) {
  std::vector<double> out(n);
  using U = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  Kokkos::deep_copy(Kokkos::View<double*, Kokkos::HostSpace, U>(out.data(), n),
                    Kokkos::View<const double*, View::memory_space, U>(p, n));
  return out;
}

double mib(double bytes) { return bytes / double(1 << 20); }

void run(const Args& a) {
  const int me = bench::rank(), n = bench::size();
  if (me == 0) std::filesystem::create_directories(a.dir);
  MPI_Barrier(MPI_COMM_WORLD);
  std::int64_t total_rows = 0;
  Model m(a, &total_rows);

  // The bytes: this rank's copy of the data-parallel part, then its tables, as save_checkpoint
  // writes them (parameter, Adam's two moments, the step counter per parameter).
  std::vector<char> whole;
  for (std::size_t k = 0; k < m.dp_tensors; ++k) m.append_bytes(k, whole);
  const std::size_t dp_bytes = whole.size();
  for (std::size_t k = m.dp_tensors; k < m.params.size(); ++k) m.append_bytes(k, whole);
  const std::size_t local_bytes = whole.size() - dp_bytes;
  const std::size_t mine = me == 0 ? whole.size() : local_bytes;  // what gradsync has this rank write
  const char* mine_at = whole.data() + (me == 0 ? 0 : dp_bytes);
  std::uint64_t sizes[2] = {mine, whole.size()}, before[2] = {0, 0}, totals[2] = {0, 0};
  MPI_Exscan(sizes, before, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) before[0] = before[1] = 0;  // MPI_Exscan leaves rank 0's undefined
  MPI_Allreduce(sizes, totals, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  std::uint64_t table_bytes = local_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &table_bytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const double payload = double(totals[0]);

  const std::string dir = a.dir + "/";
  std::vector<Timed> ms;
  ms.push_back({"gradsync save_checkpoint",
                dir + "gradsync.h5",
                [&] { gradsync::save_checkpoint(m.dopt, dir + "gradsync.h5"); },
                {}});
  ms.push_back({"raw MPI_File_write_at_all",
                dir + "raw.bin",
                [&] { write_file(dir + "raw.bin", mine_at, mine, MPI_Offset(before[0]), true); },
                {}});
  ms.push_back({"raw MPI_File_write_at (independent)",
                dir + "raw_indep.bin",
                [&] { write_file(dir + "raw_indep.bin", mine_at, mine, MPI_Offset(before[0]), false); },
                {}});
  ms.push_back({"every rank its whole copy (write_at_all)",
                dir + "whole.bin",
                [&] { write_file(dir + "whole.bin", whole.data(), whole.size(), MPI_Offset(before[1]), true); },
                {}});
  for (auto& t : ms) remove_file(t.file);

  long gradsync_file = -1;
  for (int r = -1; r < a.reps; ++r)  // round -1: untimed
    for (std::size_t j = 0; j < ms.size(); ++j) {
      Timed& t = ms[(j + std::size_t(std::max(r, 0))) % ms.size()];
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      t.run();
      if (a.fsync) fsync_file(t.file);
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 0) t.times.push_back(dt);
      if (&t == &ms[0] && me == 0) gradsync_file = file_size(t.file);
      remove_file(t.file);
    }

  // The work besides I/O on this rank's share: a host copy per dataset (format 1 only; version 2
  // reads host memory in place) and the checksum of each, format 2's (format 1's byte-wise FNV-1a
  // ran 25x slower).
  std::vector<double> copy_t, sum_t;
  if (a.parts)
    for (int r = 0; r < a.reps; ++r) {
      const std::size_t first = me == 0 ? 0 : m.dp_tensors;
      double dt[2] = {0, 0};
      std::uint64_t sink = 0;
      for (std::size_t k = first; k < m.params.size(); ++k) {
        std::vector<const double*> bufs{m.params[k].data()};
        m.dopt.optimizer().for_each_state(k, [&](auto* data, std::size_t) {
          if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, double>) bufs.push_back(data);
        });
        for (const double* b : bufs) {
          const std::size_t len = m.params[k].extent(0);
          double t0 = MPI_Wtime();
          const std::vector<double> h = host_copy(b, len);
          double t1 = MPI_Wtime();
          sink ^= gradsync::impl::checksum_words(h.data(), len * sizeof(double));
          dt[0] += t1 - t0;
          dt[1] += MPI_Wtime() - t1;
        }
      }
      if (sink == 42) std::printf(" ");  // keeps the checksums
      MPI_Allreduce(MPI_IN_PLACE, dt, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      copy_t.push_back(dt[0]);
      sum_t.push_back(dt[1]);
    }

  // The report.
  std::vector<std::uint64_t> per_rank(static_cast<std::size_t>(n));
  MPI_Gather(&sizes[0], 1, MPI_UINT64_T, per_rank.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::vector<std::int64_t> rows_per_rank(static_cast<std::size_t>(n));
  MPI_Gather(&m.table_rows_here, 1, MPI_INT64_T, rows_per_rank.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (me != 0) return;
  std::printf("bench_checkpoint: %d ranks, DLRM Criteo Kaggle (%s), rows capped at %lld, Adam, double\n", n,
              a.config.c_str(), static_cast<long long>(a.rows));
  std::printf("  data-parallel: %zu tensors, %zu values; with Adam's moments and step counts %.2f MiB (once)\n",
              m.dp_tensors, m.dp_values, mib(double(dp_bytes)));
  std::printf("  tables: %zu of dim %zu, %lld rows, %.2f MiB of values; with Adam's state %.2f MiB\n", m.tables, m.dim,
              static_cast<long long>(total_rows), mib(double(total_rows) * double(m.dim) * 8),
              mib(double(table_bytes)));
  std::printf("  payload: %.2f MiB (gradsync's file: %.2f MiB); every rank its whole copy: %.2f MiB\n", mib(payload),
              mib(double(gradsync_file)), mib(double(totals[1])));
  for (int r = 0; r < n; ++r)
    std::printf("  rank %d writes %.2f MiB (%lld table rows)\n", r, mib(double(per_rank[std::size_t(r)])),
                static_cast<long long>(rows_per_rank[std::size_t(r)]));
  std::printf("  directory: %s (%s)%s; %d repetitions after one untimed round, slowest rank\n", a.dir.c_str(),
              fs_type(a.dir).c_str(), a.fsync ? ", fsync before the clock stops" : ", no fsync (page cache)", a.reps);
  std::printf("%-44s %10s %10s %12s %12s\n", "method", "median ms", "min ms", "median MiB/s", "best MiB/s");
  for (const auto& t : ms) {
    const double med = bench::median(t.times), lo = *std::min_element(t.times.begin(), t.times.end());
    std::printf("%-44s %10.1f %10.1f %12.0f %12.0f\n", t.name.c_str(), 1e3 * med, 1e3 * lo, mib(payload) / med,
                mib(payload) / lo);
  }
  const double g = bench::median(ms[0].times), raw = bench::median(ms[1].times);
  const double indep = bench::median(ms[2].times), whole_t = bench::median(ms[3].times);
  std::printf("gradsync / raw MPI-IO throughput: %.2fx (target >= 0.7x); / raw independent %.2fx\n", raw / g,
              indep / g);
  if (a.parts)
    std::printf(
        "save_checkpoint's work besides I/O, this share, slowest rank (median): host copies (format 1 only) "
        "%.1f ms, checksums %.1f ms\n",
        1e3 * bench::median(copy_t), 1e3 * bench::median(sum_t));
  // ranks | MiB | gradsync | raw write_at_all | ratio | raw write_at | ratio | every rank its whole copy
  std::printf("| %d | %.1f | %.0f | %.0f | %.2fx | %.0f | %.2fx | %.0f |\n", n, mib(payload), mib(payload) / g,
              mib(payload) / raw, raw / g, mib(payload) / indep, indep / g, mib(payload) / whole_t);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint (rank %d): %s\n", bench::rank(), e.what());
    rc = 1;
  }
  Kokkos::finalize();
  if (rc) MPI_Abort(MPI_COMM_WORLD, rc);
  MPI_Finalize();
  return rc;
}
