// gradsync internals: one rank's checkpoint job, the items it saves or loads.
//
// Before any file is touched, every rank turns its model into a list of items (impl::CkptItem):
// a DistributedOptimizer's parameters with their optimizer state, a bare sync's parameters named
// in a CheckpointState, the program's own entries, and the sync's error-feedback residuals. Each
// item takes its kind (data-parallel, local, row shard) from the sync's registration of its name,
// so a save and a load classify alike; what a file cannot hold is refused here, on the rank that
// finds it, and agreed on before the first collective of the file.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../checkpoint_state.hpp"
#include "../distributed_optimizer.hpp"
#include "../error.hpp"
#include "../gradient_sync.hpp"
#include "../registrations.hpp"
#include "checkpoint_catalog.hpp"
#include "hash.hpp"
#include "sync_access.hpp"

namespace gradsync::impl {

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
  if (const int pass = sync.passes_into_cycle(); pass > 0)
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
  sync.registrations().for_each(
      [&](const std::string& name, const std::string& group, RegistrationKind kind, std::size_t size) {
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

}  // namespace gradsync::impl
