// gradsync benchmark: the fused sync against raw MPI on the same bytes, per-tensor MPI, growth
// sweeps and overlap with a simulated backward. Rank 0 appends CSV rows to the output file:
//   section,case,method,bytes,tensors,ranks,median_s,reps
// tests/bench/run.sh runs every section, PyTorch DDP beside it, and writes docs/BENCHMARKS.md.
//
//   bench_sync models  <models_dir> <out.csv> [budget_s]   real models, raw sweep, per tensor
//   bench_sync chunks  <models_dir> <out.csv> [budget_s]   gradsync and raw over chunk sizes
//   bench_sync growth  <out.csv> [max_mib] [budget_s]      tensor count and byte sweeps
//   bench_sync overlap <models_dir> <out.csv> [budget_s]   mark_ready during a simulated backward
//   bench_sync timeline <models_dir> <out_dir>            the traces of docs/TIMELINE.md (ResNet-50)
//   bench_sync timeline_cost <models_dir> <reps>          ResNet-50 with Options::tuning.timeline off and on
//   bench_sync compression <models_dir> <out.csv> [budget_s] [model]  fp32 vs bf16/fp16 on the wire
//   bench_sync hostpath <tensors> <reps>                   host path only (for callgrind)
//   bench_sync dlrmstep <models_dir> <average|sum|raw> <reps>  DLRM's sync only (for callgrind)
//   bench_sync wireloops [values]                          the ring's host passes per value (1 rank)
//   bench_sync tablesize <models_dir> <out.csv> [budget_s] DLRM's sync at 1x and 10x the table rows
//   bench_sync smoke                                       a few tiny runs of every path (ctest)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <gradsync/gradsync.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"

namespace {

// Host memory, whatever Kokkos' default space: the baselines are raw MPI calls on the same buffers
// (the GPU benchmark is tests/gpu/bench_gpu.cu).
using Grad = Kokkos::View<float*, Kokkos::HostSpace>;
using Arena = gradsync::GradientArena<float, Kokkos::HostSpace>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, Grad>;
using Ids = Kokkos::View<int*, Kokkos::HostSpace>;
using TableRows = gradsync::RowSparse<Grad, Ids>;
struct Dense {};
struct Tables {};

}  // namespace

template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

FILE* out_file = nullptr;

void row(const std::string& section, const std::string& cas, const std::string& method, std::size_t bytes,
         std::size_t tensors, double median_s, std::size_t reps) {
  if (bench::rank() != 0) return;
  std::fprintf(out_file, "%s,%s,%s,%zu,%zu,%d,%.9g,%zu\n", section.c_str(), cas.c_str(), method.c_str(), bytes, tensors,
               bench::size(), median_s, reps);
  std::fflush(out_file);
  std::printf("  %-10s %-22s %-26s %12zu B %6zu tensors  %10.3f ms\n", section.c_str(), cas.c_str(), method.c_str(),
              bytes, tensors, median_s * 1e3);
  std::fflush(stdout);
}

// DLRM's embedding tables: a step touches at most one row per sample of the global batch (128),
// so each table's gradient is a RowSparse of that many rows (all distinct: the most work).
constexpr std::size_t dlrm_rows_per_step = 128;

TableRows table_rows(const Grad& rows, std::size_t table_rows_total) {
  Ids ids("ids", dlrm_rows_per_step);
  for (std::size_t k = 0; k < dlrm_rows_per_step; ++k) ids(k) = int((k * 7919) % table_rows_total);
  return TableRows(rows, ids, std::int64_t(table_rows_total),
                   std::int64_t(std::min(dlrm_rows_per_step, table_rows_total)));
}

// The gradients of a model, each its own allocation (as a framework would hold them). A table
// (m.row_width > 0) holds only the rows a step touches.
struct Tensors {
  std::vector<Grad> g;
  std::vector<TableRows> rows;  // per tensor; used for tables only
  explicit Tensors(const bench::Model& m) {
    for (std::size_t i = 0; i < m.numel.size(); ++i) {
      const bool table = m.local[i] && m.row_width > 0;
      const std::size_t n = table ? dlrm_rows_per_step * m.row_width : m.numel[i];
      g.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "g"), n);
      Kokkos::deep_copy(g.back(), 1e-3f);
      rows.push_back(table ? table_rows(g.back(), m.numel[i] / m.row_width) : TableRows());
    }
  }
};

// Runs the steps on which the plan times its candidates (across hosts: flat against hierarchical),
// so that measurements see the plan it keeps. Collective; every rank tunes alike.
void settle(Sync& s) {
  while (s.tuning()) (void)s.synchronize();
}

