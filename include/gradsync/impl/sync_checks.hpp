// gradsync: impl::SyncChecks, every agreement the ranks reach before they exchange gradients.
//
// Collectives that disagree hang or corrupt silently, so before each step's first collective the
// ranks agree, on the side channel and under the stall deadline, that all of them have arrived at
// the same call with the same settings (the arrival round, and on the blocking path a commit
// round); when registrations changed they compare them (impl/consistency.hpp) and whether their
// gradients are neighbours in memory alike. Local checks (tensors resized since registration,
// Options::check_finite, host staging that cannot work, fp16 overflow) fail on this rank and tell
// the peers first, so none of them waits for it. It owns what these checks remember between calls:
// whether registrations changed since the last comparison, the resolved protocol facts and the
// hash of the option words. It reads the registrations, the plan's neighbours and the engine's
// segments; it changes neither (the facade passes its verdicts on).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend_traits.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "consistency.hpp"
#include "finite.hpp"
#include "fusion_plan.hpp"
#include "stall.hpp"
#include "sync_context.hpp"
#include "sync_plan.hpp"
#include "sync_registry.hpp"
#include "timeline.hpp"

namespace gradsync::impl {

template <class Backend, class V, class MemorySpace, class ExecutionSpace>
class SyncChecks {
 public:
  using Context = SyncContext<Backend, ExecutionSpace>;
  using Registry = SyncRegistry<V>;
  using SegView = SegmentView<V, MemorySpace>;

  // What the arrival round found.
  struct Arrival {
    bool registrations_changed = false;  // on some rank: every rank compares them
    bool options_differ = false;         // every rank knows: the comparison names the option
    std::int64_t samples = 0;            // the sum over ranks of the samples given (set_samples)
  };

  // What a rank brings to the arrival round about set_samples(): whether its sync is weighted, and
  // its samples in the aggregation cycle so far (prepare(): neither, `neutral`).
  struct Samples {
    bool neutral = true;
    bool weighted = false;
    std::int64_t cycle = 0;
  };

  // `blocking`, `staged` and `plan` (SyncPlan::candidates_hash) as this rank resolved them: they
  // are agreed with the options.
  SyncChecks([[maybe_unused]] const Backend& backend, bool blocking, bool staged, std::int64_t plan)
      : agreed_(has_mpi_comm<Backend>::value) {
    facts_.blocking = blocking;
    facts_.staged = staged;
    facts_.plan = plan;
    if constexpr (has_cuda_aware<Backend>::value) facts_.cuda_aware = backend.cuda_aware();
  }

  // Whether the ranks agree before every exchange (a side channel with deadlines), or on the
  // first call only (a backend without one: its collectives block).
  bool agrees_each_call() const { return agreed_; }
  bool agreed_once() const { return agreed_once_; }
  // Registrations changed since the ranks last compared them.
  bool registrations_pending() const { return need_check_; }
  void registrations_changed() { need_check_ = true; }

  // A registered vector that was resized or reallocated since add() fails here.
  void check_not_resized(Context& cx, const Registry& registry) {
    registry.for_each_requeried([&](const auto& e) {
      const auto now = e.requery();
      if (now.first != e.data || now.second != e.size)
        fail_here(cx, ErrorKind::error,
                  cat("tensor '", e.name, "' (group ", e.group,
                      ") was resized or reallocated after it was "
                      "registered (",
                      e.size, " -> ", now.second, " elements) on rank ", cx.backend.rank(),
                      "; build a new GradientSync and register it again after resizing"));
    });
  }

