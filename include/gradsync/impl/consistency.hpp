// gradsync internals: the cross-rank consistency check of the data-parallel registrations.
//
// Only fixed-size collectives, so the check cannot itself hang on the mismatch it looks for:
//   1. one MIN allreduce of a small signature holding each value and its negation (so MIN also
//      gives MAX): the options that shape the exchange, the number of data-parallel tensors, and a
//      hash of their (group, size, value type, name when given) list. Equal everywhere: done. This
//      is all the check costs when ranks agree.
//   2. on a mismatch of the options: an allgather of the option words; the message names the
//      first differing option and what each rank has.
//   3. on a mismatch of the list: a MIN allreduce over per-position hashes padded to the agreed
//      largest count finds the first differing position; an allgather of a fixed-size descriptor of
//      each rank's tensor there names it; a last allgather asks every rank how it holds the
//      tensor one of the ranks has there, which tells a register_local_var policy mismatch apart.
// Every rank takes the same branches (they depend only on the collective results) and throws
// the same MismatchError. Local tensors (by policy or register_local_var) are left out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../options.hpp"
#include "stall.hpp"

namespace gradsync::impl {

/// One registration as this rank sees it.
struct RegDesc {
  std::string group, name;
  std::size_t size = 0;
  std::size_t index_in_group = 0;
  bool policy_local = false;   // local by its group's LocalVarPolicy: never compared
  bool runtime_local = false;  // made local by register_local_var: not exchanged
  bool named = false;          // the name was given to add(): compared (a default name never is)
  int compression = 0;         // its wire format (int(Compression)), resolved: compared
};

// What a rank decided beyond Options that shapes the plan or the collectives, so must agree too.
struct ProtocolFacts {
  std::int64_t cuda_aware = -1;  // the backend hands device memory to MPI (MpiBackend); -1: no such setting
  std::int64_t blocking = 0;     // collectives as resolved (Collectives::automatic asks the backend)
  std::int64_t staged = 0;       // fused chunks staged through host memory, as resolved
  std::int64_t plan = 0;         // the plan's candidates from the topology (chunk sizes, algorithms)
};

inline std::int64_t double_bits(double d) {
  std::int64_t v;
  std::memcpy(&v, &d, sizeof v);
  return v;
}

// The options that must agree, as words, with their names for the message.
struct OptionWords {
  static constexpr int count = 25;
  static constexpr int calls = 10;  // the word that counts synchronize() calls
  std::int64_t w[count] = {};
  static const char* name(int i) {
    static const char* const names[count] = {
        "value type",
        "op",
        "prescale_factor",
        "postscale_factor",
        "fusion_threshold_bytes",
        "backward_passes_per_step",
        "average_aggregated_gradients",
        "consistency_check",
        "check_finite",
        "gradsync::impl::max_chunk_elements()",
        "synchronize() calls so far",
        "scale_local_gradients",
        "fusion_order",
        "collectives",
        "in_place_min_fraction",
        "in_place_min_bytes",
        "host_staging",
        "CUDA-aware MPI (GRADSYNC_CUDA_AWARE_MPI, or MpiBackend's CudaAwareMpi argument)",
        "collectives as resolved (Collectives::automatic follows the backend)",
        "host staging as resolved (host_staging, and whether the backend reaches the gradients' memory)",
        "algorithm",
        "the plan as resolved from the topology (nodes, ranks per node, chunk sizes, algorithms)",
        "compression",
        "error_feedback",
        "shard"};
    return names[i];
  }
  static std::string show(int i, std::int64_t v) {
    auto pick = [v](std::initializer_list<const char*> names) {
      return v >= 0 && v < std::int64_t(names.size()) ? std::string(names.begin()[v]) : cat(v);
    };
    switch (i) {
      case 0:
        return v == 4 ? "float" : v == 8 ? "double" : cat(v, "-byte values");
      case 1:
        return to_string(ReduceOp(v));
      case 2:
      case 3:
      case 14: {
        double d;
        std::memcpy(&d, &v, sizeof d);
        return cat(d);
      }
      case 4:
        // The sentinels compared as the words hold them (w[4] is the option's bits).
        return std::uint64_t(v) == std::uint64_t(fusion_threshold_auto)          ? "fusion_threshold_auto"
               : std::uint64_t(v) == std::uint64_t(fusion_threshold_by_topology) ? "by topology (the default)"
                                                                                 : cat(v);
      case 6:
      case 8:
      case 11:
        return v ? "true" : "false";
      case 7:
        return pick({"off", "on_change", "every_step"});
      case 12:
        return pick({"reverse", "registration"});
      case 13:
        return pick({"automatic", "blocking", "nonblocking"});
      case 16:
        return pick({"auto", "always", "never"});
      case 17:
        return v < 0 ? "not a setting of this backend" : v ? "yes" : "no";
      case 18:
        return v ? "blocking" : "nonblocking";
      case 19:
        return v ? "staged through host" : "not staged";
      case 20:
        return pick({"automatic", "flat", "hierarchical"});
      case 22:
        return pick({"none", "fp16", "bf16"});
      case 23:
        return v ? "true" : "false";
      case 24:
        return pick({"none", "optimizer_state"});
      default:
        return cat(v);
    }
  }
  static const char* hint(int i) {
    switch (i) {
      case 0:
        return ". Use the same GradientSync<Backend, Tensor> value type on every rank";
      case 9:
        return ". Set the same override of max_chunk_elements() on every rank";
      case 10:
        return ". A rank skipped or added a synchronize() call";
      case 17:
        return ". Set GRADSYNC_CUDA_AWARE_MPI alike on every rank (or give every MpiBackend the same CudaAwareMpi)";
      default:
        return ". Set the same options on every rank (a GRADSYNC_* environment variable set on some ranks only "
               "overrides them there)";
    }
  }

