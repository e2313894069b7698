// Sharded optimizer state (Options::shard, issue 46): the sync reduce-scatters the data-parallel
// gradients, the DistributedOptimizer keeps state for this rank's slices only, updates them and
// allgathers the parameters. Reference: the same model trained unsharded in the same process, the
// same gradients every pass; the parameters must agree to 1e-12 relative after several steps, with
// tensor sizes no rank count divides, local groups of different sizes per rank, two passes per
// step, uneven samples and clipping.
#include <cmath>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::error_of;
using gradsync_test::rel_err;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
struct Pairs {};    // process sets of ranks {0, 1}, {2, 3}: at 3 ranks {0, 1} and {2}
struct PairSum {};  // reduced over the pair, / n (the global mean loss)
template <>
struct gradsync::LocalVarPolicy<PairSum> : gradsync::ReduceOver<Pairs> {};
struct PairMean {};  // reduced over the pair, / |S|
template <>
struct gradsync::LocalVarPolicy<PairMean> : gradsync::ReduceOver<Pairs, gradsync::SetScale::set_size> {};

namespace {

using View = Kokkos::View<double*, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// Data-parallel sizes no rank count in 1..4 divides (in place: >= 8192 doubles; packed: the rest),
// and a local tower whose size differs per rank.
const std::vector<std::size_t> dp_sizes = {13, 70001, 5, 30011, 1, 9001, 7};
std::size_t tower_size(int rank) { return 37 + 1000 * std::size_t(rank); }
// A process set's tensors (Sets::with): sizes no set size divides, one larger than a chunk.
const std::vector<std::size_t> set_sizes = {4099, 3, 20011};
std::vector<int> pair_of(int rank, int n) {
  std::vector<int> s{rank / 2 * 2};
  if (s[0] + 1 < n) s.push_back(s[0] + 1);
  return s;
}
enum class Sets { none, with, sums_only };  // sums_only: no PairMean (set_samples refuses it)

double grad_value(std::size_t k, std::size_t i, int rank, int pass) {
  return std::sin(0.37 * double(i) + 1.3 * double(k) + 0.7 * rank + 0.11 * pass) * (1.0 + 0.1 * rank);
}
// Quarters in [-2, 2]: every partial sum of up to 4 ranks and 2 passes is exact in bf16 and fp16,
// so a compressed sum equals the full-precision one whatever the order of its roundings.
double exact_value(std::size_t k, std::size_t i, int rank, int pass) {
  return double(int((7 * i + 3 * k + 5 * std::size_t(rank) + std::size_t(pass)) % 17) - 8) / 4;
}
double init_value(std::size_t k, std::size_t i) { return std::cos(0.05 * double(i) + double(k)); }

template <class Opt>
struct Model {
  std::vector<View> p, g;
  gradsync::DistributedOptimizer<Opt, Sync> dopt;
  Model(Opt opt, gradsync::Options o, int rank, Sets sets = Sets::none)
      : dopt(std::move(opt), Sync(gradsync::MpiBackend(MPI_COMM_WORLD), o)) {
    if (sets != Sets::none) dopt.sync().template bind_process_set<Pairs>(pair_of(rank, world_size()));
    const std::size_t ns = sets == Sets::none ? 0 : set_sizes.size();
    for (std::size_t k = 0; k <= dp_sizes.size() + ns; ++k) {
      const std::size_t j = k - dp_sizes.size() - 1;  // among the set's tensors
      const std::size_t n = k < dp_sizes.size() ? dp_sizes[k] : k == dp_sizes.size() ? tower_size(rank) : set_sizes[j];
      p.emplace_back("p", n);
      g.emplace_back("g", n);
      for (std::size_t i = 0; i < n; ++i) p.back()(i) = init_value(k, i);
      if (k < dp_sizes.size())
        dopt.template add<Dense>(p.back(), g.back());
      else if (k == dp_sizes.size())
        dopt.template add<Tower>(p.back(), g.back());
      else if (j == 1 && sets == Sets::with)
        dopt.template add<PairMean>(p.back(), g.back());
      else
        dopt.template add<PairSum>(p.back(), g.back());
    }
  }
  void fill(int rank, int pass, bool exact = false) {
    for (std::size_t k = 0; k < g.size(); ++k)
      for (std::size_t i = 0; i < g[k].size(); ++i)
        g[k](i) = exact ? exact_value(k, i, rank, pass) : grad_value(k, i, rank, pass);
  }
};

struct Case {
  int passes;
  bool samples, clip;
  gradsync::Compression compression = gradsync::Compression::none;  // both runs; exact values with it
  Sets sets = Sets::none;
};

// K steps of the sharded and the unsharded model side by side; the worst relative difference of
// the parameters (every rank's), and the norms clipping saw.
template <class Opt>
double run_case(const Opt& opt, const Case& c, int steps, double* state_ratio = nullptr) {
  const int rank = world_rank(), n = world_size();
  gradsync::Options o;
  o.backward_passes_per_step = c.passes;
  o.compression = c.compression;
  const bool exact = c.compression != gradsync::Compression::none;
  Model<Opt> plain(opt, o, rank, c.sets);
  o.shard = gradsync::Shard::optimizer_state;
  Model<Opt> sharded(opt, o, rank, c.sets);
  int pass = 0;
  for (int s = 0; s < steps; ++s) {
    for (int q = 0; q < c.passes; ++q, ++pass) {
      for (auto* m : {&plain.dopt, &sharded.dopt})
        if (c.samples) m->set_samples(1 + (rank + pass) % 3);
      plain.fill(rank, pass, exact);
      sharded.fill(rank, pass, exact);
      const bool a = plain.dopt.synchronize(), b = sharded.dopt.synchronize();
      REQUIRE(a == b);
      if (!a) continue;
      if (c.clip) {
        const double na = plain.dopt.clip_grad_norm(0.5), nb = sharded.dopt.clip_grad_norm(0.5);
        CAPTURE(na);
        CAPTURE(nb);
        GRADSYNC_CHECK_ALL(rel_err(nb, na) <= 1e-12);
      }
      plain.dopt.apply();
      sharded.dopt.apply();
    }
  }
  double worst = 0;
  for (std::size_t k = 0; k < plain.p.size(); ++k)
    for (std::size_t i = 0; i < plain.p[k].size(); ++i)
      worst = std::max(worst, rel_err(sharded.p[k](i), plain.p[k](i)));
  if (state_ratio) {
    const double full = double(plain.dopt.state_bytes()), mine = double(sharded.dopt.state_bytes());
    const double local = 2.0 * double(tower_size(rank)) * sizeof(double);  // Adam: two moments
    double set = 0;  // Adam's state of the set's tensors: whole unsharded, 1/|S| of it sharded
    for (std::size_t k = 0; k < set_sizes.size() && c.sets != Sets::none; ++k)
      set += 2.0 * double(set_sizes[k]) * sizeof(double);
    const double members = double(pair_of(rank, n).size());
    *state_ratio = (mine - local - set / members) / ((full - local - set) / n);
  }
  (void)n;
  return gradsync_test::max_over_ranks(worst);
}

}  // namespace

