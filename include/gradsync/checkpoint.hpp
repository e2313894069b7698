// gradsync: checkpoint and restart of a hybrid model in one parallel HDF5 file.
//
// Optional: include it (gradsync.hpp includes it only where GradSync::hdf5 is linked) and link
// GradSync::hdf5, which brings a parallel HDF5 (Debian: libhdf5-openmpi-dev):
//   find_package(GradSync CONFIG REQUIRED COMPONENTS hdf5)
//   target_link_libraries(app PRIVATE GradSync::hdf5)
//
//   gradsync::save_checkpoint(dopt, "run.h5");         // collective: parameters and optimizer state
//   ...                                                // a new job, the same model registered again
//   gradsync::load_checkpoint(dopt, "run.h5");         // on as many ranks or another count
//   gradsync::save_checkpoint(sync, "run.h5", state);  // a program that updates parameters itself
//
// The file holds the data-parallel parameters and their optimizer state once (rank 0's copy), every
// local parameter under its registered name (a process set's replicas once), each row-sharded table
// whole, at its rows, the program's own state (CheckpointState), gradsync's version, the rank count
// and a format version; docs/CHECKPOINT.md shows the layout. It is written under `path + ".partial"`
// and renamed to `path` after its completion record: a job killed while writing leaves no file that
// loads. Each dataset carries a checksum (FNV-1a over its 64-bit words in 4 lanes; a sharded
// table's: the sum of its rows'), verified on load.
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

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "distributed_optimizer.hpp"
#include "error.hpp"
#include "gradient_sync.hpp"
#include "impl/checkpoint_catalog.hpp"
#include "impl/checkpoint_hdf5.hpp"
#include "impl/demangle.hpp"
#include "impl/stall.hpp"
#include "impl/sync_access.hpp"

namespace gradsync {

/// The layout version save_checkpoint() writes. load_checkpoint() reads it and every older one
/// down to checkpoint_oldest_format_version (1: no row-sharded tables, no process-set replicas).
inline constexpr int checkpoint_format_version = 2;
/// The oldest layout load_checkpoint() reads.
inline constexpr int checkpoint_oldest_format_version = 1;

/// A checkpoint that cannot be written or loaded: every rank of the sync throws it, with the same
/// message (the lowest failing rank's, naming the tensor, its group and that rank).
class CheckpointError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

/// Where a row shard of a table sits in the whole table: the checkpoint keys the table by name and
/// places each shard at its rows, so that shards saved by 4 ranks load into 2 or 3.
struct RowShard {
  std::uint64_t first_row = 0;    ///< the shard's first row in the whole table
  std::uint64_t global_rows = 0;  ///< the whole table's rows
  std::uint64_t row_length = 0;   ///< values per row; 0: the View's values per first index
};

namespace impl {
struct CheckpointStateAccess;
}

/// What a checkpoint holds besides (or instead of) a DistributedOptimizer's parameters: the
/// parameters of a program that updates them itself (a bare GradientSync), its own state (step
/// counters, a data cursor), and the row shards among the parameters. It keeps copies of the Views
/// (their memory stays alive) and the addresses of scalars (which must outlive the save or load).
/// Every rank builds its own; the same calls in the same order on every rank for the data-parallel
/// and replicated entries.
class CheckpointState {
 public:
  /// A parameter whose gradient the sync holds under `name`: data-parallel, local or replicated over
  /// a process set (ReduceOver), as that gradient's group says; the sizes must match.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& parameter(const View& v, std::string name) {
    params_.push_back(Param{false, RowShard{}, view_data("param", v, name)});
    return *this;
  }
  /// The same for a row shard of a table (its gradient is local or a process set's): its rows are
  /// [shard.first_row, shard.first_row + rows) of a table of shard.global_rows rows.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& parameter(const View& v, std::string name, RowShard shard) {
    if (shard.row_length == 0) shard.row_length = row_length_of(v);
    params_.push_back(Param{true, shard, view_data("param", v, name)});
    return *this;
  }
  /// Program state alike on every rank (a step counter, a learning-rate schedule's position):
  /// written once, read by every rank. The same entries on every rank.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& replicated(const View& v, std::string name) {
    return user(impl::CkptKind::data_parallel, view_data("value", v, name));
  }
  /// A scalar alike on every rank (double, float or std::int64_t), read back into it.
  template <class T, class = std::enable_if_t<impl::is_ckpt_value_v<T>>>
  CheckpointState& replicated(T& x, std::string name) {
    return user(impl::CkptKind::data_parallel, scalar_data(x, std::move(name)));
  }
  /// Program state of this rank alone, under a name unique across ranks; at load it goes to
  /// whichever rank declares that name.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& local(const View& v, std::string name) {
    return user(impl::CkptKind::local, view_data("value", v, name));
  }
  /// A scalar of this rank alone.
  template <class T, class = std::enable_if_t<impl::is_ckpt_value_v<T>>>
  CheckpointState& local(T& x, std::string name) {
    return user(impl::CkptKind::local, scalar_data(x, std::move(name)));
  }
  /// For a DistributedOptimizer: its parameter `name` (local or a process set's) is a row shard of
  /// a table; its optimizer state is sharded alike (the step counters are the table's).
  CheckpointState& shard(std::string name, RowShard shard) {
    shards_[std::move(name)] = shard;
    return *this;
  }

 private:
  friend struct impl::CheckpointStateAccess;
  struct Param {
    bool sharded = false;
    RowShard shard;
    impl::CkptData data;  // its name is the parameter's until the item is built
  };

  template <class View>
  static std::uint64_t row_length_of(const View& v) {
    return v.extent(0) == 0 ? 1 : std::uint64_t(v.size() / v.extent(0));
  }
  template <class View>
  static impl::CkptData view_data(const char* dataset, const View& v, const std::string& name) {
    using T = typename View::non_const_value_type;
    static_assert(impl::is_ckpt_value_v<T>, "gradsync::CheckpointState: Views of double, float or std::int64_t");
    if (!v.span_is_contiguous())
      throw ConfigError(impl::cat("CheckpointState: '", name,
                                  "' is a View that is not contiguous (a strided subview?): ",
                                  "checkpoints copy contiguous memory; register a contiguous View"));
    impl::CkptData d = impl::ckpt_data<T, typename View::memory_space>(dataset, v.data(), v.size(), false,
                                                                       std::make_shared<const View>(v));
    d.name = name;  // the entry's name until the item is built; then the dataset's
    return d;
  }
  template <class T>
  static impl::CkptData scalar_data(T& x, std::string name) {
    impl::CkptData d = impl::ckpt_data<T, Kokkos::HostSpace>("value", &x, 1);
    d.name = std::move(name);
    return d;
  }
  CheckpointState& user(impl::CkptKind kind, impl::CkptData d) {
    impl::CkptItem it;
    it.name = std::move(d.name);
    it.group = "user";
    it.kind = kind;
    d.name = "value";
    it.data.push_back(std::move(d));
    user_.push_back(std::move(it));
    return *this;
  }

  std::vector<Param> params_;
  std::vector<impl::CkptItem> user_;
  std::map<std::string, RowShard> shards_;
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
struct CheckpointStateAccess {
  static const auto& params(const CheckpointState& s) { return s.params_; }
  static const auto& user(const CheckpointState& s) { return s.user_; }
  static const auto& shards(const CheckpointState& s) { return s.shards_; }
};

