// Wire compression (issue 19): fp16 / bf16 on the wire, added in fp32, against analytic per-rank values.
//
// Rank r's gradient value i is a formula of (r, i), so every rank knows the exact average. A sum over
// p ranks is rounded once per contribution (the pack) and once per addition (p - 1 of them, in the
// ring or in MPI's tree), each time by at most u = 2^-8 (bf16) or 2^-11 (fp16) of the value rounded,
// and no partial sum exceeds (1 + u)^p * sum_r |x_r|: so |result - exact| <= u (2p - 1) (1 + u)^p
// sum_r |x_r| / n (average), plus the unpack's own rounding in T. Each test also checks that the
// values did travel as 16 bits (some error above T's own rounding), so none passes vacuously.
#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "generic_backend.hpp"
#include "gradsync_test.hpp"

using gradsync_test::has;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Head {};    // kept in full precision whatever the options say
struct Half {};    // fp16 whatever the options say
struct Tables {};  // local, scaled by 1/n
struct Tower {};   // local, not scaled
template <>
struct gradsync::LocalVarPolicy<Head> : gradsync::CompressWith<gradsync::Compression::none> {};
template <>
struct gradsync::LocalVarPolicy<Half> : gradsync::CompressWith<gradsync::Compression::fp16> {};
template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::none> {};

static_assert(gradsync::has_compression_choice_v<Head> && !gradsync::has_compression_choice_v<Dense>);
static_assert(gradsync::impl::group_compression<Half>() == int(gradsync::Compression::fp16));
static_assert(gradsync::impl::group_compression<Dense>() == -1);

