// gradsync: impl::SyncPlan, what a GradientSync sends, in which chunks, by which algorithm.
//
// Decided from the topology and the options when the sync is built (the candidates, of which the
// PlanTuner may time several on the first steps), and laid out from the registrations: chunks in
// fused order, which of them are reduced in place, which buffer slot each packed one takes, the
// scale factors folded into the unpack, the segments of the local tensors. Host-side decisions
// only: the buffers and the device copies of the segments belong to the SyncEngine, which runs the
// plan. The layout is rebuilt only when registrations change (or the tuner moves on): dirty().
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../backend_traits.hpp"
#include "../compression.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "../stats.hpp"
#include "../topology.hpp"
#include "consistency.hpp"
#include "fusion_kernels.hpp"
#include "fusion_plan.hpp"
#include "plan_tuner.hpp"
#include "segment_table.hpp"
#include "sync_registry.hpp"
#include "test_hooks.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace>
class SyncPlan {
 public:
  using Seg = Segment<V>;
  using FusedTensor = typename FusionPlan<V>::Tensor;

  // What build() hands the engine to provision: the segments to upload and the sizes to allocate.
  struct Layout {
    std::vector<FusedTensor> data_parallel;  // in fused order
    std::vector<Seg> segments;               // data-parallel, split at chunk boundaries
    std::vector<Seg> local_segments;         // local tensors scaled (or accumulated) in place
    std::vector<Seg> deferred_segments;      // local tensors whose scale the caller applies
    // set_samples: local tensors weighted by samples, one list per SampleWeighting but none (its
    // factors at run time: local_weights())
    std::array<std::vector<Seg>, sample_weightings> weighted_segments;
    std::int64_t capacity = 0;                                         // fusion buffer elements
    std::int64_t total = 0;                                            // data-parallel elements
    std::int64_t local_total = 0;                                      // local accumulator elements (N > 1)
    std::vector<std::pair<std::int64_t, std::int64_t>> tensor_chunks;  // per fused tensor
  };

  // stream_ordered: the backend's collectives run in order on the sync's own stream (ordered_on).
  SyncPlan(const Backend& backend, const Options& opt, bool stream_ordered)
      : topology_(find_topology(backend)),
        choices_(plan_candidates(opt, topology_, backend.size(), stream_ordered)),
        tuner_(choices_.size()),
        collectives_block_(opt.shard == Shard::none &&
                           (opt.tuning.collectives == Collectives::blocking ||
                            (opt.tuning.collectives == Collectives::automatic && prefers_blocking(backend)))),
        sharded_(opt.shard != Shard::none) {}

  // --- The decision (the same on every rank: the topology is, the options are compared) ---

  const Topology& topology() const { return topology_; }
  const std::vector<PlanChoice>& choices() const { return choices_; }
  const PlanTuner& tuner() const { return tuner_; }
  const PlanChoice& current() const { return choices_[tuner_.current()]; }
  std::size_t fusion_threshold_bytes() const { return std::min(current().chunk_bytes, fill_cap_); }
  Algorithm algorithm() const { return current().algorithm; }
  int chunks_in_flight() const { return current().in_flight; }
  bool collectives_block() const { return collectives_block_; }  // Options::tuning.collectives as resolved
  bool blocking() const { return blocking_; }
  bool hierarchical() const { return hierarchical_; }
  int in_flight() const { return in_flight_; }

  // Options::tuning.timeline: names the plan's tensors (fused order) and chunks.
  void note_in(Timeline& t, const std::vector<std::string>& names,
               const std::vector<std::pair<std::int64_t, std::int64_t>>& tensor_chunks) const {
    t.plan(
        names, tensor_chunks, num_chunks(),
        [&](std::size_t c) {  // the bytes on the wire, as stats().bytes_allreduced counts them
          return std::make_pair(wire_bytes(c), reduced_in_place(c));
        },
        to_string(algorithm()), blocking() ? 1 : in_flight());
  }

  // The candidates' hash, agreed with the options (chunks in flight may differ: they change no collective).
  std::int64_t candidates_hash() const {
    std::uint64_t h = fnv1a(&topology_.nodes, sizeof(int));
    h = fnv1a(&topology_.max_local_size, sizeof(int), h);
    for (const PlanChoice& c : choices_) {
      const std::int64_t w[2] = {std::int64_t(c.chunk_bytes), std::int64_t(c.algorithm)};
      h = fnv1a(w, sizeof w, h);
    }
    return std::int64_t(h >> 1);
  }

