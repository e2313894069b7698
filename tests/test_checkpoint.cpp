// Checkpoints (issue 33): a hybrid model (data-parallel MLP, a local tower per rank) trained N steps,
// saved, trained M more, against a fresh model loaded from the file and trained M steps: the same
// parameters and optimizer state to the last bit, with Sgd (momentum) and Adam. Refusals agreed on
// every rank with nothing loaded: a missing name, another size, a corrupted dataset, a truncated,
// foreign or incomplete file. The h5py test (checkpoint_h5py.py) reads the file this one leaves.
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gradsync/checkpoint.hpp>
#include <gradsync/gradsync.hpp>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::error_of;
using gradsync_test::fill_host;
using gradsync_test::has;
using gradsync_test::host_values;
using gradsync_test::state_of;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Mlp {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
struct Everyone {};    // a process set of every rank
struct Replicated {};  // reduced over it: written once, read by every member
template <>
struct gradsync::LocalVarPolicy<Replicated> : gradsync::ReduceOver<Everyone> {};
struct Pairs {};      // process sets {0, 1}, {2, 3} (at 3 ranks: {0, 1}, {2})
struct PairTable {};  // a table replicated over its pair: sharded within it under Options::shard
template <>
struct gradsync::LocalVarPolicy<PairTable> : gradsync::ReduceOver<Pairs> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// What a variant of the model changes on the last rank (the refusal tests).
struct Variant {
  std::string tower_suffix = ".w";  // the name of the last rank's tower weight
  int extra = 0;                    // values added to it
  gradsync::Shard shard = gradsync::Shard::none;
  bool pairs = false;  // a PairTable tensor per pair of ranks
};

gradsync::Options options_of(const Variant& v) {
  gradsync::Options o;
  o.shard = v.shard;
  return o;
}

template <class Opt>
struct Model {
  std::vector<View> params, grads;  // before dopt: they outlive its pointers
  gradsync::DistributedOptimizer<Opt, Sync> dopt;

  // `seed` shifts every initial value: a fresh model starts elsewhere than the saved one.
  Model(Opt opt, double seed, const Variant& v = {})
      : dopt(std::move(opt), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), options_of(v))) {
    const int r = world_rank();
    const bool last = r == world_size() - 1;
    add<Mlp>("mlp.w", 6, seed);
    add<Mlp>("mlp.b", 3, seed);
    const std::string tower = "tower" + std::to_string(r);
    add<Tower>(tower + (last ? v.tower_suffix : std::string(".w")), std::size_t(4 + r + (last ? v.extra : 0)),
               seed + r);
    add<Tower>(tower + ".b", 2, seed + r);
    if (v.pairs) {
      const int lead = r / 2 * 2;
      std::vector<int> pair{lead};
      if (lead + 1 < world_size()) pair.push_back(lead + 1);
      dopt.sync().template bind_process_set<Pairs>(pair);
      add<PairTable>("pair" + std::to_string(lead), std::size_t(9 + lead), seed + lead);
    }
    dopt.broadcast_parameters(0);
  }

  template <class Group>
  void add(const std::string& name, std::size_t n, double seed) {
    params.emplace_back(name, n);
    grads.emplace_back("grad." + name, n);
    fill_host(params.back(), [&](std::size_t i) { return 0.1 * double(i + 1) - 0.25 + 0.01 * seed; });
    dopt.template add<Group>(params.back(), grads.back(), name);
  }

  // Gradients that depend on the parameters and the rank: a restart that lost any state diverges.
  void train(int steps) {
    const int r = world_rank();
    for (int s = 0; s < steps; ++s) {
      for (std::size_t k = 0; k < params.size(); ++k) {
        const std::vector<double> p = host_values(params[k]);
        fill_host(grads[k], [&](std::size_t i) { return std::sin(3 * p[i]) + 0.05 * double(r + 1) * double(i + 1); });
      }
      REQUIRE(dopt.step());
    }
  }

  // The parameters' values, in registration order.
  std::vector<double> params_only() const {
    std::vector<double> out;
    for (const View& p : params)
      for (double x : host_values(p)) out.push_back(x);
    return out;
  }
  // Every parameter's values and optimizer state, in registration order.
  std::vector<double> snapshot() {
    std::vector<double> out;
    for (std::size_t k = 0; k < params.size(); ++k) {
      for (double x : host_values(params[k])) out.push_back(x);
      if (!dopt.sharded())  // sharded: slots are slices, made at the first apply()
        for (double x : state_of(dopt.optimizer(), k)) out.push_back(x);
    }
    return out;
  }
};

std::string file_name(const char* what) {
  return "checkpoint_" + std::string(what) + "_np" + std::to_string(world_size()) + ".h5";
}