namespace {

using gradsync::Compression;

double unit_roundoff(Compression c) { return c == Compression::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

gradsync::Options base_options() {
  gradsync::Options o;
  o.tuning.read_environment = false;
  o.stall_timeout = 60;
  return o;
}

// Rank r's value i of tensor k: magnitudes over several binades, both signs, fractions no 16-bit
// format holds.
double value(std::size_t k, std::size_t i, int r) {
  const double mag = std::ldexp(1.0, int((i * 7 + k) % 9) - 4);  // 2^-4 .. 2^4
  return mag * (0.6 + 0.37 * std::cos(0.013 * double(i) + 1.7 * r + 0.5 * double(k))) *
         ((i + std::size_t(r)) % 5 == 0 ? -1 : 1);
}

// All finite values of a 16-bit format, sorted: the brute-force reference for rounding.
template <class W>
std::vector<std::pair<double, std::uint16_t>> all_finite() {
  std::vector<std::pair<double, std::uint16_t>> v;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float x = gradsync::impl::Wire<W>::decode(std::uint16_t(b));
    if (std::isfinite(x) && !(x == 0 && std::signbit(x))) v.push_back({double(x), std::uint16_t(b)});
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Round to nearest, ties to the even bit pattern, by search over every finite value; values past
// the largest by more than half its last step go to infinity.
template <class W>
double nearest(const std::vector<std::pair<double, std::uint16_t>>& all, double x) {
  const double top = all.back().first, step = top - all[all.size() - 2].first;
  if (std::abs(x) >= top + step / 2) return x > 0 ? HUGE_VAL : -HUGE_VAL;
  auto hi = std::lower_bound(all.begin(), all.end(), std::make_pair(x, std::uint16_t(0)));
  if (hi == all.end()) return top;
  if (hi == all.begin() || hi->first == x) return hi->first;
  auto lo = hi - 1;
  const double dl = x - lo->first, dh = hi->first - x;
  if (dl != dh) return dl < dh ? lo->first : hi->first;
  return (lo->second & 1u) == 0 ? lo->first : hi->first;
}

template <class W>
void check_rounding() {
  using WT = gradsync::impl::Wire<W>;
  const auto all = all_finite<W>();
  std::mt19937_64 rng(42);
  int bad = 0;
  // Every pattern survives decode -> encode (NaNs stay NaN).
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float x = WT::decode(std::uint16_t(b));
    const std::uint16_t back = WT::encode(x);
    if (std::isnan(x) ? !std::isnan(WT::decode(back)) : back != b) ++bad;
  }
  CHECK(bad == 0);
  // Random floats and doubles over the whole range (subnormals, ties, overflow): the nearest value.
  for (int t = 0; t < 200000; ++t) {
    const std::uint16_t b = std::uint16_t(rng());
    const double base = WT::decode(b);
    if (!std::isfinite(base)) continue;
    double x;
    switch (t % 4) {
      case 0:
        x = base * (1 + std::ldexp(double(std::int64_t(rng() % 4096) - 2048), -19));
        break;   // near a value
      case 1: {  // exactly half-way to the next pattern: a tie
        const double next = WT::decode(std::uint16_t(b + 1));
        if (!std::isfinite(next) || (next < 0) != (base < 0)) continue;
        x = (base + next) / 2;
        break;
      }
      case 2:
        x = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng), int(rng() % 60) - 30);
        break;
      default:
        x = base * (1 + std::ldexp(1.0, -30));
        break;  // a hair above: never a tie
    }
    const double want = nearest<W>(all, x);
    const double got_f = WT::decode(WT::encode(float(x)));
    const double got_d = WT::decode(WT::encode(x));
    if (double(float(x)) == x && got_f != want) ++bad;  // floats: only where x is a float
    if (got_d != want) ++bad;
    if (bad == 1) {
      MESSAGE("x = ", x, " want ", want, " float path ", got_f, " double path ", got_d);
      ++bad;
    }
  }
  CHECK(bad == 0);
  CHECK(std::isnan(WT::decode(WT::encode(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(WT::decode(WT::encode(-0.0f)) == 0.0f);
}

template <class T>
using View = Kokkos::View<T*>;
template <class T>
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View<T>>;

template <class T>
View<T> make(const char* label, std::size_t n, std::size_t k, int r, double scale = 1) {
  View<T> v(std::string(label), n);
  gradsync_test::fill_host(v, [&](std::size_t i) { return scale * value(k, i, r); });
  return v;
}

// Largest |got - exact| / bound over the tensors, where exact and bound follow from value().
template <class T>
struct Errors {
  double worst_ratio = 0;  // error / rounding bound: at most 1
  double worst_error = 0;  // relative to the value, to see that rounding happened
};

template <class T>
Errors<T> compare(const std::vector<View<T>>& views, const std::vector<std::size_t>& ks, int n, double u, double factor,
                  int passes = 1) {
  Errors<T> e;
  const double p = n;
  for (std::size_t t = 0; t < views.size(); ++t) {
    const auto h = gradsync_test::host_copy(views[t]);
    for (std::size_t i = 0; i < h.size(); ++i) {
      double sum = 0, abs_sum = 0;
      for (int r = 0; r < n; ++r) sum += passes * value(ks[t], i, r), abs_sum += passes * std::abs(value(ks[t], i, r));
      const double exact = sum * factor;
      const double bound = u * (2 * p - 1) * std::pow(1 + u, p) * abs_sum * factor +
                           4 * std::numeric_limits<T>::epsilon() * std::abs(exact);
      const double err = std::abs(double(h(i)) - exact);
      e.worst_ratio = std::max(e.worst_ratio, err / bound);
      e.worst_error = std::max(e.worst_error, err / std::max(std::abs(exact), 1e-30));
    }
  }
  return e;
}

struct Path {
  gradsync::Collectives collectives;
  gradsync::HostStaging staging;
  int passes;
  const char* name;
  bool mark = false;  // mark_ready every gradient, last first, before synchronize()
  gradsync::Algorithm algorithm = gradsync::Algorithm::automatic;
  int ranks_per_node = 0;  // made-up nodes (impl::mpi_ranks_per_node_override); 0: the real ones
};
// Made-up nodes for one sync: ranks r / k share a "node".
struct RanksPerNode {
  explicit RanksPerNode(int k) { gradsync::impl::mpi_ranks_per_node_override() = k; }
  ~RanksPerNode() { gradsync::impl::mpi_ranks_per_node_override() = 0; }
  RanksPerNode(const RanksPerNode&) = delete;
  RanksPerNode& operator=(const RanksPerNode&) = delete;
};
const Path paths[] = {
    {gradsync::Collectives::nonblocking, gradsync::HostStaging::automatic, 1, "nonblocking"},
    {gradsync::Collectives::blocking, gradsync::HostStaging::automatic, 1, "blocking"},
    {gradsync::Collectives::nonblocking, gradsync::HostStaging::always, 2, "nonblocking, staged, 2 passes"},
    {gradsync::Collectives::blocking, gradsync::HostStaging::always, 1, "blocking, staged"},
    {gradsync::Collectives::nonblocking, gradsync::HostStaging::automatic, 1, "nonblocking, mark_ready", true},
    // Three stages with gradsync's op: reduce within each node, allreduce among nodes, broadcast.
    {gradsync::Collectives::automatic, gradsync::HostStaging::automatic, 1, "hierarchical, nodes of 2 ranks", false,
     gradsync::Algorithm::hierarchical, 2},
    // Every rank its own node: the first steps time flat against hierarchical, compressed both ways.
    {gradsync::Collectives::automatic, gradsync::HostStaging::automatic, 1, "automatic, nodes of 1 rank", false,
     gradsync::Algorithm::automatic, 1},
};

template <class T>
void check_average(Compression c) {
  const int n = world_size(), r = world_rank();
  const double u = unit_roundoff(c);
  // Sizes: small tensors fused into one chunk (MPI's own Iallreduce with gradsync's op, under 64 KiB
  // on the wire), and a tensor of its own chunk over 64 KiB on the wire (gradsync's ring, 2+ ranks).
  const std::vector<std::size_t> sizes = {1, 300, 4099, 70000};
  for (const Path& path : paths) {
    CAPTURE(path.name);
    RanksPerNode nodes(path.ranks_per_node);
    gradsync::Options o = base_options();
    o.tuning.algorithm = path.algorithm;
    o.compression = c;
    o.tuning.collectives = path.collectives;
    o.tuning.host_staging = path.staging;
    o.backward_passes_per_step = path.passes;
    o.postscale_factor = 0.5;  // folded into the unpack with the 1/n
    Sync<T> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    std::vector<View<T>> views;
    std::vector<std::size_t> ks;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      views.push_back(make<T>("g", sizes[k], k, r));
      ks.push_back(k);
      sync.template add<Dense>(views.back());
    }
    std::size_t total = 0;
    for (std::size_t s : sizes) total += s;
    const int steps = 4;  // the automatic choice times its candidates on the first steps
    for (int step = 0; step < steps; ++step) {
      for (int pass = 0; pass < path.passes; ++pass) {
        for (std::size_t k = 0; k < sizes.size(); ++k)
          gradsync_test::fill_host(views[k], [&](std::size_t i) { return value(k, i, r); });
        if (path.mark)
          for (std::size_t k = sizes.size(); k-- > 0;) sync.mark_ready(views[k]);
        const bool done = sync.synchronize();
        GRADSYNC_CHECK_ALL(done == (pass + 1 == path.passes));
      }
      const Errors<T> e = compare(views, ks, n, u, 0.5 / n, path.passes);
      CAPTURE(e.worst_ratio);
      CAPTURE(e.worst_error);
      GRADSYNC_CHECK_ALL(e.worst_ratio <= 1.0);
      // The values did pass through 16 bits: errors well above T's own rounding.
      GRADSYNC_CHECK_ALL(e.worst_error > u / 8);
    }
    const gradsync::Stats s = sync.stats();
    GRADSYNC_CHECK_ALL(s.bytes_allreduced == steps * total * 2);  // 2 bytes a value
    GRADSYNC_CHECK_ALL(s.bytes_uncompressed == steps * total * sizeof(T));
    // The 70000-value tensor is summed in place by gradsync's ring (16 bits on the wire, converted as
    // it goes) on the nonblocking, unstaged, unaggregated paths at 2+ ranks; the others pack it. The
    // automatic path's first steps time two algorithms, one of them blocking: not checked.
    const bool ring = n >= 2 && path.collectives == gradsync::Collectives::nonblocking &&
                      path.staging == gradsync::HostStaging::automatic && path.passes == 1;
    if (path.ranks_per_node != 1) GRADSYNC_CHECK_ALL(s.bytes_in_place == (ring ? steps * 70000 * 2 : 0));
  }
}

// Compressed chunks summed in place (impl/wire_ring.hpp): large tensors whose lengths the ranks do not
// divide (segments of unequal lengths), with prescale and postscale, beside a small packed one.
template <class T>
void check_in_place(Compression c) {
  const int n = world_size(), r = world_rank();
  const double u = unit_roundoff(c);
  const std::vector<std::size_t> sizes = {33000, 70001, 200003, 3000};  // 33000: 66,000 bytes on the wire
  gradsync::Options o = base_options();
  o.compression = c;
  o.tuning.collectives = gradsync::Collectives::nonblocking;
  o.prescale_factor = 0.5;   // applied before the first rounding: the wire carries prescaled values
  o.postscale_factor = 1.5;  // with the 1/n, in each rank's write back
  Sync<T> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  std::vector<View<T>> views;
  std::vector<std::size_t> ks;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    views.push_back(make<T>("g", sizes[k], k, r));
    ks.push_back(k);
    sync.template add<Dense>(views.back());
  }
  const int steps = 3;  // the ring states and buffers are reused
  for (int step = 0; step < steps; ++step) {
    for (std::size_t k = 0; k < sizes.size(); ++k)
      gradsync_test::fill_host(views[k], [&](std::size_t i) { return value(k, i, r); });
    CHECK(sync.synchronize());
    const Errors<T> e = compare(views, ks, n, u, 0.75 / n);
    CAPTURE(e.worst_ratio);
    CAPTURE(e.worst_error);
    GRADSYNC_CHECK_ALL(e.worst_ratio <= 1.0);
    GRADSYNC_CHECK_ALL(e.worst_error > u / 8);  // the values did travel as 16 bits
    // Every rank holds the same bits: rank 0's values, broadcast, compared byte for byte.
    bool same = true;
    for (const View<T>& v : views) {
      const std::vector<T> mine = gradsync_test::host_values(v);
      std::vector<T> root = mine;
      MPI_Bcast(root.data(), int(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
      same = same && std::memcmp(root.data(), mine.data(), mine.size() * sizeof(T)) == 0;
    }
    GRADSYNC_CHECK_ALL(same);
  }
  // The three large tensors went through the ring in place at 2+ ranks (one rank: nothing to sum, packed).
  const gradsync::Stats s = sync.stats();
  const std::size_t large = 33000 + 70001 + 200003, total = large + 3000;
  GRADSYNC_CHECK_ALL(s.bytes_in_place == (n >= 2 ? steps * large * 2 : 0));
  GRADSYNC_CHECK_ALL(s.bytes_allreduced == steps * total * 2);
  GRADSYNC_CHECK_ALL(s.bytes_uncompressed == steps * total * sizeof(T));
  GRADSYNC_CHECK_ALL(sync.summary().chunks_in_place == (n >= 2 ? 3u : 0u));
}

}  // namespace

TEST_CASE("fp16 and bf16 conversions round to nearest even (against a search over every value)") {
  if (world_rank() != 0) return;  // no MPI involved: one rank is enough
  check_rounding<gradsync::WireBf16>();
  check_rounding<gradsync::WireFp16>();
  using F = gradsync::impl::Wire<gradsync::WireFp16>;
  CHECK(F::encode(65504.0f) == 0x7bff);
  CHECK(F::encode(65519.99f) == 0x7bff);
  CHECK(F::encode(65520.0f) == 0x7c00);         // the tie past the largest rounds to infinity
  CHECK(F::encode(1.0f + 0x1p-11f) == 0x3c00);  // a tie: to even
  CHECK(F::encode(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(F::encode(0x1p-24f) == 0x0001);  // the smallest subnormal
  CHECK(F::encode(0x1p-25f) == 0x0000);  // half of it: a tie to even (zero)
  using B = gradsync::impl::Wire<gradsync::WireBf16>;
  CHECK(B::encode(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(B::encode(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(B::encode(std::numeric_limits<float>::max()) == 0x7f80);
}

TEST_CASE("bf16 and fp16 on the wire: every value within the rounding bound of the analytic average") {
  for (Compression c : {Compression::bf16, Compression::fp16}) {
    CAPTURE(std::string(gradsync::to_string(c)));
    SUBCASE("float") { check_average<float>(c); }
    SUBCASE("double") { check_average<double>(c); }
  }
}

TEST_CASE("in place: the ring converts as it goes; every rank holds the same bits, within the rounding bound") {
  for (Compression c : {Compression::bf16, Compression::fp16}) {
    CAPTURE(std::string(gradsync::to_string(c)));
    SUBCASE("float") { check_in_place<float>(c); }
    SUBCASE("double") { check_in_place<double>(c); }
  }
}

TEST_CASE("per-group choice: a group keeps full precision, another takes fp16; local groups bit for bit unchanged") {
  const int n = world_size(), r = world_rank();
  using T = float;
  for (Compression c : {Compression::none, Compression::bf16}) {
    CAPTURE(std::string(gradsync::to_string(c)));
    gradsync::Options o = base_options();
    o.compression = c;
    Sync<T> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    View<T> dense = make<T>("dense", 5000, 0, r), head = make<T>("head", 3000, 1, r),
            fp16_part = make<T>("half", 700, 2, r);
    // Local groups, of a size that differs per rank.
    View<T> table = make<T>("table", 100 + 10 * std::size_t(r), 3, r), tower = make<T>("tower", 50, 4, r);
    const std::vector<T> table0 = gradsync_test::host_values(table), tower0 = gradsync_test::host_values(tower);
    sync.add<Dense>(dense, "dense");
    sync.add<Head>(head, "head");
    sync.add<Half>(fp16_part, "half");
    sync.add<Tables>(table, "table");
    sync.add<Tower>(tower, "tower");
    CHECK(sync.synchronize());

    // Head: full precision, T's own rounding of the sum and the scale only.
    const double head_err = gradsync_test::worst_vs_rank_average(
        std::vector<View<T>>{head}, n, [](std::size_t, std::size_t i, int q) { return value(1, i, q); });
    GRADSYNC_CHECK_ALL(head_err <= gradsync_test::tol<T>() * n);
    const Errors<T> eh = compare<T>({fp16_part}, {2}, n, unit_roundoff(Compression::fp16), 1.0 / n);
    GRADSYNC_CHECK_ALL(eh.worst_ratio <= 1.0 && eh.worst_error > std::ldexp(1.0, -14));
    const Errors<T> ed =
        compare<T>({dense}, {0}, n, unit_roundoff(c == Compression::none ? Compression::bf16 : c), 1.0 / n);
    GRADSYNC_CHECK_ALL(ed.worst_ratio <= 1.0);
    if (c == Compression::none)  // followed the options: full precision
      GRADSYNC_CHECK_ALL(
          gradsync_test::worst_vs_rank_average(std::vector<View<T>>{dense}, n, [](std::size_t, std::size_t i, int q) {
            return value(0, i, q);
          }) <= gradsync_test::tol<T>() * n);
    else
      GRADSYNC_CHECK_ALL(ed.worst_error > std::ldexp(1.0, -11));

    // Local tensors: never sent; scaled exactly as without compression (bit for bit).
    const std::vector<T> table1 = gradsync_test::host_values(table), tower1 = gradsync_test::host_values(tower);
    bool same = table1.size() == table0.size() && tower1 == tower0;
    for (std::size_t i = 0; same && i < table0.size(); ++i) same = table1[i] == table0[i] * (T(1) / T(n));
    GRADSYNC_CHECK_ALL(same);

    const std::size_t wire = (c == Compression::none ? 0 : 5000) + 700,
                      full = (c == Compression::none ? 5000 : 0) + 3000;
    const gradsync::Stats s = sync.stats();
    GRADSYNC_CHECK_ALL(s.bytes_allreduced == 2 * wire + sizeof(T) * full);
    GRADSYNC_CHECK_ALL(s.bytes_uncompressed == sizeof(T) * (wire + full));
    const std::string d = gradsync::describe(sync);
    GRADSYNC_CHECK_ALL(has(d, "Half: 1 tensor, 2,800 bytes, data-parallel, fp16 on the wire\n"));
    GRADSYNC_CHECK_ALL(has(d, "Head: 1 tensor, 12,000 bytes, data-parallel\n"));
    GRADSYNC_CHECK_ALL(has(d, c == Compression::none
                                  ? "Dense: 1 tensor, 20,000 bytes, data-parallel\n"
                                  : "Dense: 1 tensor, 20,000 bytes, data-parallel, bf16 on the wire\n"));
    GRADSYNC_CHECK_ALL(has(d, std::string(", compression ") + gradsync::to_string(c) + ", error_feedback false"));
  }
}

TEST_CASE("bytes on the wire are exactly half of fp32's, over a whole model of several chunks") {
  const int r = world_rank();
  for (Compression c : {Compression::none, Compression::bf16, Compression::fp16}) {
    gradsync::Options o = base_options();
    o.compression = c;
    o.tuning.fusion_threshold_bytes = 64 << 10;
    Sync<float> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    std::vector<View<float>> vs;
    for (std::size_t k = 0; k < 12; ++k) {
      vs.push_back(make<float>("g", 1000 + 5000 * k, k, r));
      sync.add<Dense>(vs.back());
    }
    CHECK(sync.synchronize());
    CHECK(sync.synchronize());
    const gradsync::Stats s = sync.stats();
    const std::size_t values = 2 * (12 * 1000 + 5000 * 66);
    GRADSYNC_CHECK_ALL(s.bytes_uncompressed == 4 * values);
    GRADSYNC_CHECK_ALL(s.bytes_allreduced == (c == Compression::none ? 4 : 2) * values);
  }
}

TEST_CASE("fp16 overflow: a sum past 65504 is an Error naming the tensor on every rank; the sync stays usable") {
  const int n = world_size(), r = world_rank();
  for (auto coll : {gradsync::Collectives::nonblocking, gradsync::Collectives::blocking}) {
    gradsync::Options o = base_options();
    o.compression = Compression::fp16;
    o.tuning.collectives = coll;
    o.op = gradsync::ReduceOp::sum;
    Sync<float> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    View<float> small("small", 100), big("big", 40000);
    sync.add<Dense>(small, "small");
    sync.add<Dense>(big, "big");
    gradsync_test::fill_host(small, [](std::size_t) { return 1.0; });
    // Each rank's values are within range; their sum over the ranks is not (one rank: 70000 alone).
    gradsync_test::fill_host(big, [&](std::size_t i) { return i == 777 ? (n == 1 ? 70000.0 : 40000.0) : 2.0; });
    const std::string msg = gradsync_test::error_of([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    // Nonblocking at 2+ ranks, 'big' is summed in place by the ring, which finds the sum on every rank.
    const bool ring = n >= 2 && coll == gradsync::Collectives::nonblocking;
    GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place == (ring ? 40000u * 2 : 0u));
    GRADSYNC_CHECK_ALL(has(msg, "the fp16 sum of gradient 'big' (group Dense, 40000 values) is not finite"));
    GRADSYNC_CHECK_ALL(has(msg, "65504"));
    // The next step, within range, is exact (small integers are exact in fp16).
    gradsync_test::fill_host(big, [&](std::size_t i) { return double(i % 7) + r; });
    GRADSYNC_CHECK_ALL(gradsync_test::error_of([&] { (void)sync.synchronize(); }).empty());
    const auto h = gradsync_test::host_values(big);
    bool exact = true;
    for (std::size_t i = 0; i < h.size(); ++i) exact = exact && h[i] == float(n * double(i % 7) + n * (n - 1) / 2);
    GRADSYNC_CHECK_ALL(exact);
  }
  // bf16 has fp32's range: the same values are summed (within bf16's rounding).
  gradsync::Options o = base_options();
  o.compression = Compression::bf16;
  o.op = gradsync::ReduceOp::sum;
  Sync<float> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  View<float> big("big", 1000);
  sync.add<Dense>(big, "big");
  gradsync_test::fill_host(big, [](std::size_t) { return 40000.0; });
  CHECK(sync.synchronize());
  const double want = 40000.0 * n, got = gradsync_test::value_at(big, 5);
  GRADSYNC_CHECK_ALL(std::abs(got - want) <= std::ldexp(1.0, -8) * (2 * n) * want);
}

TEST_CASE("error feedback: over K steps the sum of synchronized gradients is within one rounding of the exact sum") {
  // Element i is nonzero on rank i % n only, so the sums add zeros (exact) and the packing's
  // rounding is the whole error: without feedback it repeats every step (K of them), with it the
  // residual carries it to the next step and the K-step sum is off by the last residual only.
  // 3000 values are packed; 40000 (80,000 bytes on the wire) are summed in place by the ring at 2+
  // ranks, where each rank keeps what its rounding of a partial sum dropped.
  const int n = world_size(), r = world_rank();
  constexpr int K = 40;
  auto x = [&](std::size_t i) {
    return std::ldexp(1.0 + 0.3 * double(1 + i % 5) / 128.0, int(i % 3)) * (i % 4 == 1 ? -1 : 1);
  };
  for (std::size_t len : {std::size_t(3000), std::size_t(40000)})
    for (Compression c : {Compression::bf16, Compression::fp16}) {
      for (bool feedback : {false, true}) {
        CAPTURE(len);
        CAPTURE(std::string(gradsync::to_string(c)));
        CAPTURE(feedback);
        gradsync::Options o = base_options();
        o.compression = c;
        o.error_feedback = feedback;
        o.op = gradsync::ReduceOp::sum;
        Sync<double> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
        View<double> g("g", len);
        sync.add<Dense>(g);
        std::vector<double> total(len, 0.0);
        for (int k = 0; k < K; ++k) {
          gradsync_test::fill_host(g, [&](std::size_t i) { return int(i % std::size_t(n)) == r ? x(i) : 0.0; });
          CHECK(sync.synchronize());
          const auto h = gradsync_test::host_values(g);
          for (std::size_t i = 0; i < len; ++i) total[i] += h[i];
        }
        double worst = 0;  // in units of one rounding of x(i): u |x(i)|
        for (std::size_t i = 0; i < len; ++i)
          worst = std::max(worst, std::abs(total[i] - K * x(i)) / (unit_roundoff(c) * std::abs(x(i))));
        CAPTURE(worst);
        GRADSYNC_CHECK_ALL(sync.stats().bytes_in_place == (len > 3000 && n >= 2 ? K * len * 2 : 0u));
        if (feedback)
          GRADSYNC_CHECK_ALL(worst <= 1.0);
        else
          GRADSYNC_CHECK_ALL(worst > 0.2 * K);  // the same rounding, K times
      }
    }
}

TEST_CASE("ranks that disagree on compression or error feedback: a MismatchError naming it on every rank") {
  const int n = world_size(), r = world_rank();
  GRADSYNC_SKIP_BELOW_RANKS(2, "ranks that disagree need two of them");
  for (int which = 0; which < 2; ++which)
    for (auto coll : {gradsync::Collectives::nonblocking, gradsync::Collectives::blocking}) {
      gradsync::Options o = base_options();
      o.tuning.collectives = coll;
      o.stall_timeout = 20;
      if (which == 1) o.compression = Compression::bf16;  // every rank compresses; one adds feedback
      if (r == n - 1) {
        if (which == 0)
          o.compression = Compression::bf16;
        else
          o.error_feedback = true;
      }
      Sync<float> sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
      View<float> g = make<float>("g", 1000, 0, r);
      const std::vector<float> before = gradsync_test::host_values(g);
      sync.add<Dense>(g);
      const std::string msg = gradsync_test::error_of<gradsync::MismatchError>([&] { (void)sync.synchronize(); });
      CAPTURE(msg);
      GRADSYNC_CHECK_ALL(
          has(msg, which == 0 ? "ranks disagree on compression: " : "ranks disagree on error_feedback: "));
      GRADSYNC_CHECK_ALL(has(msg, which == 0 ? "bf16" : "true"));
      GRADSYNC_CHECK_ALL(gradsync_test::host_values(g) == before);
    }
}

TEST_CASE("GRADSYNC_COMPRESSION and GRADSYNC_ERROR_FEEDBACK override the options; a bad value is a ConfigError") {
  gradsync::Options o;
  setenv("GRADSYNC_COMPRESSION", "bf16", 1);
  setenv("GRADSYNC_ERROR_FEEDBACK", "on", 1);
  const gradsync::Options a = gradsync::apply_env(o);
  CHECK(a.compression == Compression::bf16);
  CHECK(a.error_feedback);
  setenv("GRADSYNC_COMPRESSION", "fp8", 1);
  const std::string msg = gradsync_test::error_of<gradsync::ConfigError>([&] { gradsync::apply_env(o); });
  CHECK(has(msg, "GRADSYNC_COMPRESSION='fp8' is not one of: none, fp16, bf16"));
  unsetenv("GRADSYNC_COMPRESSION");
  unsetenv("GRADSYNC_ERROR_FEEDBACK");
}

TEST_CASE("SelfBackend: one rank, one rounding per value") {
  gradsync::Options o = base_options();
  o.compression = Compression::bf16;
  gradsync::GradientSync<gradsync::SelfBackend, View<double>> sync(gradsync::SelfBackend{}, o);
  View<double> g = make<double>("g", 2000, 0, 0);
  sync.add<Dense>(g);
  CHECK(sync.synchronize());
  const auto h = gradsync_test::host_values(g);
  double worst = 0, any = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double e = std::abs(h[i] - value(0, i, 0)) / std::abs(value(0, i, 0));
    worst = std::max(worst, e);
    any = std::max(any, e);
  }
  CHECK(worst <= std::ldexp(1.0, -8));
  CHECK(any > std::ldexp(1.0, -12));
  CHECK(sync.stats().bytes_allreduced == 2 * 2000);
}

namespace {
// A backend of the user's own that does not declare Capability::wire_sums: never handed 16-bit values.
struct FloatOnlyName {
  static constexpr const char* value = "float-only";
};
using FloatOnlyBackend = gradsync_test::GenericMpiBackend<FloatOnlyName>;
static_assert(!gradsync::impl::sums_wire<FloatOnlyBackend>::value &&
              gradsync::impl::sums_wire<gradsync::MpiBackend>::value);
}  // namespace

TEST_CASE("a backend that does not sum 16-bit values: a ConfigError on every rank, uncompressed still works") {
  for (Compression c : {Compression::bf16, Compression::none}) {
    gradsync::Options o = base_options();
    o.compression = c;
    gradsync::GradientSync<FloatOnlyBackend, View<float>> sync(FloatOnlyBackend(MPI_COMM_WORLD), o);
    View<float> g = make<float>("g", 100, 0, world_rank());
    sync.add<Dense>(g);
    const std::string msg = gradsync_test::error_of<gradsync::ConfigError>([&] { (void)sync.synchronize(); });
    CAPTURE(msg);
    GRADSYNC_CHECK_ALL(
        c == Compression::none ? msg.empty() : has(msg, "backend 'float-only' does not declare Capability::wire_sums"));
  }
}