  // Before each exchange the ranks agree, on the side channel and under the stall deadline, that
  // all of them have arrived at this synchronize() call (on every call, whatever the local
  // settings say, so that this round is the one collective every rank always runs: it cannot
  // itself mismatch). It carries a hash of everything that shapes the plan or the protocol
  // (the options, the resolved collectives, staging and CUDA-awareness: impl::OptionWords), so
  // ranks whose settings differ all throw a MismatchError naming the setting before any other
  // collective, whatever their check modes, deadlines or check_finite say. The round also tells
  // every rank whether any rank's registrations changed, so all of them run the consistency
  // check, and a change on one rank only is a MismatchError, not a stall; a rank that called
  // synchronize() more often is one too. Blocking collectives cannot be given a deadline, so on
  // the blocking path a second round commits (commit()): a rank that gives up in round 1 never
  // posts round 2, so a rank that arrives late and completes round 1 waits in round 2 and stops
  // too, instead of blocking in a collective its peers have left. Once round 2 completes every rank
  // is committed: the chunks follow with no user code in between. Nonblocking chunks are watched
  // themselves and need no commit. One or two small allreduces of latency per call. Backends
  // without a side channel run round 1 on the first call only (their collectives block).
  // prepare() sends its call number negated, so a rank in prepare() never matches one in synchronize().
  // The samples (set_samples) ride along: whether each rank is weighted (MIN of the flag and of its
  // negation) and their sum, one more word summed in the same collective.
  Arrival arrive(Context& cx, bool preparing, const Samples& samples = {}) {
    const std::int64_t call = std::int64_t(cx.stats.passes) + 1;
    const std::int64_t sent = preparing ? -call : call;
    const std::uint64_t h = option_hash(cx);
    const std::int64_t hi = std::int64_t(h >> 32), lo = std::int64_t(h & 0xffffffffu);
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    const std::int64_t w = samples.neutral ? none : std::int64_t(samples.weighted);
    std::int64_t v[10] = {-std::int64_t(need_check_),  sent,         -sent, hi, -hi, lo, -lo, w,
                          samples.neutral ? none : -w, samples.cycle};
    try {
      cx.ctl.template allreduce_min_sum<9, 1>(cx.backend, v, cx.opt, WaitSite{"arrival check", call, -1, 0});
    } catch (const StallError& e) {
      cx.ctl.tell_peers(ErrorKind::stall, e.what());  // late ranks stop at their next wait (round 2, a chunk)
      throw;
    }
    agreed_once_ = true;
    if (v[1] < 0 && -v[2] > 0)
      cx.ctl.fail(ErrorKind::mismatch,
                  "some ranks called prepare() while others called synchronize() or mark_ready(): prepare() is "
                  "collective, call it on every rank",
                  cx.opt);
    if (v[1] != -v[2])  // (all in prepare(): the calls are the negated values)
      cx.ctl.fail(ErrorKind::mismatch,
                  cat("the ranks reached the exchange in different synchronize() calls (", v[1] < 0 ? v[2] : v[1],
                      " to ", v[1] < 0 ? -v[1] : -v[2], "): a rank called synchronize() more often than the others"),
                  cx.opt);
    if (v[7] != none && v[8] != none && v[7] != -v[8]) name_unweighted(cx, samples, call);
    return Arrival{v[0] < 0, v[3] != -v[4] || v[5] != -v[6], v[9]};
  }

  // Some ranks gave set_samples() counts, others did not: every rank learns which (one allgather,
  // on this failure only) and throws the same MismatchError.
  [[noreturn]] void name_unweighted(Context& cx, const Samples& samples, std::int64_t call) {
    const int n = cx.backend.size();
    std::vector<unsigned char> all(static_cast<std::size_t>(n));
    const unsigned char mine = samples.weighted ? 1 : 0;
    cx.ctl.allgather(cx.backend, &mine, all.data(), 1, cx.opt, WaitSite{"arrival check (samples)", call, -1, 0});
    std::vector<int> with, without;
    for (int r = 0; r < n; ++r) (all[std::size_t(r)] ? with : without).push_back(r);
    const auto ranks = [](const std::vector<int>& r) {
      return r.size() == 1 ? cat("rank ", r[0]) : cat("ranks ", rank_list(r));
    };
    throw AgreedMismatch(cat("set_samples(): ", ranks(with), " gave sample counts for synchronize() call ", call, ", ",
                             ranks(without), " did not: a weighted sync needs a count from every rank on every pass"));
  }