TEST_CASE("sharded Adam, AdamW and Sgd with momentum equal the unsharded run, every path") {
  gradsync::AdamOptions ao;
  ao.lr = 1e-2;
  ao.weight_decay = 1e-3;
  gradsync::AdamWOptions wo;
  wo.lr = 1e-2;
  gradsync::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  for (const Case& c : {Case{1, false, false}, Case{2, false, false}, Case{1, true, false}, Case{1, false, true},
                        Case{2, true, true}}) {
    CAPTURE(c.passes);
    CAPTURE(c.samples);
    CAPTURE(c.clip);
    const double adam = run_case(gradsync::Adam<View>(ao), c, 4);
    const double adamw = run_case(gradsync::AdamW<View>(wo), c, 4);
    const double sgd = run_case(gradsync::Sgd<View>(so), c, 4);
    CAPTURE(adam);
    CAPTURE(adamw);
    CAPTURE(sgd);
    GRADSYNC_CHECK_ALL(adam <= 1e-12 && adamw <= 1e-12 && sgd <= 1e-12);
  }
  // Compressed (the reduce-scatter of gradsync's ring with 16 bits on the wire, the allgather of the
  // parameters in full precision), on values whose sums are exact in 16 bits.
  for (const Case& c :
       {Case{1, false, false, gradsync::Compression::bf16}, Case{2, false, true, gradsync::Compression::bf16},
        Case{1, false, true, gradsync::Compression::fp16}, Case{2, false, false, gradsync::Compression::fp16}}) {
    CAPTURE(c.passes);
    CAPTURE(int(c.compression));
    const double adam = run_case(gradsync::Adam<View>(ao), c, 3);
    CAPTURE(adam);
    GRADSYNC_CHECK_ALL(adam <= 1e-12);
  }
}

