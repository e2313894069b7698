// hybrid_dlrm: one rank's share of the hybrid-parallel DLRM, for any gradsync backend.
//
// Forward, on rank r of n with global batch B (rank r holds samples [lo_r, lo_r + b_r)):
//   1. r generates its b_r samples; an all-to-all sends each table's ids to the table's owner;
//   2. every owner looks up its tables for all B samples; an all-to-all hands each rank the
//      embeddings of its own samples;
//   3. bottom MLP, dot interaction, top MLP, sigmoid + BCE, data-parallel on the b_r samples.
// Backward runs the same in reverse: the embedding gradients go back to the owners through the
// reverse all-to-all, and each owner sums them into sparse-row gradients of its tables.
//
// Rank r differentiates L_r = (n / B) * sum of its samples' losses (the local mean loss when B
// divides evenly), so the global mean loss is L = (1/n) sum_r L_r for any split of the batch.
// GradientSync then averages the MLP gradients (the gradient of L) and scales the table
// gradients (which hold sum_r dL_r/dE = n dL/dE) by 1/n when the table group says
// KeepLocal<LocalScale::world_size>. Each table's gradient is a gradsync::RowSparse (the rows the
// batch touched and their row numbers), so that scale costs the rows touched, never the table's
// size. With SelfBackend the same code is the single-process model.
//
// --uneven: rank p holds a share of the batch proportional to p (rank 0 none), and differentiates
// what a rank naturally knows, the mean loss over its own b_r samples, giving b_r to
// set_samples(): the sync then averages the MLP gradients with weights b_r / B. A table's owner
// sums gradients that arrived from every rank, which no weight can fix after the fact; so each
// rank sends its samples' own gradients (b_r x its mean's) through the backward all-to-all, the
// owner's sum is then B dL/dE, and the table group's LocalScale::samples (SetScale::samples with
// replicas) divides it by B = sum_r b_r.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "data.hpp"
#include "kernels.hpp"

namespace dlrm {

/// The data-parallel group: every MLP parameter.
struct Mlp {};

/// Whole tables assigned to ranks so that the rows per rank are balanced: largest table first, each
/// to the rank holding the fewest rows so far (ties: lowest rank). Deterministic on every rank.
inline std::vector<int> assign_tables(const Config& c, int ranks) {
  const int T = c.num_tables();
  std::vector<int> order(static_cast<std::size_t>(T)), owner(static_cast<std::size_t>(T), 0);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c.rows(a) > c.rows(b); });
  std::vector<std::int64_t> load(std::size_t(ranks), 0);
  for (int t : order) {
    const int p = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[std::size_t(t)] = p;
    load[std::size_t(p)] += c.rows(t);
  }
  return owner;
}

struct Layer {
  std::string name;
  int in = 0, out = 0;
  bool relu = true;
  Matrix w, gw;
  View1<Real> b, gb;
  Matrix y, dy;  // output activation and its gradient, [local samples][out]
};

/// Bytes this rank sent to other ranks in all-to-alls (its block to itself is not counted).
struct AllToAllStats {
  std::uint64_t ids = 0, embeddings = 0, gradients = 0, calls = 0;
  std::uint64_t total() const { return ids + embeddings + gradients; }
};

// The sync's options: the defaults, with --compression (the environment still applies over them).
inline gradsync::Options sync_options(const Config& c) {
  gradsync::Options o;
  o.compression = c.compression == "bf16"   ? gradsync::Compression::bf16
                  : c.compression == "fp16" ? gradsync::Compression::fp16
                                            : gradsync::Compression::none;
  if (c.shard) o.shard = gradsync::Shard::optimizer_state;
  return o;
}

template <class Backend, class TableGroup>
class Trainer {
 public:
  using Sync = gradsync::GradientSync<Backend, View1<Real>>;
  using HostReal = typename View1<Real>::HostMirror;
  using RowIds = Kokkos::View<int**, Kokkos::LayoutRight, Mem>;  // [owned table][slot]: row numbers
  using TableRows =
      gradsync::RowSparse<decltype(Kokkos::subview(std::declval<const Cube&>(), Index(0), Kokkos::ALL(),
                                                   Kokkos::ALL())),
                          decltype(Kokkos::subview(std::declval<const RowIds&>(), Index(0), Kokkos::ALL()))>;

  Trainer(const Config& c, Backend backend) : Trainer(c, backend, backend, {}) {}

