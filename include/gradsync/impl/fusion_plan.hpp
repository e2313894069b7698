// gradsync internals: how data-parallel gradients are laid out in the fused index space and cut
// into chunks, each chunk a list of segments (pieces of tensors) for the batched kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "fusion_kernels.hpp"

namespace gradsync::impl {

// Segments are split at this length so one team never serializes a huge tensor on a GPU.
inline constexpr std::int64_t max_segment_elements = std::int64_t(1) << 20;

struct Chunk {
  std::int64_t begin = 0, end = 0;          // range in the fused index space
  std::int64_t seg_begin = 0, seg_end = 0;  // its segments in FusionPlan::segments
  // Its segments lie back to back in memory (a piece of one tensor, or neighbouring tensors):
  // it can be reduced in place, without a copy through the fusion buffer.
  bool contiguous = false;
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
  };

  // Tensors are laid out back to back in the given order. With `per_tensor` every tensor starts a
  // chunk of its own (no fusion); otherwise chunks are fixed windows of `limit` elements that may
  // split tensors. No chunk exceeds `limit` elements either way.
  static FusionPlan build(const std::vector<Tensor>& tensors, std::int64_t limit, bool per_tensor) {
    FusionPlan p;
    for (const Tensor& t : tensors) p.total += std::int64_t(t.size);
    std::int64_t offset = 0;
    for (const Tensor& t : tensors) {
      const std::int64_t size = std::int64_t(t.size);
      p.tensor_chunks.emplace_back(-1, -2);
      for (std::int64_t done = 0; done < size;) {
        const std::int64_t pos = offset + done;
        if (p.chunks.empty() || pos >= p.chunks.back().end) {
          Chunk c;
          c.begin = pos;
          c.end = std::min(pos + limit, per_tensor ? offset + size : p.total);
          c.seg_begin = c.seg_end = std::int64_t(p.segments.size());
          p.chunks.push_back(c);
        }
        Chunk& c = p.chunks.back();
        auto& tc = p.tensor_chunks.back();
        if (tc.first < 0) tc.first = std::int64_t(p.chunks.size()) - 1;
        tc.second = std::int64_t(p.chunks.size()) - 1;
        const std::int64_t len = std::min({size - done, c.end - pos, max_segment_elements});
        p.segments.push_back(Segment<T>{t.data + done, pos, len, T(1)});
        c.seg_end = std::int64_t(p.segments.size());
        done += len;
      }
      offset += size;
    }
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
};

}  // namespace gradsync::impl