TEST_CASE("sharded with compression: each rank's slice holds the 16-bit sum, in place and packed, 1 and 2 passes") {
  const int rank = world_rank(), n = world_size();
  for (auto comp : {gradsync::Compression::bf16, gradsync::Compression::fp16})
    for (int passes : {1, 2})
      for (bool exact : {true, false}) {
        CAPTURE(int(comp));
        CAPTURE(passes);
        CAPTURE(exact);
        gradsync::Options o;
        o.shard = gradsync::Shard::optimizer_state;
        o.compression = comp;
        o.backward_passes_per_step = passes;
        Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
        std::vector<View> g;
        for (std::size_t k = 0; k < dp_sizes.size(); ++k) {
          g.emplace_back("g", dp_sizes[k]);
          sync.add<Dense>(g.back());
        }
        bool done = false;
        for (int q = 0; q < passes; ++q) {
          for (std::size_t k = 0; k < g.size(); ++k)
            for (std::size_t i = 0; i < g[k].size(); ++i)
              g[k](i) = exact ? exact_value(k, i, rank, q) : grad_value(k, i, rank, q);
          done = sync.synchronize();
        }
        REQUIRE(done);
        // Each owned value against the sum of the passes averaged over ranks: equal where the
        // sums are exact, else within the bound of p roundings of the sum (docs/COMPRESSION.md).
        const double unit = std::ldexp(1.0, comp == gradsync::Compression::bf16 ? -8 : -11);
        double worst = 0, moved = 0;
        std::size_t seen = 0;
        for (const auto& [data, count] : sync.owned_slices())
          for (std::size_t j = 0; j < count; ++j, ++seen) {
            std::size_t k = 0, i = 0;
            for (; k < g.size(); ++k)
              if (data + j >= g[k].data() && data + j < g[k].data() + g[k].size()) {
                i = std::size_t(data + j - g[k].data());
                break;
              }
            REQUIRE(k < g.size());
            double sum = 0, mag = 0;
            for (int r = 0; r < n; ++r)
              for (int q = 0; q < passes; ++q) {
                const double v = exact ? exact_value(k, i, r, q) : grad_value(k, i, r, q);
                sum += v;
                mag += std::abs(v);
              }
            const double want = sum / n, err = std::abs(data[j] - want);  // passes summed (Horovod's default)
            moved = std::max(moved, err);
            // (fp16: plus half its subnormals' spacing, 2^-25, per rounding, for sums near 0)
            worst = std::max(worst, exact ? err : err / (unit * n * (mag / n) + std::ldexp(1.0, -25)));
          }
        CAPTURE(worst);
        CAPTURE(moved);
        GRADSYNC_CHECK_ALL(seen > 0 || n > 4);
        GRADSYNC_CHECK_ALL(exact ? worst <= 1e-15 : worst <= 1.0);
        // Not exact: the 16-bit rounding shows, so the values did cross in 16 bits.
        if (!exact) GRADSYNC_CHECK_ALL(gradsync_test::max_over_ranks(moved) > 1e-6);
      }
}