bool exists(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

// Rank 0 copies `from` to `to`, keeping `keep` bytes (all when negative); every rank waits.
void copy_file(const std::string& from, const std::string& to, long keep = -1) {
  if (world_rank() == 0) {
    std::ifstream in(from, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (keep >= 0) bytes.resize(std::size_t(keep));
    std::ofstream(to, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// No partial file of a save to `path` is left (path + ".partial-<id>", one per save).
bool no_partials(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".partial";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return false;
  return true;
}

// Rank 0 removes `path` and what an earlier run left beside it; every rank waits.
void remove_with_partials(const std::string& path) {
  namespace fs = std::filesystem;
  if (world_rank() == 0) {
    const fs::path p(path);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    std::error_code ec;
    fs::remove(p, ec);
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind(p.filename().string() + ".partial", 0) == 0) stale.push_back(e.path());
    for (const fs::path& q : stale) fs::remove(q, ec);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// HDF5 files, groups, datasets, attributes and datatypes open in this process.
long h5_open_objects() { return long(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL)); }

long file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return long(in.tellg());
}

// Where a contiguous dataset's bytes start in the file (rank 0, serially).
haddr_t dataset_offset(const std::string& path, const char* dataset) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return at;
}

template <class Opt>
void check_restart(const Opt& opt, const char* tag) {
  const int n_before = 3, m_after = 4;
  const std::string path = file_name(tag);
  Model<Opt> a(opt, 0.0);
  a.train(n_before);
  const std::vector<double> saved = a.snapshot();
  gradsync::save_checkpoint(a.dopt, path);
  CHECK(all_ranks(exists(path) && no_partials(path)));
  a.train(m_after);
  const std::vector<double> reference = a.snapshot();

  Model<Opt> b(opt, 7.0);  // starts elsewhere, step counters at 0
  REQUIRE(b.snapshot() != saved);
  gradsync::load_checkpoint(b.dopt, path);
  CHECK(all_ranks(b.snapshot() == saved));  // parameters, moments and step counts, bit for bit
  b.train(m_after);
  const std::vector<double> continued = b.snapshot();
  CHECK(all_ranks(continued == reference));
  CHECK(all_ranks(continued != saved));  // the M steps moved it
}

}  // namespace

TEST_CASE("save, continue, load into a fresh model: a bit-identical continuation") {
  SUBCASE("Sgd with momentum and weight decay") {
    gradsync::SgdOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
    check_restart(gradsync::Sgd<View>(o), "sgd");
  }
  SUBCASE("Adam (moments and step counts)") {
    gradsync::AdamOptions o;
    o.lr = 0.02;
    check_restart(gradsync::Adam<View>(o), "adam");
  }
}

// Whether two snapshots agree to `tol` relative, value by value.
bool close(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (gradsync_test::rel_err(a[i], b[i]) > tol) return false;
  return true;
}

// Sharded optimizer state (Options::shard) in checkpoints: the file holds every parameter's state
// whole, as an unsharded save writes it, so either loads into either (and, the format being the
// same, into any rank count: the example hybrid_dlrm restarts across counts). Reference: the
// unsharded run, uninterrupted; the sharded run differs from it only in the order of additions.
TEST_CASE("sharded optimizer state: the file an unsharded save writes, loaded into either setting") {
  gradsync::AdamOptions o;
  o.lr = 0.02;
  const gradsync::Adam<View> opt(o);
  Variant sh;
  sh.shard = gradsync::Shard::optimizer_state;
  Model<gradsync::Adam<View>> plain(opt, 0.0), sharded(opt, 0.0, sh);
  plain.train(3);
  sharded.train(3);
  const std::string ps = file_name("shard_sharded"), pp = file_name("shard_plain");
  gradsync::save_checkpoint(sharded.dopt, ps);
  gradsync::save_checkpoint(plain.dopt, pp);
  // The sharded save holds what the unsharded one does: parameters, moments and step counts.
  Model<gradsync::Adam<View>> c(opt, 7.0), d(opt, 7.0);
  gradsync::load_checkpoint(c.dopt, ps);
  gradsync::load_checkpoint(d.dopt, pp);
  CHECK(all_ranks(close(c.snapshot(), d.snapshot())));
  CHECK(all_ranks(close(d.snapshot(), plain.snapshot(), 0)));
  // Either file into a fresh sharded model (its slices made by the load): the uninterrupted run goes on.
  Model<gradsync::Adam<View>> e(opt, 7.0, sh), f(opt, 7.0, sh);
  gradsync::load_checkpoint(e.dopt, pp);
  gradsync::load_checkpoint(f.dopt, ps);
  CHECK(all_ranks(close(e.snapshot(), plain.params_only(), 0)));  // a sharded snapshot: the parameters
  for (auto* m : {&plain, &c, &e, &f}) m->train(4);
  Model<gradsync::Adam<View>>* sharded_ones[] = {&e, &f};
  const std::vector<double> reference = plain.snapshot();
  CHECK(all_ranks(close(c.snapshot(), reference)));
  for (auto* m : sharded_ones) {
    CHECK(all_ranks(close(m->snapshot(), plain.params_only())));
  }
}

// The same with a process set's table (ReduceOver<Pairs>), sharded within its pair: its state is
// summed over the pair for the file, which holds it whole, as an unsharded save does.
TEST_CASE("sharded within process sets: the file an unsharded save writes, loaded into either setting") {
  gradsync::AdamOptions o;
  o.lr = 0.02;
  const gradsync::Adam<View> opt(o);
  Variant pl, sh;
  pl.pairs = sh.pairs = true;
  sh.shard = gradsync::Shard::optimizer_state;
  Model<gradsync::Adam<View>> plain(opt, 0.0, pl), sharded(opt, 0.0, sh);
  plain.train(3);
  sharded.train(3);
  CHECK(all_ranks(close(sharded.params_only(), plain.params_only())));
  const std::string ps = file_name("pairs_sharded"), pp = file_name("pairs_plain");
  gradsync::save_checkpoint(sharded.dopt, ps);
  gradsync::save_checkpoint(plain.dopt, pp);
  Model<gradsync::Adam<View>> c(opt, 7.0, pl), e(opt, 7.0, sh), f(opt, 7.0, sh);
  gradsync::load_checkpoint(c.dopt, ps);  // the sharded save: moments and counters whole
  CHECK(all_ranks(close(c.snapshot(), plain.snapshot())));
  gradsync::load_checkpoint(e.dopt, pp);
  gradsync::load_checkpoint(f.dopt, ps);
  for (auto* m : {&plain, &c, &e, &f}) m->train(4);
  const std::vector<double> reference = plain.snapshot();
  CHECK(all_ranks(close(c.snapshot(), reference)));
  CHECK(all_ranks(close(e.params_only(), plain.params_only())));
  CHECK(all_ranks(close(f.params_only(), plain.params_only())));
  // A fresh sharded model that missed the load diverges: the check can fail.
  Model<gradsync::Adam<View>> g(opt, 7.0, sh);
  g.train(4);
  CHECK(all_ranks(!close(g.params_only(), plain.params_only())));
}

TEST_CASE("refused checkpoints: an error on every rank naming the tensor, nothing loaded") {
  const int last = world_size() - 1;
  const std::string path = file_name("refusals");
  const std::string tower_w = "tower" + std::to_string(last) + ".w";
  {
    Model<gradsync::Adam<View>> a(gradsync::Adam<View>(), 0.0);
    a.train(2);
    gradsync::save_checkpoint(a.dopt, path);
  }
  // Loads into a fresh model and returns the error; checks on every rank that nothing changed.
  const auto refused = [&](const std::string& file, const Variant& v = {}) {
    Model<gradsync::Adam<View>> b(gradsync::Adam<View>(), 3.0, v);
    const std::vector<double> before = b.snapshot();
    const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, file); });
    CHECK(all_ranks(!e.empty()));
    CHECK(all_ranks(b.snapshot() == before));
    CHECK(all_ranks(has(e, file)));
    b.train(1);  // the sync is still usable
    return e;
  };

  SUBCASE("a name the file lacks") {
    Variant v;
    v.tower_suffix = ".renamed";
    const std::string e = refused(path, v);
    CHECK(all_ranks(has(e, "parameter '" + std::to_string(last).insert(0, "tower") + ".renamed' (group Tower")));
    CHECK(all_ranks(has(e, "is not in the checkpoint")));
  }
  SUBCASE("a size that differs") {
    Variant v;
    v.extra = 2;
    const std::string e = refused(path, v);
    CHECK(all_ranks(has(e, "parameter '" + tower_w + "' (group Tower, local, " + std::to_string(6 + last))));
    CHECK(all_ranks(has(
        e, "has " + std::to_string(4 + last) + " values in the checkpoint, " + std::to_string(6 + last) + " here")));
  }
  SUBCASE("a corrupted dataset") {
    const std::string bad = file_name("corrupted");
    copy_file(path, bad);
    if (world_rank() == 0) {
      const haddr_t at = dataset_offset(bad, "/data_parallel/mlp.w/param");
      std::fstream f(bad, std::ios::binary | std::ios::in | std::ios::out);
      f.seekg(std::streamoff(at + 13));
      char c = 0;
      f.get(c);
      f.seekp(std::streamoff(at + 13));
      f.put(char(c ^ 0x10));  // one bit of the second value's mantissa
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string e = refused(bad);
    CHECK(all_ranks(has(e, "parameter 'mlp.w' (group Mlp, data-parallel, 6 values)")));
    CHECK(all_ranks(has(e, "/data_parallel/mlp.w/param fails its checksum")));
  }
  SUBCASE("a truncated file") {
    const std::string cut = file_name("truncated");
    copy_file(path, cut, file_size(path) / 2);
    const std::string e = refused(cut);
    CHECK(all_ranks(has(e, "truncated")));
  }
  SUBCASE("a foreign file, a missing one, an incomplete one") {
    const std::string text = file_name("foreign");
    if (world_rank() == 0) std::ofstream(text) << "not a checkpoint\n";
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(all_ranks(has(refused(text), "not an HDF5 file")));
    CHECK(all_ranks(has(refused(file_name("missing")), "no such file")));
    // An HDF5 file of someone else's.
    const std::string other = file_name("other");
    if (world_rank() == 0) {
      const hid_t f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(all_ranks(has(refused(other), "not a gradsync checkpoint")));
    // A checkpoint without its completion record (as a job killed before it, renamed by hand).
    const std::string partial = file_name("incomplete");
    copy_file(path, partial);
    if (world_rank() == 0) {
      const hid_t f = H5Fopen(partial.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      H5Adelete(f, "complete");
      H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(all_ranks(has(refused(partial), "incomplete checkpoint")));
  }
}

TEST_CASE("local names must be unique across ranks; the file is untouched by a refused save") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "one rank has no peer to collide with");
  using Opt = gradsync::Sgd<View>;
  std::vector<View> p{View("p", 3), View("t", 2)}, g{View("gp", 3), View("gt", 2)};
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.add<Mlp>(p[0], g[0], "w");
  dopt.add<Tower>(p[1], g[1], "table");  // the same name on every rank
  const std::string path = file_name("collide");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, path); });
  CHECK(all_ranks(has(e, "parameter 'table' (group Tower) is registered as local on rank 1 and as local on rank 0")));
  CHECK(all_ranks(!exists(path) && no_partials(path)));
}