// One rank's checkpoint: its items, and a refusal found before any collective.
struct CkptJob {
  int rank = 0, size = 1;
  std::string what, refusal;
  std::string id;  // this save's, alike on every rank: the partial file's suffix, the file's save_id
  std::vector<CkptItem> items;
  std::string optimizer = "none";
  // The sync's error-feedback residuals (per rank; /residuals), when it has any.
  bool has_residuals = false;
  CkptData residuals;
  std::uint64_t residual_layout = 0;
  std::int64_t* residual_samples = nullptr;
  void refuse(const std::string& why) {
    if (refusal.empty()) refusal = cat(what, ": ", why, " (rank ", rank, ")");
  }
};

// A name no other save shares, of this job or of another one writing the same path at the same time
// (a requeued job while the old one still runs): random bits, the process, the time, a count.
inline std::string ckpt_unique_id() {
  static std::atomic<std::uint64_t> count{0};
  std::uint64_t v[5] = {0, 0, std::uint64_t(::getpid()),
                        std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count()), count++};
  try {
    std::random_device rd;
    v[0] = rd();
    v[1] = rd();
  } catch (...) {  // no entropy source: the process, the time and the count remain
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(v, sizeof v)));
  return buf;
}

// A sync's registrations by name: group, kind, dense values.
struct CkptRegistration {
  std::string group;
  RegistrationKind kind = RegistrationKind::data_parallel;
  std::size_t size = 0;
  int count = 0;
};

// The job of a save or load, once the ranks agreed on the file: rank 0's path (and this save's id)
// reaches every rank, which compares it with its own, before any file is touched; a call in the
// middle of an aggregation cycle is refused here too. Collective, under the watchdog (`comm`).
template <class S, class Comm>
CkptJob checkpoint_job(S& sync, const Comm& comm, const char* call, const std::string& path) {
  CkptJob job;
  job.rank = comm.rank();
  job.size = comm.size();
  job.what = cat(call, "(\"", path, "\")");
  FieldWriter mine;
  if (job.rank == 0) mine << path << ckpt_unique_id();
  const std::string first = comm.broadcast(mine.str(), 0);
  FieldReader f(first);
  const std::string path0 = f.text();
  job.id = f.text();
  if (path0 != path)
    job.refusal = cat(call, "(): the ranks name different files: \"", path0, "\" on rank 0, \"", path, "\" on rank ",
                      job.rank, "; every rank must pass the same path");
  if (const int pass = SyncAccess::passes_into_cycle(sync); pass > 0)
    job.refuse(cat("called in the middle of an aggregation cycle (", pass, " of ",
                   sync.options().backward_passes_per_step,
                   " backward passes accumulated): the accumulated gradients are not in checkpoints; call it after the "
                   "cycle's last synchronize()"));
  if (std::string e = comm.agree(job.refusal); !e.empty()) throw CheckpointError(e);
  // Error feedback: the residuals, in the plan's layout (built now if due, collectively).
  using T = typename S::value_type;
  const auto r = SyncAccess::residual_state(sync);
  job.residual_layout = r.layout;
  job.residual_samples = r.samples;
  if (r.data) {
    job.has_residuals = true;
    job.residuals = ckpt_data<T, typename S::memory_space>("values", r.data, r.size);
  }
  return job;
}

template <class S>
std::map<std::string, CkptRegistration> registrations_by_name(const S& sync) {
  std::map<std::string, CkptRegistration> out;
  SyncAccess::for_each_registration(
      sync, [&](const std::string& name, const std::string& group, RegistrationKind kind, std::size_t size) {
        CkptRegistration& r = out[name];
        r.group = group;
        r.kind = kind;
        r.size = size;
        ++r.count;
      });
  return out;
}

// A parameter's item from its registration: its kind (and row shard) from the sync.
inline CkptItem parameter_item(CkptJob& job, const std::map<std::string, CkptRegistration>& regs,
                               const std::string& name, std::size_t size, const RowShard* shard) {
  CkptItem it;
  it.name = name;
  const auto r = regs.find(name);
  if (r == regs.end()) {
    job.refuse(cat("parameter '", name, "': the sync holds no gradient of that name; register its gradient under ",
                   "this name, or give program state with CheckpointState::replicated() or local()"));
    return it;
  }
  it.group = r->second.group;
  if (r->second.count > 1)
    job.refuse(cat("parameter '", name, "' (group ", it.group, "): ", r->second.count,
                   " gradients are registered under that name; a checkpoint keys parameters by name"));
  if (r->second.size != size)
    job.refuse(
        cat("parameter '", name, "' (group ", it.group, ") has ", size, " values, its gradient ", r->second.size));
  const RegistrationKind kind = r->second.kind;
  it.kind = kind == RegistrationKind::data_parallel ? CkptKind::data_parallel : CkptKind::local;
  it.shared = kind == RegistrationKind::process_set;
  if (shard) {
    if (it.kind == CkptKind::data_parallel)
      job.refuse(cat("parameter '", name, "' (group ", it.group,
                     ") is data-parallel: whole on every rank, never a row shard"));
    else if (shard->row_length == 0 || size % shard->row_length != 0 ||
             shard->first_row + size / shard->row_length > shard->global_rows)
      job.refuse(cat("parameter '", name, "' (group ", it.group, "): ", size, " values are no rows of ",
                     shard->row_length, " values at row ", shard->first_row, " of a table of ", shard->global_rows,
                     " rows"));
    else {
      it.kind = CkptKind::sharded;
      it.first_row = shard->first_row;
      it.rows = size / shard->row_length;
      it.global_rows = shard->global_rows;
      it.row_length = shard->row_length;
    }
  }
  return it;
}