  // Host staging: when the backend cannot read the buffer's memory space, or when asked to.
  static bool staging_wanted(const Backend& backend, const Options& opt) {
    return opt.tuning.host_staging == HostStaging::always || !backend.template can_access<MemorySpace>();
  }

  // The candidate to run now. The same on every rank: the topology is, the options are compared,
  // and the tuner moves on after the same number of steps and picks from agreed timings.
  void apply_choice(Stats& stats) {
    const PlanChoice& c = current();
    hierarchical_ = c.algorithm == Algorithm::hierarchical;
    // Where the backend has no nonblocking form of the three stages, they are blocking calls.
    blocking_ = collectives_block_ || (hierarchical_ && !has_nonblocking_hierarchical_sum<Backend>::value);
    in_flight_ = c.in_flight;
    stats.nodes = std::uint64_t(topology_.nodes);
    stats.algorithm = c.algorithm;
    stats.chunk_bytes = c.chunk_bytes;
    stats.chunks_in_flight = std::uint64_t(blocking_ ? 1 : c.in_flight);
  }

  // fusion_threshold_auto / automatic: time this step, move to the next candidate or settle.
  template <class AgreeMax>
  void tune(double seconds, AgreeMax&& agree_max, Stats& stats, Timeline* timeline) {
    if (tuner_.record(seconds, agree_max)) {
      dirty_ = true;
      apply_choice(stats);
    }
    if (timeline) timeline->tuned(seconds, fusion_threshold_bytes(), to_string(algorithm()), !tuner_.active());
  }

  // --- The layout, rebuilt when registrations change ---

  bool dirty() const { return dirty_; }
  void invalidate() { dirty_ = true; }
  // Registrations changed: rebuild, and merge no neighbours until the ranks agree again.
  void registrations_changed() {
    dirty_ = true;
    merge_neighbours_ = false;
  }
  // Whether every rank has the same neighbours in memory (SyncChecks::neighbours_agree).
  // Rebuilt before the step's first collective (only N == 1 reduces in place: no rebuild mid-cycle).
  void set_merge_neighbours(bool agreed, int passes_per_step) {
    if (agreed != merge_neighbours_ && passes_per_step == 1) dirty_ = true;
    merge_neighbours_ = agreed;
  }