TEST_CASE("a checkpoint for h5py: the data-parallel weights and the towers as text") {
  // checkpoint_h5py.py compares the file's datasets with these dumps (17 significant digits).
  Model<gradsync::Adam<View>> a(gradsync::Adam<View>(), 0.0);
  a.train(3);
  const std::string base = "checkpoint_h5py_np" + std::to_string(world_size());
  gradsync::save_checkpoint(a.dopt, base + ".h5");
  std::ofstream out(base + "." + std::to_string(world_rank()) + ".txt");
  const char* names[] = {"mlp.w", "mlp.b", nullptr, nullptr};
  const std::string tower = "tower" + std::to_string(world_rank());
  const std::string local_names[] = {tower + ".w", tower + ".b"};
  for (std::size_t k = 0; k < a.params.size(); ++k) {
    const bool local = k >= 2;
    if (!local && world_rank() != 0) continue;  // written once, as in the file
    out << (local ? "local " : "data_parallel ") << (local ? local_names[k - 2] : std::string(names[k]));
    char buf[32];
    for (double x : host_values(a.params[k])) {
      std::snprintf(buf, sizeof buf, " %.17g", x);
      out << buf;
    }
    out << "\n";
  }
  CHECK(all_ranks(bool(out)));
}

TEST_CASE("a save that cannot create its file: an error on every rank, the sync usable") {
  Model<gradsync::Sgd<View>> a(gradsync::Sgd<View>(), 0.0);
  const std::string path = "no_such_directory/run.h5";
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(a.dopt, path); });
  CHECK(all_ranks(
      has(e, "save_checkpoint(\"no_such_directory/run.h5\"): cannot create 'no_such_directory/run.h5.partial-")));
  const std::vector<double> before = a.snapshot();
  a.train(1);
  CHECK(all_ranks(a.snapshot() != before));
}

namespace {

// A hybrid model over any rank count m, as a job restarted on another allocation declares it: the
// data-parallel "mlp.w", "rep" replicated over a process set of every rank (ReduceOver), the towers
// of the `n_towers` ranks of the job that saved (tower r, of 4 + r values, on rank r % m), the row
// shard q of m of table "emb" (G rows of L values), and the program's own state: a replicated
// step counter and one cursor per tower.
constexpr std::uint64_t table_rows = 10, row_length = 3;
std::pair<std::uint64_t, std::uint64_t> rows_of(int q, int m) {
  return {table_rows * std::uint64_t(q) / std::uint64_t(m), table_rows * std::uint64_t(q + 1) / std::uint64_t(m)};
}

struct Resharded {
  using Opt = gradsync::Adam<View>;
  std::vector<View> params, grads;
  gradsync::DistributedOptimizer<Opt, Sync> dopt;
  gradsync::CheckpointState extra;
  std::int64_t step = 0;
  std::vector<std::int64_t> cursors;  // one per held tower
  std::vector<int> towers;            // the towers this rank holds
  int q = 0, m = 1;
  std::uint64_t first = 0, rows = 0;