  /// 2-D hybrid parallelism (--replicas R): `group` is this rank's replica group (n/R consecutive
  /// ranks), over which the tables are sharded and the all-to-alls run; `table_set` the ranks
  /// holding the same shard in every group, over which TableGroup (a ReduceOver group) sums the
  /// table gradients. `world` (every rank) averages the MLPs and normalises the loss.
  Trainer(const Config& c, Backend world, Backend group, std::vector<int> table_set)
      : cfg_(c), backend_(world), group_(std::move(group)), sync_(std::move(world), sync_options(c)), gen_(cfg_) {
    n_ = backend_.size();
    r_ = backend_.rank();
    gn_ = group_.size();
    gr_ = group_.rank();
    T_ = cfg_.num_tables();
    B_ = cfg_.batch;
    dim_ = cfg_.dim;
    if (B_ < n_ && !cfg_.uneven)
      throw std::runtime_error("the global batch (" + std::to_string(B_) +
                               ") must hold at least one sample per rank (" + std::to_string(n_) + " ranks)");
    if (n_ % gn_ != 0 || r_ % gn_ != gr_)
      throw std::runtime_error("a replica group must be " + std::to_string(gn_) + " consecutive ranks of the " +
                               std::to_string(n_));
    std::vector<Index> lo;         // the global batch over every rank; the group's part, from its first sample
    for (int p = 0; p <= n_; ++p)  // --uneven: rank p's share proportional to p, sum_{q<p} q = p(p-1)/2
      lo.push_back(!cfg_.uneven ? Index(B_) * p / n_
                   : n_ == 1    ? Index(B_) * p
                                : Index(B_) * (Index(p) * (p - 1) / 2) / (Index(n_) * (n_ - 1) / 2));
    const int first = r_ - gr_;
    for (int p = 0; p <= gn_; ++p) lo_.push_back(lo[std::size_t(first + p)] - lo[std::size_t(first)]);
    for (int p = 0; p < gn_; ++p) cnt_.push_back(lo_[std::size_t(p) + 1] - lo_[std::size_t(p)]);
    GB_ = lo_[std::size_t(gn_)];
    sample0_ = lo[std::size_t(r_)];
    b_ = cnt_[std::size_t(gr_)];
    // dL_r/dz per sample: L_r = (n/B) x its losses' sum, or with --uneven its own mean loss.
    loss_scale_ = !cfg_.uneven ? Real(n_) / Real(B_) : b_ > 0 ? Real(1) / Real(b_) : Real(0);
    weighted_ = cfg_.uneven && cfg_.weights;
    if constexpr (gradsync::is_set_reduced_v<TableGroup>)
      sync_.template bind_process_set<typename gradsync::LocalVarPolicy<TableGroup>::set_tag>(
          table_set.empty() ? std::vector<int>{r_} : table_set);
    plan_tables();
    build_mlps();
    build_interaction();
    build_exchange();
    register_gradients();
  }

  /// Generates this rank's share of global batch `step`, runs forward and backward, synchronizes
  /// the gradients. Returns the global mean loss of the batch (before the update).
  Real compute_gradients(std::uint64_t step) {
    Real sums[3] = {0, gen_.fill(step, sample0_, b_, dense_h_, ids_local_h_, label_h_), 0};
    for (Index s = 0; s < b_; ++s) sums[2] += label_h_(s);
    Kokkos::deep_copy(dense_, dense_h_);
    Kokkos::deep_copy(label_, label_h_);
    exchange_ids();
    build_sparse_rows();

    // Lookup for the global batch, then the forward all-to-all.
    Kokkos::parallel_for("dlrm::lookup", range(Index(my_.size()) * GB_ * dim_),
                         EmbeddingLookup{tables_, ids_my_, row_offset_, pos_, emb_send_, GB_, dim_});
    alltoallv(emb_send_, emb_send_h_, emb_scount_, emb_sdispl_, emb_recv_, emb_recv_h_, emb_rcount_, emb_rdispl_,
              stats_.embeddings);
    Kokkos::parallel_for("dlrm::unpack_embeddings", range(b_ * T_ * dim_),
                         EmbeddingBlocks{emb_recv_, table_offset_, emb_, T_, dim_, false});

    // Data-parallel part on the local samples.
    forward(bottom_, dense_);
    const Matrix& h = bottom_.back().y;
    Kokkos::parallel_for("dlrm::interaction", range(b_ * cfg_.interaction_width()),
                         InteractionForward{h, inter_, emb_, pair_i_, pair_j_, dim_, cfg_.interaction_width()});
    forward(top_, inter_);
    Kokkos::parallel_reduce("dlrm::sigmoid_bce", range(b_),
                            SigmoidBce{top_.back().y, top_.back().dy, label_, loss_scale_}, sums[0]);

    backward(top_, dinter_);
    Kokkos::parallel_for(
        "dlrm::interaction_backward", range(b_ * cfg_.num_vectors() * dim_),
        InteractionBackward{dinter_, h, bottom_.back().dy, emb_, demb_, pair_index_, dim_, cfg_.num_vectors()});
    backward(bottom_, Matrix());

    // Backward all-to-all: each embedding gradient returns to its table's owner.
    Kokkos::parallel_for(
        "dlrm::pack_embedding_grads", range(b_ * T_ * dim_),
        EmbeddingBlocks{emb_recv_, table_offset_, demb_, T_, dim_, true, weighted_ ? Real(b_) : Real(1)});
    alltoallv(emb_recv_, emb_recv_h_, emb_rcount_, emb_rdispl_, emb_send_, emb_send_h_, emb_scount_, emb_sdispl_,
              stats_.gradients);
    Kokkos::parallel_for(
        "dlrm::sparse_row_gradient", range(Index(my_.size()) * GB_ * dim_),
        SparseRowGradient{emb_send_, pos_, uniq_first_, uniq_count_, csr_begin_, csr_sample_, table_grad_, GB_, dim_});
    Kokkos::fence();
    // Every call completes the step: RowSparse tables need backward_passes_per_step = 1 (add() refuses more).
    if (weighted_) sync_.set_samples(std::int64_t(b_));
    (void)sync_.synchronize();

    // The global mean loss (and the teacher's), for reporting: (1/B) x the sums over every sample.
    backend_.allreduce_sum(sums, 3);
    teacher_loss_ = sums[1] / Real(B_);
    clicks_ += sums[2];
    samples_ += Real(B_);
    return sums[0] / Real(B_);
  }

