// gradsync internals: what a checkpoint holds, as every rank knows it.
//
// A rank's checkpoint is a list of items (a parameter with its optimizer state, or user state),
// each a few datasets of values somewhere in memory. An item is data-parallel (alike on every rank:
// written once, by rank 0, read by every rank), local (keyed by its name: written by the rank that
// holds it, or the lowest of the ranks of a process set that hold it alike, and read by whichever
// ranks hold that name at load), or a row shard (rows [first_row, first_row + rows) of a global
// table keyed by its name: each distinct shard written by its lowest holder at its rows, so that a
// table saved as 4 shards loads as 2 or 3). The catalog gathers every rank's local items and
// shards, so that every rank knows the whole file, and refuses what a file cannot hold.
#pragma once

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "checkpoint_hdf5.hpp"
#include "demangle.hpp"
#include "memory_ops.hpp"
#include "stall.hpp"

namespace gradsync::impl {

enum class CkptType : int { f64 = 0, f32 = 1, i64 = 2 };
inline std::size_t ckpt_type_size(CkptType t) { return t == CkptType::f32 ? 4 : 8; }
inline const char* ckpt_type_name(CkptType t) {
  return t == CkptType::f64 ? "float64" : t == CkptType::f32 ? "float32" : "int64";
}
template <class T>
inline constexpr bool is_ckpt_value_v =
    std::is_same_v<T, double> || std::is_same_v<T, float> || std::is_same_v<T, std::int64_t>;
template <class T>
constexpr CkptType ckpt_type_of() {
  static_assert(is_ckpt_value_v<T>, "gradsync checkpoints hold double, float or std::int64_t values");
  return std::is_same_v<T, double> ? CkptType::f64 : std::is_same_v<T, float> ? CkptType::f32 : CkptType::i64;
}

// A dataset's checksum in format 2: FNV-1a over the little-endian 64-bit words, in 4 interleaved
// lanes (word i into lane i mod 4, lane k starting at the basis xor k), the last n mod 32 bytes
// byte-wise into lane 0, then h = lane 0 and h = (h ^ lane k) * prime for k = 1..3. Four
// independent multiply chains: about 17 GB/s on one core, where byte-wise FNV-1a (format 1) runs
// at 0.6 GB/s and was most of a save's time. `seed` replaces the basis (a row's, by its number).
inline std::uint64_t checksum_words(const void* data, std::size_t n, std::uint64_t seed = 1469598103934665603ull) {
  constexpr std::uint64_t prime = 1099511628211ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::uint64_t lane[4] = {seed, seed ^ 1, seed ^ 2, seed ^ 3};
  const std::size_t blocks = n / 32;
  for (std::size_t b = 0; b < blocks; ++b)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w = 0;
      for (int j = 0; j < 8; ++j) w |= std::uint64_t(p[b * 32 + std::size_t(k) * 8 + std::size_t(j)]) << (8 * j);
      lane[k] = (lane[k] ^ w) * prime;
    }
  for (std::size_t i = blocks * 32; i < n; ++i) lane[0] = (lane[0] ^ p[i]) * prime;
  std::uint64_t h = lane[0];
  for (int k = 1; k < 4; ++k) h = (h ^ lane[k]) * prime;
  return h;
}

// A dataset's checksum as the file's format version defines it.
inline std::uint64_t checksum_bytes(int version, const void* p, std::size_t n) {
  return version >= 2 ? checksum_words(p, n) : fnv1a(p, n);
}

// One dataset of an item: `count` contiguous values in some memory space, copied through the host.
struct CkptData {
  std::string name;  // "param", "state<k>", "counters", "value"
  CkptType type = CkptType::f64;
  std::uint64_t count = 0;               // values on this rank (a row shard: its rows x row length)
  bool rowwise = false;                  // a row shard's values, placed at the shard's rows
  const void* host = nullptr;            // the values themselves when the host can read them
  std::function<void(void*)> get;        // copies the values to a host buffer
  std::function<void(const void*)> put;  // and back
};

template <class T, class Space>
CkptData ckpt_data(std::string name, T* p, std::size_t n, bool rowwise = false, std::shared_ptr<const void> keep = {}) {
  CkptData d;
  d.name = std::move(name);
  d.type = ckpt_type_of<std::remove_const_t<T>>();
  d.count = n;
  d.rowwise = rowwise;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) d.host = p;
  d.get = [p, n, keep](void* out) { copy_values<Kokkos::HostSpace, Space>(static_cast<T*>(out), p, n); };
  d.put = [p, n, keep](const void* in) { copy_values<Space, Kokkos::HostSpace>(p, static_cast<const T*>(in), n); };
  return d;
}