  Resharded(MPI_Comm comm, int n_towers, double seed, std::uint64_t short_by = 0)
      : dopt(Opt(), Sync(gradsync::MpiBackend(comm))) {
    MPI_Comm_rank(comm, &q);
    MPI_Comm_size(comm, &m);
    std::vector<int> all(static_cast<std::size_t>(m));
    for (int k = 0; k < m; ++k) all[std::size_t(k)] = k;
    dopt.sync().bind_process_set<Everyone>(all);
    add<Mlp>("mlp.w", 6, seed, 0);
    add<Replicated>("rep", 4, seed + 0.5, 0);
    for (int r = q; r < n_towers; r += m) {
      towers.push_back(r);
      add<Tower>("tower" + std::to_string(r), std::size_t(4 + r), seed + r, 0);
    }
    std::tie(first, rows) = rows_of(q, m);
    rows -= first + (q == m - 1 ? short_by : 0);
    add<Tower>("emb", std::size_t(rows * row_length), seed + 100, first * row_length);  // one name, every rank
    extra.shard("emb", gradsync::RowShard{first, table_rows, row_length});
    extra.replicated(step, "step");
    cursors.resize(towers.size());
    for (std::size_t k = 0; k < towers.size(); ++k) extra.local(cursors[k], "cursor" + std::to_string(towers[k]));
  }

  // Values that depend on the element's place in the whole model (its global row), not the split.
  template <class Group>
  void add(const std::string& name, std::size_t n, double seed, std::uint64_t at) {
    params.emplace_back(name, n);
    grads.emplace_back("grad." + name, n);
    fill_host(params.back(), [&](std::size_t i) { return 0.01 * double(at + i + 1) - 0.2 + 0.03 * seed; });
    dopt.template add<Group>(params.back(), grads.back(), name);
  }
  void train(int steps) {
    for (int s = 0; s < steps; ++s) {
      for (std::size_t k = 0; k < params.size(); ++k) {
        const std::vector<double> p = host_values(params[k]);
        fill_host(grads[k], [&](std::size_t i) { return std::sin(3 * p[i]) + 0.05 * double(q + 1) * double(i + 1); });
      }
      REQUIRE(dopt.step());
    }
  }
  // Parameter k's values then its optimizer state (Adam: exp_avg, exp_avg_sq, the step count).
  std::vector<double> full(std::size_t k) {
    std::vector<double> out = host_values(params[k]);
    for (double x : state_of(dopt.optimizer(), k)) out.push_back(x);
    return out;
  }
};

// Every rank's vector, in rank order.
std::vector<std::vector<double>> allgather(const std::vector<double>& mine) {
  const int n = world_size();
  int len = int(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n), 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 1; r < n; ++r) offs[std::size_t(r)] = offs[std::size_t(r) - 1] + lens[std::size_t(r) - 1];
  std::vector<double> all(std::size_t(offs.back() + lens.back()));
  MPI_Allgatherv(mine.data(), len, MPI_DOUBLE, all.data(), lens.data(), offs.data(), MPI_DOUBLE, MPI_COMM_WORLD);
  std::vector<std::vector<double>> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(all.begin() + offs[std::size_t(r)], all.begin() + offs[std::size_t(r)] + lens[std::size_t(r)]);
  return out;
}

// The first m ranks of the world as a communicator (MPI_COMM_NULL on the others).
MPI_Comm first_ranks(int m) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < m ? 0 : MPI_UNDEFINED, world_rank(), &c);
  return c;
}

}  // namespace

TEST_CASE("restart on another rank count: local parameters by name, row shards re-split, process sets") {
  const int n = world_size(), me = world_rank();
  const std::string path = file_name("reshard");
  // The saving job: n ranks, tower r and rows_of(r, n) of "emb" on rank r; 2 Adam steps.
  std::vector<double> mlp, rep;
  std::vector<std::vector<double>> tower, emb;
  {
    Resharded a(MPI_COMM_WORLD, n, 0.0);
    a.train(2);
    a.step = 2;
    a.cursors[0] = 100 + me;
    gradsync::save_checkpoint(a.dopt, path, a.extra);
    mlp = a.full(0);
    rep = a.full(1);
    tower = allgather(a.full(2));
    emb = allgather(a.full(3));
  }
  // The whole table's values, exp_avg and exp_avg_sq, from the n shards ([values][m][v][count] each).
  std::vector<double> whole[3];
  for (int r = 0; r < n; ++r) {
    const auto [b, e] = rows_of(r, n);
    const std::size_t len = std::size_t((e - b) * row_length);
    for (int part = 0; part < 3; ++part)
      whole[part].insert(whole[part].end(), emb[std::size_t(r)].begin() + std::ptrdiff_t(part * len),
                         emb[std::size_t(r)].begin() + std::ptrdiff_t((part + 1) * len));
    CHECK(emb[std::size_t(r)].back() == 2.0);  // the step count
  }
  if (me == 0) {  // for checkpoint_h5py.py: the whole table as h5py should find it
    std::ofstream dump("checkpoint_reshard_np" + std::to_string(n) + ".emb.txt");
    char buf[32];
    for (double x : whole[0]) {
      std::snprintf(buf, sizeof buf, "%.17g\n", x);
      dump << buf;
    }
  }

  for (int m = 1; m <= n; ++m) {
    MPI_Comm comm = first_ranks(m);
    if (comm != MPI_COMM_NULL) {
      Resharded b(comm, n, 7.0);  // starts elsewhere
      REQUIRE(b.full(0) != mlp);
      gradsync::load_checkpoint(b.dopt, path, b.extra);
      CHECK(b.full(0) == mlp);
      CHECK(b.full(1) == rep);
      for (std::size_t k = 0; k < b.towers.size(); ++k) {
        CHECK(b.full(2 + k) == tower[std::size_t(b.towers[k])]);
        CHECK(b.cursors[k] == 100 + b.towers[k]);
      }
      std::vector<double> want;
      for (int part = 0; part < 3; ++part)
        want.insert(want.end(), whole[part].begin() + std::ptrdiff_t(b.first * row_length),
                    whole[part].begin() + std::ptrdiff_t((b.first + b.rows) * row_length));
      want.push_back(2.0);
      CHECK(b.full(2 + b.towers.size()) == want);
      CHECK(b.step == 2);
      b.train(1);  // and it trains on
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  SUBCASE("shards that leave rows to no rank") {
    Resharded b(MPI_COMM_WORLD, n, 7.0, 1);
    const std::vector<double> before = b.full(0);
    const std::string e =
        error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, path, b.extra); });
    CHECK(all_ranks(has(e, "the shards of 'emb' (group Tower, 10 rows) end at row 9: the last rows are on no rank")));
    CHECK(all_ranks(b.full(0) == before));
  }
  SUBCASE("a tower no rank holds now: another model") {
    Resharded b(MPI_COMM_WORLD, n - 1, 7.0);
    const std::string e =
        error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, path, b.extra); });
    CHECK(all_ranks(has(e, "local and 1 row-sharded parameters, this model")));
    CHECK(all_ranks(has(e, "(another model?)")));
  }
  SUBCASE("another table shape") {
    Resharded b(MPI_COMM_WORLD, n, 7.0);
    // The same shards read as rows of one value: they cover 30 rows, but the file's table is 10 x 3.
    b.extra.shard("emb", gradsync::RowShard{b.first * row_length, table_rows * row_length, 1});
    const std::string e =
        error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, path, b.extra); });
    CHECK(all_ranks(has(e, "parameter 'emb' (group Tower, row-sharded, rows 0-")));
    CHECK(all_ranks(has(e, "the checkpoint's table has 10 rows of 3 values, this one 30 of 1")));
  }
}

