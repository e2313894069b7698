// gradsync: checkpoint and restart of a hybrid model in one parallel HDF5 file.
//
// Optional: include it (gradsync.hpp includes it only where GradSync::hdf5 is linked) and link
// GradSync::hdf5, which brings a parallel HDF5 (Debian: libhdf5-openmpi-dev):
//   find_package(GradSync CONFIG REQUIRED COMPONENTS hdf5)
//   target_link_libraries(app PRIVATE GradSync::hdf5)
//
//   gradsync::save_checkpoint(dopt, "run.h5");   // collective: parameters and optimizer state
//   ...                                          // a new job, the same model registered again
//   gradsync::load_checkpoint(dopt, "run.h5");   // collective: the training continues bit for bit
//
// The file holds the data-parallel parameters and their optimizer state once (rank 0's copy), every
// local parameter under its registered name with its optimizer state, gradsync's version, the rank
// count and a format version; docs/CHECKPOINT.md shows the layout. It is written under
// `path + ".partial"` and renamed to `path` after its completion record: a job killed while writing
// leaves no file that loads. Each dataset carries an FNV-1a checksum of its bytes, verified on load.
#pragma once

#if !defined(GRADSYNC_HAVE_HDF5)
#error \
    "gradsync/checkpoint.hpp needs parallel HDF5: link GradSync::hdf5 (find_package(GradSync COMPONENTS hdf5)); this gradsync was configured without it or the target is not linked"
#endif

#include <hdf5.h>
#include <mpi.h>

#if !defined(H5_HAVE_PARALLEL)
#error \
    "gradsync/checkpoint.hpp: this hdf5.h is a serial HDF5; checkpoints are written with MPI-IO and need a parallel HDF5 (Debian: libhdf5-openmpi-dev)"
#endif

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "config.hpp"
#include "distributed_optimizer.hpp"
#include "error.hpp"
#include "impl/demangle.hpp"
#include "impl/stall.hpp"
#include "impl/sync_access.hpp"

namespace gradsync {

/// The layout version save_checkpoint() writes and load_checkpoint() reads.
inline constexpr int checkpoint_format_version = 1;

/// A checkpoint that cannot be written or loaded: every rank of the sync throws it, with the same
/// message (the lowest failing rank's, naming the tensor, its group and that rank).
class CheckpointError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

namespace impl {

// The DistributedOptimizer's registrations and optimizer, read and written by the checkpoint.
struct CheckpointAccess {
  template <class D>
  static auto& entries(D& d) {
    return d.entries_;
  }
  template <class D>
  static auto& optimizer(D& d) {
    return d.opt_;
  }
};

// An HDF5 identifier closed by its own H5?close at scope exit.
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    reset();
    id_ = std::exchange(o.id_, H5I_INVALID_HID);
    close_ = o.close_;
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now; false when HDF5 refused (a collective close that failed).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && close_) ok = close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5 prints its error stack by default; gradsync reports its own errors instead.
class H5Quiet {
 public:
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5Quiet(const H5Quiet&) = delete;
  H5Quiet& operator=(const H5Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5 link names cannot hold '/', and "." is the group itself: those and '%' are escaped.
inline std::string h5_escape(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '/')
      out += "%2F";
    else if (c == '%')
      out += "%25";
    else
      out += c;
  }
  if (out == "." || out.empty()) out = "%2E" + out.substr(out.empty() ? 0 : 1);
  return out;
}

template <class T>
hid_t h5_native() {
  if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return H5T_NATIVE_UINT64;
  if constexpr (std::is_same_v<T, int>) return H5T_NATIVE_INT;
}

template <class T>
const char* value_type_name() {
  return std::is_same_v<T, double> ? "float64" : std::is_same_v<T, float> ? "float32" : "int64";
}

// Attributes: written collectively (every rank the same value), read by one rank.
inline bool h5_write_attr_string(hid_t obj, const char* key, const std::string& v) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.ok() || H5Tset_size(type.get(), v.empty() ? 1 : v.size()) < 0) return false;
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, key, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string buf = v.empty() ? std::string(1, '\0') : v;
  return a.ok() && H5Awrite(a.get(), type.get(), buf.data()) >= 0;
}
template <class T>
bool h5_write_attr(hid_t obj, const char* key, T v) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, key, h5_native<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Awrite(a.get(), h5_native<T>(), &v) >= 0;
}
// False when the attribute is missing or is no string.
inline bool h5_read_attr_string(hid_t obj, const char* key, std::string& out) {
  if (H5Aexists(obj, key) <= 0) return false;
  H5Handle a(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return false;
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) return false;
  const std::size_t n = H5Tget_size(type.get());
  std::vector<char> buf(n + 1, '\0');
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tset_size(mem.get(), n) < 0 || H5Aread(a.get(), mem.get(), buf.data()) < 0) return false;
  out.assign(buf.data(), std::strlen(buf.data()));
  return true;
}
template <class T>
bool h5_read_attr(hid_t obj, const char* key, T& out) {
  if (H5Aexists(obj, key) <= 0) return false;
  H5Handle a(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Aread(a.get(), h5_native<T>(), &out) >= 0;
}

// One parameter of the checkpoint as every rank knows it: the catalog is alike on every rank.
struct CkptTensor {
  std::string name, group;
  std::uint64_t size = 0;
  int owner = -1;  // the rank that writes it (0 for the data-parallel ones)
  bool local = false;
  int nstate = 0;               // state buffers of value_type, `size` values each
  std::uint64_t ncounters = 0;  // std::int64_t counters (step counts), concatenated
  std::string path() const { return (local ? "/local/" : "/data_parallel/") + h5_escape(name); }
};

// The lowest failing rank's message on every rank ("" when none failed): one allreduce, and one
// broadcast of the message when there is one.
inline std::string agree_on_failure(MPI_Comm comm, const std::string& mine) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
  int first = mine.empty() ? INT_MAX : me;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return {};
  std::uint64_t n = me == first ? mine.size() : 0;
  MPI_Bcast(&n, 1, MPI_UINT64_T, first, comm);
  std::string msg = me == first ? mine : std::string(std::size_t(n), ' ');
  MPI_Bcast(msg.data(), int(n), MPI_CHAR, first, comm);
  return msg;
}