TEST_CASE("sharded fp16: a sum past 65504 in one rank's slice is an Error naming the tensor on every rank") {
  const int n = world_size(), r = world_rank();
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  o.compression = gradsync::Compression::fp16;
  o.op = gradsync::ReduceOp::sum;
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View small("small", 100), big("big", 40000);  // packed, and in place
  sync.add<Dense>(small, "small");
  sync.add<Dense>(big, "big");
  // The last value of each: in the last rank's slice only. One rank's values are within range, their
  // sum over the ranks is not (one rank: 70000 alone).
  for (View* bad : {&big, &small}) {
    const std::string name = bad == &big ? "big" : "small";
    CAPTURE(name);
    for (View* v : {&small, &big})
      for (std::size_t i = 0; i < v->size(); ++i) (*v)(i) = 1.0;
    (*bad)(bad->size() - 1) = n == 1 ? 70000.0 : 40000.0;
    const std::string msg = error_of<gradsync::Error>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    GRADSYNC_CHECK_ALL(msg.find("the fp16 sum of gradient '" + name + "'") != std::string::npos);
    // The next step, within range, goes through: each slice holds its exact sum.
    for (View* v : {&small, &big})
      for (std::size_t i = 0; i < v->size(); ++i) (*v)(i) = double(i % 7) + r;
    GRADSYNC_CHECK_ALL(error_of<gradsync::Error>([&] { (void)sync.synchronize(); }).empty());
    bool exact = true;
    for (const auto& [data, count] : sync.owned_slices())
      for (std::size_t j = 0; j < count; ++j) {
        const View& v = data >= big.data() && data < big.data() + big.size() ? big : small;
        const std::size_t i = std::size_t(data + j - v.data());
        exact = exact && data[j] == n * double(i % 7) + n * (n - 1) / 2;
      }
    GRADSYNC_CHECK_ALL(exact);
  }
}

TEST_CASE("sharded Adam holds a 1/p share of the data-parallel state, and the slices cover each value once") {
  const int n = world_size();
  double ratio = 0;
  const double worst = run_case(gradsync::Adam<View>(), Case{1, false, false}, 2, &ratio);
  GRADSYNC_CHECK_ALL(worst <= 1e-12);
  CAPTURE(ratio);
  // Each group's slice is within one value of 1/p of it: a few values over in all.
  GRADSYNC_CHECK_ALL(ratio <= 1.01 && ratio >= 0.99);
  // The ranks' slices partition the data-parallel values.
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  Model<gradsync::Adam<View>> m(gradsync::Adam<View>(), o, world_rank());
  m.fill(world_rank(), 0);
  REQUIRE(m.dopt.synchronize());
  double mine = 0;
  for (const auto& [data, count] : m.dopt.sync().owned_slices()) mine += double(count);
  double total = mine;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  std::size_t dp = 0;
  for (std::size_t s : dp_sizes) dp += s;
  GRADSYNC_CHECK_ALL(total == double(dp));
  GRADSYNC_CHECK_ALL(mine <= double(dp) / n + 64);
  m.dopt.apply();
  const std::string d = gradsync::describe(m.dopt);
  CAPTURE(d);
  CHECK(d.find(" bytes on this rank (data-parallel state sharded") != std::string::npos);
  CHECK(d.find("shard optimizer_state") != std::string::npos);
}

TEST_CASE("what a sharded step cannot do yet is a ConfigError naming it") {
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  o.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_auto;
  CHECK(error_of<gradsync::ConfigError>([&] {
          Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
        }).find("fusion_threshold_auto") != std::string::npos);
  o.tuning.fusion_threshold_bytes = gradsync::fusion_threshold_by_topology;
  o.tuning.collectives = gradsync::Collectives::blocking;
  CHECK(error_of<gradsync::ConfigError>([&] { Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), o); }).find("blocking") !=
        std::string::npos);
  // A row-sparse data-parallel gradient: refused at the plan, on every rank alike.
  o.tuning.collectives = gradsync::Collectives::automatic;
  Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View d("d", 10);
  Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> values("v", 4, 3);
  Kokkos::View<int*, Kokkos::HostSpace> ids("i", 4);
  gradsync::RowSparse<decltype(values), decltype(ids)> rows(values, ids, 100, 0);
  s.add<Dense>(d);
  s.add<Dense>(rows, "rows");
  const std::string e = error_of<gradsync::ConfigError>([&] { (void)s.synchronize(); });
  CAPTURE(e);
  GRADSYNC_CHECK_ALL(e.find("row-sparse data-parallel gradient 'rows'") != std::string::npos);
}