TEST_CASE("a bare GradientSync: parameters by their gradients' names, the program's own state") {
  const int r = world_rank();
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD));
  View w("w", 5), gw("gw", 5), t("t", std::size_t(2 + r)), gt("gt", std::size_t(2 + r));
  sync.add<Mlp>(gw, "w");
  sync.add<Tower>(gt, "t" + std::to_string(r));
  std::int64_t step = 41;
  double lr = 0.125;
  Kokkos::View<float*> noise("noise", 3);
  fill_host(w, [](std::size_t i) { return 0.5 - 0.1 * double(i); });
  fill_host(t, [&](std::size_t i) { return double(r) + 0.25 * double(i); });
  fill_host(noise, [&](std::size_t i) { return float(r) * 0.5f + float(i); });
  gradsync::CheckpointState st;
  st.parameter(w, "w").parameter(t, "t" + std::to_string(r)).replicated(step, "step").replicated(lr, "lr");
  st.local(noise, "noise" + std::to_string(r));
  const std::string path = file_name("bare");
  gradsync::save_checkpoint(sync, path, st);
  const std::vector<double> w0 = host_values(w), t0 = host_values(t);
  const std::vector<float> n0 = host_values(noise);
  fill_host(w, [](std::size_t) { return 9.0; });
  fill_host(t, [](std::size_t) { return 9.0; });
  fill_host(noise, [](std::size_t) { return 9.0f; });
  step = 0;
  lr = 0;
  gradsync::load_checkpoint(sync, path, st);
  CHECK(all_ranks(host_values(w) == w0 && host_values(t) == t0 && host_values(noise) == n0));
  CHECK(all_ranks(step == 41 && lr == 0.125));

  gradsync::CheckpointState unknown;
  unknown.parameter(w, "nope");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(sync, path, unknown); });
  CHECK(all_ranks(has(e, "parameter 'nope': the sync holds no gradient of that name")));
  gradsync::CheckpointState sized;
  sized.parameter(t, "w");
  const std::string e2 = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(sync, path, sized); });
  CHECK(all_ranks(has(e2, "parameter 'w' (group Mlp) has 2 values, its gradient 5 (rank 0)")));  // the lowest rank's
}

namespace {

// A data-parallel model whose gradients travel as bf16 with error feedback: each rank keeps its
// rounding errors (residuals) and adds them to its next gradient.
struct Compressed {
  using Opt = gradsync::Sgd<View>;
  View w{"w", 300}, gw{"gw", 300};
  gradsync::DistributedOptimizer<Opt, Sync> dopt;
  explicit Compressed(MPI_Comm comm, double seed) : dopt(Opt(), Sync(gradsync::MpiBackend(comm), options())) {
    fill_host(w, [&](std::size_t i) { return std::cos(0.1 * double(i) + seed); });
    dopt.add<Mlp>(w, gw, "w");
  }
  static gradsync::Options options() {
    gradsync::Options o;
    o.compression = gradsync::Compression::bf16;
    o.error_feedback = true;
    return o;
  }
  void train(int steps) {
    int r = 0;
    MPI_Comm_rank(dopt.sync().backend().comm(), &r);
    for (int s = 0; s < steps; ++s) {
      const std::vector<double> p = host_values(w);
      fill_host(gw, [&](std::size_t i) { return std::sin(3 * p[i]) * (1 + 1e-3 * double(r)) + 1e-4 * double(i); });
      REQUIRE(dopt.step());
    }
  }
  std::vector<double> residuals() {
    const auto st = gradsync::impl::SyncAccess::residual_state(dopt.sync());
    return st.data ? std::vector<double>(st.data, st.data + st.size) : std::vector<double>();
  }
};

}  // namespace