  /// Clips every gradient (the MLPs' and the tables' rows) by the norm of the whole model's
  /// gradient, as one process would compute it; returns that norm before clipping. Collective.
  double clip_gradients(double max_norm) { return norm_.clip(sync_, max_norm); }

  /// Adds delta to every parameter of this rank's tables (the check starts replicas apart).
  void perturb_tables(Real delta) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tables_);
    for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] += delta;
    Kokkos::deep_copy(tables_, h);
  }

  /// With replicas: every replica of a table shard takes the values of the shard's first replica
  /// (gradsync::broadcast_set_parameter over the shard's process set). Collective.
  void broadcast_tables() {
    if constexpr (gradsync::is_set_reduced_v<TableGroup>) {
      sync_.prepare();  // the process sets' communicators
      gradsync::broadcast_set_parameter<TableGroup>(sync_, tables_);
    }
  }

  /// One SGD step: MLPs everywhere (--shard: this rank's slices, then every rank's to every rank),
  /// only the touched rows of this rank's tables.
  void apply_sgd() {
    if (cfg_.shard) {
      for (auto [g, count] : sync_.owned_slices())
        for (const auto& [p, pg] : mlp_pairs_)  // the parameter whose gradient holds the slice
          if (g >= pg.data() && g < pg.data() + pg.size())
            Kokkos::parallel_for("dlrm::sgd", range(Index(count)), AxpyUpdate{p.data() + (g - pg.data()), g, cfg_.lr});
      Kokkos::fence();
      gradsync::allgather_parameters(sync_, mlp_pairs_);
    } else {
      for (auto* mlp : {&bottom_, &top_})
        for (Layer& l : *mlp) {
          Kokkos::parallel_for("dlrm::sgd", range(Index(l.w.size())), AxpyUpdate{l.w.data(), l.gw.data(), cfg_.lr});
          Kokkos::parallel_for("dlrm::sgd", range(Index(l.b.size())), AxpyUpdate{l.b.data(), l.gb.data(), cfg_.lr});
        }
    }
    // The rows the sync left in each table's RowSparse: this batch's rows, or with replicas the
    // union of every replica's rows (summed over the table's process set).
    for (std::size_t i = 0; i < table_rows_.size(); ++i)
      Kokkos::parallel_for(
          "dlrm::sgd_sparse_rows", range(table_rows_[i].rows() * dim_),
          TableRowUpdate{tables_, table_grad_, row_ids_, Index(i), row_offset_h_(Index(i)), cfg_.lr, dim_});
    Kokkos::fence();
  }

  /// The sum of squares of every parameter of the global model, each table once (with replicas,
  /// replica group 0's copy): per table, then the MLPs, added in a fixed order, so that the value
  /// depends on the parameters alone and not on the rank count. Collective.
  double digest() const {
    std::vector<double> per_table(std::size_t(T_) + 1, 0.0);  // the last: the MLPs (rank 0's)
    if (replica() == 0)
      for (int t : my_) {
        double s = 0;
        for (Real x : table_parameters(t)) s += double(x) * double(x);
        per_table[std::size_t(t)] = s;
      }
    if (r_ == 0)
      for (const auto* mlp : {&bottom_, &top_})
        for (const Layer& l : *mlp)
          for (const auto& v : {examples::to_host(l.w), examples::to_host(l.b)})
            for (Real x : v) per_table.back() += double(x) * double(x);
    backend_.allreduce_sum(per_table.data(), per_table.size());  // one nonzero term per entry
    double sum = 0;
    for (double x : per_table) sum += x;
    return sum;
  }

#if defined(GRADSYNC_HAVE_HDF5)
  /// Writes every parameter (the MLPs once, each table under its gradient's name "table t", with
  /// replicas once per shard) and `step`, the next batch's index, to the checkpoint `path`. Collective.
  void save(const std::string& path, std::int64_t step) {
    gradsync::save_checkpoint(sync_, path, checkpoint_state(step));
  }
  /// Reads them back, on any rank count and table assignment; returns the next batch's index.
  std::int64_t load(const std::string& path) {
    std::int64_t step = 0;
    gradsync::load_checkpoint(sync_, path, checkpoint_state(step));
    return step;
  }