enum class CkptKind : int { data_parallel = 0, local = 1, sharded = 2 };
inline const char* ckpt_kind_name(CkptKind k) {
  return k == CkptKind::data_parallel ? "data-parallel" : k == CkptKind::local ? "local" : "row-sharded";
}
inline const char* ckpt_top(CkptKind k) {
  return k == CkptKind::data_parallel ? "/data_parallel" : k == CkptKind::local ? "/local" : "/sharded";
}

// One item of this rank's checkpoint.
struct CkptItem {
  std::string name, group;
  CkptKind kind = CkptKind::data_parallel;
  bool shared = false;  // held alike by the ranks of a process set (ReduceOver)
  std::uint64_t first_row = 0, rows = 0, global_rows = 0, row_length = 0;  // a row shard
  std::vector<CkptData> data;
  std::string path() const { return std::string(ckpt_top(kind)) + "/" + h5_escape(name); }
  // Errors name it so.
  std::string who() const {
    return cat("parameter '", name, "' (group ", group, ", ", ckpt_kind_name(kind), ", ",
               kind == CkptKind::sharded ? cat("rows ", first_row, "-", first_row + rows, " of ", global_rows)
                                         : cat(data.empty() ? 0 : data[0].count, " values"),
               ")");
  }
  // The extent of dataset d in the file.
  std::uint64_t file_count(const CkptData& d) const { return d.rowwise ? global_rows * row_length : d.count; }
};

// A dataset's shape as the file holds it.
struct CkptDataShape {
  std::string name;
  CkptType type = CkptType::f64;
  std::uint64_t count = 0;  // in the file (a row shard's dataset: the global table's)
  bool rowwise = false;
  bool operator==(const CkptDataShape& o) const {
    return name == o.name && type == o.type && count == o.count && rowwise == o.rowwise;
  }
};

// One name of the file's /local or /sharded part, from every rank's items.
struct CkptEntry {
  struct Piece {
    std::uint64_t first_row = 0, rows = 0;
    int writer = -1;  // the lowest rank holding these rows (or this local item)
  };
  std::string name, group;
  CkptKind kind = CkptKind::local;
  bool shared = false;
  std::uint64_t global_rows = 0, row_length = 0;
  std::vector<CkptDataShape> data;
  std::vector<Piece> pieces;  // sharded: distinct row ranges, ascending; local: one
  int holders = 0;
  // The rank that writes (and at load verifies) the rows starting at `first_row`.
  int writer_of(std::uint64_t first_row) const {
    for (const Piece& p : pieces)
      if (p.first_row == first_row) return p.writer;
    return -1;
  }
};

// The checkpoint's collectives over the sync's ranks, each waited under the sync's stall watchdog
// (`W`: the impl::Watched of SyncAccess::collective): a rank that skips the call is named by
// the others at the deadline instead of hanging them, and a peer's failure stops them at once. The
// values cross in heap cells, left to the graveyard when a wait gives up (a late peer may still
// write there).
template <class W>
class CkptComm {
 public:
  explicit CkptComm(const W& w) : w_(w) {}
  int rank() const { return w_.rank(); }
  int size() const { return w_.size(); }
  // The sync's communicator, for HDF5's collective file calls (started once the ranks agreed).
  MPI_Comm mpi() const { return w_.backend().comm(); }
  template <class T>
  void sum(std::vector<T>& v) const {
    in_cell(v, [&](T* p) { w_.allreduce_sum(p, v.size()); });
  }
  template <class T>
  void min(std::vector<T>& v) const {
    in_cell(v, [&](T* p) { w_.allreduce_min(p, v.size()); });
  }
  // sum() over another communicator (a process set's, `b`), watched alike where it is of the
  // sync's backend type.
  template <class B, class T>
  void sum_over(const B& b, std::vector<T>& v) const {
    in_cell(v, [&](T* p) {
      decltype(auto) over = w_.over(b);
      over.allreduce_sum(p, v.size());
    });
  }
  // `root`'s string on every rank.
  std::string broadcast(const std::string& s, int root) const {
    std::vector<std::uint64_t> n{s.size()};
    in_cell(n, [&](std::uint64_t* p) { w_.broadcast(p, 1, root); });
    std::vector<char> bytes(s.begin(), s.end());
    bytes.resize(std::size_t(n[0]));
    in_cell(bytes, [&](char* p) { w_.broadcast(p, bytes.size(), root); });
    return std::string(bytes.begin(), bytes.end());
  }
  // The lowest failing rank's message on every rank ("" when none failed): one allreduce, and two
  // broadcasts of the message when there is one.
  std::string agree(const std::string& mine) const {
    std::vector<int> first{mine.empty() ? INT_MAX : rank()};
    min(first);
    if (first[0] == INT_MAX) return {};
    return broadcast(rank() == first[0] ? mine : std::string(), first[0]);
  }
  // Every rank's string, in rank order (padded to the longest: two allgathers).
  std::vector<std::string> allgather(const std::string& mine) const {
    const std::size_t n = std::size_t(size());
    std::vector<std::uint64_t> lens(n + 1, 0);  // [every rank's | this rank's]
    lens[n] = mine.size();
    in_cell(lens, [&](std::uint64_t* p) { w_.allgather(p + n, p, 1); });
    const std::size_t longest = std::size_t(*std::max_element(lens.begin(), lens.begin() + std::ptrdiff_t(n)));
    std::vector<char> all((n + 1) * longest, '\0');
    std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(n * longest));
    in_cell(all, [&](char* p) { w_.allgather(p + n * longest, p, longest); });
    std::vector<std::string> out;
    for (std::size_t r = 0; r < n; ++r) out.emplace_back(all.data() + r * longest, std::size_t(lens[r]));
    return out;
  }

 private:
  template <class T, class Op>
  static void in_cell(std::vector<T>& v, Op&& op) {
    if (v.empty()) return;  // the sizes are alike on every rank: no rank calls the collective
    auto cell = std::make_shared<std::vector<T>>(v);
    try {
      op(cell->data());
    } catch (...) {
      graveyard().push_back(std::move(cell));
      throw;
    }
    v = *cell;
  }
  const W& w_;
};

