// Checkpoints (issue 33): a hybrid model (data-parallel MLP, a local tower per rank) trained N steps,
// saved, trained M more, against a fresh model loaded from the file and trained M steps: the same
// parameters and optimizer state to the last bit, with Sgd (momentum) and Adam. Refusals agreed on
// every rank with nothing loaded: a missing name, another size, a corrupted dataset, a truncated,
// foreign or incomplete file. The h5py test (checkpoint_h5py.py) reads the file this one leaves.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <gradsync/checkpoint.hpp>
#include <gradsync/gradsync.hpp>
#include <memory>
#include <string>
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
struct Replicated {};  // reduced over it: not in checkpoints yet
template <>
struct gradsync::LocalVarPolicy<Replicated> : gradsync::ReduceOver<Everyone> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// What a variant of the model changes on the last rank (the refusal tests).
struct Variant {
  std::string tower_suffix = ".w";  // the name of the last rank's tower weight
  int extra = 0;                    // values added to it
};

template <class Opt>
struct Model {
  std::vector<View> params, grads;  // before dopt: they outlive its pointers
  gradsync::DistributedOptimizer<Opt, Sync> dopt;

  // `seed` shifts every initial value: a fresh model starts elsewhere than the saved one.
  Model(Opt opt, double seed, const Variant& v = {})
      : dopt(std::move(opt), Sync(gradsync::MpiBackend(MPI_COMM_WORLD))) {
    const int r = world_rank();
    const bool last = r == world_size() - 1;
    add<Mlp>("mlp.w", 6, seed);
    add<Mlp>("mlp.b", 3, seed);
    const std::string tower = "tower" + std::to_string(r);
    add<Tower>(tower + (last ? v.tower_suffix : std::string(".w")), std::size_t(4 + r + (last ? v.extra : 0)),
               seed + r);
    add<Tower>(tower + ".b", 2, seed + r);
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

  // Every parameter's values and optimizer state, in registration order.
  std::vector<double> snapshot() {
    std::vector<double> out;
    for (std::size_t k = 0; k < params.size(); ++k) {
      for (double x : host_values(params[k])) out.push_back(x);
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
  CHECK(all_ranks(exists(path) && !exists(path + ".partial")));
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
  if (world_size() < 2) return;  // one rank has no peer to collide with
  using Opt = gradsync::Sgd<View>;
  std::vector<View> p{View("p", 3), View("t", 2)}, g{View("gp", 3), View("gt", 2)};
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.add<Mlp>(p[0], g[0], "w");
  dopt.add<Tower>(p[1], g[1], "table");  // the same name on every rank
  const std::string path = file_name("collide");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, path); });
  CHECK(all_ranks(has(e, "parameter 'table' (group Tower) is registered as local on rank 1 and as local on rank 0")));
  CHECK(all_ranks(!exists(path) && !exists(path + ".partial")));
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
      has(e, "save_checkpoint(\"no_such_directory/run.h5\"): cannot create 'no_such_directory/run.h5.partial'")));
  const std::vector<double> before = a.snapshot();
  a.train(1);
  CHECK(all_ranks(a.snapshot() != before));
}

TEST_CASE("ReduceOver parameters are refused for now, on every rank, before any file exists") {
  using Opt = gradsync::Sgd<View>;
  View w("w", 3), gw("gw", 3), r("r", 2), gr("gr", 2);
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  std::vector<int> everyone;
  for (int k = 0; k < world_size(); ++k) everyone.push_back(k);
  dopt.sync().bind_process_set<Everyone>(everyone);
  dopt.add<Mlp>(w, gw, "w");
  dopt.add<Replicated>(r, gr, "replicated");
  const std::string path = file_name("reduce_over");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, path); });
  CHECK(all_ranks(has(e, "parameter 'replicated' (group Replicated) on rank 0 is reduced over a process set")));
  CHECK(all_ranks(!exists(path) && !exists(path + ".partial")));
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
  if (world_size() < 2) return;  // one rank cannot differ from itself
  using Opt = gradsync::Sgd<View>;
  const std::size_t n = world_rank() == 1 ? 4 : 3;
  View w("w", n), gw("gw", n);
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(), Sync(gradsync::MpiBackend(MPI_COMM_WORLD)));
  dopt.add<Mlp>(w, gw, "w");
  const std::string path = file_name("dp_differ");
  const std::string e = error_of<gradsync::CheckpointError>([&] { gradsync::save_checkpoint(dopt, path); });
  CHECK(all_ranks(has(e, "save_checkpoint(\"" + path + "\"): the ranks' data-parallel parameters differ")));
  CHECK(all_ranks(!exists(path) && !exists(path + ".partial")));
}