  Layout build(const SyncRegistry<V>& registry, const Options& opt, int ranks, bool staged, const Backend& backend) {
    const int N = opt.backward_passes_per_step;
    const V inv_agg = opt.average_aggregated_gradients ? V(1) / V(N) : V(1);
    Layout L;

    // Data-parallel tensors in fused order: offsets, chunks, segments split at chunk boundaries.
    L.data_parallel = registry.data_parallel_in_fused_order(opt);
    fill_cap_ = ~std::size_t(0);
    if (current().fill) {     // the same on every rank: the registrations are compared, and the
      std::size_t bytes = 0;  // rule's chunks in flight, not the option (ranks may differ in it)
      for (const FusedTensor& t : L.data_parallel) bytes += t.size * sizeof(V);
      fill_cap_ = network_chunk_for_model(current().chunk_bytes, bytes, network_chunks_in_flight(ranks));
    }
    // Large tensors are reduced where they are, in chunks of their own, skipping both copies
    // through the fusion buffer: not when staged or when the buffer holds aggregated sums.
    windowed_ = N == 1;
    staged_ = staged;
    in_place_ = windowed_ && !staged_;
    const double own = std::max(std::ceil(opt.tuning.in_place_min_fraction * double(chunk_limit())),
                                double(opt.tuning.in_place_min_bytes / sizeof(V)));
    const std::int64_t own_min = in_place_ && own < 9e18 ? std::max<std::int64_t>(1, std::int64_t(own))
                                                         : std::numeric_limits<std::int64_t>::max();
    auto plan = FusionPlan<V>::build(L.data_parallel, std::int64_t(chunk_limit()), fusion_threshold_bytes() == 0,
                                     own_min, merge_neighbours_, std::int64_t(chunk_limit(sizeof(std::uint16_t))));
    chunks_ = std::move(plan.chunks);
    for (Chunk& ch : chunks_)  // compressed chunks in place where the backend's ring converts as it goes
      ch.wire_ring =
          in_place_ && !blocking_ && !hierarchical_ && ch.contiguous && wire_ring_fits(backend, ch.kind, ch.size());
    wire_shards_ = sharded_ && ranks > 1;
    if (wire_shards_)            // every compressed chunk is a ring's reduce-scatter: in place where it is on every
      for (Chunk& ch : chunks_)  // rank, else from the fusion buffer
        ch.wire_ring = in_place_ && ch.own && ch.kind != 0;
    // Without aggregation the buffer is chunk-sized slots that chunks cycle through (one when each
    // chunk is reduced before the next is packed); with it the buffer holds every data-parallel
    // sum between passes.
    slots_ = blocking_ ? 1 : pipeline_depth;
    // Packed chunks take the buffer's slots in turn; a chunk waits for the previous user of its slot.
    slot_of_.assign(chunks_.size(), -1);
    prev_in_slot_.assign(chunks_.size(), -1);
    {
      std::vector<std::int64_t> last(std::size_t(slots_), -1);
      std::int64_t packed = 0;
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        if (reduced_in_place(c)) continue;
        const std::int64_t slot = packed++ % slots_;
        slot_of_[c] = slot;
        prev_in_slot_[c] = last[std::size_t(slot)];
        last[std::size_t(slot)] = std::int64_t(c);
      }
    }
    plan_groups(backend);
    find_owned(plan.segments, ranks, backend.rank());
    slot_size_ = windowed_ ? plan.widest : 0;
    L.capacity = windowed_ ? plan.widest * std::min<std::int64_t>(slots_, std::int64_t(chunks_.size())) : plan.total;
    L.total = plan.total;
    first_ptr_.assign(chunks_.size(), nullptr);
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (chunks_[c].seg_end > chunks_[c].seg_begin)
        first_ptr_[c] = plan.segments[std::size_t(chunks_[c].seg_begin)].ptr;
    L.segments = std::move(plan.segments);
    L.tensor_chunks = std::move(plan.tensor_chunks);

    // Local tensors: scaled in place, accumulated beside the buffer when N > 1.
    // Deferred tensors (defer_local_scale) keep their sums; their factor goes to the deferred
    // segments, which apply_local_scale() runs when the caller wants the pass after all.
    for (const auto& e : registry) {
      if (!e.local() || e.size == 0) continue;
      const V s = SyncRegistry<V>::local_factor(e, opt, ranks);
      if (e.defer_scale && s != V(1))
        for_each_segment(e.size, [&](std::int64_t off, std::int64_t len) {
          L.deferred_segments.push_back(Seg{e.data + off, 0, len, s});
        });
      const SampleWeighting w = SyncRegistry<V>::weighting(e, opt);
      if (weighted_ && w != SampleWeighting::none) {  // e.g. n_rk per pass, 1/N per step
        for_each_segment(e.size, [&, base = L.local_total](std::int64_t off, std::int64_t len) {
          L.weighted_segments[std::size_t(w) - 1].push_back(Seg{e.data + off, base + off, len, V(1)});
        });
        L.local_total += std::int64_t(e.size);
        continue;
      }
      const V applied = e.defer_scale ? V(1) : s;
      if (N == 1 && applied == V(1)) continue;  // nothing to do for this tensor
      for_each_segment(e.size, [&, base = L.local_total](std::int64_t off, std::int64_t len) {
        L.local_segments.push_back(Seg{e.data + off, base + off, len, applied});
      });
      L.local_total += std::int64_t(e.size);
    }