// Length-prefixed fields: names may hold any character.
class FieldWriter {
 public:
  template <class X>
  FieldWriter& operator<<(const X& x) {
    std::string f;
    if constexpr (std::is_same_v<X, std::string>)
      f = x;
    else
      f = std::to_string(x);
    s_ += std::to_string(f.size()) + ":" + f;
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};
class FieldReader {
 public:
  explicit FieldReader(const std::string& s) : s_(s) {}
  bool done() const { return at_ >= s_.size(); }
  std::string text() {
    const std::size_t colon = s_.find(':', at_);
    const std::size_t n = std::stoull(s_.substr(at_, colon - at_));
    std::string f = s_.substr(colon + 1, n);
    at_ = colon + 1 + n;
    return f;
  }
  std::uint64_t number() { return std::stoull(text()); }

 private:
  const std::string& s_;
  std::size_t at_ = 0;
};

// The file's shape of an item's datasets.
inline std::vector<CkptDataShape> ckpt_shapes(const CkptItem& it) {
  std::vector<CkptDataShape> out;
  for (const CkptData& d : it.data) out.push_back({d.name, d.type, it.file_count(d), d.rowwise});
  return out;
}

// Every rank's items, agreed: built collectively from this rank's, with the refusal (alike on every
// rank) when they cannot make one file.
class CkptCatalog {
 public:
  template <class Comm>
  CkptCatalog(const Comm& comm, const std::string& what, const std::vector<CkptItem>& mine)
      : rank_(comm.rank()), size_(comm.size()) {
    std::string refusal;
    const auto refuse = [&](const std::string& why) {
      if (refusal.empty()) refusal = cat(what, ": ", why);
    };
    // Data-parallel items are alike on every rank (the file's metadata is created collectively
    // from them): one hash, its MPI_MIN and that of its complement, tells.
    std::vector<std::uint64_t> h{fnv1a("dp", 2), 0};
    FieldWriter others;
    std::set<std::string> names_here;
    for (const CkptItem& it : mine) {
      if (!names_here.insert(it.name).second)
        refuse(cat(it.who(), " is registered twice on rank ", rank_, ": a checkpoint keys parameters by name"));
      if (it.kind == CkptKind::data_parallel) {
        FieldWriter f;
        f << it.name << it.group;
        for (const CkptDataShape& d : ckpt_shapes(it)) f << d.name << int(d.type) << d.count;
        h[0] = fnv1a(f.str().data(), f.str().size(), h[0]);
        dp_names_.insert(it.name);
        ++dp_count_;
        continue;
      }
      others << it.name << it.group << int(it.kind) << int(it.shared) << it.first_row << it.rows << it.global_rows
             << it.row_length << it.data.size();
      for (const CkptDataShape& d : ckpt_shapes(it)) others << d.name << int(d.type) << d.count << int(d.rowwise);
    }
    h[1] = ~h[0];
    comm.min(h);
    if (h[0] != ~h[1])
      refuse(cat("the ranks' data-parallel parameters differ (names, groups, sizes or optimizer state; rank ", rank_,
                 " has ", dp_count_, "); broadcast_parameters() names the first difference"));

    // Every rank's local items and shards, in rank order: the lowest holder writes.
    const std::vector<std::string> all = comm.allgather(others.str());
    std::map<std::string, std::vector<std::pair<int, CkptItem>>> by_name;
    for (int r = 0; r < size_; ++r) {
      FieldReader f(all[std::size_t(r)]);
      while (!f.done()) {
        CkptItem it;
        it.name = f.text();
        it.group = f.text();
        it.kind = CkptKind(f.number());
        it.shared = f.number() != 0;
        it.first_row = f.number();
        it.rows = f.number();
        it.global_rows = f.number();
        it.row_length = f.number();
        const std::size_t nd = f.number();
        std::vector<CkptDataShape> shapes;
        for (std::size_t d = 0; d < nd; ++d) {
          CkptDataShape s;
          s.name = f.text();
          s.type = CkptType(f.number());
          s.count = f.number();
          s.rowwise = f.number() != 0;
          CkptData data;
          data.name = s.name;
          data.type = s.type;
          data.count = s.rowwise ? it.rows * it.row_length : s.count;
          data.rowwise = s.rowwise;
          it.data.push_back(std::move(data));
        }
        by_name[it.name].emplace_back(r, std::move(it));
      }
    }
    for (auto& [name, held] : by_name) {
      const auto& [r0, first] = held.front();
      CkptEntry e;
      e.name = name;
      e.group = first.group;
      e.kind = first.kind;
      e.shared = first.shared;
      e.global_rows = first.global_rows;
      e.row_length = first.row_length;
      e.data = ckpt_shapes(first);
      e.holders = int(held.size());
      if (dp_names_.count(name))
        refuse(cat(first.who(), " is ", ckpt_kind_name(first.kind), " on rank ", r0,
                   " and data-parallel elsewhere: give it another name"));
      for (const auto& [r, it] : held) {
        if (it.kind != e.kind || it.group != e.group || ckpt_shapes(it) != e.data || it.global_rows != e.global_rows ||
            it.row_length != e.row_length)
          refuse(cat(it.who(), " on rank ", r, " is not what rank ", r0, " holds under that name: ", first.who(),
                     " (another group, kind, size or optimizer state)"));
        if (e.kind == CkptKind::local) {
          if (e.pieces.empty())
            e.pieces.push_back({0, 0, r});
          else if (!(it.shared && e.shared))
            refuse(cat("parameter '", name, "' (group ", it.group, ") is registered as local on rank ", r,
                       " and as local on rank ", r0,
                       ": a checkpoint keys local parameters by name; give them names unique across ranks"));
          continue;
        }
        // A row shard: replicas of a process set hold the same rows; other ranks other rows.
        bool again = false;
        for (const CkptEntry::Piece& p : e.pieces)
          if (p.first_row == it.first_row && p.rows == it.rows) {
            again = true;
            if (!(it.shared && e.shared))
              refuse(cat(it.who(), " is held by rank ", p.writer, " and rank ", r,
                         " (only the replicas of a process set may hold the same rows)"));
          }
        if (!again) e.pieces.push_back({it.first_row, it.rows, r});
      }
      if (e.kind == CkptKind::sharded) {
        std::sort(e.pieces.begin(), e.pieces.end(),
                  [](const CkptEntry::Piece& a, const CkptEntry::Piece& b) { return a.first_row < b.first_row; });
        std::uint64_t next = 0;
        for (const CkptEntry::Piece& p : e.pieces) {
          if (p.first_row != next)
            refuse(cat("the shards of '", name, "' (group ", e.group, ", ", e.global_rows, " rows) ",
                       p.first_row > next ? "leave rows " : "overlap at rows ",
                       p.first_row > next ? cat(next, "-", p.first_row) : cat(p.first_row, "-", next),
                       p.first_row > next ? " to no rank" : cat(" (rank ", p.writer, ")"),
                       ": the shards must cover the table once"));
          next = std::max(next, p.first_row + p.rows);
        }
        if (next != e.global_rows)
          refuse(cat("the shards of '", name, "' (group ", e.group, ", ", e.global_rows, " rows) end at row ", next,
                     next < e.global_rows ? ": the last rows are on no rank" : ": past the table"));
      }
      (e.kind == CkptKind::local ? local_ : sharded_).push_back(std::move(e));
    }
    refusal_ = refusal;
  }

  const CkptEntry* find(const CkptItem& it) const {
    const auto& v = it.kind == CkptKind::local ? local_ : sharded_;
    for (const CkptEntry& e : v)
      if (e.name == it.name) return &e;
    return nullptr;
  }

  int rank_ = 0, size_ = 1;
  std::string refusal_;  // alike on every rank but for the data-parallel hash: agreed by the caller
  std::size_t dp_count_ = 0;
  std::set<std::string> dp_names_;
  std::vector<CkptEntry> local_, sharded_;  // by name
};

}  // namespace gradsync::impl