#endif

  // ---- inspection (the check, the report) ----
  int rank() const { return r_; }
  int size() const { return n_; }
  /// This rank's replica group (--replicas: groups of n/R consecutive ranks; 0 without).
  int replica() const { return r_ / gn_; }
  const std::vector<Layer>& bottom() const { return bottom_; }
  /// --shard: this rank's slices of the MLP gradients (where a sharded sync leaves the average).
  const auto& owned_slices() const { return sync_.owned_slices(); }
  const std::vector<Layer>& top() const { return top_; }
  const std::vector<int>& owned_tables() const { return my_; }
  const std::vector<int>& owners() const { return owner_; }
  const gradsync::Stats& sync_stats() const { return sync_.stats(); }
  const Sync& sync() const { return sync_; }
  /// The sync's one-time costs (consistency check, plan, buffers) before the first step; collective.
  void prepare_sync() { sync_.prepare(); }
  const AllToAllStats& alltoall_stats() const { return stats_; }
  /// The teacher's own expected loss on the last batch: what a perfect model would score.
  Real teacher_loss() const { return teacher_loss_; }
  /// The loss of the best constant prediction (the click rate of every batch so far).
  Real constant_loss() const {
    const Real p = samples_ > 0 ? clicks_ / samples_ : Real(0.5);
    return p <= 0 || p >= 1 ? Real(0) : -(p * std::log(p) + (1 - p) * std::log1p(-p));
  }
  Index local_samples() const { return b_; }
  std::int64_t owned_rows() const { return row_offset_h_(Index(my_.size())); }
  std::size_t mlp_parameters() const { return sync_.data_parallel_bytes() / sizeof(Real); }

  /// Table t's sparse-row gradient (rows touched by the last batch, ascending) and its values.
  std::pair<std::vector<int>, std::vector<Real>> table_gradient(int t) const {
    const Index i = local_index(t);
    // Only table t's slots come to the host (on a device build, not every owned table's).
    auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                 Kokkos::subview(table_grad_, i, Kokkos::ALL(), Kokkos::ALL()));
    auto ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(row_ids_, i, Kokkos::ALL()));
    std::pair<std::vector<int>, std::vector<Real>> out;
    for (Index k = 0; k < table_rows_[std::size_t(i)].rows(); ++k) {
      out.first.push_back(ids(k));
      for (int d = 0; d < dim_; ++d) out.second.push_back(g(k, d));
    }
    return out;
  }

  /// Table t's parameters, [rows][dim].
  std::vector<Real> table_parameters(int t) const {
    const Index i = local_index(t);
    // Only table t's rows come to the host (on a device build, not every owned table's).
    auto p = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(),
        Kokkos::subview(tables_, std::make_pair(row_offset_h_(i), row_offset_h_(i + 1)), Kokkos::ALL()));
    return std::vector<Real>(p.data(), p.data() + p.size());
  }

 private:
  Index local_index(int t) const {
    auto it = std::find(my_.begin(), my_.end(), t);
    if (it == my_.end()) throw std::runtime_error("table " + std::to_string(t) + " is not on this rank");
    return Index(it - my_.begin());
  }

  void plan_tables() {
    owner_ = assign_tables(cfg_, gn_);  // over the replica group (every rank without replicas)
    tables_of_.assign(std::size_t(gn_), {});
    slot_.assign(std::size_t(T_), 0);
    for (int t = 0; t < T_; ++t) {
      auto& list = tables_of_[std::size_t(owner_[std::size_t(t)])];
      slot_[std::size_t(t)] = int(list.size());
      list.push_back(t);
    }
    my_ = tables_of_[std::size_t(gr_)];
    const Index m = Index(my_.size());
    row_offset_ = View1<Index>("dlrm::row_offset", m + 1);
    row_offset_h_ = Kokkos::create_mirror_view(row_offset_);
    row_offset_h_(0) = 0;
    for (Index i = 0; i < m; ++i) row_offset_h_(i + 1) = row_offset_h_(i) + cfg_.rows(my_[std::size_t(i)]);
    Kokkos::deep_copy(row_offset_, row_offset_h_);
    tables_ = Matrix("dlrm::tables", row_offset_h_(m), dim_);
    // DLRM's initialisation: uniform in +-1/sqrt(rows), from (seed, table, element): the same
    // values whichever rank owns the table.
    for (Index i = 0; i < m; ++i) {
      const int t = my_[std::size_t(i)];
      const Index first = row_offset_h_(i), rows = cfg_.rows(t);
      Kokkos::parallel_for("dlrm::init_table", range(rows * dim_),
                           InitUniform{tables_.data() + first * dim_, cfg_.seed, 0x1000 + std::uint64_t(t),
                                       Real(1.0 / std::sqrt(double(rows)))});
    }
    table_grad_ = Cube("dlrm::table_grad", std::size_t(m), std::size_t(B_), std::size_t(dim_));
    row_ids_ = RowIds("dlrm::row_ids", std::size_t(m), std::size_t(B_));
    row_ids_h_ = Kokkos::create_mirror_view(row_ids_);
  }

  void build_mlp(std::vector<Layer>& mlp, const std::vector<int>& widths, const char* name, std::uint64_t tag,
                 bool last_relu) {
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      Layer L;
      L.name = std::string(name) + "." + std::to_string(l);
      L.in = widths[l];
      L.out = widths[l + 1];
      L.relu = last_relu || l + 2 < widths.size();
      L.w = Matrix(L.name + ".weight", L.out, L.in);
      L.gw = Matrix(L.name + ".weight.grad", L.out, L.in);
      L.b = View1<Real>(L.name + ".bias", L.out);
      L.gb = View1<Real>(L.name + ".bias.grad", L.out);
      L.y = Matrix(L.name + ".y", b_, L.out);
      L.dy = Matrix(L.name + ".dy", b_, L.out);
      // DLRM's initialisation (normal with these deviations), drawn uniform with the same variance.
      const double sw = std::sqrt(2.0 / double(L.in + L.out)), sb = std::sqrt(1.0 / double(L.out));
      Kokkos::parallel_for("dlrm::init_mlp", range(Index(L.w.size())),
                           InitUniform{L.w.data(), cfg_.seed, tag + 2 * l, Real(std::sqrt(3.0) * sw)});
      Kokkos::parallel_for("dlrm::init_mlp", range(Index(L.b.size())),
                           InitUniform{L.b.data(), cfg_.seed, tag + 2 * l + 1, Real(std::sqrt(3.0) * sb)});
      mlp.push_back(std::move(L));
    }
  }

  void build_mlps() {
    build_mlp(bottom_, cfg_.bottom, "bottom", 0x100, true);  // DLRM's bottom MLP ends in a ReLU too
    build_mlp(top_, cfg_.top, "top", 0x200, false);          // the top MLP ends in the logit
    const int F = cfg_.dense_features();
    dense_ = Matrix("dlrm::dense", b_, F);
    dense_h_ = Kokkos::create_mirror_view(dense_);
    label_ = View1<Real>("dlrm::label", b_);
    label_h_ = Kokkos::create_mirror_view(label_);
    ids_local_h_ = Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace>("dlrm::ids_local", b_, T_);
  }

  void build_interaction() {
    const int V = cfg_.num_vectors(), P = cfg_.num_pairs();
    pair_i_ = View1<int>("dlrm::pair_i", P);
    pair_j_ = View1<int>("dlrm::pair_j", P);
    pair_index_ = Kokkos::View<int**, Kokkos::LayoutRight, Mem>("dlrm::pair_index", V, V);
    auto pi = Kokkos::create_mirror_view(pair_i_);
    auto pj = Kokkos::create_mirror_view(pair_j_);
    auto px = Kokkos::create_mirror_view(pair_index_);
    int p = 0;
    for (int i = 0; i < V; ++i)
      for (int j = i + 1; j < V; ++j) {
        pi(p) = i;
        pj(p) = j;
        px(i, j) = px(j, i) = p;
        ++p;
      }
    Kokkos::deep_copy(pair_i_, pi);
    Kokkos::deep_copy(pair_j_, pj);
    Kokkos::deep_copy(pair_index_, px);
    inter_ = Matrix("dlrm::interaction", b_, cfg_.interaction_width());
    dinter_ = Matrix("dlrm::interaction.grad", b_, cfg_.interaction_width());
    emb_ = Cube("dlrm::embeddings", std::size_t(b_), std::size_t(T_), std::size_t(dim_));
    demb_ = Cube("dlrm::embeddings.grad", std::size_t(b_), std::size_t(T_), std::size_t(dim_));
  }

  // Counts, displacements and positions of the three all-to-alls; they depend only on the batch
  // split and the table assignment, so they are computed once.
  void build_exchange() {
    const Index m = Index(my_.size());
    id_scount_.assign(std::size_t(gn_), 0);
    id_rcount_ = id_sdispl_ = id_rdispl_ = emb_scount_ = emb_rcount_ = emb_sdispl_ = emb_rdispl_ = id_scount_;
    for (int p = 0; p < gn_; ++p) {
      id_scount_[std::size_t(p)] = int(Index(tables_of_[std::size_t(p)].size()) * b_);  // my samples' ids of p's tables
      id_rcount_[std::size_t(p)] = int(m * cnt_[std::size_t(p)]);                       // p's samples' ids of my tables
      emb_scount_[std::size_t(p)] = id_rcount_[std::size_t(p)] * dim_;
      emb_rcount_[std::size_t(p)] = id_scount_[std::size_t(p)] * dim_;
    }
    for (int p = 1; p < gn_; ++p) {
      id_sdispl_[std::size_t(p)] = id_sdispl_[std::size_t(p) - 1] + id_scount_[std::size_t(p) - 1];
      id_rdispl_[std::size_t(p)] = id_rdispl_[std::size_t(p) - 1] + id_rcount_[std::size_t(p) - 1];
      emb_sdispl_[std::size_t(p)] = emb_sdispl_[std::size_t(p) - 1] + emb_scount_[std::size_t(p) - 1];
      emb_rdispl_[std::size_t(p)] = emb_rdispl_[std::size_t(p) - 1] + emb_rcount_[std::size_t(p) - 1];
    }
    ids_send_.assign(std::size_t(T_ * b_), 0);
    ids_recv_.assign(std::size_t(m * GB_), 0);

    // pos: where owned table i's vector for global sample s sits in the buffer exchanged with s's rank.
    pos_ = View1<Index>("dlrm::pos", m * GB_);
    auto pos = Kokkos::create_mirror_view(pos_);
    for (int p = 0; p < gn_; ++p)
      for (Index i = 0; i < m; ++i)
        for (Index s = 0; s < cnt_[std::size_t(p)]; ++s)
          pos(i * GB_ + lo_[std::size_t(p)] + s) = emb_sdispl_[std::size_t(p)] + (i * cnt_[std::size_t(p)] + s) * dim_;
    Kokkos::deep_copy(pos_, pos);
    // table_offset: where table t's vectors for my samples start in what its owner sent me.
    table_offset_ = View1<Index>("dlrm::table_offset", T_);
    auto off = Kokkos::create_mirror_view(table_offset_);
    for (int t = 0; t < T_; ++t)
      off(t) = emb_rdispl_[std::size_t(owner_[std::size_t(t)])] + Index(slot_[std::size_t(t)]) * b_ * dim_;
    Kokkos::deep_copy(table_offset_, off);

    emb_send_ = View1<Real>("dlrm::emb_send", std::size_t(m * GB_ * dim_));
    emb_recv_ = View1<Real>("dlrm::emb_recv", std::size_t(b_ * T_ * dim_));
    emb_send_h_ = Kokkos::create_mirror_view(emb_send_);
    emb_recv_h_ = Kokkos::create_mirror_view(emb_recv_);

    ids_my_ = View1<int>("dlrm::ids", m * GB_);
    ids_my_h_ = Kokkos::create_mirror_view(ids_my_);
    uniq_first_ = View1<Index>("dlrm::uniq_first", m);
    uniq_count_ = View1<Index>("dlrm::uniq_count", m);
    uniq_table_ = View1<Index>("dlrm::uniq_table", m * GB_);
    uniq_row_ = View1<int>("dlrm::uniq_row", m * GB_);
    csr_begin_ = View1<Index>("dlrm::csr_begin", m * GB_ + 1);
    csr_sample_ = View1<Index>("dlrm::csr_sample", m * GB_);
    uniq_first_h_ = Kokkos::create_mirror_view(uniq_first_);
    uniq_count_h_ = Kokkos::create_mirror_view(uniq_count_);
    uniq_table_h_ = Kokkos::create_mirror_view(uniq_table_);
    uniq_row_h_ = Kokkos::create_mirror_view(uniq_row_);
    csr_begin_h_ = Kokkos::create_mirror_view(csr_begin_);
    csr_sample_h_ = Kokkos::create_mirror_view(csr_sample_);
    sort_buf_.resize(std::size_t(GB_));
  }

  void register_gradients() {
    for (auto* mlp : {&bottom_, &top_})
      for (Layer& l : *mlp) {
        sync_.template add<Mlp>(l.gw, l.name + ".weight");
        sync_.template add<Mlp>(l.gb, l.name + ".bias");
        mlp_pairs_.push_back({MlpSpan(l.w.data(), l.w.size()), MlpSpan(l.gw.data(), l.gw.size())});
        mlp_pairs_.push_back({MlpSpan(l.b.data(), l.b.size()), MlpSpan(l.gb.data(), l.gb.size())});
      }
    // Each table's sparse-row gradient: local to its owner, its touched rows scaled by the group's
    // policy. Up to B rows (one per sample), of a table of rows(t) rows.
    for (std::size_t i = 0; i < my_.size(); ++i) {
      table_rows_.emplace_back(Kokkos::subview(table_grad_, Index(i), Kokkos::ALL(), Kokkos::ALL()),
                               Kokkos::subview(row_ids_, Index(i), Kokkos::ALL()), cfg_.rows(my_[i]));
      sync_.template add<TableGroup>(table_rows_.back(), "table " + std::to_string(my_[i]));
    }
  }