TEST_CASE("check_finite, sharded: a NaN on one rank is an Error naming the tensor on every rank") {
  const int rank = world_rank();
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  o.check_finite = true;
  Model<gradsync::Adam<View>> m(gradsync::Adam<View>(), o, rank);
  m.fill(rank, 0);
  REQUIRE(m.dopt.step());
  m.fill(rank, 1);
  if (rank == world_size() - 1) m.g[3](17) = std::nan("");
  const std::string e = error_of<gradsync::Error>([&] { (void)m.dopt.synchronize(); });
  CAPTURE(e);
  GRADSYNC_CHECK_ALL(e.find("Dense[3]") != std::string::npos);
}

TEST_CASE("sharded with mark_ready during backward: each chunk's reduce-scatter starts early, the same bits") {
  const int rank = world_rank();
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  o.tuning.fusion_threshold_bytes = 64 << 10;  // several chunks and groups: some start before the last is ready
  Model<gradsync::Adam<View>> plain(gradsync::Adam<View>(), o, rank), marked(gradsync::Adam<View>(), o, rank);
  for (int s = 0; s < 3; ++s) {
    plain.fill(rank, s);
    marked.fill(rank, s);
    for (std::size_t k = marked.g.size(); k-- > 0;) marked.dopt.sync().mark_ready(marked.g[k]);  // backward order
    REQUIRE(plain.dopt.step());
    REQUIRE(marked.dopt.step());
  }
  bool same = true;
  for (std::size_t k = 0; k < plain.p.size(); ++k)
    for (std::size_t i = 0; i < plain.p[k].size(); ++i) same &= plain.p[k](i) == marked.p[k](i);
  GRADSYNC_CHECK_ALL(same);
  GRADSYNC_CHECK_ALL(marked.dopt.sync().stats().allreduce_calls == plain.dopt.sync().stats().allreduce_calls);
}