  OptionWords(const Options& o, int value_size, std::int64_t passes, std::size_t max_chunk,
              const ProtocolFacts& f = {}) {
    w[0] = value_size;
    w[1] = std::int64_t(o.op);
    w[2] = double_bits(o.prescale_factor);
    w[3] = double_bits(o.postscale_factor);
    w[4] = std::int64_t(o.tuning.fusion_threshold_bytes);
    w[5] = o.backward_passes_per_step;
    w[6] = o.average_aggregated_gradients;
    w[7] = std::int64_t(o.tuning.consistency_check);
    w[8] = o.check_finite;
    w[9] = std::int64_t(max_chunk);
    w[calls] = passes;
    w[11] = o.scale_local_gradients;              // not exchanged, but local gradients would follow another loss
    w[12] = std::int64_t(o.tuning.fusion_order);  // these four shape the chunks and the calls
    w[13] = std::int64_t(o.tuning.collectives);
    w[14] = double_bits(o.tuning.in_place_min_fraction);
    w[15] = std::int64_t(o.tuning.in_place_min_bytes);
    w[16] = std::int64_t(o.tuning.host_staging);  // staging: no in-place chunks, no factor folded into the sum
    w[17] = f.cuda_aware;                         // MpiBackend: blocking or not, ring or MPI, staging
    w[18] = f.blocking;
    w[19] = f.staged;
    w[20] = std::int64_t(o.tuning.algorithm);
    w[21] = f.plan;
    w[22] = std::int64_t(o.compression);  // the wire format, hence the bytes and the sums
    w[23] = o.error_feedback;
    w[24] = std::int64_t(o.shard);  // a reduce-scatter instead of an allreduce
  }
  // Every word but the call count, which the arrival check compares by itself.
  std::uint64_t hash_without_calls() const {
    OptionWords c = *this;
    c.w[calls] = 0;
    return fnv1a(c.w, sizeof c.w);
  }
};

/// Every rank calls this once the ranks know that their option words differ: one fixed-size
/// allgather of the words, then every rank throws the same MismatchError naming the first differing
/// option and what each rank has.
template <class Backend>
[[noreturn]] void name_option_mismatch(const Backend& backend, Control<Backend>& ctl, const Options& o,
                                       const OptionWords& ow, const WaitSite& site) {
  const int n = ctl.size();
  std::vector<std::int64_t> all(std::size_t(n) * OptionWords::count);
  ctl.allgather(backend, reinterpret_cast<const unsigned char*>(ow.w), reinterpret_cast<unsigned char*>(all.data()),
                int(sizeof ow.w), o, site);
  for (int i = 0; i < OptionWords::count; ++i) {
    std::vector<std::string> what(static_cast<std::size_t>(n));
    bool differ = false;
    for (int r = 0; r < n; ++r) {
      const std::int64_t v = all[std::size_t(r) * OptionWords::count + std::size_t(i)];
      what[std::size_t(r)] = OptionWords::show(i, v);
      differ |= v != all[std::size_t(i)];
    }
    if (differ)
      throw AgreedMismatch(cat("ranks disagree on ", OptionWords::name(i), ": ", by_rank(what), OptionWords::hint(i)));
  }
  throw AgreedMismatch("ranks disagree on the options (hash mismatch)");
}

template <std::size_t N>
void copy_str(char (&dst)[N], const std::string& s) {
  std::memset(dst, 0, N);
  std::memcpy(dst, s.data(), std::min(N - 1, s.size()));
}

/// Throws MismatchError on every rank when the ranks' data-parallel registrations or exchange
/// options differ. `value_size` is sizeof(value_type). Collective over ctl's ranks.
template <class Backend>
void check_consistency(const Backend& backend, Control<Backend>& ctl, const Options& o,
                       const std::vector<RegDesc>& regs, int value_size, std::int64_t passes, std::size_t max_chunk,
                       const ProtocolFacts& facts = {}) {
  if (ctl.size() == 1) return;
  const WaitSite site{"consistency check (allreduce)", passes, -1, 0};
  const WaitSite gather_site{"consistency check (allgather)", passes, -1, 0};

  const OptionWords ow(o, value_size, passes, max_chunk, facts);

  // Per data-parallel tensor: a non-negative hash of (group, size, value type, name when given).
  // A default name ("Group[i]") follows from the rest, so only given names add anything.
  std::vector<std::int64_t> h;
  std::vector<const RegDesc*> dp;
  for (const RegDesc& r : regs) {
    if (r.policy_local || r.runtime_local) continue;
    std::uint64_t x = fnv1a(r.group.data(), r.group.size());
    const std::uint64_t sz = r.size;
    x = fnv1a(&sz, sizeof sz, x);
    x = fnv1a(&value_size, sizeof value_size, x);
    const unsigned char named = r.named;
    x = fnv1a(&named, 1, x);
    if (r.named) x = fnv1a(r.name.data(), r.name.size(), x);
    if (r.compression != 0) x = fnv1a(&r.compression, sizeof r.compression, x);  // a group's own wire format
    h.push_back(std::int64_t(x & 0x7fffffffffffffffull));
    dp.push_back(&r);
  }
  const std::uint64_t oh = fnv1a(ow.w, sizeof ow.w);
  const std::uint64_t lh = fnv1a(h.data(), h.size() * sizeof(std::int64_t));
  // Values below 2^32 (or counts), so negation never overflows.
  constexpr int S = 5;
  std::int64_t sig[2 * S] = {std::int64_t(oh >> 32), std::int64_t(oh & 0xffffffffu), std::int64_t(dp.size()),
                             std::int64_t(lh >> 32), std::int64_t(lh & 0xffffffffu)};
  for (int i = 0; i < S; ++i) sig[S + i] = -sig[i];
  ctl.allreduce_min(backend, sig, 2 * S, o, site);
  auto agree = [&](int i) { return sig[i] == -sig[S + i]; };
  if (agree(0) && agree(1) && agree(2) && agree(3) && agree(4)) return;  // the common case

  if (!agree(0) || !agree(1)) name_option_mismatch(backend, ctl, o, ow, gather_site);
  const int n = ctl.size();
  const std::size_t nr = std::size_t(n);

  // The lists differ: find the first position whose hash differs, over the largest count.
  const std::int64_t max_count = -sig[S + 2];
  std::vector<std::int64_t> ph(2 * std::size_t(max_count));
  for (std::int64_t i = 0; i < max_count; ++i) {
    ph[std::size_t(i)] = i < std::int64_t(h.size()) ? h[std::size_t(i)] : -1;
    ph[std::size_t(max_count + i)] = -ph[std::size_t(i)];
  }
  ctl.allreduce_min(backend, ph.data(), int(ph.size()), o, site);
  std::int64_t pos = 0;
  while (pos < max_count && ph[std::size_t(pos)] == -ph[std::size_t(max_count + pos)]) ++pos;

  struct Wire {
    std::int64_t present = 0, size = 0, index_in_group = 0, count = 0, compression = 0;
    char group[112] = {}, name[112] = {};
  };
  Wire mine;
  mine.count = std::int64_t(dp.size());
  if (pos < std::int64_t(dp.size())) {
    const RegDesc& r = *dp[std::size_t(pos)];
    mine.present = 1;
    mine.size = std::int64_t(r.size);
    mine.index_in_group = std::int64_t(r.index_in_group);
    mine.compression = r.compression;
    copy_str(mine.group, r.group);
    copy_str(mine.name, r.name);
  }
  std::vector<Wire> all(nr);
  ctl.allgather(backend, reinterpret_cast<const unsigned char*>(&mine), reinterpret_cast<unsigned char*>(all.data()),
                int(sizeof(Wire)), o, gather_site);
  const char* vt = value_size == 4 ? "float" : value_size == 8 ? "double" : "value";
  std::vector<std::string> what(nr), counts(nr);
  for (int r = 0; r < n; ++r) {
    const Wire& w = all[std::size_t(r)];
    counts[std::size_t(r)] = std::to_string(w.count);
    what[std::size_t(r)] =
        w.present
            ? cat("'", w.name, "' (group ", w.group, ", index ", w.index_in_group, ", ", w.size, " x ", vt,
                  w.compression ? cat(", ", to_string(Compression(w.compression)), " on the wire") : std::string(), ")")
            : std::string("no tensor");
  }
  std::string msg = cat("ranks disagree on the data-parallel registrations at data-parallel tensor #", pos, ": ",
                        by_rank(what), ". Data-parallel tensor counts: ", by_rank(counts));

  // Which tensor is it? The one with the smallest index in its group among those reported: ask
  // every rank how it holds that one (absent, data-parallel, or local by register_local_var).
  const Wire* cand = nullptr;
  for (const Wire& w : all)
    if (w.present && (!cand || w.index_in_group < cand->index_in_group ||
                      (w.index_in_group == cand->index_in_group && std::strcmp(w.group, cand->group) < 0)))
      cand = &w;
  if (cand) {
    struct Status {
      std::int64_t how = 0, size = 0;  // 0 absent, 1 data-parallel, 2 register_local_var
    } st;
    for (const RegDesc& r : regs)
      if (!r.policy_local && r.index_in_group == std::size_t(cand->index_in_group) &&
          r.group.substr(0, sizeof(cand->group) - 1) == cand->group) {
        st.how = r.runtime_local ? 2 : 1;
        st.size = std::int64_t(r.size);
      }
    std::vector<Status> sts(nr);
    ctl.allgather(backend, reinterpret_cast<const unsigned char*>(&st), reinterpret_cast<unsigned char*>(sts.data()),
                  int(sizeof(Status)), o, gather_site);
    std::vector<int> local, global;
    for (int r = 0; r < n; ++r) {
      if (sts[std::size_t(r)].how == 2) local.push_back(r);
      if (sts[std::size_t(r)].how == 1) global.push_back(r);
    }
    if (!local.empty() && !global.empty())
      msg =
          cat("policy mismatch: tensor ", cand->group, "[", cand->index_in_group, "] is local (register_local_var) on ",
              local.size() == 1 ? "rank " : "ranks ", local.size() == 1 ? std::to_string(local[0]) : rank_list(local),
              " but data-parallel on ", global.size() == 1 ? "rank " : "ranks ",
              global.size() == 1 ? std::to_string(global[0]) : rank_list(global),
              "; call register_local_var for it on every rank or on none. Details: ", msg);
  }
  throw AgreedMismatch(msg);
}

}  // namespace gradsync::impl
