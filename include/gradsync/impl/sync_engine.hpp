// gradsync: impl::SyncEngine, which runs a SyncPlan on a backend, step after step.
//
// It owns what a step needs at run time: the fusion buffer (slots that packed chunks cycle
// through, or every sum between passes when gradients are aggregated), the host staging copies,
// the 16-bit wire buffers of compressed chunks with their residuals and fp16 overflow flag, the
// device copies of the plan's segments, the local accumulator, and the step in progress (which
// chunks are ready, launched, completed, and their requests). A step packs each chunk (or scales it
// in place), hands it to the backend (blocking, hierarchical, or nonblocking with several in
// flight and waited under the stall watchdog), then unpacks it with every factor folded in.
// Provisioned from the plan's layout at each plan build; the steady step allocates nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend_traits.hpp"
#include "../compression.hpp"
#include "../config.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "backend_order.hpp"
#include "fusion_kernels.hpp"
#include "huge_pages.hpp"
#include "profiling.hpp"
#include "ready_tracker.hpp"
#include "stall.hpp"
#include "sync_context.hpp"
#include "sync_plan.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

// No check before a chunk is launched (SyncEngine::progress and reduce take a scan).
struct NoScan {
  void operator()(std::int64_t, std::int64_t) const {}
};

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class SyncEngine {
 public:
  using Context = SyncContext<Backend, ExecutionSpace>;
  using Plan = SyncPlan<Backend, V, MemorySpace>;
  using Seg = Segment<V>;
  using SegView = SegmentView<V, MemorySpace>;
  using Buffer = BufferView<V, MemorySpace>;
  using WireBuffer = BufferView<std::uint16_t, MemorySpace>;

  // Allocates (or keeps, when large enough) the buffers the plan's layout needs and uploads its
  // segments. `keepalive`: the registered tensors' own keepalives, which a stalled collective may
  // still write into.
  void provision(Context& cx, const Plan& plan, const typename Plan::Layout& L,
                 const std::vector<std::shared_ptr<void>>& keepalive) {
    std::vector<const void*> dp_data;
    for (const auto& t : L.data_parallel) dp_data.push_back(t.data);
    ready_.build(dp_data, L.tensor_chunks, plan.num_chunks());
    requests_.clear();  // move-only handles: none copied
    requests_.resize(plan.num_chunks());
    regions_.reserve(plan.widest_group());
    ensure_on_huge_pages(cx, buffer_, std::size_t(L.capacity), "gradsync::fusion_buffer");
    move_to_huge_pages(cx, plan, L.data_parallel);
    if (plan.staged()) ensure(cx, staging_, std::size_t(L.capacity), "gradsync::host_staging");
    plan_wire(cx, plan, std::size_t(L.capacity), L.total, L.segments);
    upload(cx, L.segments, dp_segs_, "gradsync::segments");
    if (cx.opt.backward_passes_per_step > 1)
      ensure(cx, local_acc_, std::size_t(L.local_total), "gradsync::local_accumulator");
    upload(cx, L.local_segments, local_segs_, "gradsync::local_segments");
    upload(cx, L.deferred_segments, deferred_segs_, "gradsync::deferred_segments");
    n_deferred_segs_ = std::int64_t(L.deferred_segments.size());
    n_dp_segs_ = std::int64_t(L.segments.size());
    n_local_segs_ = std::int64_t(L.local_segments.size());
    for (int k = 0; k < sample_weightings; ++k) {
      upload(cx, L.weighted_segments[std::size_t(k)], weighted_segs_[std::size_t(k)], "gradsync::weighted_segments");
      n_weighted_segs_[std::size_t(k)] = std::int64_t(L.weighted_segments[std::size_t(k)].size());
    }
    cx.stats.buffer_bytes =
        (buffer_.extent(0) + local_acc_.extent(0) + staging_.extent(0) + residual_.extent(0)) * sizeof(V) +
        (wire_.extent(0) + wire_staging_.extent(0)) * sizeof(std::uint16_t);
    // What a collective left incomplete by a stall may still write into.
    // After a stall MPI may still write into the buffers and, for chunks reduced in place, into the
    // gradients themselves: a failure keeps all of them alive (registered Views hold a keepalive copy).
    std::vector<std::shared_ptr<void>> keep{
        std::make_shared<Buffer>(buffer_), std::make_shared<decltype(staging_)>(staging_),
        std::make_shared<WireBuffer>(wire_), std::make_shared<decltype(wire_staging_)>(wire_staging_),
        std::make_shared<Backend>(cx.backend)};
    keep.insert(keep.end(), keepalive.begin(), keepalive.end());
    cx.ctl.keep_on_failure(std::move(keep));
  }

  // Passes 1 .. N-1: sum gradients into the buffer (data-parallel) and the accumulator (local).
  void accumulate(Context& cx, const Plan& plan, bool first) {
    ProfileRegion region(Region::accumulate);
    launch_segments(label_pack(), cx.exec, n_dp_segs_,
                    PackKernel<V, ExecutionSpace, MemorySpace>{dp_segs_, buffer_, 0, 0, plan.pre_factor(), !first});
    launch_segments(label_local(), cx.exec, n_local_segs_,
                    LocalKernel<V, ExecutionSpace, MemorySpace>{local_segs_, local_acc_,
                                                                first ? LocalMode::store : LocalMode::accumulate});
    launch_weighted(cx, plan, first ? LocalMode::store : LocalMode::accumulate);
  }

  // --- The step in progress ---

  // The first reducing call of a step (mark_ready or synchronize): nothing is ready or in flight.
  void open_step() {
    ready_.reset();
    wire_non_finite_ = nullptr;
    launched_ = completed_ = flying_ = 0;
  }
  // The index of the data-parallel tensor at p in fused order (-1: none).
  std::int64_t find_ready_slot(const void* p) const { return ready_.find(p); }
  void mark_ready(std::size_t i) { ready_.mark(i); }

  // Lets launched chunks advance and launches those that became possible; never blocks.
  // `scan(seg_begin, seg_end)` runs before a chunk is launched (Options::check_finite).
  template <class Scan = NoScan>
  void progress(Context& cx, const Plan& plan, bool aggregated, Scan&& scan = {}) {
    while (completed_ < launched_ && cx.backend.test(requests_[completed_])) complete_chunk(cx, plan);
    launch_through(cx, plan, ready_.ready_prefix(), aggregated, false, scan);
  }

  // Reduces every chunk not yet launched, waits for all and closes the step.
  template <class Scan = NoScan>
  void reduce(Context& cx, const Plan& plan, bool aggregated, Scan&& scan = {}) {
    launch_through(cx, plan, plan.num_chunks(), aggregated, true, scan);
    while (completed_ < launched_) complete_chunk(cx, plan);
  }

  // The failure path (StepPipeline::fail): the requests of chunks in flight, handed over to be
  // parked with the buffers they write into; the engine holds no step afterwards.
  std::shared_ptr<void> park() {
    auto parked = std::make_shared<std::vector<typename Backend::Request>>(std::move(requests_));
    requests_.clear();
    launched_ = completed_ = flying_ = 0;
    return parked;
  }

  // Options::shard, after the optimizer's update: the allgather of every group's slices, in the
  // regions of the step's reduce-scatter (the caller put what each rank owns into its gradients'
  // slices). Blocks until done, under the stall watchdog.
  void gather(Context& cx, const Plan& plan) {
    gather_begin();
    gather_end(cx, plan);
  }
  // The same chunk by chunk, as the optimizer's update completes their slices: gather_begin(),
  // gather_through(end) once the slices of chunks [0, end) are in the gradients (launches what
  // the in-flight limit allows, tests what flies; never blocks), gather_end() for the rest.
  void gather_begin() {
    launched_ = completed_ = flying_ = 0;
    gathering_ = true;
  }
  void gather_through(Context& cx, const Plan& plan, std::size_t end) {
    NoScan scan;
    while (completed_ < launched_ && cx.backend.test(requests_[completed_])) complete_chunk(cx, plan);
    launch_through(cx, plan, std::min(end, plan.num_chunks()), false, false, scan);
  }
  void gather_end(Context& cx, const Plan& plan) {
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{gathering_};
    NoScan scan;
    launch_through(cx, plan, plan.num_chunks(), false, true, scan);
    while (completed_ < launched_) complete_chunk(cx, plan);
    fence(cx.exec, label_fence_sync());
  }

  // Local tensors: their factor (and the sums of an aggregation cycle), in place.
  void finish_local(Context& cx, const Plan& plan, bool aggregated) {
    TimelineScope span(n_local_segs_ ? cx.timeline : nullptr, Timeline::Kind::local, "local scaling", n_local_segs_);
    ProfileRegion region(Region::local_scale, n_local_segs_ > 0);
    launch_segments(label_local(), cx.exec, n_local_segs_,
                    LocalKernel<V, ExecutionSpace, MemorySpace>{local_segs_, local_acc_,
                                                                aggregated ? LocalMode::finish : LocalMode::scale});
    launch_weighted(cx, plan, aggregated ? LocalMode::finish : LocalMode::scale);
  }

  // set_samples() with error feedback: the residuals are rounding errors of the weighted sum,
  // which the step's 1/N scales; a step with another N rescales them by N / N_prev, so that each
  // carries the same error of the gradient.
  // For checkpoints: this rank's residuals in the fused index space (null and 0 without).
  V* residual_data() const { return residual_.extent(0) > 0 ? residual_.data() : nullptr; }
  std::size_t residual_size() const { return std::size_t(residual_.extent(0)); }

  void rescale_residuals(Context& cx, V f) {
    if (n_residual_segs_ > 0 && f != V(1))
      launch_segments(label_local(), cx.exec, n_residual_segs_,
                      InPlaceScaleKernel<V, ExecutionSpace, MemorySpace>{residual_segs_, 0, f});
  }

  // Deferred local scales (defer_local_scale): whether there are any, and their pass.
  bool has_deferred() const { return n_deferred_segs_ > 0; }
  void apply_deferred(Context& cx) {
    ProfileRegion region(Region::local_scale, n_deferred_segs_ > 0);
    launch_segments(label_local(), cx.exec, n_deferred_segs_,
                    LocalKernel<V, ExecutionSpace, MemorySpace>{deferred_segs_, local_acc_, LocalMode::scale});
  }

  // The data-parallel segments as uploaded (for Options::check_finite's scan).
  const SegView& data_parallel_segments() const { return dp_segs_; }
  std::int64_t num_data_parallel_segments() const { return n_dp_segs_; }

  // fp16: whether the plan has fp16 chunks (an overflow flag to read after each step), and the
  // flag: the first value of the segment whose sum overflowed (the flag is cleared), or null.
  // Sharded over several ranks each rank sees its slice's sums only: the ranks agree on the first
  // (one small collective a step, fp16 only), so that every rank throws, naming the same value.
  bool watches_overflow() const { return overflow_.extent(0) > 0; }
  const V* take_overflow(Context& cx, const Plan& plan) {
    if (plan.sharded() && cx.backend.size() > 1) {
      std::int64_t at = wire_shard_bad_ < 0 ? std::numeric_limits<std::int64_t>::max() : wire_shard_bad_;
      wire_shard_bad_ = -1;
      cx.ctl.allreduce_min(cx.backend, &at, 1, cx.opt,
                           WaitSite{"fp16 overflow agreement", std::int64_t(cx.stats.passes), -1, 0});
      if (at == std::numeric_limits<std::int64_t>::max()) return nullptr;
      for (const Seg& g : host_segs_)
        if (at >= g.off && at < g.off + g.count) return g.ptr + (at - g.off);
      return nullptr;
    }
    copy_buffer(cx.exec, overflow_host_, 0, overflow_, 0, 1);
    fence(cx.exec, label_fence_sync());
    const std::int64_t k = overflow_host_.data()[0];
    const V* in_ring = wire_non_finite_;  // fp16 summed in place: found by the ring, the same on every rank
    wire_non_finite_ = nullptr;
    if (k == 0) return in_ring;
    const std::int64_t zero = 0;
    upload_buffer(overflow_, &zero, 1);
    return host_segs_[std::size_t(k - 1)].ptr;
  }

 private:
  static constexpr std::int64_t residual_piece = std::int64_t(1) << 20;

  // The weighted local segments, a launch per kind with its own factors (SampleWeights).
  void launch_weighted(Context& cx, const Plan& plan, LocalMode mode) {
    for (int k = 0; k < sample_weightings; ++k) {
      if (n_weighted_segs_[std::size_t(k)] == 0) continue;
      const auto kind = SampleWeighting(k + 1);
      launch_segments(
          label_local(), cx.exec, n_weighted_segs_[std::size_t(k)],
          LocalKernel<V, ExecutionSpace, MemorySpace>{weighted_segs_[std::size_t(k)], local_acc_, mode,
                                                      plan.weights().before(kind), plan.weights().after(kind)});
    }
  }

  template <class View>
  void ensure(Context& cx, View& v, std::size_t n, const char* label) {
    if (v.extent(0) >= n) return;
    v = allocate_buffer<View>(label, n);
    ++cx.stats.allocations;
  }

  // Host memory MPI copies from (impl/huge_pages.hpp): the fusion buffer starts on huge pages,
  // and gradients reduced where they are move onto them.
  template <class View>
  void ensure_on_huge_pages(Context& cx, View& v, std::size_t n, const char* label) {
    if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) {
      if (cx.opt.tuning.huge_pages && v.extent(0) < n && n * sizeof(typename View::value_type) >= huge_page_bytes) {
        v = allocate_on_huge_pages<View>(label, n);
        ++cx.stats.allocations;
        return;
      }
    }
    ensure(cx, v, n, label);
  }
  template <class Tensors>
  void move_to_huge_pages(Context& cx, const Plan& plan, const Tensors& dp) {
    cx.stats.bytes_on_huge_pages = 0;
    if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) {
      const auto& chunks = plan.chunks();
      const bool any = std::any_of(chunks.begin(), chunks.end(), [](const Chunk& c) { return c.contiguous; });
      if (!cx.opt.tuning.huge_pages || !plan.in_place() || !any) return;
      std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
      for (const auto& t : dp)
        ranges.emplace_back(reinterpret_cast<std::uintptr_t>(t.data),
                            reinterpret_cast<std::uintptr_t>(t.data + t.size));
      cx.stats.bytes_on_huge_pages = collapse_to_huge_pages(std::move(ranges));
    }
  }

  void upload(Context& cx, const std::vector<Seg>& host, SegView& dev, const char* label) {
    ensure(cx, dev, host.size(), label);
    if (host.empty()) return;
    if (upload_buffer(dev, host.data(), host.size())) ++cx.stats.allocations;  // a host mirror, at plan time
  }

  // Buffers of compressed chunks, when the plan has any: the 16-bit copy (the fusion buffer's
  // layout), its host staging when the backend cannot sum 16-bit values where they live
  // (MpiBackend on device memory: its op runs on the CPU), the residuals (zero at every plan build:
  // fused positions may have moved) and, for fp16, the overflow flag.
  void plan_wire(Context& cx, const Plan& plan, std::size_t capacity, std::int64_t total,
                 const std::vector<Seg>& segs) {
    bool any = false, fp16 = false;
    for (const Chunk& ch : plan.chunks()) {
      any = any || ch.kind != 0;
      fp16 = fp16 || ch.kind == int(Compression::fp16);
    }
    wire_staged_ = false;
    host_segs_.clear();
    if (!any) {
      wire_ = WireBuffer();
      wire_staging_ = {};
      residual_ = Buffer();
      n_residual_segs_ = 0;
      overflow_ = {};
      return;
    }
    if (!sums_wire<Backend>::value)  // every rank has the same backend type: all throw here
      throw ConfigError(
          cat("compression (Options::compression or a group's CompressWith) needs a backend that "
              "sums 16-bit values; backend '",
              Backend::name(),
              "' does not declare "
              "Capability::wire_sums (gradsync/backend.hpp): use Compression::none with it"));
    wire_staged_ = plan.staged() || !reduces_wire_in<MemorySpace>(cx.backend);
    ensure_on_huge_pages(cx, wire_, capacity, "gradsync::wire_buffer");  // MPI copies from it (huge_pages.hpp)
    if (wire_staged_) ensure(cx, wire_staging_, capacity, "gradsync::wire_staging");
    if (cx.opt.error_feedback) {
      ensure(cx, residual_, std::size_t(total), "gradsync::residual");
      const std::vector<V> zeros(residual_.extent(0), V(0));
      upload_buffer(residual_, zeros.data(), zeros.size());
      std::vector<Seg> pieces;  // for rescale_residuals: the buffer in pieces (a team each on GPUs)
      for (std::int64_t off = 0; off < total; off += residual_piece)
        pieces.push_back(Seg{residual_.data() + off, off, std::min(residual_piece, total - off), V(1)});
      upload(cx, pieces, residual_segs_, "gradsync::residual_segments");
      n_residual_segs_ = std::int64_t(pieces.size());
    }
    if (fp16) {
      ensure(cx, overflow_, 1, "gradsync::overflow");
      ensure(cx, overflow_host_, 1, "gradsync::overflow_host");
      const std::int64_t zero = 0;
      upload_buffer(overflow_, &zero, 1);
      host_segs_ = segs;
    }
  }

  void scale_in_place(Context& cx, const Plan& plan, std::size_t c, V factor) {
    if (factor == V(1)) return;
    const Chunk& ch = plan.chunk(c);
    launch_segments(label_unpack(), cx.exec, ch.seg_end - ch.seg_begin,
                    InPlaceScaleKernel<V, ExecutionSpace, MemorySpace>{dp_segs_, ch.seg_begin, factor});
  }

  // Packs chunk c into its place (the kernels index the buffer by segment offset - base), times `pre`.
  // `values`: into the buffer as V whatever the chunk's wire format (sharded, the ring converts).
  void pack_chunk(Context& cx, const Plan& plan, std::size_t c, bool aggregated, V pre, bool values = false) {
    TimelineScope span(cx.timeline, Timeline::Kind::pack, "pack", std::int64_t(c));
    ProfileRegion region(Region::pack);
    const Chunk& ch = plan.chunk(c);
    launch_segments(label_pack(), cx.exec, ch.seg_end - ch.seg_begin,
                    PackKernel<V, ExecutionSpace, MemorySpace>{
                        dp_segs_, buffer_, ch.seg_begin, ch.begin - plan.buffer_pos(c), pre, aggregated, wire_,
                        residual_, values ? Compression::none : Compression(ch.kind)});
  }

  // Kept out of line: inlined into complete_chunk, GCC 12 gives its
  // per-segment loop one more instruction (callgrind, bench_sync hostpath).
  // `values`: from the buffer as V (pack_chunk's).
  [[gnu::noinline]] void unpack_chunk(Context& cx, const Plan& plan, std::size_t c, V post, bool values = false) {
    TimelineScope span(cx.timeline, Timeline::Kind::unpack, "unpack", std::int64_t(c));
    ProfileRegion region(Region::unpack);
    const Chunk& ch = plan.chunk(c);
    const int kind = values ? 0 : ch.kind;
    launch_segments(label_unpack(), cx.exec, ch.seg_end - ch.seg_begin,
                    UnpackKernel<V, ExecutionSpace, MemorySpace>{
                        dp_segs_, buffer_, ch.seg_begin, ch.begin - plan.buffer_pos(c), post, wire_, Compression(kind),
                        kind == int(Compression::fp16) ? overflow_ : BufferView<std::int64_t, MemorySpace>{}});
  }

  // Packs chunk c and hands it to the backend without waiting for the reduction.
  void launch_chunk(Context& cx, const Plan& plan, std::size_t c, bool aggregated) {
    if (plan.chunk(c).kind != 0) return launch_compressed(cx, plan, c, aggregated);
    const std::int64_t pos = plan.buffer_pos(c), len = plan.chunk(c).size();
    const std::size_t bytes = std::size_t(len) * sizeof(V);
    // In place, the factors go into the backend's reduction where it can take them (one pass over
    // 1/p of the bytes, in cache); otherwise they are applied before the reduction, a pass that
    // leaves the piece in cache for the backend to read instead of one over memory it has just
    // written. Packed chunks take them in the unpack.
    const bool fold = folds(cx, plan, c, bytes);
    V* data = nullptr;
    if (plan.reduced_in_place(c)) {
      if (!fold) scale_in_place(cx, plan, c, plan.pre_factor() * plan.post_factor());
      data = plan.chunk_data(c);
      cx.stats.bytes_in_place += bytes;
    } else {
      pack_chunk(cx, plan, c, aggregated, plan.pre_factor());
      if (plan.staged()) copy_buffer(cx.exec, staging_, std::size_t(pos), buffer_, std::size_t(pos), std::size_t(len));
      data = (plan.staged() ? staging_.data() : buffer_.data()) + pos;
    }
    // The backend reads the buffer outside Kokkos, unless it is ordered on exec's own stream.
    if (plan.staged() || !ordered_on(cx.backend, cx.exec)) fence(cx.exec, label_fence_pack());
    if (cx.timeline) cx.timeline->reduce_begin(c);
    ProfileRegion region(Region::reduce);  // the sum (blocking), or its start (nonblocking)
    if (plan.blocking() && plan.hierarchical()) {
      if constexpr (has_hierarchical_sum<Backend>::value) cx.backend.hierarchical_allreduce_sum(data, std::size_t(len));
    } else if (plan.blocking()) {
      cx.backend.allreduce_sum(data, std::size_t(len));
    } else if (plan.hierarchical()) {
      requests_[c] = start_hierarchical(cx, data, std::size_t(len));
    } else
      requests_[c] = start_sum(cx, plan, data, std::size_t(len), fold);
    ++cx.stats.allreduce_calls;
    cx.stats.bytes_allreduced += bytes;
    cx.stats.bytes_uncompressed += bytes;
  }

  // Chunks [c, e) as one sum over their regions (SyncPlan::plan_groups; sharded, every chunk):
  // members in place where they are, the packed one in its slot. With N == 1 members are packed as
  // they are and the sum applies both factors to every region (this rank's pre inside the ring when
  // weighted); sharded with N > 1 the buffer's sums were packed with pre and the sum applies post.
  // Sharded it is the reduce-scatter, or with gathering_ the allgather of the slices.
  void launch_group([[maybe_unused]] Context& cx, [[maybe_unused]] const Plan& plan, [[maybe_unused]] std::size_t c,
                    [[maybe_unused]] std::size_t e, [[maybe_unused]] bool aggregated) {
    if constexpr (has_region_sums<Backend>::value || has_shard_sums<Backend>::value) {  // else no groups
      const V pre = plan.windowed() || gathering_ ? V(1) : plan.pre_factor();
      regions_.clear();
      std::size_t bytes = 0;
      for (std::size_t k = c; k < e; ++k) {
        const std::size_t len = std::size_t(plan.chunk(k).size());
        if (plan.reduced_in_place(k)) {
          regions_.push_back(SumRegion<V>{plan.chunk_data(k), len});
          cx.stats.bytes_in_place += len * sizeof(V);
        } else {
          pack_chunk(cx, plan, k, aggregated && !gathering_, pre, true);
          regions_.push_back(SumRegion<V>{buffer_.data() + plan.buffer_pos(k), len});
        }
        bytes += len * sizeof(V);
      }
      if (!ordered_on(cx.backend, cx.exec)) fence(cx.exec, label_fence_pack());
      if (cx.timeline && !gathering_)
        for (std::size_t k = c; k < e; ++k) cx.timeline->reduce_begin(k);
      ProfileRegion region(Region::reduce);
      requests_[c] = start_regions(cx, plan);
      ++cx.stats.allreduce_calls;
      cx.stats.bytes_allreduced += bytes;
      cx.stats.bytes_uncompressed += bytes;
    }
  }
  typename Backend::Request start_regions([[maybe_unused]] Context& cx, [[maybe_unused]] const Plan& plan) {
    [[maybe_unused]] const V both = plan.pre_factor() * plan.post_factor();
    if constexpr (has_shard_sums<Backend>::value) {
      if (gathering_) return cx.backend.iallgather_regions(regions_.data(), regions_.size());
      if (plan.sharded() && !plan.windowed())
        return cx.backend.ireduce_scatter_sum_regions(regions_.data(), regions_.size(), plan.post_factor());
      if (plan.sharded() && plan.weighted())
        return cx.backend.ireduce_scatter_sum_regions(regions_.data(), regions_.size(), plan.post_factor(),
                                                      plan.pre_factor());
      if (plan.sharded()) return cx.backend.ireduce_scatter_sum_regions(regions_.data(), regions_.size(), both);
    }
    if constexpr (has_region_sums<Backend>::value)
      return cx.backend.iallreduce_sum_regions(regions_.data(), regions_.size(), both);
    return typename Backend::Request{};  // never: a plan without groups or shards
  }

  // A compressed chunk: packed into 16-bit values by the pack kernel, summed by the backend in its
  // wire format (staged through host memory when the backend cannot sum it where it lives).
  void launch_compressed(Context& cx, const Plan& plan, std::size_t c, bool aggregated) {
    if (plan.chunk(c).wire_ring) return launch_wire_ring(cx, plan, c);
    const std::int64_t pos = plan.buffer_pos(c), len = plan.chunk(c).size();
    pack_chunk(cx, plan, c, aggregated, plan.pre_factor());
    if (wire_staged_) copy_buffer(cx.exec, wire_staging_, std::size_t(pos), wire_, std::size_t(pos), std::size_t(len));
    std::uint16_t* data = (wire_staged_ ? wire_staging_.data() : wire_.data()) + pos;
    if (wire_staged_ || !ordered_on(cx.backend, cx.exec)) fence(cx.exec, label_fence_pack());
    if (cx.timeline) cx.timeline->reduce_begin(c);
    ProfileRegion region(Region::reduce);  // the sum (blocking), or its start (nonblocking)
    if (plan.chunk(c).kind == int(Compression::fp16))
      sum_wire(cx, plan, c, reinterpret_cast<WireFp16*>(data), std::size_t(len));
    else
      sum_wire(cx, plan, c, reinterpret_cast<WireBf16*>(data), std::size_t(len));
    ++cx.stats.allreduce_calls;
    cx.stats.bytes_allreduced += std::size_t(len) * sizeof(std::uint16_t);
    cx.stats.bytes_uncompressed += std::size_t(len) * sizeof(V);
  }
  // A compressed chunk summed in place by the backend's ring (impl/wire_ring.hpp): both factors and
  // the residuals go with it; nothing is packed or unpacked.
  void launch_wire_ring(Context& cx, const Plan& plan, std::size_t c) {
    const std::int64_t len = plan.chunk(c).size();
    if (!ordered_on(cx.backend, cx.exec)) fence(cx.exec, label_fence_pack());
    if (cx.timeline) cx.timeline->reduce_begin(c);
    ProfileRegion region(Region::reduce);  // the sum (blocking), or its start (nonblocking)
    V* res = residual_.extent(0) > 0 ? residual_.data() + plan.chunk(c).begin : nullptr;
    requests_[c] = start_wire_ring(cx.backend, plan.chunk(c).kind, plan.chunk_data(c), len, plan.pre_factor(),
                                   plan.post_factor(), res);
    ++cx.stats.allreduce_calls;
    cx.stats.bytes_allreduced += std::size_t(len) * sizeof(std::uint16_t);
    cx.stats.bytes_in_place += std::size_t(len) * sizeof(std::uint16_t);
    cx.stats.bytes_uncompressed += std::size_t(len) * sizeof(V);
  }
  // Sharded, a compressed chunk: the ring's reduce-scatter converts as it goes (impl/wire_ring.hpp),
  // over the chunk in place or its values packed into the buffer (with this rank's pre when the
  // buffer holds an aggregation cycle's sums, as launch_group's).
  void launch_wire_shard([[maybe_unused]] Context& cx, [[maybe_unused]] const Plan& plan,
                         [[maybe_unused]] std::size_t c, [[maybe_unused]] bool aggregated) {
    if constexpr (has_wire_shard<Backend>::value) {  // else the plan refused it
      const Chunk& ch = plan.chunk(c);
      const std::size_t len = std::size_t(ch.size());
      V* data = plan.chunk_data(c);
      if (plan.reduced_in_place(c)) {
        cx.stats.bytes_in_place += len * sizeof(std::uint16_t);
      } else {
        pack_chunk(cx, plan, c, aggregated, plan.windowed() ? V(1) : plan.pre_factor(), true);
        data = buffer_.data() + plan.buffer_pos(c);
      }
      if (!ordered_on(cx.backend, cx.exec)) fence(cx.exec, label_fence_pack());
      if (cx.timeline) cx.timeline->reduce_begin(c);
      ProfileRegion region(Region::reduce);
      V* res = residual_.extent(0) > 0 ? residual_.data() + ch.begin : nullptr;
      const V pre = plan.windowed() ? plan.pre_factor() : V(1);
      if (ch.kind == int(Compression::fp16))
        requests_[c] =
            cx.backend.template ireduce_scatter_wire_in_place<WireFp16>(data, len, pre, plan.post_factor(), res);
      else
        requests_[c] =
            cx.backend.template ireduce_scatter_wire_in_place<WireBf16>(data, len, pre, plan.post_factor(), res);
      ++cx.stats.allreduce_calls;
      cx.stats.bytes_allreduced += len * sizeof(std::uint16_t);
      cx.stats.bytes_uncompressed += len * sizeof(V);
    }
  }
  // A completed compressed reduce-scatter: the first sum in this rank's slice that is not finite
  // (fp16), by fused position, for take_overflow's agreement.
  void note_wire_shard([[maybe_unused]] const Plan& plan, [[maybe_unused]] std::size_t c) {
    if constexpr (has_wire_shard<Backend>::value) {
      const std::int64_t bad = requests_[c].non_finite;
      if (bad >= 0) {
        const std::int64_t at = plan.chunk(c).begin + bad;
        wire_shard_bad_ = wire_shard_bad_ < 0 ? at : std::min(wire_shard_bad_, at);
      }
    }
  }

  template <class W>
  void sum_wire([[maybe_unused]] Context& cx, [[maybe_unused]] const Plan& plan, [[maybe_unused]] std::size_t c,
                [[maybe_unused]] W* data, [[maybe_unused]] std::size_t n) {
    if constexpr (sums_wire<Backend>::value) {  // else plan_wire refused the plan
      if (plan.blocking() && plan.hierarchical()) {
        if constexpr (has_hierarchical_sum<Backend>::value) cx.backend.hierarchical_allreduce_sum(data, n);
      } else if (plan.blocking()) {
        cx.backend.allreduce_sum(data, n);
      } else if (plan.hierarchical()) {
        requests_[c] = start_hierarchical(cx, data, n);
      } else {
        requests_[c] = cx.backend.iallreduce_sum(data, n);
      }
    }
  }

  // The three stages of Algorithm::hierarchical, nonblocking (the plan blocks where the backend cannot).
  template <class T>
  typename Backend::Request start_hierarchical([[maybe_unused]] Context& cx, [[maybe_unused]] T* data,
                                               [[maybe_unused]] std::size_t n) {
    if constexpr (has_nonblocking_hierarchical_sum<Backend>::value)
      return cx.backend.ihierarchical_allreduce_sum(data, n);
    return typename Backend::Request{};  // never: blocking (the plan)
  }

  typename Backend::Request start_sum(Context& cx, const Plan& plan, V* data, std::size_t n, bool fold) {
    if constexpr (has_weighted_fold<Backend>::value)
      if (fold && plan.weighted()) return cx.backend.iallreduce_sum(data, n, plan.post_factor(), plan.pre_factor());
    if constexpr (has_folds_factor<Backend>::value)
      if (fold) return cx.backend.iallreduce_sum(data, n, V(plan.pre_factor() * plan.post_factor()));
    return cx.backend.iallreduce_sum(data, n);
  }

  // Whether the factors of chunk c go into the backend's reduction (see launch_chunk).
  static bool folds(Context& cx, const Plan& plan, std::size_t c, std::size_t bytes) {
    // Weighted (set_samples), this rank's factor must meet its values before the sum.
    return plan.reduced_in_place(c) && !plan.blocking() && !plan.hierarchical() &&
           (!plan.weighted() || has_weighted_fold<Backend>::value) && folds_factor(cx.backend, bytes);
  }

  // Waits for the oldest chunk in flight (or its group) and unpacks it into the gradients.
  void complete_chunk(Context& cx, const Plan& plan) {
    const std::size_t c = completed_, e = plan.group_end(c);
    completed_ = e;
    --flying_;
    const std::int64_t waited_from = cx.timeline && !plan.blocking() ? Timeline::now() : 0;
    // Nonblocking collectives are waited under the stall watchdog (blocking ones cannot be).
    if (!plan.blocking()) {
      ProfileRegion region(Region::reduce);
      const char* what = gathering_ ? "allgather" : plan.sharded() ? "reduce-scatter" : "allreduce";
      wait_for(cx.backend, requests_[c], cx.ctl, cx.opt,
               WaitSite{what, std::int64_t(cx.stats.passes), std::int64_t(c), std::int64_t(plan.num_chunks())});
    }
    const Route how = route(plan, c, e);
    if (how != Route::alone) {  // launch_group's or launch_wire_shard's: the factors are in already
      if (how == Route::wire_shard) note_wire_shard(plan, c);
      for (std::size_t k = c; k < e; ++k) {
        if (cx.timeline && !gathering_) cx.timeline->reduce_end(k, waited_from);
        if (!plan.reduced_in_place(k)) unpack_chunk(cx, plan, k, V(1), true);
      }
      return;
    }
    if (cx.timeline) cx.timeline->reduce_end(c, waited_from);
    if (plan.reduced_in_place(c)) {  // scaled before or in the reduction
      if (plan.chunk(c).wire_ring && wire_ring_non_finite<Backend>(requests_[c]) >= 0)  // fp16 only
        wire_non_finite_ = plan.chunk_data(c) + wire_ring_non_finite<Backend>(requests_[c]);
      return;
    }
    const std::int64_t pos = plan.buffer_pos(c), len = plan.chunk(c).size();
    if (plan.chunk(c).kind != 0) {
      if (wire_staged_)
        copy_buffer(cx.exec, wire_, std::size_t(pos), wire_staging_, std::size_t(pos), std::size_t(len));
    } else if (plan.staged()) {
      copy_buffer(cx.exec, buffer_, std::size_t(pos), staging_, std::size_t(pos), std::size_t(len));
    }
    unpack_chunk(cx, plan, c, plan.post_factor());
  }

  // Launches chunks [launched_, end) in fused order. Nonblocking: chunk k is reduced while chunk
  // k+1 is packed and chunk k-1 unpacked, up to max_chunks_in_flight chunks in flight, packed ones each in
  // a slot of the buffer; without `may_block` it stops where it would have to wait. Blocking:
  // each chunk is packed, reduced and unpacked before the next (one slot, which stays hot).
  // A group of chunks goes as one collective once every member is ready.
  template <class Scan>
  void launch_through(Context& cx, const Plan& plan, std::size_t end, bool aggregated, bool may_block, Scan& scan) {
    while (launched_ < end) {
      const std::size_t c = launched_, e = plan.group_end(c);
      if (e > end) return;
      while (!plan.blocking() && (flying_ >= std::size_t(plan.in_flight()) || slot_taken(plan, c, e))) {
        if (!may_block) return;
        complete_chunk(cx, plan);
      }
      for (std::size_t k = c; k < e; ++k) scan(plan.chunk(k).seg_begin, plan.chunk(k).seg_end);  // before it leaves
      const Route how = route(plan, c, e);
      if (how == Route::group)
        launch_group(cx, plan, c, e, aggregated);
      else if (how == Route::wire_shard)
        launch_wire_shard(cx, plan, c, aggregated);
      else
        launch_chunk(cx, plan, c, aggregated);
      launched_ = e;
      ++flying_;
      if (plan.blocking()) complete_chunk(cx, plan);
    }
  }
  // How chunk c (its group [c, e)) goes: as one collective over regions (plan_groups; sharded,
  // every uncompressed chunk and every allgather), as a compressed reduce-scatter, or alone.
  enum class Route { group, wire_shard, alone };
  Route route(const Plan& plan, std::size_t c, std::size_t e) const {
    if (e > c + 1) return Route::group;
    if (!plan.sharded()) return Route::alone;
    if (gathering_ || plan.chunk(c).kind == 0) return Route::group;
    return plan.wire_shard(c) ? Route::wire_shard : Route::alone;  // alone: one rank, as unsharded
  }

  // Whether a packed chunk of [c, e) waits for the previous user of its slot.
  bool slot_taken(const Plan& plan, std::size_t c, std::size_t e) const {
    for (std::size_t k = c; k < e; ++k)
      if (plan.prev_in_slot(k) >= 0 && std::size_t(plan.prev_in_slot(k)) >= completed_) return true;
    return false;
  }

  // The step in progress (whether one is open: impl::SyncStep): chunks launched and completed so
  // far, collectives in flight, and which chunks are ready.
  std::size_t launched_ = 0, completed_ = 0, flying_ = 0;
  bool gathering_ = false;  // gather(): the sharded allgather, not the step's exchange
  ReadyTracker ready_;
  std::vector<typename Backend::Request> requests_;  // per chunk (a group's: its first chunk's)
  std::vector<SumRegion<V>> regions_;                // launch_group's operand (reserved: no allocation)

  Buffer buffer_, local_acc_;
  BufferView<V, staging_space_t<MemorySpace>> staging_;
  SegView dp_segs_, local_segs_, deferred_segs_, residual_segs_;
  std::int64_t n_dp_segs_ = 0, n_local_segs_ = 0, n_deferred_segs_ = 0, n_residual_segs_ = 0;
  std::array<SegView, sample_weightings> weighted_segs_;  // set_samples: per SampleWeighting but none
  std::array<std::int64_t, sample_weightings> n_weighted_segs_ = {};
  // Compression (plan_wire): the 16-bit chunks, their host staging, this rank's rounding residuals
  // (error feedback, by fused position), the fp16 overflow flag and the segments, to find a tensor.
  WireBuffer wire_;
  BufferView<std::uint16_t, staging_space_t<MemorySpace>> wire_staging_;
  bool wire_staged_ = false;
  const V* wire_non_finite_ = nullptr;  // fp16 in place: a sum the ring found not finite this step
  std::int64_t wire_shard_bad_ = -1;    // sharded fp16: the first such sum in this rank's slice (fused)
  Buffer residual_;
  BufferView<std::int64_t, MemorySpace> overflow_;
  BufferView<std::int64_t, staging_space_t<MemorySpace>> overflow_host_;
  std::vector<Seg> host_segs_;
};

}  // namespace gradsync::impl