// Every rank's strings, in rank order (the local parameters' catalog).
inline std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  int len = int(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    offs[std::size_t(r)] = total;
    total += lens[std::size_t(r)];
  }
  std::string all(std::size_t(total), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.push_back(all.substr(std::size_t(offs[std::size_t(r)]), std::size_t(lens[std::size_t(r)])));
  return out;
}

// Length-prefixed fields: names may hold any character.
inline void put_field(std::string& s, const std::string& f) { s += std::to_string(f.size()) + ":" + f; }
inline std::string get_field(const std::string& s, std::size_t& at) {
  const std::size_t colon = s.find(':', at);
  const std::size_t n = std::stoull(s.substr(at, colon - at));
  std::string f = s.substr(colon + 1, n);
  at = colon + 1 + n;
  return f;
}

// A parameter's buffers as the checkpoint sees them: the parameter, its state, its counters.
template <class T>
struct CkptBuffers {
  T* param = nullptr;
  std::vector<T*> state;
  std::vector<std::int64_t*> counters;
};

template <class T, class MemorySpace>
std::vector<T> copy_to_host(const T* p, std::size_t n) {
  std::vector<T> out(n);
  using U = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  if (n)
    Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, U>(out.data(), n),
                      Kokkos::View<const T*, MemorySpace, U>(p, n));
  return out;
}
template <class T, class MemorySpace>
void copy_from_host(T* p, const std::vector<T>& v) {
  using U = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  if (!v.empty())
    Kokkos::deep_copy(Kokkos::View<T*, MemorySpace, U>(p, v.size()),
                      Kokkos::View<const T*, Kokkos::HostSpace, U>(v.data(), v.size()));
}

// What save and load share: the registrations split into data-parallel and local ones, the
// catalog every rank agrees on, and the refusals (process sets, names not unique across ranks).
template <class D>
class CheckpointPlan {
 public:
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  using Opt = typename D::optimizer_type;