TEST_CASE("process-set groups sharded within their set: the unsharded run's parameters, each slice the set's sum") {
  const int rank = world_rank(), n = world_size();
  gradsync::AdamOptions ao;
  ao.lr = 1e-2;
  gradsync::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  for (const Case& c : {Case{1, false, false, gradsync::Compression::none, Sets::with},
                        Case{2, false, true, gradsync::Compression::none, Sets::with},
                        Case{1, true, true, gradsync::Compression::none, Sets::sums_only},
                        Case{2, true, false, gradsync::Compression::none, Sets::sums_only}}) {
    CAPTURE(c.passes);
    CAPTURE(c.samples);
    CAPTURE(c.clip);
    double ratio = 0;
    const double adam = run_case(gradsync::Adam<View>(ao), c, 3, &ratio);
    const double sgd = run_case(gradsync::Sgd<View>(so), c, 3);
    CAPTURE(adam);
    CAPTURE(sgd);
    CAPTURE(ratio);
    GRADSYNC_CHECK_ALL(adam <= 1e-12 && sgd <= 1e-12);
    // The data-parallel state is 1/p of it and each set's 1/|S|, each within a few values.
    GRADSYNC_CHECK_ALL(ratio <= 1.01 && ratio >= 0.99);
  }
  // One sharded step: each slice of a set's tensor holds its analytic sum over the set's members,
  // / n (PairSum) or / |S| (PairMean), and the members' slices cover the set's values once.
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  Model<gradsync::Adam<View>> m(gradsync::Adam<View>(), o, rank, Sets::with);
  m.fill(rank, 0);
  REQUIRE(m.dopt.synchronize());
  const std::vector<int> set = pair_of(rank, n);
  double worst = 0, mine = 0;
  for (const auto& [data, count] : m.dopt.sync().owned_slices())
    for (std::size_t k = dp_sizes.size() + 1; k < m.g.size(); ++k) {
      const double* g0 = m.g[k].data();
      if (data < g0 || data >= g0 + m.g[k].size()) continue;
      const std::size_t j = k - dp_sizes.size() - 1;
      const double f = j == 1 ? 1.0 / double(set.size()) : 1.0 / double(n);
      for (std::size_t i = std::size_t(data - g0); i < std::size_t(data - g0) + count; ++i) {
        double sum = 0;
        for (int r : set) sum += grad_value(k, i, r, 0);
        worst = std::max(worst, std::abs(m.g[k](i) - f * sum));
      }
      mine += double(count);
    }
  CAPTURE(worst);
  GRADSYNC_CHECK_ALL(worst <= 1e-13);
  double covered = mine;
  MPI_Allreduce(MPI_IN_PLACE, &covered, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double per_set = 0;
  for (std::size_t s : set_sizes) per_set += double(s);
  GRADSYNC_CHECK_ALL(covered == per_set * double((n + 1) / 2));  // every set's values once
  GRADSYNC_CHECK_ALL(mine <= per_set / double(set.size()) + 2);
  // The norm counts each set's values once: that of the unsharded step.
  o.shard = gradsync::Shard::none;
  Model<gradsync::Adam<View>> u(gradsync::Adam<View>(), o, rank, Sets::with);
  u.fill(rank, 0);
  REQUIRE(u.dopt.synchronize());
  const double a = m.dopt.global_norm(), b = u.dopt.global_norm();
  CAPTURE(a);
  CAPTURE(b);
  GRADSYNC_CHECK_ALL(rel_err(a, b) <= 1e-12);
}

namespace {
// Adam that records, at each step_slots(), how many collectives its sync had launched.
struct RecordingAdam : gradsync::Adam<View> {
  using gradsync::Adam<View>::Adam;
  const Sync* sync = nullptr;
  std::vector<std::uint64_t> seen;
  void step_slots(std::size_t first, std::size_t last) {
    if (sync) seen.push_back(sync->stats().allreduce_calls);
    gradsync::Adam<View>::step_slots(first, last);
  }
};
// Adam with step() only: the update of every slot, then the allgather of every chunk.
struct WholeStepAdam {
  gradsync::Adam<View> adam;
  template <class P, class G>
  std::size_t add(const P& p, const G& g) {
    return adam.add(p, g);
  }
  void step() { adam.step(); }
  template <class F>
  void for_each_state(std::size_t slot, F&& f) {
    adam.for_each_state(slot, std::forward<F>(f));
  }
};
}  // namespace

TEST_CASE("sharded apply(): each group's allgather starts once its slices are updated, the same bits") {
  const int rank = world_rank();
  gradsync::Options o;
  o.shard = gradsync::Shard::optimizer_state;
  o.tuning.fusion_threshold_bytes = 64 << 10;  // several groups of chunks
  Model<RecordingAdam> chunked(RecordingAdam(), o, rank, Sets::with);
  Model<WholeStepAdam> whole(WholeStepAdam(), o, rank, Sets::with);
  chunked.dopt.optimizer().sync = &chunked.dopt.sync();
  for (int s = 0; s < 3; ++s) {
    chunked.fill(rank, s);
    whole.fill(rank, s);
    REQUIRE(chunked.dopt.step());
    REQUIRE(whole.dopt.step());
  }
  bool same = true;
  for (std::size_t k = 0; k < whole.p.size(); ++k)
    for (std::size_t i = 0; i < whole.p[k].size(); ++i) same &= whole.p[k](i) == chunked.p[k](i);
  GRADSYNC_CHECK_ALL(same);
  // The last step: the local slots, then one update per group (and the process set's slices);
  // collectives were launched between the first group's update and the last one's.
  const auto& seen = chunked.dopt.optimizer().seen;
  const std::size_t per_step = seen.size() / 3;
  CAPTURE(per_step);
  GRADSYNC_CHECK_ALL(per_step >= 4);
  GRADSYNC_CHECK_ALL(seen.back() > seen[seen.size() - per_step + 1]);
}
