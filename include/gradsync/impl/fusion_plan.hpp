// gradsync internals: how data-parallel gradients are laid out in the fused index space and cut
// into chunks, each chunk a list of segments (pieces of tensors) for the batched kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "fusion_kernels.hpp"
#include "wire_ring.hpp"

namespace gradsync::impl {

// Segments are split at this length so one team never serializes a huge tensor on a GPU: a 4 MiB
// chunk of one float tensor is 256 teams (blocks), enough to fill a device; on a CPU a team per 4096
// values costs nothing measurable.
inline constexpr std::int64_t max_segment_elements = std::int64_t(1) << 12;

struct Chunk {
  std::int64_t begin = 0, end = 0;          // range in the fused index space
  std::int64_t seg_begin = 0, seg_end = 0;  // its segments in FusionPlan::segments
  // Its segments lie back to back in memory (a piece of one tensor, or neighbouring tensors):
  // it can be reduced in place, without a copy through the fusion buffer.
  bool contiguous = false;
  // A piece of a large tensor or region of its own: contiguous on every rank. (A packed chunk may
  // be contiguous on one rank and not on another: its tensors' addresses are each rank's own.)
  bool own = false;
  int kind = 0;  // its tensors' wire format (int(Compression)); a chunk never mixes formats
  // Compressed, contiguous, and summed in place by the backend's ring, which converts as it goes
  // (impl/wire_ring.hpp): no 16-bit copy. Set by the sync, which knows the backend.
  bool wire_ring = false;
  std::int64_t size() const { return end - begin; }
};

template <class T>
struct FusionPlan {
  std::vector<Chunk> chunks;
  std::vector<Segment<T>> segments;  // off = position in the fused index space
  std::int64_t total = 0;            // elements of all tensors
  std::int64_t widest = 0;           // elements of the largest chunk
  std::int64_t widest_packed = 0;    // elements of the largest chunk that is not contiguous
  // Per input tensor, its chunks [first, last]; {-1, -2} for an empty tensor (in no chunk).
  std::vector<std::pair<std::int64_t, std::int64_t>> tensor_chunks;

  struct Tensor {
    T* data;
    std::size_t size;
    int kind = 0;  // wire format: chunks are cut where it changes
  };

  // Chunks follow the given tensor order. Tensors of at least `own_min` elements (and every
  // tensor with `per_tensor`, i.e. no fusion) get chunks of their own: equal pieces of at most
  // `limit` elements, reducible in place. The others fill packed chunks of `limit` elements, which
  // may split a tensor; a packed chunk is placed where it fills up (or at the end), so each chunk
  // comes after every tensor it holds. Fused positions follow chunk order. Consecutive tensors that
  // are neighbours in memory (gradients carved from one allocation, in either direction) count as
  // one region with `merge_neighbours` (the ranks agreed they all have the same neighbours): of at
  // least `own_min` elements, it is cut into pieces like one large tensor, so an arena of gradients
  // is reduced in place in as few calls as one contiguous buffer.
  // Tensors of a compressed kind (kind != 0) use `wire_limit` instead of `limit` when it is given:
  // the threshold counts bytes handed to the backend, and their values are 2 bytes there.
  static FusionPlan build(const std::vector<Tensor>& tensors, std::int64_t limit, bool per_tensor,
                          std::int64_t own_min = std::numeric_limits<std::int64_t>::max(),
                          bool merge_neighbours = false, std::int64_t wire_limit = 0) {
    FusionPlan p;
    const std::int64_t plain_limit = limit;
    auto limit_of = [&](int kind) { return kind != 0 && wire_limit > 0 ? wire_limit : plain_limit; };
    std::vector<Segment<T>> open;           // the packed chunk being filled, offsets from its start
    std::vector<std::size_t> open_tensors;  // the tensors it holds
    std::int64_t open_size = 0;
    auto emit = [&](std::vector<Segment<T>>& segs, std::int64_t size, const std::vector<std::size_t>& members) {
      Chunk c;
      c.begin = p.total;
      c.end = p.total + size;
      c.seg_begin = std::int64_t(p.segments.size());
      for (Segment<T> sg : segs) {
        sg.off += p.total;
        p.segments.push_back(sg);
      }
      c.seg_end = std::int64_t(p.segments.size());
      const std::int64_t idx = std::int64_t(p.chunks.size());
      if (!members.empty()) c.kind = tensors[members.front()].kind;
      for (std::size_t i : members) {
        auto& tc = p.tensor_chunks[i];
        if (tc.first < 0) tc.first = idx;
        tc.second = idx;
      }
      p.chunks.push_back(c);
      p.total += size;
    };
    std::vector<Segment<T>> own;
    p.tensor_chunks.assign(tensors.size(), {-1, -2});
    const bool merge = merge_neighbours && !per_tensor && own_min < std::numeric_limits<std::int64_t>::max();
    std::int64_t single_through = -1;  // tensors of a region too small to merge: taken one by one
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (merge && std::int64_t(i) > single_through) {
        const Region r = region_from(tensors, i);
        if (r.members.size() > 1 && r.total >= own_min) {
          emit_region(p, r, tensors, limit_of(tensors[r.members.front()].kind), own, emit);
          i = r.last;
          continue;
        }
        single_through = std::int64_t(r.last);
      }
      const Tensor& t = tensors[i];
      const std::int64_t size = std::int64_t(t.size);
      if (size == 0) continue;
      if (per_tensor || size >= own_min) {  // a region of one tensor
        emit_region(p, Region{{i}, t.data, size, false, i}, tensors, limit_of(t.kind), own, emit);
        continue;
      }
      if (open_size > 0 && tensors[open_tensors.back()].kind != t.kind) {  // formats never share a chunk
        emit(open, open_size, open_tensors);
        open.clear();
        open_tensors.clear();
        open_size = 0;
      }
      limit = limit_of(t.kind);  // the open chunk holds this kind only
      for (std::int64_t done = 0; done < size;) {
        const std::int64_t len = std::min({size - done, limit - open_size, max_segment_elements});
        open.push_back(Segment<T>{t.data + done, open_size, len, T(1)});
        if (open_tensors.empty() || open_tensors.back() != i) open_tensors.push_back(i);
        open_size += len;
        done += len;
        if (open_size == limit) {
          emit(open, open_size, open_tensors);
          open.clear();
          open_tensors.clear();
          open_size = 0;
        }
      }
    }
    if (open_size > 0) emit(open, open_size, open_tensors);
    for (Chunk& c : p.chunks) {
      c.contiguous = true;
      for (std::int64_t k = c.seg_begin; k + 1 < c.seg_end; ++k)
        c.contiguous = c.contiguous && p.segments[std::size_t(k)].ptr + p.segments[std::size_t(k)].count ==
                                           p.segments[std::size_t(k + 1)].ptr;
      p.widest = std::max(p.widest, c.size());
      if (!c.contiguous) p.widest_packed = std::max(p.widest_packed, c.size());
    }
    return p;
  }