  CheckpointPlan(D& dopt, const char* call, const std::string& path) : dopt_(dopt) {
    static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>,
                  "gradsync checkpoints: parameters are float or double");
    auto& sync = dopt.sync();
    comm_ = sync.backend().comm();
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    what_ = impl::cat(call, "(\"", path, "\")");
    std::unordered_map<const T*, bool> local;
    impl::SyncAccess::for_each_gradient(sync, [&](const T* d, std::size_t, bool l, T) { local[d] = l; });
    std::unordered_set<const T*> in_sets;
    for (const auto& s : impl::SyncAccess::process_sets(sync).sets())
      for (const auto& t : s.tensors) in_sets.insert(t.data);
    std::string mine, refusal;
    for (auto& e : CheckpointAccess::entries(dopt)) {
      if (in_sets.count(e.grad) && refusal.empty())
        refusal = impl::cat(what_, ": parameter '", e.name, "' (group ", e.group, ") on rank ", rank_,
                            " is reduced over a process set (ReduceOver): not in checkpoints yet (docs/CHECKPOINT.md)");
      CkptTensor t;
      t.name = e.name;
      t.group = e.group;
      t.size = e.size;
      t.local = local.at(e.grad);
      t.owner = t.local ? rank_ : 0;
      CkptBuffers<T> b;
      b.param = e.param;
      if constexpr (impl::has_state_visitor<Opt>::value)
        CheckpointAccess::optimizer(dopt).for_each_state(e.slot, [&](auto* data, std::size_t n) {
          using S = std::remove_pointer_t<decltype(data)>;
          if constexpr (std::is_same_v<S, T>) {
            b.state.push_back(data);
          } else {
            static_assert(std::is_same_v<S, std::int64_t>,
                          "optimizer for_each_state: state is value_type buffers or std::int64_t counters");
            for (std::size_t i = 0; i < n; ++i) b.counters.push_back(data + i);
          }
        });
      t.nstate = int(b.state.size());
      t.ncounters = b.counters.size();
      if (t.local) {
        put_field(mine, t.name);
        put_field(mine, t.group);
        put_field(mine, std::to_string(t.size));
        put_field(mine, std::to_string(t.nstate));
        put_field(mine, std::to_string(t.ncounters));
        mine_local_.push_back(tensors_.size());
      } else {
        dp_.push_back(tensors_.size());
      }
      tensors_.push_back(std::move(t));
      buffers_.push_back(std::move(b));
    }
    // The catalog: this rank's data-parallel parameters, alike on every rank (the file's metadata is
    // created collectively from it: ranks that differ would diverge; one hash tells before a first
    // synchronize() compared them), and every rank's local ones, gathered.
    std::uint64_t h[2] = {fnv1a("dp", 2), 0};
    for (std::size_t k : dp_) {
      const CkptTensor& t = tensors_[k];
      const std::uint64_t shape[3] = {t.size, std::uint64_t(t.nstate), t.ncounters};
      h[0] = fnv1a(shape, sizeof shape,
                   fnv1a(t.name.data(), t.name.size() + 1, fnv1a(t.group.data(), t.group.size() + 1, h[0])));
    }
    h[1] = ~h[0];  // one MPI_MIN gives the minimum and the maximum
    MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MIN, comm_);
    if (h[0] != ~h[1] && refusal.empty())
      refusal = impl::cat(
          what_, ": the ranks' data-parallel parameters differ (names, groups, sizes or optimizer state; rank ", rank_,
          " has ", dp_.size(), "); broadcast_parameters() names the first difference");
    const std::vector<std::string> all = allgather_strings(comm_, mine);
    std::map<std::string, int> seen;
    for (std::size_t k : dp_) seen[tensors_[k].name] = -1;
    for (int r = 0; r < size_; ++r) {
      const std::string& s = all[std::size_t(r)];
      for (std::size_t at = 0; at < s.size();) {
        CkptTensor t;
        t.name = get_field(s, at);
        t.group = get_field(s, at);
        t.size = std::stoull(get_field(s, at));
        t.nstate = std::stoi(get_field(s, at));
        t.ncounters = std::stoull(get_field(s, at));
        t.local = true;
        t.owner = r;
        const auto [it, fresh] = seen.emplace(t.name, r);
        if (!fresh && refusal.empty())
          refusal = impl::cat(what_, ": parameter '", t.name, "' (group ", t.group, ") is registered as local on rank ",
                              r, " and as ", it->second < 0 ? "data-parallel" : impl::cat("local on rank ", it->second),
                              ": a checkpoint keys local parameters by name; give them names unique across ranks");
        catalog_local_.push_back(std::move(t));
      }
    }
    refusal_ = refusal;  // alike on every rank but the process-set one: agreed by the caller
  }

  D& dopt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string what_, refusal_;
  std::vector<CkptTensor> tensors_;      // this rank's registrations, in order
  std::vector<CkptBuffers<T>> buffers_;  // their memory
  std::vector<std::size_t> dp_, mine_local_;
  std::vector<CkptTensor> catalog_local_;  // every rank's local parameters, rank by rank
};