#if defined(GRADSYNC_HAVE_HDF5)
  gradsync::CheckpointState checkpoint_state(std::int64_t& step) {
    gradsync::CheckpointState st;
    for (auto* mlp : {&bottom_, &top_})
      for (Layer& l : *mlp) st.parameter(l.w, l.name + ".weight").parameter(l.b, l.name + ".bias");
    for (std::size_t i = 0; i < my_.size(); ++i)
      st.parameter(
          Kokkos::subview(tables_, std::make_pair(row_offset_h_(Index(i)), row_offset_h_(Index(i) + 1)), Kokkos::ALL()),
          "table " + std::to_string(my_[i]));
    st.replicated(step, "step");
    return st;
  }
#endif

  // ---- one step's pieces ----

  void forward(std::vector<Layer>& mlp, const Matrix& input) {
    Matrix x = input;
    for (Layer& l : mlp) {
      Kokkos::parallel_for("dlrm::dense", range(b_ * l.out), DenseForward{x, l.w, l.y, l.b, l.in, l.out, l.relu});
      x = l.y;
    }
  }

  // Expects the last layer's dy; leaves dinput (when given) = dL/d(input).
  void backward(std::vector<Layer>& mlp, const Matrix& dinput) {
    for (std::size_t k = mlp.size(); k-- > 0;) {
      Layer& l = mlp[k];
      if (l.relu) Kokkos::parallel_for("dlrm::relu_backward", range(b_ * l.out), ReluBackward{l.dy, l.y, l.out});
      const Matrix x = k > 0 ? mlp[k - 1].y : (&mlp == &top_ ? inter_ : dense_);
      Kokkos::parallel_for("dlrm::dense_backward_weights", range(Index(l.out) * (l.in + 1)),
                           DenseBackwardWeights{l.dy, x, l.gw, l.gb, l.in, b_});
      const Matrix dx = k > 0 ? mlp[k - 1].dy : dinput;
      if (dx.data() != nullptr)
        Kokkos::parallel_for("dlrm::dense_backward_input", range(b_ * l.in),
                             DenseBackwardInput{l.dy, l.w, dx, l.in, l.out});
    }
  }

  // Each table's ids go from the ranks holding the samples to the rank holding the table.
  void exchange_ids() {
    for (int q = 0; q < gn_; ++q) {
      int* out = ids_send_.data() + id_sdispl_[std::size_t(q)];
      for (int t : tables_of_[std::size_t(q)])
        for (Index s = 0; s < b_; ++s) *out++ = ids_local_h_(s, t);
    }
    watched_alltoallv(ids_send_.data(), id_scount_.data(), id_sdispl_.data(), ids_recv_.data(), id_rcount_.data(),
                      id_rdispl_.data(), "all-to-all of embedding ids");
    count_sent(id_scount_, sizeof(int), stats_.ids);
    const Index m = Index(my_.size());
    for (int p = 0; p < gn_; ++p)
      for (Index i = 0; i < m; ++i)
        for (Index s = 0; s < cnt_[std::size_t(p)]; ++s)
          ids_my_h_(i * GB_ + lo_[std::size_t(p)] + s) =
              ids_recv_[std::size_t(id_rdispl_[std::size_t(p)] + i * cnt_[std::size_t(p)] + s)];
    Kokkos::deep_copy(ids_my_, ids_my_h_);
  }

  // The rows each owned table's batch touched (ascending) and, per row, the samples that touched
  // it (ascending): index bookkeeping on the host, the sums themselves in SparseRowGradient.
  void build_sparse_rows() {
    const Index m = Index(my_.size());
    Index u = 0, q = 0;
    for (Index i = 0; i < m; ++i) {
      for (Index s = 0; s < GB_; ++s) sort_buf_[std::size_t(s)] = {ids_my_h_(i * GB_ + s), s};
      std::sort(sort_buf_.begin(), sort_buf_.end());
      uniq_first_h_(i) = u;
      for (Index k = 0; k < GB_; ++k) {
        if (k == 0 || sort_buf_[std::size_t(k)].first != sort_buf_[std::size_t(k) - 1].first) {
          uniq_table_h_(u) = i;
          uniq_row_h_(u) = sort_buf_[std::size_t(k)].first;
          csr_begin_h_(u) = q;
          ++u;
        }
        csr_sample_h_(q++) = sort_buf_[std::size_t(k)].second;
      }
      uniq_count_h_(i) = u - uniq_first_h_(i);
      for (Index k = 0; k < uniq_count_h_(i); ++k) row_ids_h_(i, k) = uniq_row_h_(uniq_first_h_(i) + k);
      table_rows_[std::size_t(i)].set_rows(uniq_count_h_(i));
    }
    Kokkos::deep_copy(row_ids_, row_ids_h_);
    csr_begin_h_(u) = q;
    uniq_total_ = u;
    Kokkos::deep_copy(uniq_first_, uniq_first_h_);
    Kokkos::deep_copy(uniq_count_, uniq_count_h_);
    Kokkos::deep_copy(uniq_table_, uniq_table_h_);
    Kokkos::deep_copy(uniq_row_, uniq_row_h_);
    Kokkos::deep_copy(csr_begin_, csr_begin_h_);
    Kokkos::deep_copy(csr_sample_, csr_sample_h_);
  }

  // An all-to-all of device buffers through the backend, staged through host mirrors (no-ops when
  // the default memory space is the host's).
  void alltoallv(const View1<Real>& send, const HostReal& send_h, const std::vector<int>& scount,
                 const std::vector<int>& sdispl, const View1<Real>& recv, const HostReal& recv_h,
                 const std::vector<int>& rcount, const std::vector<int>& rdispl, std::uint64_t& bytes) {
    Kokkos::fence();
    Kokkos::deep_copy(send_h, send);
    watched_alltoallv(send_h.data(), scount.data(), sdispl.data(), recv_h.data(), rcount.data(), rdispl.data(),
                      "all-to-all of embeddings");
    Kokkos::deep_copy(recv, recv_h);
    count_sent(scount, sizeof(Real), bytes);
  }

  // Over MPI, waited under the sync's stall watchdog (gradsync::alltoallv): a stopped or failed rank
  // of the group ends the others' wait with an error naming the exchange instead of hanging them.
  template <class T>
  void watched_alltoallv(const T* send, const int* scount, const int* sdispl, T* recv, const int* rcount,
                         const int* rdispl, const char* what) {
    if constexpr (std::is_same_v<Backend, gradsync::MpiBackend>)
      gradsync::alltoallv(sync_, send, scount, sdispl, recv, rcount, rdispl, group_.comm(), what);
    else
      group_.alltoallv(send, scount, sdispl, recv, rcount, rdispl);
  }

  void count_sent(const std::vector<int>& scount, std::size_t elem, std::uint64_t& bytes) {
    for (int p = 0; p < gn_; ++p)
      if (p != gr_) bytes += std::uint64_t(scount[std::size_t(p)]) * elem;
    ++stats_.calls;
  }

  Config cfg_;
  Backend backend_;  // every rank: the loss (MpiBackend copies share one communicator)
  Backend group_;    // the replica group: the all-to-alls (backend_ itself without replicas)
  Sync sync_;
  gradsync::GlobalNorm<Sync> norm_;  // --clip
  Generator gen_;
  int n_ = 1, r_ = 0, gn_ = 1, gr_ = 0, T_ = 0, dim_ = 0;
  Index B_ = 0, b_ = 0;
  Real loss_scale_ = 1;          // dL_r / d(a sample's loss)
  bool weighted_ = false;        // --uneven with set_samples() (--weights on)
  Index GB_ = 0;                 // the replica group's samples (B_ without replicas)
  Index sample0_ = 0;            // this rank's first sample in the global batch
  std::vector<Index> lo_, cnt_;  // per member of the replica group: first sample (from the group's), count

  std::vector<int> owner_, slot_, my_;
  std::vector<std::vector<int>> tables_of_;
  View1<Index> row_offset_;
  typename View1<Index>::HostMirror row_offset_h_;
  Matrix tables_;
  Cube table_grad_;
  RowIds row_ids_;
  typename RowIds::HostMirror row_ids_h_;
  std::vector<TableRows> table_rows_;  // table_grad_'s slices as RowSparse, shared with the sync

  std::vector<Layer> bottom_, top_;
  using MlpSpan = gradsync::Span<Real, Mem>;
  std::vector<std::pair<MlpSpan, MlpSpan>> mlp_pairs_;  // (parameter, gradient) of every MLP tensor
  Matrix dense_, inter_, dinter_;
  typename Matrix::HostMirror dense_h_;
  View1<Real> label_;
  HostReal label_h_;
  Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace> ids_local_h_;
  Cube emb_, demb_;
  View1<int> pair_i_, pair_j_;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> pair_index_;

  std::vector<int> id_scount_, id_sdispl_, id_rcount_, id_rdispl_;
  std::vector<int> emb_scount_, emb_sdispl_, emb_rcount_, emb_rdispl_;
  std::vector<int> ids_send_, ids_recv_;
  View1<Index> pos_, table_offset_;
  View1<Real> emb_send_, emb_recv_;
  HostReal emb_send_h_, emb_recv_h_;

  View1<int> ids_my_;
  typename View1<int>::HostMirror ids_my_h_;
  View1<Index> uniq_first_, uniq_count_, uniq_table_, csr_begin_, csr_sample_;
  View1<int> uniq_row_;
  typename View1<Index>::HostMirror uniq_first_h_, uniq_count_h_, uniq_table_h_, csr_begin_h_, csr_sample_h_;
  typename View1<int>::HostMirror uniq_row_h_;
  Index uniq_total_ = 0;
  std::vector<std::pair<int, Index>> sort_buf_;

  AllToAllStats stats_;
  Real teacher_loss_ = 0, clicks_ = 0, samples_ = 0;
};

}  // namespace dlrm