TEST_CASE("error-feedback residuals: restored at the same rank count (a bit-identical continuation), zero at another") {
  const std::string path = file_name("residuals");
  Compressed a(MPI_COMM_WORLD, 0.0);
  a.train(3);
  const std::vector<double> saved = a.residuals();
  REQUIRE(saved.size() >= 300);
  CHECK(all_ranks(std::any_of(saved.begin(), saved.end(), [](double x) { return x != 0; })));  // bf16 rounding
  gradsync::save_checkpoint(a.dopt, path);
  a.train(2);
  const std::vector<double> reference = host_values(a.w);

  Compressed b(MPI_COMM_WORLD, 5.0);
  gradsync::load_checkpoint(b.dopt, path);
  CHECK(all_ranks(b.residuals() == saved));  // this rank's own, bit for bit
  b.train(2);
  CHECK(all_ranks(host_values(b.w) == reference));

  // On fewer ranks the per-rank residuals have no owner: they start at zero, and it trains on.
  if (world_size() > 1) {
    MPI_Comm comm = first_ranks(world_size() - 1);
    if (comm != MPI_COMM_NULL) {
      Compressed c(comm, 5.0);
      gradsync::load_checkpoint(c.dopt, path);
      const std::vector<double> res = c.residuals();
      CHECK(std::all_of(res.begin(), res.end(), [](double x) { return x == 0; }));
      c.train(1);
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("in the middle of an aggregation cycle: refused on every rank; after the cycle, saved") {
  gradsync::Options o;
  o.backward_passes_per_step = 2;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View w("w", 4), gw("gw", 4);
  sync.add<Mlp>(gw, "w");
  gradsync::CheckpointState st;
  st.parameter(w, "w");
  const std::string path = file_name("cycle");
  if (world_rank() == 0) std::remove(path.c_str());  // a previous run's
  MPI_Barrier(MPI_COMM_WORLD);
  fill_host(gw, [](std::size_t i) { return double(i); });
  CHECK(!sync.synchronize());
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(sync, path, st); });
  CHECK(all_ranks(has(e, "called in the middle of an aggregation cycle (1 of 2 backward passes accumulated)")));
  CHECK(all_ranks(!exists(path)));
  CHECK(sync.synchronize());
  gradsync::save_checkpoint(sync, path, st);
  CHECK(all_ranks(exists(path)));
  // A sharded DistributedOptimizer: the same refusal, in its first cycle (no slices yet) and after
  // its first update.
  o.shard = gradsync::Shard::optimizer_state;
  gradsync::DistributedOptimizer dopt(gradsync::Adam<View>(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o));
  View p("p", 5000), gp("gp", 5000);
  dopt.add<Mlp>(p, gp, "p");
  const std::string sharded_path = file_name("cycle_sharded");
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    fill_host(gp, [](std::size_t i) { return double(i % 9); });
    CHECK(!dopt.synchronize());
    const std::string es = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, sharded_path); });
    CHECK(all_ranks(has(es, "called in the middle of an aggregation cycle (1 of 2 backward passes accumulated)")));
    CHECK(dopt.synchronize());
    dopt.apply();
  }
  gradsync::save_checkpoint(dopt, sharded_path);
  CHECK(all_ranks(exists(sharded_path)));
}

TEST_CASE("float parameters, an optimizer without state; another optimizer's file is refused") {
  using FView = Kokkos::View<float*>;
  using FSync = gradsync::GradientSync<gradsync::MpiBackend, FView>;
  const int r = world_rank();
  const std::string path = file_name("float");
  const auto make = [&](auto opt, FView w, FView gw, FView t, FView gt) {
    auto d = std::make_unique<gradsync::DistributedOptimizer<decltype(opt), FSync>>(
        std::move(opt), FSync(gradsync::MpiBackend(MPI_COMM_WORLD)));
    d->template add<Mlp>(w, gw, "w");
    d->template add<Tower>(t, gt, "t" + std::to_string(r));
    return d;
  };
  FView w("w", 5), gw("gw", 5), t("t", 2 + r), gt("gt", 2 + r);
  fill_host(w, [](std::size_t i) { return 0.1f * float(i) + 1e-7f; });
  fill_host(t, [&](std::size_t i) { return float(r) - 0.3f * float(i); });
  const std::vector<float> w0 = host_values(w), t0 = host_values(t);
  {
    auto a = make(gradsync::Sgd<FView>(), w, gw, t, gt);  // no momentum: no state buffers, a step count
    gradsync::save_checkpoint(*a, path);
  }
  FView w2("w2", 5), gw2("gw2", 5), t2("t2", 2 + r), gt2("gt2", 2 + r);
  auto b = make(gradsync::Sgd<FView>(), w2, gw2, t2, gt2);
  gradsync::load_checkpoint(*b, path);
  CHECK(all_ranks(host_values(w2) == w0 && host_values(t2) == t0));

  FView w3("w3", 5), gw3("gw3", 5), t3("t3", 2 + r), gt3("gt3", 2 + r);
  auto c = make(gradsync::Adam<FView>(), w3, gw3, t3, gt3);
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(*c, path); });
  CHECK(all_ranks(has(e,
                      "parameter 'w' (group Mlp, data-parallel, 5 values): the checkpoint holds 2 datasets for it, "
                      "this optimizer 4")));
  CHECK(all_ranks(host_values(w3) == std::vector<float>(5, 0.0f)));
}

TEST_CASE("data-parallel parameters that differ between ranks: refused on every rank before any file exists") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "one rank cannot differ from itself");
  using Opt = gradsync::Sgd<View>;
  const std::size_t n = world_rank() == 1 ? 4 : 3;
  View w("w", n), gw("gw", n);
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.add<Mlp>(w, gw, "w");
  const std::string path = file_name("dp_differ");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, path); });
  CHECK(all_ranks(has(e, "save_checkpoint(\"" + path + "\"): the ranks' data-parallel parameters differ")));
  CHECK(all_ranks(!exists(path) && no_partials(path)));
}

// Issue 43: the ranks agree on the file, every collective is watched, concurrent saves, full disks.

namespace {

// Runs f() with this process's working directory at `dir` (the same relative path then names
// another file on this rank: a node-local copy).
template <class F>
void in_directory(const std::string& dir, F&& f) {
  const std::filesystem::path back = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  try {
    f();
  } catch (...) {
    std::filesystem::current_path(back);
    throw;
  }
  std::filesystem::current_path(back);
}

// A directory `name`, empty, made by rank 0; every rank waits.
std::string fresh_directory(const std::string& name) {
  if (world_rank() == 0) {
    std::filesystem::remove_all(name);
    std::filesystem::create_directories(name);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return name;
}

}  // namespace

TEST_CASE("load_checkpoint: every rank loads one file, or every rank refuses naming the ranks and both files") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "one rank cannot disagree with itself");
  const int last = world_size() - 1;
  const std::string path_a = file_name("agree_a"), path_b = file_name("agree_b");
  {
    Model<gradsync::Adam<View>> a(gradsync::Adam<View>(), 0.0);
    a.train(2);
    gradsync::save_checkpoint(a.dopt, path_a);
    a.train(1);
    gradsync::save_checkpoint(a.dopt, path_b);  // valid too, one step further
  }
  Model<gradsync::Adam<View>> b(gradsync::Adam<View>(), 3.0);
  const std::vector<double> before = b.snapshot();
  SUBCASE("another path on the last rank") {
    const std::string e = error_of<gradsync::CheckpointError>(
        [&] { gradsync::load_checkpoint(b.dopt, world_rank() == last ? path_b : path_a); });
    CHECK(
        all_ranks(has(e, "load_checkpoint(): the ranks name different files: \"" + path_a + "\" on rank 0, \"" +
                             path_b + "\" on rank " + std::to_string(last) + "; every rank must pass the same path")));
  }
  SUBCASE("one path naming another file on the last rank (a node-local copy that differs)") {
    const std::string name = file_name("agree_same"), other = fresh_directory(file_name("agree_other") + ".d");
    copy_file(path_a, name);
    copy_file(path_b, other + "/" + name);
    std::string e;
    const auto load = [&] {
      e = error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, name); });
    };
    if (world_rank() == last)
      in_directory(other, load);
    else
      load();
    CHECK(all_ranks(has(e, "load_checkpoint(\"" + name + "\"): rank " + std::to_string(last) +
                               " opened another file than rank 0 under this path (save ")));
    CHECK(all_ranks(has(e, "every rank must load the same checkpoint (found on rank " + std::to_string(last) + ")")));
  }
  CHECK(all_ranks(b.snapshot() == before));  // nothing loaded anywhere
  b.train(1);                                // and the sync is usable
}