    double post = opt.postscale_factor * double(inv_agg);
    if (opt.op == ReduceOp::average) post /= double(ranks);
    post_factor_ = V(post);
    pre_factor_ = V(opt.prescale_factor);
    return L;
  }

  // The layout is in use (the engine holds its buffers).
  void built() { dirty_ = false; }

  std::size_t num_chunks() const { return chunks_.size(); }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  const Chunk& chunk(std::size_t c) const { return chunks_[c]; }
  bool staged() const { return staged_; }
  bool in_place() const { return in_place_; }
  V pre_factor() const { return pre_factor_; }
  V post_factor() const { return post_factor_; }

  // set_samples(): the weighted sync's factors change every pass. Weighted, a rank's samples go
  // before the sum (pre_factor), so in-place chunks never fold the factors into the reduction.
  bool weighted() const { return weighted_; }
  void set_weighted() {
    weighted_ = true;
    dirty_ = true;
  }
  // This pass: the data-parallel factors (pre: prescale x this rank's samples; post: postscale,
  // divided by the step's samples for an average) and the weighted local tensors' (own: this
  // rank's samples in this pass; total: 1 / the step's samples, 1 before the reducing pass).
  void set_step_factors(V pre, V post, const SampleWeights<V>& w) {
    pre_factor_ = pre;
    post_factor_ = post;
    weights_ = w;
  }
  const SampleWeights<V>& weights() const { return weights_; }

  // Where chunk c lives in the buffer: its slot when windowed, its own place otherwise.
  std::int64_t buffer_pos(std::size_t c) const { return windowed_ ? slot_of_[c] * slot_size_ : chunks_[c].begin; }
  // A packed chunk waits for the previous user of its slot (-1: none, or in place).
  std::int64_t prev_in_slot(std::size_t c) const { return prev_in_slot_[c]; }
  // Compressed chunks only where the backend's ring converts as it goes; others need their 16-bit copy.
  bool reduced_in_place(std::size_t c) const {
    return chunks_[c].kind == 0 ? in_place_ && chunks_[c].contiguous : chunks_[c].wire_ring;
  }
  // Options::shard: each group (or chunk) is reduce-scattered, this rank keeping shard_slice of it;
  // owned(): those slices in the gradients' memory, in fused order (empty unless sharded).
  bool sharded() const { return sharded_; }
  // Sharded over several ranks, a compressed chunk goes as the backend's compressed reduce-scatter
  // (Capability::wire_shard); at one rank as an unsharded compressed chunk (the slice is everything).
  bool wire_shard(std::size_t c) const { return wire_shards_ && chunks_[c].kind != 0; }
  const std::vector<std::pair<V*, std::size_t>>& owned() const { return owned_; }
  // Per slice of owned(): the end of the group of chunks it lies in (its allgather can start
  // once every slice before that end is updated).
  const std::vector<std::size_t>& owned_chunk_ends() const { return owned_end_; }
  // The buffer is chunk-sized slots (N == 1) rather than every sum of an aggregation cycle.
  bool windowed() const { return windowed_; }
  // Chunks summed as one collective (plan_groups): chunk c's group is [group_begin(c), group_end(c)).
  std::size_t group_begin(std::size_t c) const { return groups_[c].first; }
  std::size_t group_end(std::size_t c) const { return groups_[c].second; }
  bool grouped(std::size_t c) const { return groups_[c].second - groups_[c].first > 1; }
  // The most chunks one group holds (1: none grouped).
  std::size_t widest_group() const { return widest_group_; }
  // Where an in-place chunk starts in the gradients' memory.
  V* chunk_data(std::size_t c) const { return first_ptr_[c]; }
  // Bytes chunk c hands to the backend.
  std::size_t wire_bytes(std::size_t c) const {
    return std::size_t(chunks_[c].size()) * (chunks_[c].kind != 0 ? sizeof(std::uint16_t) : sizeof(V));
  }

 private:
  static constexpr std::int64_t pipeline_depth = 2;  // buffer slots for nonblocking packed chunks

  // Elements per chunk: the threshold in values (at least one), never more than one call can take.
  // A threshold of 0 means no fusion: chunks then follow tensor boundaries instead.
  // Compressed chunks (value_bytes 2) hold twice as many values: the threshold counts bytes handed to
  // the backend.
  std::size_t chunk_limit(std::size_t value_bytes = sizeof(V)) const {
    const std::size_t threshold = fusion_threshold_bytes();
    if (threshold == 0) return max_chunk_elements();
    const std::size_t by_bytes = threshold / value_bytes;
    return std::max<std::size_t>(1, std::min(by_bytes, max_chunk_elements()));
  }

  // Consecutive chunks summed as one collective over their regions (Capability::region_sums), up to
  // a chunk's worth of values: raw MPI sends a small model as one buffer, and one collective per
  // large tensor plus one for the packed slot cost DLRM's MLP 1.16x raw (docs/BENCHMARKS.md). Only
  // plain nonblocking in-place sums (a factor folded for every region alike: not weighted), and at
  // most one chunk that is not a region of its own, so that no packed member waits for its slot on
  // another member. Decided from sizes, kinds and the plan, which every rank shares, never from
  // addresses (a packed chunk may be in place on one rank only): the regions' sizes agree.
  // Sharded, every group and chunk is a reduce-scatter over regions (the ring at any size), weighted
  // or not.
  void plan_groups([[maybe_unused]] const Backend& backend) {
    groups_.resize(chunks_.size());
    for (std::size_t c = 0; c < chunks_.size(); ++c) groups_[c] = {c, c + 1};
    widest_group_ = 1;
    if constexpr (has_region_sums<Backend>::value || has_shard_sums<Backend>::value) {
      if (!in_place_ || blocking_ || hierarchical_ || (weighted_ && !sharded_) || fusion_threshold_bytes() == 0) return;
      const std::int64_t limit = std::int64_t(chunk_limit());
      for (std::size_t c = 0; c < chunks_.size();) {
        std::size_t e = c;
        std::int64_t total = 0;
        bool packed = false;
        for (; e < chunks_.size() && chunks_[e].kind == 0 && total + chunks_[e].size() <= limit; ++e) {
          if (!chunks_[e].own && packed) break;
          packed = packed || !chunks_[e].own;
          total += chunks_[e].size();
        }
        if (e > c + 1 && (sharded_ || sums_regions(backend, std::size_t(total) * sizeof(V)))) {
          for (std::size_t k = c; k < e; ++k) groups_[k] = {c, e};
          widest_group_ = std::max(widest_group_, e - c);
        }
        c = std::max(e, c + 1);
      }
    }
  }

  static bool sums_regions([[maybe_unused]] const Backend& b, [[maybe_unused]] std::size_t bytes) {
    if constexpr (has_region_sums<Backend>::value) return b.sums_regions(bytes);
    return false;
  }

  // This rank's slice of each group (shard_slice of its values in fused order), as pieces of the
  // gradients (the segments', which lie in fused order), neighbours merged.
  void find_owned(const std::vector<Seg>& segs, int ranks, int rank) {
    owned_.clear();
    owned_end_.clear();
    if (!sharded_) return;
    for (std::size_t c = 0; c < chunks_.size(); c = groups_[c].second) {
      const Chunk &first = chunks_[c], &last = chunks_[groups_[c].second - 1];
      const auto [lo, hi] = shard_slice(std::size_t(last.end - first.begin), ranks, rank);
      const std::int64_t a = first.begin + std::int64_t(lo), b = first.begin + std::int64_t(hi);
      for (std::int64_t k = first.seg_begin; k < last.seg_end; ++k) {
        const Seg& g = segs[std::size_t(k)];
        const std::int64_t x = std::max(a, g.off), y = std::min(b, g.off + g.count);
        if (x >= y) continue;
        V* at = g.ptr + (x - g.off);
        if (!owned_.empty() && owned_.back().first + owned_.back().second == at) {
          owned_.back().second += std::size_t(y - x);
          owned_end_.back() = groups_[c].second;
        } else {
          owned_.emplace_back(at, std::size_t(y - x));
          owned_end_.push_back(groups_[c].second);
        }
      }
    }
  }

  static Topology find_topology(const Backend& b) {
    if constexpr (has_topology<Backend>::value) {
      return b.topology();
    } else {
      Topology t;  // cannot tell: one node
      t.local_size = t.min_local_size = t.max_local_size = b.size();
      t.local_rank = b.rank();
      return t;
    }
  }

  // What the plan may run: the options' values, and where they leave the choice to the plan, the
  // topology's. Across nodes (the network between some ranks) chunks are smaller and fewer are in
  // flight (docs/BENCHMARKS.md, "Across hosts"); Algorithm::automatic there times flat against
  // hierarchical when some node holds several ranks. Each further chunk size of
  // fusion_threshold_auto is a candidate too. A backend ordered on the sync's stream (NcclBackend
  // on the sync's own stream) runs pack, collective and unpack of every chunk one after another on
  // that stream: smaller chunks overlap nothing there and only add calls and launches, so its chunks
  // are 64 MiB (Horovod's fusion buffer), and auto tries that size first.
  static std::vector<PlanChoice> plan_candidates(const Options& o, const Topology& t, int ranks, bool stream_ordered) {
    const bool network = t.spans_nodes();
    constexpr std::size_t ordered_chunk = std::size_t(64) << 20;
    std::vector<std::size_t> sizes;
    if (o.tuning.fusion_threshold_bytes == fusion_threshold_auto) {
      sizes = chunk_candidates();
      if (stream_ordered) sizes.insert(sizes.begin(), ordered_chunk);
    } else if (o.tuning.fusion_threshold_bytes == fusion_threshold_by_topology) {
      sizes = {stream_ordered ? ordered_chunk : network ? network_chunk_bytes(ranks) : std::size_t(4) << 20};
    } else {
      sizes = {o.tuning.fusion_threshold_bytes};
    }
    const bool fill = network && !stream_ordered && o.tuning.fusion_threshold_bytes == fusion_threshold_by_topology;
    const int in_flight = o.tuning.max_chunks_in_flight > 0 ? o.tuning.max_chunks_in_flight
                          : network                         ? network_chunks_in_flight(ranks)
                                                            : 16;
    std::vector<Algorithm> algorithms;
    if (o.tuning.algorithm == Algorithm::hierarchical) {
      if constexpr (!has_hierarchical_sum<Backend>::value)
        throw ConfigError(cat("algorithm = hierarchical, but backend '", Backend::name(),
                              "' has no hierarchical sum (MpiBackend has); use flat or automatic"));
      algorithms = {Algorithm::hierarchical};
    } else if (o.tuning.algorithm == Algorithm::automatic && o.shard == Shard::none && t.hierarchical_helps() &&
               has_hierarchical_sum<Backend>::value) {
      algorithms = {Algorithm::flat, Algorithm::hierarchical};
    } else {
      algorithms = {Algorithm::flat};
    }
    std::vector<PlanChoice> c;
    for (Algorithm a : algorithms)
      for (std::size_t b : sizes) c.push_back({b, in_flight, a, fill});
    return c;
  }

  Topology topology_;
  std::vector<PlanChoice> choices_;         // what the plan may run (plan_candidates)
  PlanTuner tuner_;                         // which of them runs now
  bool collectives_block_ = false;          // Options::tuning.collectives as resolved for this backend
  bool blocking_ = false;                   // one blocking allreduce per chunk (collectives_block_, or hierarchical)
  bool hierarchical_ = false;               // chunks summed in three stages (Algorithm::hierarchical)
  int in_flight_ = 1;                       // nonblocking chunks reduced at once
  std::size_t fill_cap_ = ~std::size_t(0);  // PlanChoice::fill: the model's cap on the chunk, set by build()

  bool dirty_ = true;
  bool merge_neighbours_ = false;  // every rank has the same neighbours in memory
  bool windowed_ = true;           // the buffer is slots that chunks cycle through (N == 1)
  bool staged_ = false;
  bool in_place_ = false;  // contiguous chunks are reduced in the gradients' memory
  std::vector<Chunk> chunks_;
  std::vector<V*> first_ptr_;                                // per chunk, its first value in the gradients
  std::vector<std::pair<std::size_t, std::size_t>> groups_;  // per chunk, its group [begin, end)
  bool sharded_ = false;                                     // Options::shard
  bool wire_shards_ = false;                                 // sharded over several ranks (wire_shard)
  std::vector<std::pair<V*, std::size_t>> owned_;            // sharded: this rank's slices
  std::vector<std::size_t> owned_end_;                       // and the end of each one's group
  std::size_t widest_group_ = 1;
  std::int64_t slot_size_ = 0;
  std::int64_t slots_ = pipeline_depth;
  std::vector<std::int64_t> slot_of_, prev_in_slot_;  // per chunk: its slot (-1: in place), the slot's previous chunk
  V pre_factor_ = 1, post_factor_ = 1;
  bool weighted_ = false;
  SampleWeights<V> weights_;
};

}  // namespace gradsync::impl