  // The plan tuner's agreement on timings, on the side channel under the watchdog: the MAX of
  // non-negative doubles is the MIN of their negated bit patterns, which order like the values.
  static void agree_on_max(Context& cx, double* v, std::size_t n) {
    std::vector<std::int64_t> bits(n);
    for (std::size_t k = 0; k < n; ++k) {
      std::int64_t b = 0;
      std::memcpy(&b, &v[k], sizeof b);
      bits[k] = -std::max<std::int64_t>(b, 0);
    }
    cx.ctl.allreduce_min(cx.backend, bits.data(), int(n), cx.opt,
                         WaitSite{"plan tuner's agreement", std::int64_t(cx.stats.passes), -1, 0});
    for (std::size_t k = 0; k < n; ++k) {
      const std::int64_t b = -bits[k];
      std::memcpy(&v[k], &b, sizeof b);
    }
  }

  // The blocking path's second round (see arrive()).
  void commit(Context& cx) {
    if (!agreed_) return;
    const std::int64_t call = std::int64_t(cx.stats.passes) + 1;
    std::int64_t go = 0;
    cx.ctl.allreduce_min(cx.backend, &go, 1, cx.opt, WaitSite{"arrival confirmation", call, -1, 0});
  }

  // Whether the registrations are compared now: when a rank needs it, or when the options differ
  // (`force`: every rank knows it, whatever its check mode says).
  bool comparison_due(const Options& opt, bool needed, bool force) const {
    return force || (needed && opt.tuning.consistency_check != CheckMode::off) ||
           opt.tuning.consistency_check == CheckMode::every_step;
  }

  // The cross-rank comparison of registrations (impl/consistency.hpp): a MismatchError on every
  // rank, naming tensors and ranks, when they differ.
  void compare_registrations(Context& cx, const std::vector<RegDesc>& regs, std::int64_t call) {
    check_consistency(cx.backend, cx.ctl, cx.opt, regs, int(sizeof(V)), call, max_chunk_elements(), facts_);
  }
  void registrations_compared() { need_check_ = false; }

  // Gradients that are neighbours in memory merge into one in-place region (impl::FusionPlan), but
  // memory is each rank's own: the plan, hence the collectives, may depend on it only where every
  // rank has the same neighbours. A hash of the neighbour relations in fused order is compared
  // with the consistency check (one more small allreduce, only when a check runs); until the ranks
  // agree, nothing merges. Returns whether they agree (and there are neighbours).
  bool neighbours_agree(Context& cx, const std::vector<typename FusionPlan<V>::Tensor>& fused, std::int64_t call) {
    std::uint64_t h = fnv1a(nullptr, 0);
    bool any = false;
    const typename FusionPlan<V>::Tensor* prev = nullptr;
    for (const auto& t : fused) {
      if (t.size == 0) continue;  // no memory: never anyone's neighbour
      if (prev) {
        const std::int8_t d = std::int8_t(FusionPlan<V>::neighbour(*prev, t));
        any = any || d != 0;
        h = fnv1a(&d, 1, h);
      }
      prev = &t;
    }
    std::int64_t v[2] = {std::int64_t(h >> 1), -std::int64_t(h >> 1)};  // MIN of both: min and max
    cx.ctl.allreduce_min(cx.backend, v, 2, cx.opt, WaitSite{"consistency check (neighbours)", call, -1, 0});
    return any && v[0] == -v[1];
  }