TEST_CASE("save_checkpoint with another path on one rank: refused on every rank before any file exists") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a different path needs a second rank");
  const int last = world_size() - 1;
  const std::string path_a = file_name("path_a"), path_b = file_name("path_b");
  remove_with_partials(path_a);
  remove_with_partials(path_b);
  Model<gradsync::Sgd<View>> a(gradsync::Sgd<View>(), 0.0);
  const std::string e = error_of<gradsync::CheckpointError>(
      [&] { gradsync::save_checkpoint(a.dopt, world_rank() == last ? path_b : path_a); });
  CHECK(all_ranks(has(e, "save_checkpoint(): the ranks name different files: \"" + path_a + "\" on rank 0, \"" +
                             path_b + "\" on rank " + std::to_string(last))));
  CHECK(all_ranks(!exists(path_a) && !exists(path_b) && no_partials(path_a) && no_partials(path_b)));
  const std::vector<double> before = a.snapshot();
  a.train(1);  // the sync is usable
  CHECK(all_ranks(a.snapshot() != before));
}

TEST_CASE("a rank that skips save_checkpoint or load_checkpoint: the others stop at the deadline naming it") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a skipped call needs a peer that waits for it");
  const int last = world_size() - 1;
  const std::string path = file_name("skip");
  for (const bool save : {true, false}) {
    CAPTURE(save);
    gradsync::Options o;
    o.stall_timeout = 2.0;
    View w("w", 5), gw("gw", 5);
    using Opt = gradsync::Sgd<View>;
    gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o));
    dopt.add<Mlp>(w, gw, "w");
    if (!save) gradsync::save_checkpoint(dopt, path);  // a file to load (every rank)
    if (save) remove_with_partials(path);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    std::string e;
    if (world_rank() != last)  // the last rank skips the call
      e = error_of<gradsync::StallError>(
          [&] { save ? gradsync::save_checkpoint(dopt, path) : gradsync::load_checkpoint(dopt, path); });
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Barrier(MPI_COMM_WORLD);  // the world's, not the sync's communicator
    const bool named =
        world_rank() == last ||
        (has(e, save ? "for the collectives of save_checkpoint()" : "for the collectives of load_checkpoint()") &&
         has(e, "missing ranks: [" + std::to_string(last) + "]") && waited < 2.0 * 1.1 + 0.5);
    CHECK(all_ranks(named));
    if (save) CHECK(all_ranks(!exists(path) && no_partials(path)));  // it stopped before the file
  }
}

namespace {

// One "job" of the concurrent-save test: a data-parallel weight, a table split over the job's
// ranks and a replicated marker, every value a function of the marker: a file is whole when
// every value matches its marker.
struct Job {
  using Opt = gradsync::Sgd<View>;
  static constexpr std::uint64_t rows = 12, length = 4;
  View w{"w", 64}, gw{"gw", 64}, emb, gemb;
  gradsync::DistributedOptimizer<Opt, Sync> dopt;
  gradsync::CheckpointState extra;
  double marker = 0;
  std::uint64_t first = 0, count = 0;
  explicit Job(MPI_Comm comm) : dopt(Opt(), Sync(gradsync::MpiBackend(comm))) {
    int q = 0, m = 1;
    MPI_Comm_rank(comm, &q);
    MPI_Comm_size(comm, &m);
    first = rows * std::uint64_t(q) / std::uint64_t(m);
    count = rows * std::uint64_t(q + 1) / std::uint64_t(m) - first;
    emb = View("emb", count * length);
    gemb = View("gemb", count * length);
    dopt.add<Mlp>(w, gw, "w");
    dopt.add<Tower>(emb, gemb, "emb");
    extra.shard("emb", gradsync::RowShard{first, rows, length});
    extra.replicated(marker, "marker");
  }
  void set(double m) {
    marker = m;
    fill_host(w, [&](std::size_t i) { return m + 1e-3 * double(i); });
    fill_host(emb, [&](std::size_t i) { return m + double(first + i / length) + 0.1 * double(i % length); });
  }
  bool whole() const {
    const std::vector<double> wv = host_values(w), ev = host_values(emb);
    bool ok = true;
    for (std::size_t i = 0; i < wv.size(); ++i) ok = ok && wv[i] == marker + 1e-3 * double(i);
    for (std::size_t i = 0; i < ev.size(); ++i)
      ok = ok && ev[i] == marker + double(first + i / length) + 0.1 * double(i % length);
    return ok;
  }
};

}  // namespace

TEST_CASE("two jobs saving to one path at once: every save succeeds, the file is one whole save") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "two jobs need a rank each");
  const int color = world_rank() < world_size() / 2 ? 0 : 1;
  MPI_Comm job_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &job_comm);
  const std::string path = file_name("two_jobs");
  remove_with_partials(path);
  {
    Job job(job_comm);
    int refused = 0;
    for (int round = 1; round <= 6; ++round) {
      job.set(1000.0 * (color + 1) + round);
      const std::string e =
          error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(job.dopt, path, job.extra); });
      if (!e.empty()) {
        ++refused;
        MESSAGE(e);
      }
    }
    CHECK(refused == 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Whichever rename came last: one job's save, whole, read on one rank (the table in one shard).
  bool whole = true;
  if (world_rank() == 0) {
    Job one(MPI_COMM_SELF);
    one.set(-1);
    gradsync::load_checkpoint(one.dopt, path, one.extra);
    const int m = int(one.marker);
    whole = one.whole() && double(m) == one.marker && (m / 1000 == 1 || m / 1000 == 2) && m % 1000 >= 1 &&
            m % 1000 <= 6;  // a marker one of the jobs saved
    MESSAGE("the file holds the save of marker " << one.marker);
  }
  CHECK(all_ranks(whole));
  CHECK(all_ranks(no_partials(path)));
  MPI_Comm_free(&job_comm);
}