// The checkpoint's part of a CheckpointState: its parameters (through the sync's registrations)
// and the program's own entries.
inline void add_state_items(CkptJob& job, const CheckpointState& state,
                            const std::map<std::string, CkptRegistration>& regs) {
  for (const auto& p : CheckpointStateAccess::params(state)) {
    CkptItem it = parameter_item(job, regs, p.data.name, std::size_t(p.data.count), p.sharded ? &p.shard : nullptr);
    CkptData d = p.data;
    d.name = "param";
    d.rowwise = it.kind == CkptKind::sharded;
    it.data.push_back(std::move(d));
    job.items.push_back(std::move(it));
  }
  for (const CkptItem& it : CheckpointStateAccess::user(state)) {
    if (regs.count(it.name))
      job.refuse(cat("program state '", it.name, "' has the name of a registered gradient; give it another name"));
    job.items.push_back(it);
  }
}

// A DistributedOptimizer's parameters with their optimizer state (Adam's moments, the counters).
template <class D>
void add_optimizer_items(CkptJob& job, D& dopt, const CheckpointState& state,
                         const std::map<std::string, CkptRegistration>& regs) {
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  using Opt = typename D::optimizer_type;
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>,
                "gradsync checkpoints: parameters are float or double");
  const auto& shards = CheckpointStateAccess::shards(state);
  for (const auto& [name, shard] : shards) {
    bool found = false;
    for (auto& e : CheckpointAccess::entries(dopt)) found = found || e.name == name;
    if (!found) job.refuse(cat("CheckpointState::shard(\"", name, "\"): the optimizer has no parameter of that name"));
  }
  for (auto& e : CheckpointAccess::entries(dopt)) {
    const auto s = shards.find(e.name);
    CkptItem it = parameter_item(job, regs, e.name, e.size, s == shards.end() ? nullptr : &s->second);
    const bool rowwise = it.kind == CkptKind::sharded;
    it.data.push_back(ckpt_data<T, Space>("param", e.param, e.size, rowwise));
    std::vector<std::int64_t*> counters;
    if constexpr (has_state_visitor<Opt>::value)
      CheckpointAccess::optimizer(dopt).for_each_state(e.slot, [&](auto* data, std::size_t n) {
        using X = std::remove_pointer_t<decltype(data)>;
        if constexpr (std::is_same_v<X, T>) {
          it.data.push_back(ckpt_data<T, Space>(cat("state", it.data.size() - 1), data, n, rowwise));
        } else {
          static_assert(std::is_same_v<X, std::int64_t>,
                        "optimizer for_each_state: state is value_type buffers or std::int64_t counters");
          for (std::size_t i = 0; i < n; ++i) counters.push_back(data + i);
        }
      });
    if (!counters.empty()) {  // host counters, possibly several runs: one dataset
      CkptData d;
      d.name = "counters";
      d.type = CkptType::i64;
      d.count = counters.size();
      d.get = [counters](void* out) {
        for (std::size_t i = 0; i < counters.size(); ++i) static_cast<std::int64_t*>(out)[i] = *counters[i];
      };
      d.put = [counters](const void* in) {
        for (std::size_t i = 0; i < counters.size(); ++i) *counters[i] = static_cast<const std::int64_t*>(in)[i];
      };
      it.data.push_back(std::move(d));
    }
    job.items.push_back(std::move(it));
  }
}

// The owner's items: a DistributedOptimizer's parameters with their optimizer state, or a bare
// sync's named in `state`, and the program's entries.
template <class Optimizer, class Sync>
void add_items_of(CkptJob& job, DistributedOptimizer<Optimizer, Sync>& dopt, const CheckpointState& state) {
  const auto regs = registrations_by_name(dopt.sync());
  add_optimizer_items(job, dopt, state, regs);
  add_state_items(job, state, regs);
  job.optimizer = type_name<Optimizer>();
}
template <class Backend, class Tensor>
void add_items_of(CkptJob& job, GradientSync<Backend, Tensor>& sync, const CheckpointState& state) {
  add_state_items(job, state, registrations_by_name(sync));
}

// A row-sharded dataset's checksum: the sum over its rows of each row's checksum, seeded by the
// FNV-1a of the row's number, so that any split into shards sums to the same value.
inline std::uint64_t rows_checksum(const void* p, std::uint64_t first_row, std::uint64_t rows, std::size_t row_bytes) {
  std::uint64_t sum = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t at = first_row + r;
    sum += checksum_words(static_cast<const char*>(p) + r * row_bytes, row_bytes, fnv1a(&at, sizeof at));
  }
  return sum;
}

inline hid_t h5_type(CkptType t) {
  return t == CkptType::f64 ? H5T_NATIVE_DOUBLE : t == CkptType::f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64;
}

// A dataset's values on the host: the memory itself when the host can read it, else a copy.
struct HostValues {
  std::vector<char> copy;
  const void* p = nullptr;
  explicit HostValues(const CkptData& d) {
    if (d.host) {
      p = d.host;
    } else {
      copy.resize(std::size_t(d.count) * ckpt_type_size(d.type));
      d.get(copy.data());
      p = copy.data();
    }
  }
};