  /// Where b lies against a in memory: right after it (1), right before it (-1), elsewhere (0).
  static int neighbour(const Tensor& a, const Tensor& b) {
    return b.data == a.data + a.size ? 1 : b.data + b.size == a.data ? -1 : 0;
  }

 private:
  // Tensors first .. last (fused order) that tile [lo, lo + total) in memory; members in address
  // order. Empty tensors in between are skipped (they occupy no memory and join no chunk).
  struct Region {
    std::vector<std::size_t> members;
    T* lo = nullptr;
    std::int64_t total = 0;
    bool descending = false;  // fused order runs down through memory
    std::size_t last = 0;
  };

  static Region region_from(const std::vector<Tensor>& ts, std::size_t first) {
    Region r;
    r.last = first;
    if (ts[first].size == 0) return r;
    r.members.push_back(first);
    r.lo = ts[first].data;
    r.total = std::int64_t(ts[first].size);
    int dir = 0;
    for (std::size_t j = first + 1; j < ts.size(); ++j) {
      if (ts[j].size == 0) continue;
      if (ts[j].kind != ts[first].kind) break;
      const int d = neighbour(Tensor{r.lo, std::size_t(r.total)}, ts[j]);
      if (d == 0 || (dir != 0 && d != dir)) break;
      dir = d;
      if (d > 0) {
        r.members.push_back(j);
      } else {
        r.members.insert(r.members.begin(), j);
        r.lo = ts[j].data;
      }
      r.total += std::int64_t(ts[j].size);
      r.last = j;
    }
    r.descending = dir < 0;
    return r;
  }

  // Equal pieces of at most `limit` elements (a large tensor's too), taken in fused order (from the
  // top of memory down for a descending region, so the tensors backward produces first are in the
  // first piece); each piece's segments in address order, cut at tensor boundaries.
  template <class Emit>
  static void emit_region(FusionPlan& p, const Region& r, const std::vector<Tensor>& ts, std::int64_t limit,
                          std::vector<Segment<T>>& segs, Emit& emit) {
    const std::int64_t pieces = (r.total + limit - 1) / limit, piece = (r.total + pieces - 1) / pieces;
    std::vector<std::size_t> members;
    for (std::int64_t q = 0; q < pieces; ++q) {
      const std::int64_t a = r.descending ? std::max<std::int64_t>(0, r.total - (q + 1) * piece) : q * piece;
      const std::int64_t b = r.descending ? r.total - q * piece : std::min(r.total, (q + 1) * piece);
      segs.clear();
      members.clear();
      std::int64_t start = 0;
      for (std::size_t m : r.members) {
        const std::int64_t end = start + std::int64_t(ts[m].size);
        for (std::int64_t k = std::max(a, start); k < std::min(b, end); k += max_segment_elements)
          segs.push_back(Segment<T>{r.lo + k, k - a, std::min(max_segment_elements, std::min(b, end) - k), T(1)});
        if (std::max(a, start) < std::min(b, end)) members.push_back(m);
        start = end;
      }
      emit(segs, b - a, members);
      p.chunks.back().own = true;
    }
  }
};

}  // namespace gradsync::impl
