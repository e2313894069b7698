// gradsync internals: writing a checkpoint file (checkpoint.hpp's save_checkpoint).
//
// The save is ordered so that HDF5 can close the file whatever fails (see save_job), and so that a
// job killed while writing leaves no file that loads: it writes `path + ".partial"`, marks it
// complete last, and renames it to `path` only once every rank agreed that it succeeded.
#pragma once

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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

}  // namespace gradsync::impl