TEST_CASE("a failure on one rank is reported as that rank found it, not as a row-sharded table's checksum") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a failure on one rank needs a peer to report it");
  const int n = world_size(), last = n - 1;
  const std::string path = file_name("blame");
  {
    Resharded a(MPI_COMM_WORLD, n, 0.0);
    a.train(1);
    gradsync::save_checkpoint(a.dopt, path, a.extra);
  }
  Resharded b(MPI_COMM_WORLD, n, 7.0);
  const std::vector<double> before = b.full(0);
  SUBCASE("a corrupted tower on the last rank") {
    const std::string bad = file_name("blame_corrupted");
    copy_file(path, bad);
    if (world_rank() == 0) {
      const std::string ds = "/local/tower" + std::to_string(last) + "/param";
      const haddr_t at = dataset_offset(bad, ds.c_str());
      std::fstream f(bad, std::ios::binary | std::ios::in | std::ios::out);
      f.seekg(std::streamoff(at + 5));
      char c = 0;
      f.get(c);
      f.seekp(std::streamoff(at + 5));
      f.put(char(c ^ 0x01));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, bad, b.extra); });
    CHECK(all_ranks(has(e, "parameter 'tower" + std::to_string(last) + "' (group Tower, local")));
    CHECK(all_ranks(has(e, "/local/tower" + std::to_string(last) +
                               "/param fails its checksum (the file is corrupted) (found on rank " +
                               std::to_string(last) + ")")));
    CHECK(all_ranks(!has(e, "'emb'")));
  }
  SUBCASE("the file missing on rank 1") {
    const std::string empty = fresh_directory(file_name("blame_empty") + ".d");
    std::string e;
    const auto load = [&] {
      e = error_of<gradsync::CheckpointError>([&] { gradsync::load_checkpoint(b.dopt, path, b.extra); });
    };
    if (world_rank() == 1)
      in_directory(empty, load);
    else
      load();
    CHECK(all_ranks(has(e, "load_checkpoint(\"" + path + "\"): no such file (or not readable) (found on rank 1)")));
  }
  CHECK(all_ranks(b.full(0) == before));
  b.train(1);
}

namespace {

// A tmpfs of `kib` KiB mounted at `dir` by rank 0 (root only: false elsewhere, the test skips).
bool mount_tmpfs(const std::string& dir, int kib) {
  int ok = 0;
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir);
    std::system(("umount -l " + dir + " 2>/dev/null").c_str());
    ok =
        std::system(("mount -t tmpfs -o size=" + std::to_string(kib) + "k tmpfs " + dir + " 2>/dev/null").c_str()) == 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

// Rank 0 fills the file system of `dir` with `filler` until `free_bytes` are left; every rank waits.
void leave_free(const std::string& dir, const std::string& filler, std::uint64_t free_bytes) {
  if (world_rank() == 0) {
    std::remove(filler.c_str());
    struct statvfs st;
    statvfs(dir.c_str(), &st);
    const std::uint64_t avail = std::uint64_t(st.f_bavail) * st.f_frsize;
    if (avail > free_bytes) {
      std::ofstream out(filler, std::ios::binary);
      const std::string zeros(std::size_t(avail - free_bytes), '\0');
      out.write(zeros.data(), std::streamsize(zeros.size()));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

TEST_CASE("a save onto a full file system: refused on every rank, the old checkpoint kept, nothing left open") {
  const std::string dir = "checkpoint_full_np" + std::to_string(world_size()) + ".d";
  if (!mount_tmpfs(dir, 512)) {
    MESSAGE("skipped: mounting a tmpfs needs root");
    return;
  }
  const std::string path = dir + "/run.h5", filler = dir + "/filler";
  using Opt = gradsync::Sgd<View>;
  const double t_start = MPI_Wtime();
  int refusals = 0, saves = 0;
  // Free space from none to more than the large save needs, a page at a time: every place where a
  // write can fail (the metadata, the values, the completion record, the close).
  for (std::uint64_t free_kib = 0; free_kib <= 100; free_kib += 4) {
    CAPTURE(free_kib);
    leave_free(dir, filler, 400 << 10);
    Model<Opt> small(Opt(), 0.0);
    gradsync::save_checkpoint(small.dopt, path);  // the previous checkpoint
    const std::vector<double> kept = small.snapshot();
    leave_free(dir, filler, free_kib << 10);
    View w("w", 9000), gw("gw", 9000);
    fill_host(w, [](std::size_t i) { return 0.5 + double(i); });
    gradsync::DistributedOptimizer<Opt, Sync> large(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
    large.add<Mlp>(w, gw, "w");
    const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(large, path); });
    CHECK(all_ranks(h5_open_objects() == 0));
    CHECK(all_ranks(no_partials(path)));
    leave_free(dir, filler, 400 << 10);
    if (!e.empty()) {
      ++refusals;
      CHECK(all_ranks(has(e, "save_checkpoint(\"" + path + "\"): ") && has(e, "(a full file system?)")));
      Model<Opt> back(Opt(), 5.0);
      gradsync::load_checkpoint(back.dopt, path);  // the previous checkpoint, intact
      CHECK(all_ranks(back.snapshot() == kept));
    } else {
      ++saves;
      View w2("w2", 9000), gw2("gw2", 9000);
      gradsync::DistributedOptimizer<Opt, Sync> back(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
      back.add<Mlp>(w2, gw2, "w");
      gradsync::load_checkpoint(back, path);
      CHECK(all_ranks(host_values(w2) == host_values(w)));
    }
    CHECK(all_ranks(h5_open_objects() == 0));
    fill_host(gw, [](std::size_t) { return 1.0; });
    CHECK(large.step());  // the sync is usable after a refused save
  }
  CHECK(refusals > 0);
  CHECK(saves > 0);
  MESSAGE(refusals << " refused and " << saves << " saved in " << MPI_Wtime() - t_start << " s");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::system(("umount " + dir).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
}