  // Options::check_finite: one reduction over the data-parallel gradients before they are packed.
  // Kokkos execution spaces only; the raw CUDA path (CudaDeviceSpace spans) has no scan kernel yet.
  // `first`: the scan covers segments [first, first + nsegs) (one chunk, launched by mark_ready).
  void check_finite([[maybe_unused]] Context& cx, [[maybe_unused]] const Registry& registry,
                    [[maybe_unused]] const SegView& segs, [[maybe_unused]] std::int64_t nsegs,
                    [[maybe_unused]] std::int64_t first = 0) {
    if constexpr (!Kokkos::is_execution_space<ExecutionSpace>::value) {
      throw ConfigError(cat("check_finite is not supported yet for gradients in ", MemorySpace::name(),
                            " (no NaN/Inf scan kernel on this path); turn it off"));
    } else {
      const std::int64_t s = first_non_finite_segment<V, MemorySpace>(cx.exec, segs, nsegs, finite_, first);
      if (s == FirstNonFiniteKernel<V, ExecutionSpace, MemorySpace>::none) return;
      auto seg = Kokkos::create_mirror_view_and_copy(
          Kokkos::HostSpace(), Kokkos::subview(segs, std::make_pair(std::size_t(s), std::size_t(s + 1))));
      if (const auto* e = registry.data_parallel_holding(seg(0).ptr))
        fail_here(cx, ErrorKind::error,
                  cat("gradient '", e->name, "' (group ", e->group, ", ", e->size,
                      " values) holds NaN or Inf "
                      "on rank ",
                      cx.backend.rank(), " before the exchange of synchronize() call ", cx.stats.passes + 1,
                      " (Options::check_finite)"));
      fail_here(cx, ErrorKind::error, "a data-parallel gradient holds NaN or Inf (Options::check_finite)");
    }
  }

  // host_staging = never where the backend cannot reach the gradients' memory.
  void require_staging_possible(Context& cx) {
    if (cx.opt.tuning.host_staging == HostStaging::never && !cx.backend.template can_access<MemorySpace>())
      fail_here(cx, ErrorKind::config,  // its peers may wait in the agreement already (blocking path)
                cat("host_staging = never, but backend '", Backend::name(),
                    "' cannot access the gradients' memory space ", MemorySpace::name()));
  }

  // fp16: a sum that is not finite fails the step on every rank (each holds the same sums, so each
  // finds the same flag: no message is needed), naming a tensor; the sync stays usable.
  [[noreturn]] static void throw_wire_overflow(const Context& cx, const Registry& registry, const V* p) {
    std::string which = "a data-parallel gradient";
    if (const auto* e = registry.data_parallel_holding(p))
      which = cat("gradient '", e->name, "' (group ", e->group, ", ", e->size, " values)");
    throw Error(
        cat("the fp16 sum of ", which, " is not finite in synchronize() call ", cx.stats.passes,
            " (on every rank): a value or a partial sum beyond fp16's largest, 65504, or a NaN/Inf gradient. "
            "The gradients of this step are not usable; skip it, or use Compression::bf16 (fp32's range), a smaller "
            "prescale_factor, or keep this group in full precision (CompressWith<Compression::none>); "
            "see docs/COMPRESSION.md"));
  }

  // A local check failed: tell the peers (so none waits for this rank), then throw.
  [[noreturn]] void fail_here(Context& cx, ErrorKind k, const std::string& msg) {
    if (cx.timeline) cx.timeline->report(k, true, msg);
    cx.ctl.tell_peers(k, msg);
    throw_kind(k, msg);
  }

 private:
  // The hash of this rank's option words, kept while max_chunk_elements() (a test override) holds.
  std::uint64_t option_hash(Context& cx) {
    const std::size_t max_chunk = max_chunk_elements();
    if (!option_hash_valid_ || hashed_max_chunk_ != max_chunk) {
      option_hash_ = OptionWords(cx.opt, int(sizeof(V)), 0, max_chunk, facts_).hash_without_calls();
      hashed_max_chunk_ = max_chunk;
      option_hash_valid_ = true;
    }
    return option_hash_;
  }

  bool agreed_ = false;       // side channel: the ranks agree before each exchange (arrive)
  bool agreed_once_ = false;  // the first agreement ran (all a backend without a side channel runs)
  bool need_check_ = true;    // registrations changed since the ranks last compared them
  ProtocolFacts facts_;       // what this rank resolved beyond Options; agreed with the options
  std::uint64_t option_hash_ = 0;
  std::size_t hashed_max_chunk_ = 0;
  bool option_hash_valid_ = false;
  // Options::check_finite's per-segment flags (Kokkos execution spaces only).
  std::conditional_t<Kokkos::is_execution_space<ExecutionSpace>::value, FiniteScratch<MemorySpace>, NoFiniteScratch>
      finite_;
};

}  // namespace gradsync::impl