std::unique_ptr<Sync> make_sync(const bench::Model& m, Tensors& t, gradsync::Options opt) {
  auto s = std::make_unique<Sync>(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  for (std::size_t i = 0; i < m.numel.size(); ++i) {
    if (m.local[i] && m.row_width > 0)
      s->add<Tables>(t.rows[i]);
    else if (m.local[i])
      s->add<Tables>(t.g[i]);
    else
      s->add<Dense>(t.g[i]);
  }
  settle(*s);
  return s;
}

// The same gradients carved from one gradsync::GradientArena in registration order, as a framework
// that keeps its gradients in one buffer does (DDP's gradient_as_bucket_view): neighbours in memory
// merge into regions reduced in place, so the sync sees what a contiguous buffer would.
std::unique_ptr<Sync> make_arena_sync(const bench::Model& m, Arena& arena, gradsync::Options opt) {
  const auto held = [&](std::size_t i) {
    return m.local[i] && m.row_width > 0 ? dlrm_rows_per_step * m.row_width : m.numel[i];
  };
  std::size_t total = 0;
  for (std::size_t i = 0; i < m.numel.size(); ++i) total += held(i);
  arena = Arena("arena", total);
  Kokkos::deep_copy(arena.storage(), 1e-3f);
  auto s = std::make_unique<Sync>(gradsync::MpiBackend(MPI_COMM_WORLD), opt);
  for (std::size_t i = 0; i < m.numel.size(); ++i) {
    const Grad g = arena.carve(held(i));
    if (m.local[i] && m.row_width > 0)
      s->add<Tables>(table_rows(g, m.numel[i] / m.row_width));
    else if (m.local[i])
      s->add<Tables>(g);
    else
      s->add<Dense>(g);
  }
  settle(*s);
  return s;
}

// One contiguous buffer of `elements` floats reduced in chunks of `chunk` bytes (0: one call).
// With `scale` != 1 each chunk is multiplied by it right after its reduction, while it is in
// cache: the cheapest hand-written average, the baseline of gradsync's default (op = average).
void raw_chunked(float* buf, std::size_t elements, std::size_t chunk_bytes, float scale = 1.f) {
  const std::size_t step = chunk_bytes ? chunk_bytes / sizeof(float) : elements;
  for (std::size_t off = 0; off < elements; off += step) {
    const std::size_t n = std::min(step, elements - off);
    MPI_Allreduce(MPI_IN_PLACE, buf + off, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (scale != 1.f)
      for (float *p = buf + off, *e = p + n; p != e; ++p) *p *= scale;
  }
}

std::string size_label(std::size_t bytes) {
  char b[32];
  if (bytes >= MiB)
    std::snprintf(b, sizeof b, "%gMiB", double(bytes) / MiB);
  else
    std::snprintf(b, sizeof b, "%gKiB", double(bytes) / KiB);
  return b;
}

const std::vector<std::size_t>& raw_sweep() {
  static const std::vector<std::size_t> s = {256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB};
  return s;
}

std::vector<bench::Model> load_models(const std::string& dir, std::size_t* dlrm_mlp) {
  std::vector<bench::Model> ms;
  ms.push_back(bench::read_csv_model(dir + "/resnet50.csv", "ResNet-50"));
  ms.push_back(bench::read_csv_model(dir + "/vit_b_16.csv", "ViT-B/16"));
  ms.push_back(bench::read_csv_model(dir + "/mobilenet_v2.csv", "MobileNetV2"));
  ms.push_back(bench::read_dlrm_model(dir + "/dlrm_criteo_kaggle.json", 100000, dlrm_mlp));
  return ms;
}

// Times one sync of every method on `m`: gradsync, raw contiguous at each chunk size, per tensor.
void bench_model(const bench::Model& m, double budget, gradsync::Options opt, const std::string& section,
                 std::size_t dlrm_mlp) {
  Tensors t(m);
  auto sync = make_sync(m, t, opt);
  const std::size_t elems = m.dp_elements(), bytes = elems * sizeof(float);
  if (dlrm_mlp) {
    // DLRM: only the MLP moves. Checked on the plan and on what one synchronize() hands to MPI.
    const auto before = sync->stats().bytes_allreduced;
    (void)sync->synchronize();
    const auto moved = sync->stats().bytes_allreduced - before;
    if (sync->data_parallel_bytes() != dlrm_mlp * sizeof(float) || moved != dlrm_mlp * sizeof(float))
      throw std::runtime_error("DLRM: gradsync moved " + std::to_string(moved) + " bytes, the MLP holds " +
                               std::to_string(dlrm_mlp * sizeof(float)));
    std::size_t local = 0, nlocal = 0;
    for (std::size_t i = 0; i < m.numel.size(); ++i)
      if (m.local[i]) local += m.numel[i] * sizeof(float), ++nlocal;
    if (bench::rank() == 0)
      std::printf(
          "  DLRM: %zu bytes allreduced per sync = MLP bytes (%zu parameters); tables stay local, "
          "%zu rows of each scaled (RowSparse)\n",
          std::size_t(moved), dlrm_mlp, dlrm_rows_per_step);
    row(section, m.name, "local table bytes (rank 0)", local, nlocal, 0, 0);
  }
  std::vector<float> raw(elems, 0.f);
  // The same gradients again, never handed to a sync with huge_pages on: what a program has on
  // 4 KiB pages, for per-tensor MPI and the huge_pages = false variant. The default sync moves t's
  // gradients onto huge pages at its first call.
  Tensors t4k(m);
  std::vector<Grad> dp, dp4k;
  for (std::size_t i = 0; i < m.numel.size(); ++i)
    if (!m.local[i]) dp.push_back(t.g[i]), dp4k.push_back(t4k.g[i]);

  std::vector<bench::Method> ms;
  ms.push_back({"gradsync", [&] { (void)sync->synchronize(); }, {}});
  // Variants (BENCH_VARIANTS=1): what each choice of the default is worth, same run.
  std::vector<std::unique_ptr<Sync>> variants;
  auto variant = [&](const std::string& label, gradsync::Options o) {
    variants.push_back(make_sync(m, t, o));
    Sync* s = variants.back().get();
    ms.push_back({label, [s] { (void)s->synchronize(); }, {}});
  };
  gradsync::Options o = opt;
  o.tuning.collectives = gradsync::Collectives::blocking;  // one MPI_Allreduce per chunk
  variant("gradsync blocking", o);
  o = opt;
  o.op = gradsync::ReduceOp::sum;  // what raw and per-tensor compute: no 1/n pass
  variant("gradsync op=sum", o);
  o = opt;
  // Options::tuning.timeline's cost (docs/TIMELINE.md): every step recorded, the trace written as it fills.
  o.tuning.timeline =
      std::getenv("BENCH_TIMELINE") ? std::getenv("BENCH_TIMELINE") : "/tmp/gradsync_bench_timeline.json";
  variant("gradsync timeline", o);
  o = opt;
  o.tuning.huge_pages = false;
  variants.push_back(make_sync(m, t4k, o));
  ms.push_back({"gradsync on 4 KiB pages", [s = variants.back().get()] { (void)s->synchronize(); }, {}});
  if (sync->topology().spans_nodes()) {
    // Across hosts: what the topology's choices are worth, same run (docs/BENCHMARKS.md, "Across hosts").
    o = opt;
    o.tuning.fusion_threshold_bytes = std::size_t(4) << 20;  // the one-node plan
    o.tuning.max_chunks_in_flight = 16;
    o.tuning.algorithm = gradsync::Algorithm::flat;
    variant("gradsync one-node plan (4MiB 16 in flight)", o);  // no comma: a CSV field
    if (sync->topology().hierarchical_helps())
      for (auto a : {gradsync::Algorithm::flat, gradsync::Algorithm::hierarchical}) {
        o = opt;
        o.tuning.algorithm = a;
        variant(std::string("gradsync ") + gradsync::to_string(a), o);
      }
  }
  Arena arena;
  variants.push_back(make_arena_sync(m, arena, opt));
  ms.push_back({"gradsync arena", [s = variants.back().get()] { (void)s->synchronize(); }, {}});
  if (std::getenv("BENCH_VARIANTS")) {
    for (double f : {0.0, 0.25, 1.0, HUGE_VAL}) {
      o = opt;
      o.tuning.in_place_min_fraction = f;
      variant("gradsync in_place_min_fraction " + std::to_string(f), o);
    }
    for (std::size_t b : {std::size_t(16) << 10, std::size_t(256) << 10, std::size_t(1) << 20}) {
      o = opt;
      o.tuning.in_place_min_bytes = b;
      variant("gradsync in_place_min_bytes " + size_label(b), o);
    }
    for (int k : {1, 2, 4, 8, 32}) {
      o = opt;
      o.tuning.max_chunks_in_flight = k;
      variant("gradsync max_chunks_in_flight " + std::to_string(k), o);
    }
    for (std::size_t b : {std::size_t(1) << 20, std::size_t(2) << 20, std::size_t(8) << 20}) {
      o = opt;
      o.tuning.fusion_threshold_bytes = b;
      variant("gradsync fusion " + size_label(b), o);
      o.tuning.collectives = gradsync::Collectives::blocking;
      variant("gradsync blocking fusion " + size_label(b), o);
    }
    for (int k : {1, 2, 4}) {
      o = opt;
      o.tuning.max_chunks_in_flight = k;
      Arena own;  // its carves share the allocation, so it may go
      variants.push_back(make_arena_sync(m, own, o));
      ms.push_back({"gradsync arena max_chunks_in_flight " + std::to_string(k),
                    [s = variants.back().get()] { (void)s->synchronize(); },
                    {}});
    }
  }
  // The raw baseline: the sweep picks the best chunk size, then that size is timed again, head to
  // head with gradsync. Timing the pick in the same samples that chose it would report the
  // luckiest of several noisy medians (a bias of about one noise width with seven candidates).
  std::vector<bench::Method> sweep;
  std::vector<std::pair<std::size_t, bool>> sweep_of;  // per sweep entry: chunk size, averaged
  const float inv_n = 1.f / float(bench::size());
  for (bool avg : {false, true})
    for (std::size_t c : raw_sweep())
      if (c / 2 < bytes && (!avg || c >= MiB)) {
        sweep.push_back({(avg ? "raw+avg " : "raw ") + size_label(c),
                         [&, c, avg, inv_n] { raw_chunked(raw.data(), elems, c, avg ? inv_n : 1.f); },
                         {}});
        sweep_of.emplace_back(c, avg);
      }
  bench::measure_within(sweep, budget / 3, 7, 301);
  std::size_t best = 0, best_avg = 0;
  double best_t = 1e30, best_avg_t = 1e30;
  for (std::size_t k = 0; k < sweep.size(); ++k) {
    const double med = bench::median(sweep[k].times);
    row(section, m.name, sweep[k].name, bytes, m.dp_tensors(), med, sweep[k].times.size());
    const auto [c, avg] = sweep_of[k];
    double& t_best = avg ? best_avg_t : best_t;
    if (med < t_best) t_best = med, (avg ? best_avg : best) = c;
  }
  // Every rank measured the same medians (the slowest rank's time), so every rank picks alike.
  ms.push_back({"raw best (" + size_label(best) + ")", [&, best] { raw_chunked(raw.data(), elems, best); }, {}});
  // The same on 2 MiB pages (GradientArena's memory, as the arena column has): how much of the
  // arena's time is the pages rather than the sync.
  Arena huge("raw on huge pages", elems);
  ms.push_back({"raw on huge pages (" + size_label(best) + ")",
                [&, best] { raw_chunked(huge.storage().data(), elems, best); },
                {}});
  if (best_avg)
    ms.push_back({"raw+avg best (" + size_label(best_avg) + ")",
                  [&, best_avg, inv_n] { raw_chunked(raw.data(), elems, best_avg, inv_n); },
                  {}});
  auto per_tensor = [](std::vector<Grad>& gs) {
    for (auto& g : gs) MPI_Allreduce(MPI_IN_PLACE, g.data(), int(g.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  ms.push_back({"per-tensor", [&] { per_tensor(dp4k); }, {}});
  ms.push_back({"per-tensor on huge pages", [&] { per_tensor(dp); }, {}});
  bench::measure_within(ms, budget - budget / 3, 7, 301);
  for (auto& mm : ms) row(section, m.name, mm.name, bytes, m.dp_tensors(), bench::median(mm.times), mm.times.size());
}

// Wire compression (issue 19): the same gradients synchronized in fp32 and as bf16 / fp16 on the wire,
// interleaved, same run. Large tensors are reduced in place in both (compressed: gradsync's ring
// converts as it sends and receives, impl/wire_ring.hpp); "packed" variants put every chunk through
// the fusion buffer (compressed: its 16-bit copy, the path before the ring converted in place).
// Run it over a shaped link (the namespace test bed) for the bandwidth win; `model` picks models by
// name ("ResNet-50", "ViT-B/16", ...; default both of those). BENCH_METHOD=bf16 keeps the methods whose
// label has "bf16", beside the fp32 baseline.
void run_compression(const std::string& dir, double budget, const std::string& only) {
  std::size_t mlp = 0;
  for (auto& m : load_models(dir, &mlp)) {
    const bool picked =
        only.empty() ? (m.name == "ResNet-50" || m.name == "ViT-B/16") : m.name.find(only) != std::string::npos;
    if (!picked) continue;
    Tensors t(m);
    std::vector<std::unique_ptr<Sync>> syncs;
    std::vector<bench::Method> ms;
    const char* only_method = std::getenv("BENCH_METHOD");  // e.g. "bf16": only the methods whose label has it
    auto method = [&](const std::string& label, gradsync::Options o) {
      if (only_method && label.find(only_method) == std::string::npos && label != "gradsync fp32") return;
      syncs.push_back(make_sync(m, t, o));
      Sync* s = syncs.back().get();
      ms.push_back({label, [s] { (void)s->synchronize(); }, {}});
    };
    gradsync::Options o;
    method("gradsync fp32", o);
    o.tuning.in_place_min_fraction = HUGE_VAL;
    method("gradsync fp32 packed", o);
    o = {};
    o.compression = gradsync::Compression::bf16;
    method("gradsync bf16", o);
    o.tuning.in_place_min_fraction =
        HUGE_VAL;  // every chunk packed into its 16-bit copy (before the ring converted in place)
    method("gradsync bf16 packed", o);
    o = {};
    o.compression = gradsync::Compression::bf16;
    o.tuning.fusion_threshold_bytes = std::size_t(2) << 20;  // chunks of as many values as fp32's 4 MiB
    method("gradsync bf16 2MiB chunks", o);
    o = {};
    o.compression = gradsync::Compression::fp16;
    method("gradsync fp16", o);
    o.compression = gradsync::Compression::bf16;
    o.error_feedback = true;
    method("gradsync bf16 + error feedback", o);
    bench::measure_within(ms, budget, 7, 301);
    const std::size_t bytes = m.dp_elements() * sizeof(float);
    for (auto& mm : ms)
      row("compression", m.name, mm.name, bytes, m.dp_tensors(), bench::median(mm.times), mm.times.size());
    if (bench::rank() == 0) {
      const double base = bench::median(ms[0].times);
      for (std::size_t k = 1; k < ms.size(); ++k)
        std::printf("  %s: %s / gradsync fp32 = %.3f\n", m.name.c_str(), ms[k].name.c_str(),
                    bench::median(ms[k].times) / base);
      std::fflush(stdout);
    }
  }
}

void run_models(const std::string& dir, double budget, const std::string& only) {
  std::size_t mlp = 0;
  auto models = load_models(dir, &mlp);
  for (auto& m : models)
    if (only.empty() || m.name.find(only) != std::string::npos)
      bench_model(m, budget, gradsync::Options{},
                  std::getenv("BENCH_SECTION") ? std::getenv("BENCH_SECTION") : "models",
                  m.name.rfind("DLRM", 0) == 0 ? mlp : 0);
}

// gradsync at several fusion thresholds beside raw at the same chunk sizes: the default's evidence.
void run_chunks(const std::string& dir, double budget) {
  std::size_t mlp = 0;
  auto models = load_models(dir, &mlp);
  for (int k : {0, 1, 2}) {  // ResNet-50, ViT-B/16, MobileNetV2
    const bench::Model& m = models[std::size_t(k)];
    Tensors t(m);
    const std::size_t elems = m.dp_elements(), bytes = elems * sizeof(float);
    std::vector<float> raw(elems, 0.f);
    std::vector<std::unique_ptr<Sync>> syncs;
    std::vector<bench::Method> ms;
    for (std::size_t c : raw_sweep()) {
      gradsync::Options o;
      o.tuning.fusion_threshold_bytes = c;
      syncs.push_back(make_sync(m, t, o));
      Sync* s = syncs.back().get();
      ms.push_back({"gradsync " + size_label(c), [s] { (void)s->synchronize(); }, {}});
      ms.push_back({"raw " + size_label(c), [&, c] { raw_chunked(raw.data(), elems, c); }, {}});
    }
    bench::measure_within(ms, budget, 5, 201);
    for (auto& mm : ms) row("chunks", m.name, mm.name, bytes, m.dp_tensors(), bench::median(mm.times), mm.times.size());
  }
}

// Tensor count (1 KiB tensors) and total bytes (256 KiB tensors) sweeps.
void run_growth(std::size_t max_mib, double budget) {
  for (std::size_t n : {10, 30, 100, 300, 1000, 3000, 10000}) {
    bench::Model m{"count", std::vector<std::size_t>(n, 256), std::vector<bool>(n, false)};
    Tensors t(m);
    auto sync = make_sync(m, t, {});
    std::vector<bench::Method> ms;
    ms.push_back({"gradsync", [&] { (void)sync->synchronize(); }, {}});
    ms.push_back({"per-tensor",
                  [&] {
                    for (auto& g : t.g)
                      MPI_Allreduce(MPI_IN_PLACE, g.data(), int(g.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                  },
                  {}});
    std::vector<float> raw(n * 256, 0.f);
    ms.push_back({"raw 2MiB", [&] { raw_chunked(raw.data(), raw.size(), 2 * MiB); }, {}});
    bench::measure(ms, 2, bench::reps_for(0.002 * double(n) / 100, budget / 7, 15, 301));
    for (auto& mm : ms)
      row("tensors", std::to_string(n), mm.name, n * KiB, n, bench::median(mm.times), mm.times.size());
  }
  for (std::size_t mib = 1; mib <= max_mib; mib *= 2) {
    const std::size_t n = mib * 4;  // 256 KiB tensors
    bench::Model m{"bytes", std::vector<std::size_t>(n, 64 * KiB), std::vector<bool>(n, false)};
    Tensors t(m);
    auto sync = make_sync(m, t, {});
    std::vector<float> raw(n * 64 * KiB, 0.f);
    std::vector<bench::Method> ms;
    ms.push_back({"gradsync", [&] { (void)sync->synchronize(); }, {}});
    ms.push_back({"raw 2MiB", [&] { raw_chunked(raw.data(), raw.size(), 2 * MiB); }, {}});
    bench::measure(ms, 1, bench::reps_for(2 * 0.25e-3 * double(mib), budget / 10, 5, 201));
    for (auto& mm : ms)
      row("bytes", size_label(mib * MiB), mm.name, mib * MiB, n, bench::median(mm.times), mm.times.size());
  }
}

// Overlap with backward. A simulated accelerator computes backward while the host waits: tensor k
// (last layer first) becomes ready at a time proportional to the bytes before it, the whole pass
// lasting `factor` times the plain sync. The host marks each gradient ready when its time comes and
// calls progress() in between (as it would while polling device events), then synchronize().
// Exposed = end of synchronize() - end of backward; reported over the plain sync's time.
void run_overlap(const std::string& dir, double budget, double factor) {
  std::size_t mlp = 0;
  auto models = load_models(dir, &mlp);
  for (int k : {0, 1, 2}) {
    const bench::Model& m = models[std::size_t(k)];
    Tensors t(m);
    gradsync::Options blk;
    blk.tuning.collectives = gradsync::Collectives::blocking;
    auto plain = make_sync(m, t, {});
    auto plain_blk = make_sync(m, t, blk);
    auto overlapped = make_sync(m, t, {});
    std::vector<bench::Method> ms;
    ms.push_back({"sync (default)", [&] { (void)plain->synchronize(); }, {}});
    ms.push_back({"sync (blocking)", [&] { (void)plain_blk->synchronize(); }, {}});
    bench::measure(ms, 2, bench::reps_for(0.5e-9 * double(m.dp_elements()) * 2, budget / 3, 9, 101));
    const double comm = bench::median(ms[0].times);
    const double backward = factor * comm;
    // Ready times, in backward order (reverse registration).
    const std::size_t n = m.numel.size();
    std::vector<double> ready_at(n);
    double total = 0, acc = 0;
    for (std::size_t x : m.numel) total += double(x);
    for (std::size_t j = 0; j < n; ++j) {
      acc += double(m.numel[n - 1 - j]);
      ready_at[j] = backward * acc / total;
    }
    std::vector<double> exposed, no_overlap;
    const int reps = bench::reps_for(2 * (backward + comm), budget / 2, 7, 101);
    for (int r = 0; r < reps; ++r) {
      for (int mode = 0; mode < 2; ++mode) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        std::size_t j = 0;
        while (j < n) {
          if (MPI_Wtime() - t0 >= ready_at[j]) {
            if (mode == 1) overlapped->mark_ready(t.g[n - 1 - j]);
            ++j;
          } else {
            // Waiting on the device: let chunks advance, then yield the core for a moment (as a
            // host blocked on a device event would) instead of spinning against other processes.
            if (mode == 1) overlapped->progress();
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          }
        }
        if (mode == 1)
          (void)overlapped->synchronize();
        else
          (void)plain->synchronize();
        double e = MPI_Wtime() - (t0 + backward);
        MPI_Allreduce(MPI_IN_PLACE, &e, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        (mode == 1 ? exposed : no_overlap).push_back(e);
      }
    }
    const std::size_t bytes = m.dp_elements() * sizeof(float);
    row("overlap", m.name, "sync (default)", bytes, m.dp_tensors(), comm, ms[0].times.size());
    row("overlap", m.name, "sync (blocking)", bytes, m.dp_tensors(), bench::median(ms[1].times), ms[1].times.size());
    row("overlap", m.name, "backward (simulated)", bytes, m.dp_tensors(), backward, std::size_t(reps));
    row("overlap", m.name, "exposed: sync after backward", bytes, m.dp_tensors(), bench::median(no_overlap),
        std::size_t(reps));
    row("overlap", m.name, "exposed: mark_ready", bytes, m.dp_tensors(), bench::median(exposed), std::size_t(reps));
  }
}

// The traces behind docs/TIMELINE.md's pictures (Options::tuning.timeline): ResNet-50 steps after a
// simulated backward (as run_overlap: twice the plain sync's time), synchronized after it and with
// mark_ready during it, then, on 2+ ranks, a stall (the last rank skips a call; 1 s deadline).
void run_timeline(const std::string& dir, const std::string& out) {
  std::size_t mlp = 0;
  const bench::Model m = load_models(dir, &mlp)[0];
  Tensors t(m);
  gradsync::Options o;
  o.tuning.read_environment = false;
  const std::string after = out + "/resnet50_sync_after_backward.json", marked = out + "/resnet50_mark_ready.json",
                    stall = out + "/stall.json";
  o.tuning.timeline = after.c_str();
  auto plain = make_sync(m, t, o);
  o.tuning.timeline = marked.c_str();
  auto overlapped = make_sync(m, t, o);
  std::vector<bench::Method> ms{{"sync", [&] { (void)plain->synchronize(); }, {}}};
  bench::measure(ms, 2, 9);
  const double backward = 2 * bench::median(ms[0].times);
  const std::size_t n = m.numel.size();
  std::vector<double> ready_at(n);
  double total = 0, acc = 0;
  for (std::size_t x : m.numel) total += double(x);
  for (std::size_t j = 0; j < n; ++j) {
    acc += double(m.numel[n - 1 - j]);
    ready_at[j] = backward * acc / total;
  }
  for (int step = 0; step < 3; ++step)
    for (int mode = 0; mode < 2; ++mode) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (std::size_t j = 0; j < n;) {
        if (MPI_Wtime() - t0 >= ready_at[j]) {
          if (mode == 1) overlapped->mark_ready(t.g[n - 1 - j]);
          ++j;
        } else {
          if (mode == 1) overlapped->progress();
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
      (void)(mode == 1 ? overlapped : plain)->synchronize();
    }
  plain.reset();
  overlapped.reset();
  if (bench::size() < 2) return;
  o.tuning.timeline = stall.c_str();
  o.stall_timeout = 1.0;
  o.tuning.stall_warning = 0.5;
  auto stalled = make_sync(m, t, o);
  try {
    for (int step = 0; step < 3; ++step)
      if (bench::rank() != bench::size() - 1 || step != 1) (void)stalled->synchronize();  // the last rank skips one
  } catch (const gradsync::StallError& e) {
    if (bench::rank() == 0) std::printf("timeline: the stall, as expected: %s\n", e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Options::tuning.timeline's cost on ResNet-50: the same gradients synchronized with the timeline off and
// on, interleaved, `reps` times each; medians and the median of the per-round ratios.
void run_timeline_cost(const std::string& dir, int reps) {
  std::size_t mlp = 0;
  const bench::Model m = load_models(dir, &mlp)[0];
  Tensors t(m);
  gradsync::Options o;
  o.tuning.read_environment = false;
  auto off = make_sync(m, t, o);
  o.tuning.timeline = "/tmp/gradsync_timeline_cost.json";
  auto on = make_sync(m, t, o);
  std::vector<bench::Method> ms{{"timeline off", [&] { (void)off->synchronize(); }, {}},
                                {"timeline on", [&] { (void)on->synchronize(); }, {}}};
  bench::measure(ms, 3, reps);
  std::vector<double> ratio;
  for (std::size_t r = 0; r < ms[0].times.size(); ++r) ratio.push_back(ms[1].times[r] / ms[0].times[r]);
  if (bench::rank() == 0)
    std::printf(
        "timeline_cost: ResNet-50, %d ranks, %d rounds: off %.3f ms, on %.3f ms (medians); median of "
        "on/off per round %.4f\n",
        bench::size(), reps, 1e3 * bench::median(ms[0].times), 1e3 * bench::median(ms[1].times), bench::median(ratio));
}

// Sync cost against table size: DLRM with its tables capped at 100,000 rows and at 1,000,000 rows
// (10x), tables as RowSparse (128 rows a step). Both syncs are timed in the same interleaved run.
void run_tablesize(const std::string& dir, double budget) {
  std::size_t mlp = 0;
  std::vector<bench::Model> ms;
  std::vector<std::unique_ptr<Tensors>> ts;
  std::vector<std::unique_ptr<Sync>> syncs;
  std::vector<bench::Method> methods;
  for (std::size_t cap : {std::size_t(100000), std::size_t(1000000)}) {
    ms.push_back(bench::read_dlrm_model(dir + "/dlrm_criteo_kaggle.json", cap, &mlp));
    ts.push_back(std::make_unique<Tensors>(ms.back()));
    syncs.push_back(make_sync(ms.back(), *ts.back(), {}));
    Sync* s = syncs.back().get();
    methods.push_back({"gradsync, rows capped at " + std::to_string(cap), [s] { (void)s->synchronize(); }, {}});
  }
  std::vector<float> raw(ms[0].dp_elements(), 0.f);
  methods.push_back({"raw 256KiB", [&] { raw_chunked(raw.data(), raw.size(), 256 * KiB); }, {}});
  bench::measure_within(methods, budget, 15, 1001);
  for (std::size_t k = 0; k < methods.size(); ++k) {
    std::size_t table_bytes = 0;
    const bench::Model& m = ms[std::min<std::size_t>(k, 1)];
    for (std::size_t i = 0; i < m.numel.size(); ++i)
      if (m.local[i]) table_bytes += m.numel[i] * sizeof(float);
    row("tablesize", "DLRM (MLP)", methods[k].name, k < 2 ? table_bytes : raw.size() * sizeof(float), m.dp_tensors(),
        bench::median(methods[k].times), methods[k].times.size());
  }
}

// The host path alone on `n` tiny tensors (one value each): what callgrind counts.
void run_hostpath(std::size_t n, int reps) {
  bench::Model m{"tiny", std::vector<std::size_t>(n, 1), std::vector<bool>(n, false)};
  Tensors t(m);
  auto sync = make_sync(m, t, {});
  (void)sync->synchronize();  // builds the plan: not part of the steady state
  for (int r = 0; r < reps; ++r) (void)sync->synchronize();
  if (bench::rank() == 0) std::printf("hostpath: %zu tensors, %d syncs\n", n, reps);
}

// DLRM's steady-state sync alone (op average or sum), or raw MPI_Allreduce of the same MLP bytes in
// 256 KiB chunks, `reps` times: what callgrind counts, with --toggle-collect='*dlrm_steps*'.
__attribute__((noinline)) void dlrm_steps(const std::function<void()>& step, int reps) {
  for (int r = 0; r < reps; ++r) step();
}
void run_dlrmstep(const std::string& dir, const std::string& op, int reps) {
  std::size_t mlp = 0;
  const bench::Model m = bench::read_dlrm_model(dir + "/dlrm_criteo_kaggle.json", 100000, &mlp);
  Tensors t(m);
  gradsync::Options o;
  o.tuning.read_environment = false;
  if (op == "sum") o.op = gradsync::ReduceOp::sum;
  auto sync = make_sync(m, t, o);
  (void)sync->synchronize();  // builds the plan: not part of the steady state
  std::vector<float> raw(m.dp_elements(), 1e-3f);
  if (op == "raw")
    dlrm_steps([&] { raw_chunked(raw.data(), raw.size(), 256 * KiB); }, reps);
  else
    dlrm_steps([&] { (void)sync->synchronize(); }, reps);
  if (bench::rank() == 0) std::printf("dlrmstep: %s, %d steps\n", op.c_str(), reps);
}

// The ring's host passes alone, on one rank, per value of a segment (default 512 Ki values: a 4 MiB
// chunk's half at 2 ranks): what an in-place fp32 average and an in-place bf16 / fp16 sum do to each
// value besides the transport's copies. At 2 ranks a value of the fp32 average crosses as 4 bytes
// twice (reduce-scatter, allgather) and meets one last addition; a bf16 value crosses as 2 bytes twice
// and meets the first send's conversion, the owner's addition and rounding, and the write back.
void run_wire_loops(std::size_t n) {
  if (bench::rank() != 0) return;
  std::vector<float> v(n, 1.5f), w(n, 0.25f), copy(n);
  std::vector<std::uint16_t> io(n, 0x3f80), in(n, 0x3f80), copy16(n);
  auto ns = [&](auto&& f) {  // median of 41 passes, in ns per value
    std::vector<double> t;
    for (int r = 0; r < 41; ++r) {
      const auto a = std::chrono::steady_clock::now();
      f();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
    return 1e9 * bench::median(t) / double(n);
  };
  using gradsync::impl::WireRingLoops;
  const double sum = ns([&] { gradsync::impl::sum_scale_loop(v.data(), w.data(), n, 0.5f); });
  const double c32 = ns([&] { std::memcpy(copy.data(), v.data(), n * sizeof(float)); });
  const double c16 = ns([&] { std::memcpy(copy16.data(), in.data(), n * sizeof(std::uint16_t)); });
  std::printf("wireloops: %zu values, ns per value: fp32 last addition %.3f, copy of 4 B %.3f, of 2 B %.3f\n", n, sum,
              c32, c16);
  const double fp32 = sum + 2 * c32;
  auto wire = [&](const char* name, auto loops) {
    using L = decltype(loops);
    const double first = ns([&] { L::first(v.data(), io.data(), nullptr, 1.0, n); });
    const double finish = ns([&] { L::finish(v.data(), io.data(), nullptr, 1.0, 0.5, n); });
    const double write = ns([&] { L::write(v.data(), in.data(), 0.5, n); });
    const double total = first + finish + write + 2 * c16;
    std::printf(
        "wireloops: %s first send %.3f, owner's addition %.3f, write back %.3f; per value with the copies "
        "%.3f against fp32's %.3f: %.2fx\n",
        name, first, finish, write, total, fp32, total / fp32);
  };
  wire("bf16", WireRingLoops<gradsync::WireBf16, float>{});
  wire("fp16", WireRingLoops<gradsync::WireFp16, float>{});
}

// ctest: every path once, briefly (no timing is asserted; the DLRM byte check is).
void run_smoke(const std::string& dir) {
  std::size_t mlp = 0;
  if (std::ifstream(dir + "/dlrm_criteo_kaggle.json")) {
    bench::Model d = bench::read_dlrm_model(dir + "/dlrm_criteo_kaggle.json", 1000, &mlp);
    bench_model(d, 0.05, {}, "smoke", mlp);
  }
  bench::Model small{"small", std::vector<std::size_t>(50, 300), std::vector<bool>(50, false)};
  small.numel[7] = 600000;  // one tensor reduced in place
  bench_model(small, 0.05, {}, "smoke", 0);
  run_hostpath(100, 3);
  run_wire_loops(4096);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  try {
    const std::string mode = argc > 1 ? argv[1] : "smoke";
    auto arg = [&](int i, const char* dflt) { return std::string(argc > i ? argv[i] : dflt); };
    std::string out = "/dev/stdout";
    if (mode == "models" || mode == "chunks" || mode == "overlap" || mode == "tablesize" || mode == "compression")
      out = arg(3, "/dev/null");
    if (mode == "growth") out = arg(2, "/dev/null");
    if (bench::rank() == 0) {
      out_file = std::fopen(out.c_str(), "a");
      if (!out_file) throw std::runtime_error("cannot open " + out);
    }
    if (mode == "models")
      run_models(arg(2, "."), std::stod(arg(4, "8")), arg(5, ""));
    else if (mode == "compression")
      run_compression(arg(2, "."), std::stod(arg(4, "8")), arg(5, ""));
    else if (mode == "chunks")
      run_chunks(arg(2, "."), std::stod(arg(4, "8")));
    else if (mode == "growth")
      run_growth(std::stoul(arg(3, "512")), std::stod(arg(4, "40")));
    else if (mode == "overlap")
      run_overlap(arg(2, "."), std::stod(arg(4, "8")), std::stod(arg(5, "2")));
    else if (mode == "timeline")
      run_timeline(arg(2, GRADSYNC_BENCH_MODELS_DIR), arg(3, "."));
    else if (mode == "timeline_cost")
      run_timeline_cost(arg(2, GRADSYNC_BENCH_MODELS_DIR), std::stoi(arg(3, "41")));
    else if (mode == "tablesize")
      run_tablesize(arg(2, "."), std::stod(arg(4, "8")));
    else if (mode == "hostpath")
      run_hostpath(std::stoul(arg(2, "1000")), std::stoi(arg(3, "100")));
    else if (mode == "dlrmstep")
      run_dlrmstep(arg(2, GRADSYNC_BENCH_MODELS_DIR), arg(3, "average"), std::stoi(arg(4, "100")));
    else if (mode == "wireloops")
      run_wire_loops(std::stoul(arg(2, "524288")));
    else if (mode == "smoke")
      run_smoke(arg(2, GRADSYNC_BENCH_MODELS_DIR));
    else
      throw std::runtime_error("unknown mode " + mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sync (rank %d): %s\n", bench::rank(), e.what());
    rc = 1;
  }
  if (out_file && out_file != stdout) std::fclose(out_file);
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
