// gradsync internals: reading a checkpoint file (checkpoint.hpp's load_checkpoint).
//
// All or nothing: every dataset is read and its checksum verified into scratch memory, and the
// ranks agree that every rank succeeded before any parameter, optimizer state or program entry is
// overwritten; a refusal names the tensor, its group and the rank that found it, alike everywhere.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../checkpoint_state.hpp"
#include "../config.hpp"
#include "../error.hpp"
#include "checkpoint_catalog.hpp"
#include "checkpoint_hdf5.hpp"
#include "checkpoint_job.hpp"
#include "checkpoint_values.hpp"

namespace gradsync::impl {

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

}  // namespace gradsync::impl
