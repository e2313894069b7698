// The plan that knows the topology: which ranks share a node (checked against the ranks' own
// processor names), the rule across nodes, Algorithm::hierarchical's values against the analytic
// average, and Algorithm::automatic timing flat against hierarchical on the first steps with every
// rank keeping the same one. Runs at 1-4 ranks on one host, where "nodes" are also made up by
// impl::mpi_ranks_per_node_override (so the three stages run across several "nodes"), and across
// the namespace hosts of tests/multihost (ctest label multihost), where they are real.
#include <gradsync/gradsync.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using namespace gradsync_test;

namespace {

struct Dense {};

// Sets the override for one scope; the backend reads it when it is built.
struct RanksPerNode {
  explicit RanksPerNode(int k) { gradsync::impl::mpi_ranks_per_node_override() = k; }
  ~RanksPerNode() { gradsync::impl::mpi_ranks_per_node_override() = 0; }
};

// The topology the ranks' processor names imply (MPI_Get_processor_name: the hostname), gathered
// independently of the backend: nodes are the distinct names, ordered by their lowest rank.
gradsync::Topology topology_from_names() {
  const int n = world_size(), r = world_rank();
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(std::size_t(n) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(all.data() + std::size_t(i) * MPI_MAX_PROCESSOR_NAME);
  std::vector<std::string> order;  // distinct names by first rank
  std::map<std::string, int> count;
  for (const auto& s : names) {
    if (!count.count(s)) order.push_back(s);
    ++count[s];
  }
  gradsync::Topology t;
  t.nodes = int(order.size());
  t.node = int(std::find(order.begin(), order.end(), names[std::size_t(r)]) - order.begin());
  t.local_size = count[names[std::size_t(r)]];
  t.local_rank = int(std::count(names.begin(), names.begin() + r, names[std::size_t(r)]));
  t.min_local_size = n, t.max_local_size = 0;
  for (const auto& [s, c] : count)
    t.min_local_size = std::min(t.min_local_size, c), t.max_local_size = std::max(t.max_local_size, c);
  return t;
}

// Node k of ranks r / per: the topology the override must produce.
gradsync::Topology topology_by_override(int per) {
  const int n = world_size(), r = world_rank();
  gradsync::Topology t;
  t.nodes = (n + per - 1) / per;
  t.node = r / per;
  t.local_rank = r % per;
  t.local_size = std::min(per, n - t.node * per);
  t.max_local_size = std::min(per, n);
  t.min_local_size = n % per == 0 ? std::min(per, n) : n % per;
  return t;
}

bool same(const gradsync::Topology& a, const gradsync::Topology& b) {
  return a.nodes == b.nodes && a.node == b.node && a.local_rank == b.local_rank && a.local_size == b.local_size &&
         a.min_local_size == b.min_local_size && a.max_local_size == b.max_local_size;
}

// Rank r's value i of tensor k at step p: integers below 2^20, so every sum is exact in float too
// and any order of additions gives the same bits.
double grad_value(std::size_t k, std::size_t i, int r, int p) {
  return double((k * 7 + i * 3 + std::size_t(r) * 11 + std::size_t(p) * 5) % 1024);
}

template <class T>
struct Model {
  using View = Kokkos::View<T*>;
  std::vector<View> g;
  // Sizes: small ones packed together, large ones reduced in place (in 64 KiB-sized chunks below).
  Model() {
    for (std::size_t n : {std::size_t(3), std::size_t(40000), std::size_t(17), std::size_t(70001), std::size_t(5)})
      g.emplace_back("g", n);
  }
  template <class Sync>
  void add_to(Sync& s) {
    for (auto& v : g) s.template add<Dense>(v);
  }
  void fill(int p) {
    const int r = world_rank();
    for (std::size_t k = 0; k < g.size(); ++k) fill_host(g[k], [&](std::size_t i) { return grad_value(k, i, r, p); });
  }
  // Largest error against the analytic average of step p, for `passes` aggregated passes.
  double error(int p, int passes = 1) const {
    const int n = world_size();
    double worst = 0;
    for (std::size_t k = 0; k < g.size(); ++k) {
      const auto h = host_copy(g[k]);
      for (std::size_t i = 0; i < h.size(); ++i) {
        double sum = 0;
        for (int q = 0; q < passes; ++q)
          for (int r = 0; r < n; ++r) sum += grad_value(k, i, r, p - passes + 1 + q);
        worst = std::max(worst, rel_err(h(i), sum / n));
      }
    }
    return worst;
  }
};

template <class T>
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Kokkos::View<T*>>;

gradsync::Options base() {
  gradsync::Options o;
  o.tuning.read_environment = false;
  return o;
}

}  // namespace

TEST_CASE("the backend's topology is the one the processor names give") {
  gradsync::MpiBackend b(MPI_COMM_WORLD);
  const gradsync::Topology want = topology_from_names();
  GRADSYNC_CHECK_ALL(same(b.topology(), want));
  Sync<double> s(b, base());
  GRADSYNC_CHECK_ALL(same(s.topology(), want));
  GRADSYNC_CHECK_ALL(s.stats().nodes == std::uint64_t(want.nodes));
}

TEST_CASE("ranks_per_node override: nodes of k ranks, as the analytic layout") {
  for (int per : {1, 2, 3}) {
    RanksPerNode k(per);
    gradsync::MpiBackend b(MPI_COMM_WORLD);
    GRADSYNC_CHECK_ALL(same(b.topology(), topology_by_override(per)));
  }
}

TEST_CASE("the rule across nodes grows the chunk with the ranks (256 KiB a ring step) and flies 8 from 16 ranks") {
  // ranks -> (MiB, in flight): docs/SCALING.md's table, not the formula
  const std::map<int, std::pair<double, int>> want = {
      {1, {1, 2}},    {2, {1, 2}},     {3, {1, 2}},     {4, {1, 2}},       {6, {1.5, 2}},
      {8, {2, 2}},    {15, {3.75, 2}}, {16, {4, 8}},    {64, {16, 8}},     {100, {25, 8}},
      {256, {64, 8}}, {1024, {64, 8}}, {4096, {64, 8}}, {1 << 20, {64, 8}}};
  for (const auto& [p, w] : want) {
    CHECK(double(gradsync::impl::network_chunk_bytes(p)) == w.first * (1 << 20));
    CHECK(gradsync::impl::network_chunks_in_flight(p) == w.second);
  }
  CHECK(gradsync::impl::network_chunk_bytes(0) == std::size_t(1) << 20);  // no ranks: the floor, no wrap
  // A model smaller than the chunks in flight: its share, at least 1 MiB (ResNet-50 and DLRM's MLP).
  const std::size_t resnet = 102228128, mlp = 1903940, mib = std::size_t(1) << 20;
  CHECK(gradsync::impl::network_chunk_for_model(4 * mib, resnet, 8) == 4 * mib);    // 16 ranks: the rule
  CHECK(gradsync::impl::network_chunk_for_model(16 * mib, resnet, 8) == 12778516);  // 64: an eighth of it
  CHECK(gradsync::impl::network_chunk_for_model(64 * mib, resnet, 8) == 12778516);
  CHECK(gradsync::impl::network_chunk_for_model(16 * mib, mlp, 8) == mib);  // the floor
  CHECK(gradsync::impl::network_chunk_for_model(mib, mlp, 2) == mib);
  CHECK(gradsync::impl::network_chunk_for_model(64 * mib, resnet, 0) == 64 * mib);  // no division by 0
}

TEST_CASE(
    "across nodes the rule picks 1 MiB chunks and 2 in flight at up to 4 ranks; on one node 4 MiB and 16; options "
    "win") {
  const int n = world_size();
  {
    RanksPerNode k(1);  // every rank its own node: the network between all of them, nothing to gather first
    Sync<float> s(gradsync::MpiBackend(MPI_COMM_WORLD), base());
    const bool network = n > 1;
    GRADSYNC_CHECK_ALL(s.fusion_threshold_bytes() == (network ? std::size_t(1) << 20 : std::size_t(4) << 20));
    GRADSYNC_CHECK_ALL(s.chunks_in_flight() == (network ? 2 : 16));
    GRADSYNC_CHECK_ALL(s.algorithm() == gradsync::Algorithm::flat && !s.tuning());
    GRADSYNC_CHECK_ALL(s.stats().chunk_bytes == s.fusion_threshold_bytes() &&
                       s.stats().chunks_in_flight == std::uint64_t(s.chunks_in_flight()));
  }
  {
    RanksPerNode k(4);  // one node of up to 4 ranks
    Sync<float> s(gradsync::MpiBackend(MPI_COMM_WORLD), base());
    GRADSYNC_CHECK_ALL(s.fusion_threshold_bytes() == std::size_t(4) << 20 && s.chunks_in_flight() == 16 &&
                       s.algorithm() == gradsync::Algorithm::flat && !s.tuning());
  }
  {
    RanksPerNode k(1);
    gradsync::Options o = base();
    o.tuning.fusion_threshold_bytes = std::size_t(3) << 20;
    o.tuning.max_chunks_in_flight = 5;
    o.tuning.algorithm = gradsync::Algorithm::flat;
    Sync<float> s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    GRADSYNC_CHECK_ALL(s.fusion_threshold_bytes() == std::size_t(3) << 20 && s.chunks_in_flight() == 5 && !s.tuning());
  }
}

TEST_CASE_TEMPLATE("hierarchical: the analytic average, over made-up and real nodes, packed, in place and aggregated",
                   T, float, double) {
  // Nonblocking (the default): the three stages of each chunk chained, chunks launched by
  // mark_ready during "backward"; blocking: three blocking calls per chunk, none launched early.
  for (auto collectives : {gradsync::Collectives::automatic, gradsync::Collectives::blocking}) {
    const bool blocking = collectives == gradsync::Collectives::blocking;
    for (int per : {0, 1, 2, 3}) {  // 0: the real nodes
      for (int passes : {1, 2}) {
        RanksPerNode k(per);
        gradsync::Options o = base();
        o.tuning.algorithm = gradsync::Algorithm::hierarchical;
        o.tuning.collectives = collectives;
        o.tuning.fusion_threshold_bytes = 64 << 10;  // several chunks
        o.backward_passes_per_step = passes;
        Model<T> m;
        Sync<T> s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
        m.add_to(s);
        for (int p = 0; p < 2 * passes; ++p) {
          m.fill(p);
          const std::uint64_t calls = s.stats().allreduce_calls;
          for (std::size_t t = m.g.size(); t-- > 0;) s.mark_ready(m.g[t]);  // backward's order
          const bool reducing = (p + 1) % passes == 0;
          // On the nonblocking path the marks of a reducing pass start the first chunks.
          GRADSYNC_CHECK_ALL((s.stats().allreduce_calls > calls) == (reducing && !blocking));
          const bool done = s.synchronize();
          GRADSYNC_CHECK_ALL(done == reducing);
          if (done)
            GRADSYNC_CHECK_ALL(m.error(p, passes) <= tol<T>());  // the sums are exact in any order; the 1/n rounds
        }
        GRADSYNC_CHECK_ALL(s.algorithm() == gradsync::Algorithm::hierarchical &&
                           s.stats().algorithm == gradsync::Algorithm::hierarchical &&
                           s.summary().blocking == blocking &&
                           s.stats().chunks_in_flight == (blocking ? 1u : std::uint64_t(s.chunks_in_flight())));
        const std::string d = describe(s);
        GRADSYNC_CHECK_ALL(has(d, "algorithm hierarchical (set)") &&
                           has(d, blocking ? "a blocking reduce within each node, allreduce among nodes and broadcast"
                                           : "chunks in flight, each a reduce within each node, allreduce among nodes "
                                             "and broadcast"));
      }
    }
  }
}

TEST_CASE(
    "automatic across nodes: flat and hierarchical timed on the first steps, one kept by every rank, values exact") {
  const int n = world_size();
  RanksPerNode k(2);  // nodes of 2 ranks: at 3 and 4 ranks, 2 nodes with 2 ranks on one
  gradsync::Options o = base();
  Model<float> m;
  Sync<float> s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  m.add_to(s);
  const bool both = n >= 3;
  GRADSYNC_CHECK_ALL(s.tuning() == both);
  const int steps = 2 * gradsync::impl::PlanTuner::steps_per_candidate + 2;
  std::set<gradsync::Algorithm> ran;
  for (int p = 0; p < steps; ++p) {
    ran.insert(s.algorithm());
    m.fill(p);
    CHECK(s.synchronize());
    GRADSYNC_CHECK_ALL(m.error(p) <= tol<float>());
  }
  GRADSYNC_CHECK_ALL(!s.tuning());
  GRADSYNC_CHECK_ALL(ran.size() == (both ? 2u : 1u));
  const double chosen = double(int(s.algorithm()));
  GRADSYNC_CHECK_ALL(max_over_ranks(chosen) == chosen && -max_over_ranks(-chosen) == chosen);
  const gradsync::SyncSummary sum = s.summary();
  GRADSYNC_CHECK_ALL(sum.candidate_seconds.size() == (both ? 2u : 0u));
  if (both) {
    // The kept one is the faster of the agreed timings, and those are the same on every rank.
    const auto& c = sum.candidate_seconds;
    const gradsync::Algorithm faster = c[0].seconds <= c[1].seconds ? c[0].algorithm : c[1].algorithm;
    GRADSYNC_CHECK_ALL(s.algorithm() == faster);
    GRADSYNC_CHECK_ALL(max_over_ranks(c[0].seconds) == c[0].seconds && -max_over_ranks(-c[1].seconds) == c[1].seconds);
    GRADSYNC_CHECK_ALL(has(describe(s), "; timed: flat 1,048,576 bytes (1.0 MiB) "));
  }
  // Rebuilt once per candidate and once for the choice.
  GRADSYNC_CHECK_ALL(s.stats().plan_builds == (both ? 3u : 1u));
}

TEST_CASE("hierarchical on a backend without it is a ConfigError at construction") {
  gradsync::Options o = base();
  o.tuning.algorithm = gradsync::Algorithm::hierarchical;
  using SelfSync = gradsync::GradientSync<gradsync::SelfBackend, Kokkos::View<float*>>;
  const std::string e = error_of<gradsync::ConfigError>([&] { SelfSync s(gradsync::SelfBackend{}, o); });
  GRADSYNC_CHECK_ALL(has(e, "algorithm = hierarchical, but backend 'self' has no hierarchical sum"));
}
