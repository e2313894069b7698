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
#include <functional>
#include <map>
#include <memory>
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
#include "memory_ops.hpp"
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
  // Sharded (Options::shard): the slices' optimizer slots, made now if not yet (the plan first:
  // prepare(), collective) so that a save or load before the first apply() has them.
  template <class D>
  static void make_shards(D& d) {
    // In the middle of an aggregation cycle the checkpoint refuses the call with its own message
    // (prepare() would refuse it too, naming itself).
    if (!d.sharded() || d.sync().passes_into_cycle() > 0) return;
    if (!d.shards_.built()) d.sync().prepare();  // the plan, which the slices come from
    d.make_shards();
  }
  template <class D>
  static const auto& shards(const D& d) {
    return d.shards_;
  }
  template <class D>
  static std::vector<std::size_t> slots(const D& d) {
    return d.slots();
  }
  template <class D>
  static constexpr std::size_t no_slot = D::no_slot;
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
  bool saving = false;
  std::vector<std::function<void()>> after_load;  // once a load read everything (sharded state)
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
  job.saving = std::string(call) == "save_checkpoint";
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

// Sharded (Options::shard): the sharded parameters' state, whole, as an unsharded optimizer holds
// it, so that the file depends neither on the rank count nor on the shard setting. A save sums it
// from the ranks' slices (each value is one rank's; the others add zeros: exact): the data-parallel
// parameters' over every rank, a process set's over the set; a load reads it whole on every rank
// and hands each rank its slices (after_load). The whole state stays in host memory for the call:
// the memory a sharded optimizer saves is spent again during it.
template <class T>
struct ShardedWholeState {
  std::vector<T> values;                   // state k of the parameter at `at` begins at k * total + at
  std::size_t total = 0;                   // values of every parameter of this part
  int nstate = 0;                          // value buffers per slot (Adam: 2, 3 with amsgrad)
  std::map<const T*, std::size_t> at;      // parameter -> its offset
  std::map<const T*, std::size_t> count;   // parameter -> its values
  std::vector<std::int64_t> loaded_steps;  // a load's counters, per parameter (in `at` order)
  // The offset of the value at p, or npos when no parameter of this part holds it.
  std::size_t offset_of(const T* p) const {
    auto e = at.upper_bound(p);
    if (e == at.begin()) return npos;
    --e;
    return p < e->first + count.at(e->first) ? e->second + std::size_t(p - e->first) : npos;
  }
  std::int64_t& steps_of(const T* param) {
    return loaded_steps[std::size_t(std::distance(at.begin(), at.find(param)))];
  }
  static constexpr std::size_t npos = std::size_t(-1);
};
// The parts: [0] the data-parallel parameters (over every rank), then one per process set with
// tensors (over the set), and which part holds each sharded parameter.
template <class T>
struct ShardedWhole {
  std::vector<std::shared_ptr<ShardedWholeState<T>>> parts;
  std::map<const T*, std::size_t> part_of;
  std::int64_t step = 0;  // the slots' step count (every slot steps alike)
};

template <class D, class Comm>
std::shared_ptr<ShardedWhole<typename D::value_type>> sharded_whole_state(const CkptJob& job, D& dopt,
                                                                          const Comm& comm) {
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  auto w = std::make_shared<ShardedWhole<T>>();
  [[maybe_unused]] auto& opt = CheckpointAccess::optimizer(dopt);
  const auto& process_sets = SyncAccess::process_sets(dopt.sync());
  const auto& sets = process_sets.sets();
  w->parts.resize(1 + sets.size());
  for (auto& part : w->parts) part = std::make_shared<ShardedWholeState<T>>();
  for (const auto& e : CheckpointAccess::entries(dopt)) {
    if (e.slot != CheckpointAccess::no_slot<D>) continue;
    const auto* set = process_sets.set_holding(e.grad);  // its part: [0] data-parallel, 1 + its set's index
    const std::size_t k = set ? 1 + std::size_t(set - sets.data()) : 0;
    ShardedWholeState<T>& part = *w->parts[k];
    part.at[e.param] = part.total;
    part.count[e.param] = e.size;
    part.total += e.size;
    w->part_of[e.param] = k;
  }
  // The slots' shape and step count, agreed: a rank may hold no slot at all.
  std::vector<std::int64_t> mine{1, 1};  // -(buffers), -(step): min over ranks is the max
  if constexpr (has_state_visitor<typename D::optimizer_type>::value)
    for (std::size_t slot : CheckpointAccess::slots(dopt)) {
      std::int64_t n = 0;
      opt.for_each_state(slot, [&](auto* data, std::size_t) {
        if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, T>)
          ++n;
        else
          mine[1] = -*data;
      });
      mine[0] = -n;
      break;
    }
  comm.min(mine);
  w->step = -std::min<std::int64_t>(mine[1], 0);
  for (auto& part : w->parts) {
    part->nstate = int(-std::min<std::int64_t>(mine[0], 0));
    part->values.assign(std::size_t(part->nstate) * part->total, T(0));
    part->loaded_steps.assign(part->at.size(), w->step);
  }
  if (!job.saving) return w;
  if constexpr (has_state_visitor<typename D::optimizer_type>::value)
    for (const auto& p : CheckpointAccess::shards(dopt).pieces()) {
      ShardedWholeState<T>& part = *w->parts[w->part_of.at(std::prev(w->part_of.upper_bound(p.param))->first)];
      T* out = part.values.data() + part.offset_of(p.param);
      opt.for_each_state(p.slot, [&](auto* data, std::size_t n) {
        if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, T>) {
          copy_values<Kokkos::HostSpace, Space>(out, data, n);
          out += part.total;
        }
      });
    }
  comm.sum(w->parts[0]->values);
  for (std::size_t i = 0; i < sets.size(); ++i)
    if (!sets[i].tensors.empty()) comm.sum_over(*sets[i].backend, w->parts[1 + i]->values);
  return w;
}