// Room for a file's metadata, held by rank 0 in a file of its own from before the checkpoint's
// file exists until the metadata is written: a full file system refuses it before anything is
// created, and the metadata's flush finds the room it frees.
class CkptSpace {
 public:
  // False only when the file system has no room (a file that cannot be opened: the checkpoint's
  // own creation says why).
  bool reserve(const std::string& name, std::uint64_t bytes) {
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return true;
    name_ = name;
    const int rc = ::posix_fallocate(fd, 0, off_t(bytes));
    ::close(fd);
    if (rc == ENOSPC || rc == EFBIG || rc == EDQUOT) {
      release();
      return false;
    }
    return true;
  }
  void release() {
    if (!name_.empty()) std::remove(name_.c_str());
    name_.clear();
  }
  ~CkptSpace() { release(); }

 private:
  std::string name_;
};

// The save, in the order that keeps HDF5 able to close the file whatever fails. HDF5 1.10 frees a
// file whose H5Fclose failed but keeps its identifier, and its shutdown in MPI_Finalize then
// crashes on it; a close fails when it must write what an earlier write could not. So the
// checksums are summed first; the file is created with all of its metadata (the checksums, and
// `complete` = 0) and flushed into room held for it (CkptSpace), its datasets' space the file's
// before any value is written; a value's failed write leaves nothing for the close to write;
// last, `complete` is set to 1 in place.
template <class Comm>
void save_job(CkptJob& job, const Comm& comm, const std::string& path) {
  const CkptCatalog catalog(comm, job.what, job.items);
  if (std::string e = comm.agree(job.refusal.empty() ? catalog.refusal_ : job.refusal); !e.empty())
    throw CheckpointError(e);
  const int me = job.rank, nranks = job.size;
  std::map<std::string, const CkptItem*> mine;
  for (const CkptItem& it : job.items) mine[it.name] = &it;
  // Each save has a partial file of its own: two jobs saving to one path at once (a requeued job and
  // the old one) never write into one file, and each rename publishes one whole save.
  const std::string tmp = cat(path, ".partial-", job.id);
  H5Quiet quiet;
  std::string err;  // this rank's first failure; the collective calls go on, every rank alike
  const auto fail = [&](const std::string& why) {
    if (err.empty()) err = cat(job.what, ": ", why, " on rank ", me);
  };

  // The file's datasets in the order they are created (the catalog's: the data-parallel items in
  // registration order, then by name), each with this rank's item when it writes it (or some of
  // its rows), and their checksums: of what a rank writes, zero elsewhere, summed over the ranks.
  struct Writer {
    const CkptItem* item = nullptr;
    std::size_t d = 0;  // which of the item's datasets
  };
  std::vector<Writer> writers;
  for (const CkptItem& it : job.items)
    if (it.kind == CkptKind::data_parallel)
      for (std::size_t d = 0; d < it.data.size(); ++d) writers.push_back({me == 0 ? &it : nullptr, d});
  for (const CkptEntry& e : catalog.local_)
    for (std::size_t d = 0; d < e.data.size(); ++d)
      writers.push_back({e.pieces[0].writer == me ? mine.at(e.name) : nullptr, d});
  for (const CkptEntry& e : catalog.sharded_) {
    const auto m = mine.find(e.name);
    const CkptItem* held = m != mine.end() && e.writer_of(m->second->first_row) == me ? m->second : nullptr;
    for (std::size_t d = 0; d < e.data.size(); ++d) writers.push_back({held, d});
  }
  const std::size_t residual_slot = writers.size();  // /residuals/values: one row per rank
  std::vector<std::uint64_t> sums(writers.size() + (job.has_residuals ? 1 : 0), 0);
  const auto writes = [](const Writer& w) {  // a table's counters: the first rows' writer's
    return w.item && !(w.item->kind == CkptKind::sharded && !w.item->data[w.d].rowwise && w.item->first_row != 0);
  };
  for (std::size_t s = 0; s < writers.size(); ++s) {
    if (!writes(writers[s])) continue;
    const CkptItem& it = *writers[s].item;
    const CkptData& d = it.data[writers[s].d];
    const std::size_t esize = ckpt_type_size(d.type);
    const HostValues v(d);
    sums[s] = d.rowwise ? rows_checksum(v.p, it.first_row, it.rows, std::size_t(it.row_length) * esize)
                        : checksum_words(v.p, std::size_t(d.count) * esize);
  }
  if (job.has_residuals) {
    const HostValues v(job.residuals);
    sums[residual_slot] =
        rows_checksum(v.p, std::uint64_t(me), 1, std::size_t(job.residuals.count) * ckpt_type_size(job.residuals.type));
  }
  // The metadata's room (object headers, B-trees, heaps), generous: 64 KiB and 8 KiB per dataset.
  CkptSpace room;
  const std::uint64_t metadata_bytes = (std::uint64_t(16) + 2 * writers.size() + job.items.size()) << 12;
  sums.push_back(me == 0 && !room.reserve(cat(tmp, ".space"), metadata_bytes) ? 1 : 0);  // rank 0's answer
  comm.sum(sums);
  if (sums.back() != 0)
    throw CheckpointError(cat(job.what, ": no room for '", tmp, "' (a full file system?) on rank 0"));

  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm.mpi(), MPI_INFO_NULL);
  H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.ok()) fail(cat("cannot create '", tmp, "' (a missing directory, no write permission?)"));
  if (std::string e = comm.agree(err); !e.empty()) {
    file.reset();
    if (me == 0) std::remove(tmp.c_str());
    throw CheckpointError(e);
  }

  // Metadata, collective: every rank creates every group, dataset and attribute alike, in the
  // catalog's order.
  const hid_t f = file.get();
  bool ok =
      h5_write_attr_string(f, "format", "gradsync-checkpoint") &&
      h5_write_attr<int>(f, "format_version", checkpoint_format_version) &&
      h5_write_attr_string(f, "gradsync_version",
                           cat(GRADSYNC_VERSION_MAJOR, ".", GRADSYNC_VERSION_MINOR, ".", GRADSYNC_VERSION_PATCH)) &&
      h5_write_attr<int>(f, "ranks", nranks) && h5_write_attr_string(f, "optimizer", job.optimizer) &&
      h5_write_attr_string(f, "save_id", job.id) && h5_write_attr<int>(f, "complete", 0);
  struct Slot {  // one dataset of the file
    H5Handle ds;
    Writer w;
  };
  std::vector<Slot> slots;
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every value is written: no fill pass
  for (CkptKind k : {CkptKind::data_parallel, CkptKind::local, CkptKind::sharded}) {
    H5Handle g(H5Gcreate2(f, ckpt_top(k), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ok = ok && g.ok();
  }
  const auto dataset = [&](hid_t g, const char* name, CkptType type, hsize_t n) {
    H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    const std::size_t s = slots.size();
    slots.push_back(
        Slot{H5Handle(H5Dcreate2(g, name, h5_type(type), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose),
             s < writers.size() ? writers[s] : Writer{}});
    ok = ok && slots.back().ds.ok() && h5_write_attr<std::uint64_t>(slots.back().ds.get(), "checksum", sums[s]);
  };
  const auto create = [&](const std::string& gpath, const std::vector<CkptDataShape>& shapes, auto&& attrs) {
    H5Handle g(H5Gcreate2(f, gpath.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ok = ok && g.ok() && attrs(g.get());
    for (const CkptDataShape& d : shapes) dataset(g.get(), d.name.c_str(), d.type, d.count);
  };
  const auto named = [](hid_t g, const std::string& name, const std::string& group) {
    return h5_write_attr_string(g, "name", name) && h5_write_attr_string(g, "group", group);
  };
  const auto path_of = [](CkptKind kind, const std::string& name) {
    CkptItem probe;
    probe.kind = kind;
    probe.name = name;
    return probe.path();
  };
  for (const CkptItem& it : job.items)
    if (it.kind == CkptKind::data_parallel)
      create(it.path(), ckpt_shapes(it), [&](hid_t g) {
        return named(g, it.name, it.group) && h5_write_attr<std::uint64_t>(g, "size", it.data[0].count) &&
               h5_write_attr<int>(g, "rank", 0);
      });
  for (const CkptEntry& e : catalog.local_)
    create(path_of(CkptKind::local, e.name), e.data, [&](hid_t g) {
      return named(g, e.name, e.group) && h5_write_attr<std::uint64_t>(g, "size", e.data[0].count) &&
             h5_write_attr<int>(g, "rank", e.pieces[0].writer) && h5_write_attr<int>(g, "holders", e.holders);
    });
  for (const CkptEntry& e : catalog.sharded_)
    create(path_of(CkptKind::sharded, e.name), e.data, [&](hid_t g) {
      return named(g, e.name, e.group) && h5_write_attr<std::uint64_t>(g, "global_rows", e.global_rows) &&
             h5_write_attr<std::uint64_t>(g, "row_length", e.row_length) &&
             h5_write_attr<int>(g, "shards", int(e.pieces.size())) && h5_write_attr<int>(g, "holders", e.holders);
    });
  if (job.has_residuals) {
    H5Handle g(H5Gcreate2(f, "/residuals", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    ok = ok && g.ok() && h5_write_attr<int>(g.get(), "ranks", nranks) &&
         h5_write_attr<std::uint64_t>(g.get(), "size", job.residuals.count) &&
         h5_write_attr<std::uint64_t>(g.get(), "layout", job.residual_layout) &&
         h5_write_attr<std::int64_t>(g.get(), "samples", *job.residual_samples);
    dataset(g.get(), "values", job.residuals.type, hsize_t(nranks) * job.residuals.count);
  }
  if (!ok) fail("HDF5 refused to create the file's groups, datasets or attributes");
  // Collective too: the metadata on disk, in the room held for it (HDF5 cannot close a file whose
  // metadata flush failed), and the file at its full size before the values.
  room.release();
  if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) fail(cat("writing the metadata of '", tmp, "' failed (a full file system?)"));

  // Data, independent: each dataset (or row range) by its writer. Nothing here throws past this
  // point on one rank only: the ranks must reach the agreement below together, the file still open.
  try {
    for (std::size_t s = 0; s < writers.size() && err.empty(); ++s) {
      if (!writes(slots[s].w)) continue;
      const CkptItem* it = slots[s].w.item;
      const CkptData& d = it->data[slots[s].w.d];
      const HostValues v(d);
      herr_t rc = 0;
      if (d.rowwise) {
        const H5Slab slab(slots[s].ds.get(), it->first_row * it->row_length, d.count);
        if (d.count)
          rc = slab.ok()
                   ? H5Dwrite(slots[s].ds.get(), h5_type(d.type), slab.mem.get(), slab.file.get(), H5P_DEFAULT, v.p)
                   : -1;
      } else if (d.count) {
        rc = H5Dwrite(slots[s].ds.get(), h5_type(d.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.p);
      }
      if (rc < 0) fail(cat("writing ", it->who(), " failed (a full file system?)"));
    }
    if (job.has_residuals && err.empty()) {  // this rank's row
      const CkptData& d = job.residuals;
      const HostValues v(d);
      const H5Slab slab(slots[residual_slot].ds.get(), hsize_t(me) * d.count, d.count);
      if (d.count && (!slab.ok() || H5Dwrite(slots[residual_slot].ds.get(), h5_type(d.type), slab.mem.get(),
                                             slab.file.get(), H5P_DEFAULT, v.p) < 0))
        fail("writing the error-feedback residuals failed (a full file system?)");
    }
  } catch (const std::exception& e) {
    fail(cat("an exception while writing: ", e.what()));
  }
  slots.clear();
  err = comm.agree(err);
  // The completion record, last and only when every rank wrote everything: a file without it is
  // never loaded. Set in place: the attribute exists since the metadata.
  if (err.empty() && !h5_update_attr<int>(f, "complete", 1)) fail("writing the completion record failed");
  if (!file.reset()) fail(cat("closing '", tmp, "' failed (a full file system?)"));
  if (std::string e = comm.agree(err); !e.empty()) {
    if (me == 0) std::remove(tmp.c_str());
    throw CheckpointError(e);
  }
  if (me == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = cat(job.what, ": renaming '", tmp, "' to '", path, "' failed on rank 0");
    std::remove(tmp.c_str());
  }
  if (std::string e = comm.agree(err); !e.empty()) throw CheckpointError(e);
}

template <class Comm>
void load_job(CkptJob& job, const Comm& comm, const std::string& path) {
  const CkptCatalog catalog(comm, job.what, job.items);
  if (std::string e = comm.agree(job.refusal.empty() ? catalog.refusal_ : job.refusal); !e.empty())
    throw CheckpointError(e);
  const int me = job.rank;
  H5Quiet quiet;
  std::string err;
  const auto fail = [&](const std::string& why) {
    if (err.empty()) err = cat(job.what, ": ", why, " (found on rank ", me, ")");
  };
  // The row-sharded datasets' checksums are verified over the ranks: each distinct shard's rows by
  // its lowest holder, summed. Their place in that sum: entry by entry, their rowwise datasets.
  std::map<std::string, std::size_t> row_sum_base;
  std::size_t n_row_sums = 0;
  for (const CkptEntry& e : catalog.sharded_) {
    row_sum_base[e.name] = n_row_sums;
    for (const CkptDataShape& d : e.data) n_row_sums += d.rowwise ? 1 : 0;
  }
  std::vector<std::uint64_t> row_sums(n_row_sums, 0), row_expected(n_row_sums, 0);
  std::vector<char> verifies(n_row_sums, 0);

  // The residuals: restored when the file holds this job's (same ranks and layout), else zero.
  std::vector<char> residual_values;
  std::uint64_t residual_sum = 0, residual_expected = 0;
  std::int64_t residual_samples = 0;
  bool restore_residuals = false;
  std::string residual_note;
  // Staging: everything is read and verified before any value changes.
  std::vector<std::vector<std::vector<char>>> staged(job.items.size());
  // Each rank opens the file on its own (MPI_COMM_SELF): reads need no collective metadata calls.
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), MPI_COMM_SELF, MPI_INFO_NULL);
  H5Handle file;
  int version = 0;
  std::string identity;  // which file this rank opened: its save's id and its size
  [&] {
#if H5_VERSION_GE(1, 12, 0)
    const htri_t is_hdf5 = H5Fis_accessible(path.c_str(), fapl.get());
#else
    const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
    if (is_hdf5 <= 0) {
      std::FILE* probe = std::fopen(path.c_str(), "rb");
      if (!probe) return fail("no such file (or not readable)");
      std::fclose(probe);
      return fail("not an HDF5 file (foreign or truncated)");
    }
    file = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!file.ok()) return fail("HDF5 cannot open it (truncated or damaged)");
    const hid_t f = file.get();
    std::string format, save_id;
    int complete = 0;
    if (!h5_read_attr_string(f, "format", format) || format != "gradsync-checkpoint")
      return fail("an HDF5 file, but not a gradsync checkpoint (no format attribute 'gradsync-checkpoint')");
    if (!h5_read_attr<int>(f, "format_version", version) || version < checkpoint_oldest_format_version ||
        version > checkpoint_format_version)
      return fail(cat("checkpoint format version ", version, "; this gradsync reads versions ",
                      checkpoint_oldest_format_version, " to ", checkpoint_format_version));
    if (!h5_read_attr<int>(f, "complete", complete) || complete != 1)
      return fail("incomplete checkpoint: no completion record (the job writing it stopped early)");
    hsize_t bytes = 0;
    H5Fget_filesize(f, &bytes);
    identity = cat(h5_read_attr_string(f, "save_id", save_id) ? "save " + save_id : std::string("no save id"), ", ",
                   bytes, " bytes");
  }();
  // The ranks agree on the file before reading it: the same path (checkpoint_job) may still name
  // different files (a node-local copy), and each rank would then load its own, silently.
  const std::string identity0 = comm.broadcast(identity, 0);
  if (identity != identity0)
    fail(cat("rank ", me, " opened another file than rank 0 under this path (", identity, "; rank 0: ", identity0,
             "): every rank must load the same checkpoint"));
  if (std::string e = comm.agree(err); !e.empty()) throw CheckpointError(e);
  [&] {
    const hid_t f = file.get();
    // Another model: the file's entries against this job's (each of this job's is looked up below).
    const long long counts[3] = {h5_group_size(f, "/data_parallel"), h5_group_size(f, "/local"),
                                 std::max(0LL, h5_group_size(f, "/sharded"))};
    if (counts[0] < 0 || counts[1] < 0) return fail("the file lacks /data_parallel or /local");
    if (std::uint64_t(counts[0]) != catalog.dp_count_ || std::uint64_t(counts[1]) != catalog.local_.size() ||
        std::uint64_t(counts[2]) != catalog.sharded_.size())
      return fail(cat("the file holds ", counts[0], " data-parallel, ", counts[1], " local and ", counts[2],
                      " row-sharded parameters, this model ", catalog.dp_count_, ", ", catalog.local_.size(), " and ",
                      catalog.sharded_.size(), " (another model?)"));
    for (std::size_t k = 0; k < job.items.size(); ++k) {
      const CkptItem& it = job.items[k];
      const std::string who = it.who();
      if (H5Lexists(f, ckpt_top(it.kind), H5P_DEFAULT) <= 0 || H5Lexists(f, it.path().c_str(), H5P_DEFAULT) <= 0) {
        std::string other;
        for (CkptKind o : {CkptKind::data_parallel, CkptKind::local, CkptKind::sharded}) {
          const std::string p = std::string(ckpt_top(o)) + "/" + h5_escape(it.name);
          if (o != it.kind && H5Lexists(f, ckpt_top(o), H5P_DEFAULT) > 0 && H5Lexists(f, p.c_str(), H5P_DEFAULT) > 0)
            other = cat(" as ", ckpt_kind_name(it.kind), " (it holds it as ", ckpt_kind_name(o), ")");
        }
        return fail(cat(who, " is not in the checkpoint", other));
      }
      H5Handle g(H5Gopen2(f, it.path().c_str(), H5P_DEFAULT), H5Gclose);
      std::string group;
      if (!g.ok() || !h5_read_attr_string(g.get(), "group", group)) return fail(cat(who, ": damaged entry"));
      if (group != it.group) return fail(cat(who, " is in group ", group, " in the checkpoint"));
      if (it.kind == CkptKind::sharded) {
        std::uint64_t rows = 0, length = 0;
        if (!h5_read_attr<std::uint64_t>(g.get(), "global_rows", rows) ||
            !h5_read_attr<std::uint64_t>(g.get(), "row_length", length))
          return fail(cat(who, ": damaged entry"));
        if (rows != it.global_rows || length != it.row_length)
          return fail(cat(who, ": the checkpoint's table has ", rows, " rows of ", length, " values, this one ",
                          it.global_rows, " of ", it.row_length));
      }
      H5G_info_t info;
      if (H5Gget_info(g.get(), &info) < 0 || info.nlinks != it.data.size())
        return fail(cat(who, ": the checkpoint holds ", info.nlinks, " datasets for it, this optimizer ",
                        it.data.size(), " (parameter, state buffers, counters): another optimizer?"));
      std::size_t row_sum = row_sum_base.count(it.name) ? row_sum_base[it.name] : 0;
      const bool verifier = it.kind == CkptKind::sharded && catalog.find(it)->writer_of(it.first_row) == me;
      for (std::size_t d = 0; d < it.data.size(); ++d) {
        const CkptData& data = it.data[d];
        const std::string dpath = it.path() + "/" + data.name;
        if (H5Lexists(g.get(), data.name.c_str(), H5P_DEFAULT) <= 0)
          return fail(cat(who, ": the checkpoint lacks ", dpath, " (another optimizer?)"));
        H5Handle ds(H5Dopen2(g.get(), data.name.c_str(), H5P_DEFAULT), H5Dclose);
        H5Handle space(ds.ok() ? H5Dget_space(ds.get()) : H5I_INVALID_HID, H5Sclose);
        H5Handle type(ds.ok() ? H5Dget_type(ds.get()) : H5I_INVALID_HID, H5Tclose);
        hsize_t n = 0;
        if (!space.ok() || !type.ok() || H5Sget_simple_extent_ndims(space.get()) != 1 ||
            H5Sget_simple_extent_dims(space.get(), &n, nullptr) < 0)
          return fail(cat(who, ": ", dpath, " is damaged"));
        if (n != it.file_count(data))
          return fail(cat(who, ": ", dpath, " has ", n, " values in the checkpoint, ", it.file_count(data), " here"));
        const hid_t mem = h5_type(data.type);
        if (H5Tget_class(type.get()) != H5Tget_class(mem) || H5Tget_size(type.get()) != H5Tget_size(mem))
          return fail(cat(who, ": ", dpath, " holds another value type than ", ckpt_type_name(data.type)));
        const std::size_t esize = ckpt_type_size(data.type);
        std::vector<char>& buf = staged[k].emplace_back(std::size_t(data.count) * esize);
        std::uint64_t sum = 0;
        if (!h5_read_attr<std::uint64_t>(ds.get(), "checksum", sum))
          return fail(cat(who, ": ", dpath, " has no checksum"));
        if (data.rowwise) {
          const H5Slab slab(ds.get(), it.first_row * it.row_length, data.count);
          if (data.count &&
              (!slab.ok() || H5Dread(ds.get(), mem, slab.mem.get(), slab.file.get(), H5P_DEFAULT, buf.data()) < 0))
            return fail(cat(who, ": reading ", dpath, " failed (truncated file?)"));
          if (verifier) {
            row_sums[row_sum] = rows_checksum(buf.data(), it.first_row, it.rows, std::size_t(it.row_length) * esize);
            row_expected[row_sum] = sum;
            verifies[row_sum] = 1;
          }
          ++row_sum;
        } else {
          if (data.count && H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
            return fail(cat(who, ": reading ", dpath, " failed (truncated file?)"));
          if (sum != checksum_bytes(version, buf.data(), buf.size()))
            return fail(cat(who, ": ", dpath, " fails its checksum (the file is corrupted)"));
        }
      }
    }
    if (!job.has_residuals) return;
    if (H5Lexists(f, "/residuals", H5P_DEFAULT) <= 0) {
      residual_note = "the checkpoint holds none";
      return;
    }
    H5Handle g(H5Gopen2(f, "/residuals", H5P_DEFAULT), H5Gclose);
    int ranks = 0;
    std::uint64_t size = 0, layout = 0;
    if (!g.ok() || !h5_read_attr<int>(g.get(), "ranks", ranks) || !h5_read_attr<std::uint64_t>(g.get(), "size", size) ||
        !h5_read_attr<std::uint64_t>(g.get(), "layout", layout) ||
        !h5_read_attr<std::int64_t>(g.get(), "samples", residual_samples))
      return fail("/residuals is damaged");
    const int nranks = job.size;
    if (ranks != nranks || size != job.residuals.count || layout != job.residual_layout) {
      residual_note = ranks != nranks ? cat("saved on ", ranks, " ranks, loaded on ", nranks)
                                      : std::string("the fused layout differs (other tensors, chunks or formats)");
      return;
    }
    H5Handle ds(H5Dopen2(g.get(), "values", H5P_DEFAULT), H5Dclose);
    const std::size_t bytes = std::size_t(size) * ckpt_type_size(job.residuals.type);
    residual_values.resize(bytes);
    const H5Slab slab(ds.get(), hsize_t(me) * size, size);
    if (!ds.ok() || !h5_read_attr<std::uint64_t>(ds.get(), "checksum", residual_expected) ||
        (size && (!slab.ok() || H5Dread(ds.get(), h5_type(job.residuals.type), slab.mem.get(), slab.file.get(),
                                        H5P_DEFAULT, residual_values.data()) < 0)))
      return fail("reading /residuals/values failed (truncated file?)");
    residual_sum = rows_checksum(residual_values.data(), std::uint64_t(me), 1, bytes);
    restore_residuals = true;
  }();
  file.reset();
  // Every rank takes part, whatever it found: the row shards' sums cover each table once, and only
  // when no rank stopped early (its rows would be missing from them: the table is not what failed).
  std::vector<std::uint64_t> totals = row_sums;
  totals.push_back(residual_sum);         // every rank its row: the sum covers the dataset
  totals.push_back(err.empty() ? 0 : 1);  // the ranks that failed
  comm.sum(totals);
  const bool complete_sums = totals.back() == 0;
  if (complete_sums && restore_residuals && totals[totals.size() - 2] != residual_expected)
    fail("/residuals/values fails its checksum (the file is corrupted)");
  if (complete_sums)
    for (const CkptEntry& e : catalog.sharded_) {
      std::size_t at = row_sum_base[e.name];
      for (const CkptDataShape& d : e.data)
        if (d.rowwise) {
          if (verifies[at] && totals[at] != row_expected[at])
            fail(cat("parameter '", e.name, "' (group ", e.group, ", row-sharded): /sharded/", h5_escape(e.name), "/",
                     d.name, " fails its checksum (the file is corrupted)"));
          ++at;
        }
    }
  if (std::string e = comm.agree(err); !e.empty()) throw CheckpointError(e);
  // Every rank verified everything: now the values change.
  for (std::size_t k = 0; k < job.items.size(); ++k)
    for (std::size_t d = 0; d < job.items[k].data.size(); ++d) job.items[k].data[d].put(staged[k][d].data());
  if (job.has_residuals) {
    if (!restore_residuals) {  // zero: the file's do not fit this job (one step's rounding error lost)
      residual_values.assign(std::size_t(job.residuals.count) * ckpt_type_size(job.residuals.type), 0);
      residual_samples = 0;
      if (me == 0)
        std::fprintf(stderr, "gradsync: %s: the error-feedback residuals start at zero: %s\n", job.what.c_str(),
                     residual_note.c_str());
    }
    job.residuals.put(residual_values.data());
    *job.residual_samples = residual_samples;
  }
  Kokkos::fence();
}

// A save or load, under the sync's stall watchdog: every collective of it (the agreement on the
// file, the catalog, the checksums, each agreement on a failure) is nonblocking and waited like the
// step's, so a rank that skips the call is named by the others at the deadline (StallError)
// instead of hanging them, and a peer's failure stops every rank at once; either fails the sync,
// as in any helper's collective (build a new one). A refusal the ranks agreed on (CheckpointError,
// the same on every rank) leaves the sync usable. HDF5's own collectives (the file's creation, its
// metadata, its close) cannot be watched: they start only after every rank agreed to go on, and
// no rank leaves them early.
template <class S, class Items>
void run_checkpoint(S& sync, bool save, const std::string& path, Items&& items) {
  const char* call = save ? "save_checkpoint" : "load_checkpoint";
  std::string refused;
  SyncAccess::collective(sync, save ? "save_checkpoint()" : "load_checkpoint()",
                         save ? "collectives of save_checkpoint()" : "collectives of load_checkpoint()",
                         [&](const auto& watched) {
                           const CkptComm<std::decay_t<decltype(watched)>> comm(watched);
                           try {
                             CkptJob job = checkpoint_job(sync, comm, call, path);
                             Kokkos::fence();  // pending kernels may still write parameters or state
                             items(job);
                             if (save)
                               save_job(job, comm, path);
                             else
                               load_job(job, comm, path);
                           } catch (const CheckpointError& e) {  // agreed: thrown alike on every rank
                             refused = e.what();
                           }
                         });
  if (!refused.empty()) throw CheckpointError(refused.rfind("gradsync: ", 0) == 0 ? refused.substr(10) : refused);
}

}  // namespace impl

/// Writes the optimizer's parameters and optimizer state, and `state`'s entries, to the parallel
/// HDF5 file `path`: the data-parallel ones once (rank 0's copy), every local one under its
/// registered name (unique across ranks, or held alike by the ranks of a process set: written by
/// the lowest), each row shard (CheckpointState::shard) at its rows of its table, with gradsync's
/// version, the rank count and the format version (docs/CHECKPOINT.md). Written as
/// `path + ".partial"`, renamed to `path` once complete; an existing `path` is replaced. Collective
/// over the sync's ranks (an MpiBackend's communicator); between steps, and not in the middle of an
/// aggregation cycle (gradients are not saved). Throws CheckpointError on every rank, with the same
/// message, when any rank fails; then `path` is untouched.
template <class Optimizer, class Sync>
void save_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path,
                     const CheckpointState& state = {}) {
  impl::run_checkpoint(dopt.sync(), true, path, [&](impl::CkptJob& job) { impl::add_items_of(job, dopt, state); });
}

/// The same for a program that updates its parameters itself: `state` names them
/// (CheckpointState::parameter, each under the name its gradient has in `sync`) and the program's
/// own state.
template <class Backend, class Tensor>
void save_checkpoint(GradientSync<Backend, Tensor>& sync, const std::string& path, const CheckpointState& state) {
  impl::run_checkpoint(sync, true, path, [&](impl::CkptJob& job) { impl::add_items_of(job, sync, state); });
}

/// Reads a checkpoint written by save_checkpoint() into the optimizer's parameters and optimizer
/// state, and `state`'s entries: each data-parallel one on every rank, each local one on the ranks
/// that register its name now, each row shard from its rows of its table. At the writer's rank
/// count the training continues bit for bit; at another, every name must still be held by some
/// rank and each table's shards must cover it. Collective over the sync's ranks; between steps.
/// All or nothing: a file that is missing, truncated, foreign, of an unknown format version or
/// incomplete, a parameter the file lacks or holds with another size, group, table shape or
/// optimizer state, a dataset whose checksum differs, a file of another model: CheckpointError on
/// every rank, with the same message naming the tensor, its group and the rank that found it, and
/// nothing was loaded anywhere.
template <class Optimizer, class Sync>
void load_checkpoint(DistributedOptimizer<Optimizer, Sync>& dopt, const std::string& path,
                     const CheckpointState& state = {}) {
  impl::run_checkpoint(dopt.sync(), false, path, [&](impl::CkptJob& job) { impl::add_items_of(job, dopt, state); });
}

/// The same for a program that updates its parameters itself (see save_checkpoint()).
template <class Backend, class Tensor>
void load_checkpoint(GradientSync<Backend, Tensor>& sync, const std::string& path, const CheckpointState& state) {
  impl::run_checkpoint(sync, false, path, [&](impl::CkptJob& job) { impl::add_items_of(job, sync, state); });
}

}  // namespace gradsync