// The datasets of one parameter: "param", "state<k>", "counters".
inline std::vector<std::string> dataset_names(const CkptTensor& t) {
  std::vector<std::string> out{"param"};
  for (int k = 0; k < t.nstate; ++k) out.push_back(impl::cat("state", k));
  if (t.ncounters) out.push_back("counters");
  return out;
}

inline std::uint64_t checksum_bytes(const void* p, std::size_t n) { return fnv1a(p, n); }

}  // namespace impl

/// Writes the optimizer's parameters and optimizer state to the parallel HDF5 file `path`: the
/// data-parallel ones once (rank 0's copy), every local one under its registered name (which must
/// be unique across ranks) by the rank that holds it, with gradsync's version, the rank count and
/// the format version (docs/CHECKPOINT.md). Written as `path + ".partial"`, renamed to `path` once
/// complete; an existing `path` is replaced. Collective over the sync's ranks (an MpiBackend's
/// communicator); between steps (not while a step is open). Gradients are not saved: call it after
/// a step, not in the middle of an aggregation cycle. Parameters of ReduceOver groups are refused
/// for now. Throws CheckpointError on every rank, with the same message, when any rank fails; then
/// `path` is untouched.
template <class Optimizer, class Sync>
void save_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path) {
  using D = DistributedOptimizer<Optimizer, Sync>;
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  impl::SyncAccess::require_between_steps(dopt.sync(), "save_checkpoint()");
  Kokkos::fence();  // pending kernels may still write parameters or state
  impl::CheckpointPlan<D> plan(dopt, "save_checkpoint", path);
  const MPI_Comm comm = plan.comm_;
  if (std::string e = impl::agree_on_failure(comm, plan.refusal_); !e.empty()) throw CheckpointError(e);
  const std::string tmp = path + ".partial";
  impl::H5Quiet quiet;
  std::string err;  // this rank's first failure; the collective calls go on, every rank alike
  const auto fail = [&](const std::string& why) {
    if (err.empty()) err = impl::cat(plan.what_, ": ", why, " on rank ", plan.rank_);
  };
  impl::H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  impl::H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.ok()) fail(impl::cat("cannot create '", tmp, "' (a missing directory, no write permission?)"));
  if (std::string e = impl::agree_on_failure(comm, err); !e.empty()) throw CheckpointError(e);

  // Metadata, collective: every rank creates every group, dataset and attribute alike.
  const hid_t f = file.get();
  bool ok = impl::h5_write_attr_string(f, "format", "gradsync-checkpoint") &&
            impl::h5_write_attr<int>(f, "format_version", checkpoint_format_version) &&
            impl::h5_write_attr_string(
                f, "gradsync_version",
                impl::cat(GRADSYNC_VERSION_MAJOR, ".", GRADSYNC_VERSION_MINOR, ".", GRADSYNC_VERSION_PATCH)) &&
            impl::h5_write_attr<int>(f, "ranks", plan.size_) &&
            impl::h5_write_attr_string(f, "value_type", impl::value_type_name<T>()) &&
            impl::h5_write_attr_string(f, "optimizer", impl::type_name<Optimizer>());
  std::vector<const impl::CkptTensor*> all;  // the file's parameters, in catalog order
  for (std::size_t k : plan.dp_) all.push_back(&plan.tensors_[k]);
  for (const auto& t : plan.catalog_local_) all.push_back(&t);
  std::vector<impl::H5Handle> datasets;  // all[i]'s datasets, in dataset_names order
  impl::H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every value is written: no fill pass
  for (const char* top : {"/data_parallel", "/local"}) {
    impl::H5Handle g(H5Gcreate2(f, top, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ok = ok && g.ok();
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const impl::CkptTensor& t = *all[i];
    impl::H5Handle g(H5Gcreate2(f, t.path().c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ok = ok && g.ok() && impl::h5_write_attr_string(g.get(), "name", t.name) &&
         impl::h5_write_attr_string(g.get(), "group", t.group) &&
         impl::h5_write_attr<std::uint64_t>(g.get(), "size", t.size) &&
         impl::h5_write_attr<int>(g.get(), "rank", t.owner);
    for (const std::string& d : impl::dataset_names(t)) {
      const bool counters = d == "counters";
      const hsize_t n = counters ? t.ncounters : t.size;
      impl::H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
      datasets.emplace_back(
          H5Dcreate2(g.get(), d.c_str(), counters ? impl::h5_native<std::int64_t>() : impl::h5_native<T>(), space.get(),
                     H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
          H5Dclose);
      ok = ok && datasets.back().ok();
    }
  }
  if (!ok) fail("HDF5 refused to create the file's groups, datasets or attributes");

  // Data, independent: rank 0 the data-parallel parameters, each rank its local ones. Checksums
  // of what a rank wrote, zero elsewhere, OR-ed into every rank's copy for the attributes.
  std::vector<std::uint64_t> sums(datasets.size(), 0);
  std::size_t at = 0;
  std::size_t local_seen = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const impl::CkptTensor& t = *all[i];
    const std::size_t nd = impl::dataset_names(t).size();
    const bool mine = t.owner == plan.rank_;
    if (mine && err.empty()) {
      // this rank's registration of the parameter: dp_ order, then its local ones in order
      const std::size_t k = t.local ? plan.mine_local_[local_seen++] : plan.dp_[i];
      const auto& b = plan.buffers_[k];
      const auto write = [&](std::size_t d, hid_t type, const void* p, std::size_t bytes) {
        sums[at + d] = impl::checksum_bytes(p, bytes);
        if (bytes && H5Dwrite(datasets[at + d].get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p) < 0)
          fail(impl::cat("writing parameter '", t.name, "' (group ", t.group, ") failed"));
      };
      const std::vector<T> p = impl::copy_to_host<T, Space>(b.param, t.size);
      write(0, impl::h5_native<T>(), p.data(), p.size() * sizeof(T));
      for (int s = 0; s < t.nstate; ++s) {
        const std::vector<T> v = impl::copy_to_host<T, Space>(b.state[std::size_t(s)], t.size);
        write(std::size_t(1 + s), impl::h5_native<T>(), v.data(), v.size() * sizeof(T));
      }
      if (t.ncounters) {
        std::vector<std::int64_t> c;
        for (const std::int64_t* x : b.counters) c.push_back(*x);
        write(nd - 1, impl::h5_native<std::int64_t>(), c.data(), c.size() * sizeof(std::int64_t));
      }
    }
    at += nd;
  }
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_UINT64_T, MPI_BOR, comm);
  for (std::size_t d = 0; d < datasets.size(); ++d)
    if (!impl::h5_write_attr<std::uint64_t>(datasets[d].get(), "checksum", sums[d])) fail("writing a checksum failed");
  datasets.clear();
  // The completion record, last: a file without it is never loaded.
  if (!impl::h5_write_attr<int>(f, "complete", 1)) fail("writing the completion record failed");
  if (!file.reset()) fail(impl::cat("closing '", tmp, "' failed (a full file system?)"));
  if (std::string e = impl::agree_on_failure(comm, err); !e.empty()) {
    if (plan.rank_ == 0) std::remove(tmp.c_str());
    throw CheckpointError(e);
  }
  if (plan.rank_ == 0 && std::rename(tmp.c_str(), path.c_str()) != 0)
    err = impl::cat(plan.what_, ": renaming '", tmp, "' to '", path, "' failed on rank 0");
  if (std::string e = impl::agree_on_failure(comm, err); !e.empty()) throw CheckpointError(e);
}

/// Reads a checkpoint written by save_checkpoint() into the optimizer's parameters and optimizer
/// state: each data-parallel parameter on every rank, each local one on the rank that registers its
/// name. Same rank count as the writer's: the training continues bit for bit (another rank count is
/// refused for now). Collective over the sync's ranks; between steps. All or nothing: a file that is
/// missing, truncated, foreign, of another format version or incomplete, a parameter the file lacks
/// or holds with another size, group or optimizer state, a dataset whose checksum differs, a file of
/// another model (more parameters): CheckpointError on every rank, with the same message naming the
/// tensor, its group and the rank that found it, and nothing was loaded anywhere.
template <class Optimizer, class Sync>
void load_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path) {
  using D = DistributedOptimizer<Optimizer, Sync>;
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  impl::SyncAccess::require_between_steps(dopt.sync(), "load_checkpoint()");
  Kokkos::fence();
  impl::CheckpointPlan<D> plan(dopt, "load_checkpoint", path);
  const MPI_Comm comm = plan.comm_;
  if (std::string e = impl::agree_on_failure(comm, plan.refusal_); !e.empty()) throw CheckpointError(e);
  impl::H5Quiet quiet;
  std::string err;
  const auto fail = [&](const std::string& why) {
    if (err.empty()) err = impl::cat(plan.what_, ": ", why, " (found on rank ", plan.rank_, ")");
  };
  // Staging: everything is read and verified before any parameter changes.
  std::vector<std::vector<T>> values(plan.tensors_.size());  // param then state, concatenated
  std::vector<std::vector<std::int64_t>> counters(plan.tensors_.size());
  [&] {
    // Each rank opens the file on its own (MPI_COMM_SELF): reads need no collective metadata calls.
    impl::H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fapl_mpio(fapl.get(), MPI_COMM_SELF, MPI_INFO_NULL);
#if H5_VERSION_GE(1, 12, 0)
    const htri_t is_hdf5 = H5Fis_accessible(path.c_str(), fapl.get());
#else
    const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
    if (is_hdf5 <= 0) {
      std::FILE* probe = std::fopen(path.c_str(), "rb");
      if (!probe)
        fail(impl::cat("no such file (or not readable)"));
      else {
        std::fclose(probe);
        fail("not an HDF5 file (foreign or truncated)");
      }
      return;
    }
    impl::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!file.ok()) return fail("HDF5 cannot open it (truncated or damaged)");
    const hid_t f = file.get();
    std::string format, vt;
    int version = 0, ranks = 0, complete = 0;
    if (!impl::h5_read_attr_string(f, "format", format) || format != "gradsync-checkpoint")
      return fail("an HDF5 file, but not a gradsync checkpoint (no format attribute 'gradsync-checkpoint')");
    if (!impl::h5_read_attr<int>(f, "format_version", version) || version != checkpoint_format_version)
      return fail(impl::cat("checkpoint format version ", version, "; this gradsync reads version ",
                            checkpoint_format_version));
    if (!impl::h5_read_attr<int>(f, "complete", complete) || complete != 1)
      return fail("incomplete checkpoint: no completion record (the job writing it stopped early)");
    if (!impl::h5_read_attr<int>(f, "ranks", ranks) || ranks != plan.size_)
      return fail(impl::cat("written by ", ranks, " ranks, loaded by ", plan.size_,
                            ": restart at another rank count is not supported yet (docs/CHECKPOINT.md)"));
    if (!impl::h5_read_attr_string(f, "value_type", vt) || vt != impl::value_type_name<T>())
      return fail(impl::cat("its values are ", vt, ", the parameters ", impl::value_type_name<T>()));
    // Another model: the file's parameter counts against this job's.
    std::uint64_t counts[2] = {0, 0};  // data-parallel, local
    for (int half = 0; half < 2; ++half) {
      H5G_info_t info;
      impl::H5Handle g(H5Gopen2(f, half ? "/local" : "/data_parallel", H5P_DEFAULT), H5Gclose);
      if (!g.ok() || H5Gget_info(g.get(), &info) < 0) return fail("the file lacks /data_parallel or /local");
      counts[half] = info.nlinks;
    }
    if (counts[0] != plan.dp_.size() || counts[1] != plan.catalog_local_.size())
      return fail(impl::cat("the file holds ", counts[0], " data-parallel and ", counts[1],
                            " local parameters, this model ", plan.dp_.size(), " and ", plan.catalog_local_.size(),
                            " (another model?)"));
    for (std::size_t k = 0; k < plan.tensors_.size(); ++k) {
      const impl::CkptTensor& t = plan.tensors_[k];
      const std::string who = impl::cat("parameter '", t.name, "' (group ", t.group, ", ",
                                        t.local ? "local" : "data-parallel", ", ", t.size, " values)");
      if (H5Lexists(f, t.local ? "/local" : "/data_parallel", H5P_DEFAULT) <= 0 ||
          H5Lexists(f, t.path().c_str(), H5P_DEFAULT) <= 0) {
        const std::string other = (t.local ? "/data_parallel/" : "/local/") + impl::h5_escape(t.name);
        return fail(impl::cat(who, " is not in the checkpoint",
                              H5Lexists(f, other.c_str(), H5P_DEFAULT) > 0
                                  ? impl::cat(" as ", t.local ? "local" : "data-parallel", " (it holds it as ",
                                              t.local ? "data-parallel" : "local", ")")
                                  : std::string()));
      }
      impl::H5Handle g(H5Gopen2(f, t.path().c_str(), H5P_DEFAULT), H5Gclose);
      std::string group;
      if (!g.ok() || !impl::h5_read_attr_string(g.get(), "group", group))
        return fail(impl::cat(who, ": damaged entry"));
      if (group != t.group) return fail(impl::cat(who, " is in group ", group, " in the checkpoint"));
      const std::vector<std::string> names = impl::dataset_names(t);
      H5G_info_t info;
      if (H5Gget_info(g.get(), &info) < 0 || info.nlinks != names.size())
        return fail(impl::cat(who, ": the checkpoint holds ", info.nlinks, " datasets for it, this optimizer ",
                              names.size(), " (parameter, state buffers, counters): another optimizer?"));
      values[k].resize(std::size_t(t.size) * std::size_t(1 + t.nstate));
      counters[k].resize(std::size_t(t.ncounters));
      for (std::size_t d = 0; d < names.size(); ++d) {
        const bool is_counters = names[d] == "counters";
        const std::uint64_t want = is_counters ? t.ncounters : t.size;
        const std::string dpath = t.path() + "/" + names[d];
        if (H5Lexists(g.get(), names[d].c_str(), H5P_DEFAULT) <= 0)
          return fail(impl::cat(who, ": the checkpoint lacks ", dpath, " (another optimizer?)"));
        impl::H5Handle ds(H5Dopen2(g.get(), names[d].c_str(), H5P_DEFAULT), H5Dclose);
        impl::H5Handle space(ds.ok() ? H5Dget_space(ds.get()) : H5I_INVALID_HID, H5Sclose);
        impl::H5Handle type(ds.ok() ? H5Dget_type(ds.get()) : H5I_INVALID_HID, H5Tclose);
        hsize_t n = 0;
        if (!space.ok() || !type.ok() || H5Sget_simple_extent_ndims(space.get()) != 1 ||
            H5Sget_simple_extent_dims(space.get(), &n, nullptr) < 0)
          return fail(impl::cat(who, ": ", dpath, " is damaged"));
        if (n != want)
          return fail(impl::cat(who, ": ", dpath, " has ", n, " values in the checkpoint, ", want, " here"));
        const hid_t mem = is_counters ? impl::h5_native<std::int64_t>() : impl::h5_native<T>();
        if (H5Tget_class(type.get()) != H5Tget_class(mem) || H5Tget_size(type.get()) != H5Tget_size(mem))
          return fail(impl::cat(who, ": ", dpath, " holds another value type"));
        void* dst = is_counters ? static_cast<void*>(counters[k].data())
                                : static_cast<void*>(values[k].data() + d * std::size_t(t.size));
        const std::size_t bytes = std::size_t(n) * (is_counters ? sizeof(std::int64_t) : sizeof(T));
        std::uint64_t sum = 0;
        if (n && H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
          return fail(impl::cat(who, ": reading ", dpath, " failed (truncated file?)"));
        if (!impl::h5_read_attr<std::uint64_t>(ds.get(), "checksum", sum))
          return fail(impl::cat(who, ": ", dpath, " has no checksum"));
        if (sum != impl::checksum_bytes(dst, bytes))
          return fail(impl::cat(who, ": ", dpath, " fails its checksum (the file is corrupted)"));
      }
    }
  }();
  if (std::string e = impl::agree_on_failure(comm, err); !e.empty()) throw CheckpointError(e);
  // Every rank verified everything: now the parameters and their state change.
  for (std::size_t k = 0; k < plan.tensors_.size(); ++k) {
    const impl::CkptTensor& t = plan.tensors_[k];
    const auto& b = plan.buffers_[k];
    const std::size_t n = std::size_t(t.size);
    const auto part = [&](std::size_t d) {
      return std::vector<T>(values[k].begin() + std::ptrdiff_t(d * n), values[k].begin() + std::ptrdiff_t((d + 1) * n));
    };
    impl::copy_from_host<T, Space>(b.param, part(0));
    for (int s = 0; s < t.nstate; ++s)
      impl::copy_from_host<T, Space>(b.state[std::size_t(s)], part(std::size_t(1 + s)));
    for (std::size_t c = 0; c < b.counters.size(); ++c) *b.counters[c] = counters[k][c];
  }
  Kokkos::fence();
}

}  // namespace gradsync