// After a sharded load: each slice's state from the whole, and every slot's step count.
template <class D>
void adopt_sharded_state(D& dopt, ShardedWhole<typename D::value_type>& w) {
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  [[maybe_unused]] auto& opt = CheckpointAccess::optimizer(dopt);
  if constexpr (has_state_visitor<typename D::optimizer_type>::value)
    for (const auto& p : CheckpointAccess::shards(dopt).pieces()) {
      const T* param = std::prev(w.part_of.upper_bound(p.param))->first;
      ShardedWholeState<T>& part = *w.parts[w.part_of.at(param)];
      const T* in = part.values.data() + part.offset_of(p.param);
      const std::int64_t step = part.steps_of(param);
      opt.for_each_state(p.slot, [&](auto* data, std::size_t n) {
        if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, T>) {
          copy_values<Space, Kokkos::HostSpace>(data, in, n);
          in += part.total;
        } else {
          for (std::size_t i = 0; i < n; ++i) data[i] = step;
        }
      });
    }
  Kokkos::fence();
}

// A DistributedOptimizer's parameters with their optimizer state (Adam's moments, the counters).
template <class D, class Comm>
void add_optimizer_items(CkptJob& job, D& dopt, const CheckpointState& state,
                         const std::map<std::string, CkptRegistration>& regs, const Comm& comm) {
  using T = typename D::value_type;
  using Space = typename D::memory_space;
  using Opt = typename D::optimizer_type;
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, float>,
                "gradsync checkpoints: parameters are float or double");
  std::shared_ptr<ShardedWhole<T>> whole;
  if (dopt.sharded()) {
    whole = sharded_whole_state(job, dopt, comm);
    if (!job.saving) job.after_load.push_back([&dopt, whole] { adopt_sharded_state(dopt, *whole); });
  }
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
    if (e.slot == CheckpointAccess::no_slot<D>) {  // sharded: from the whole state of its part
      const auto part = whole->parts[whole->part_of.at(e.param)];
      const std::size_t at = part->at.at(e.param);
      for (int k = 0; k < part->nstate; ++k)
        it.data.push_back(ckpt_data<T, Kokkos::HostSpace>(cat("state", k), part->values.data() + k * part->total + at,
                                                          e.size, false, part));
      std::int64_t* step = &part->steps_of(e.param);
      CkptData d;
      d.name = "counters";
      d.type = CkptType::i64;
      d.count = 1;
      d.get = [whole, step](void* out) { *static_cast<std::int64_t*>(out) = *step; };
      d.put = [whole, step](const void* in) { *step = *static_cast<const std::int64_t*>(in); };
      it.data.push_back(std::move(d));
      job.items.push_back(std::move(it));
      continue;
    }
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
template <class Optimizer, class Sync, class Comm>
void add_items_of(CkptJob& job, DistributedOptimizer<Optimizer, Sync>& dopt, const CheckpointState& state,
                  const Comm& comm) {
  const auto regs = registrations_by_name(dopt.sync());
  add_optimizer_items(job, dopt, state, regs, comm);
  add_state_items(job, state, regs);
  job.optimizer = type_name<Optimizer>();
}
template <class Backend, class Tensor>
void add_items_of(CkptJob& job, GradientSync<Backend, Tensor>& sync, const CheckpointState& state) {
  add_state_items(job, state, registrations_by_name(sync));
}

}  // namespace gradsync::impl
