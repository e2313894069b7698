// Kokkos Tools regions (issue 30): the phases of a step show in any Kokkos Tools connector as
// regions named gradsync::..., properly nested, also when a step throws. Kokkos loads the tool
// built beside this test (tests/tools/region_tool.cpp) from KOKKOS_TOOLS_LIBS /
// KOKKOS_PROFILE_LIBRARY, which ctest sets; the test reads its log through dlsym.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <gradsync/gradsync.hpp>
#include <set>
#include <string>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::has;
using gradsync_test::world_rank;
using gradsync_test::world_size;

struct Dense {};
struct Tower {};
template <>
struct gradsync::LocalVarPolicy<Tower> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// The tool's accessors, found in the copy Kokkos loaded (null: the variable is not set).
struct Tool {
  int (*initialized)() = nullptr;
  int (*count)() = nullptr;
  const char* (*event)(int) = nullptr;
  int (*depth)() = nullptr;
  int (*errors)() = nullptr;
  void (*clear)() = nullptr;
};

const char* tool_path() {
  const char* p = std::getenv("KOKKOS_TOOLS_LIBS");
  if (!p || !*p) p = std::getenv("KOKKOS_PROFILE_LIBRARY");
  return p && *p ? p : nullptr;
}

template <class F>
void find(void* h, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(h, name));
  const bool found = f != nullptr;
  REQUIRE_MESSAGE(found, "region tool: no symbol ", name);
}

const Tool* tool() {
  static Tool t;
  static bool done = false;
  if (done) return t.count ? &t : nullptr;
  done = true;
  const char* path = tool_path();
  if (!path) return nullptr;
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  // the copy Kokkos loaded at initialize(), not a new one
  const bool loaded = h != nullptr;
  REQUIRE_MESSAGE(loaded, "Kokkos did not load the tool ", path);
  find(h, t.initialized, "gradsync_region_tool_initialized");
  find(h, t.count, "gradsync_region_tool_count");
  find(h, t.event, "gradsync_region_tool_event");
  find(h, t.depth, "gradsync_region_tool_depth");
  find(h, t.errors, "gradsync_region_tool_errors");
  find(h, t.clear, "gradsync_region_tool_clear");
  return &t;
}

// A region as pushed: its name and the names of the regions open around it, outermost first.
struct Pushed {
  std::string name;
  std::vector<std::string> around;
  bool inside(const std::string& outer) const { return std::find(around.begin(), around.end(), outer) != around.end(); }
};

// The log since the last clear(), replayed: every push with the regions around it. `nested`: no pop
// without an open region, and every pop closes the innermost open one (as the tool logs it).
std::vector<Pushed> replay(const Tool& t, bool& nested) {
  std::vector<Pushed> out;
  std::vector<std::string> open;
  nested = true;
  for (int i = 0; i < t.count(); ++i) {
    const std::string e = t.event(i);
    if (e[0] == '+') {
      out.push_back({e.substr(1), open});
      open.push_back(e.substr(1));
    } else if (open.empty() || e.substr(1) != open.back()) {
      nested = false;
    } else {
      open.pop_back();
    }
  }
  nested = nested && open.empty();
  return out;
}

bool any(const std::vector<Pushed>& log, const std::string& name, const std::string& inside = {}) {
  return std::any_of(log.begin(), log.end(),
                     [&](const Pushed& p) { return p.name == name && (inside.empty() || p.inside(inside)); });
}

gradsync::Options opts() {
  gradsync::Options o;
  o.op = gradsync::ReduceOp::average;
  o.tuning.fusion_threshold_bytes = 256 * sizeof(double);  // two tensors of 128 per chunk: packed, not in place
  o.tuning.collectives = gradsync::Collectives::nonblocking;
  o.stall_timeout = 20;
  o.tuning.stall_warning = 0;
  o.tuning.read_environment = false;
  return o;
}

}  // namespace

TEST_CASE("every phase of a step is a Kokkos Tools region named gradsync::..., nested") {
  const Tool* t = tool();
  if (!t) {
    MESSAGE("KOKKOS_TOOLS_LIBS / KOKKOS_PROFILE_LIBRARY not set: run through ctest (skipped)");
    return;
  }
  REQUIRE(Kokkos::Tools::profileLibraryLoaded());
  REQUIRE(t->initialized() == 1);
  const int rank = world_rank();
  using Opt = gradsync::Sgd<View>;
  gradsync::DistributedOptimizer<Opt, Sync> dopt(Opt(gradsync::SgdOptions{}),
                                                 Sync(gradsync::MpiBackend(MPI_COMM_WORLD), opts()));
  std::vector<View> p, g;
  for (int k = 0; k < 5; ++k) {
    p.emplace_back("p" + std::to_string(k), 128);
    g.emplace_back("g" + std::to_string(k), 128);
    gradsync_test::fill_host(p.back(), [&](std::size_t i) { return 0.01 * double(i) + k; });
  }
  for (int k = 0; k < 4; ++k) dopt.add<Dense>(p[std::size_t(k)], g[std::size_t(k)], "dense" + std::to_string(k));
  dopt.add<Tower>(p[4], g[4], "tower");  // local: scaled by 1/n (folded into the update, or by clip)
  t->clear();
  dopt.broadcast_parameters(0);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t k = 0; k < g.size(); ++k)
      gradsync_test::fill_host(g[k], [&](std::size_t i) { return (rank + 1.0) * double(k + 1) + 0.1 * double(i); });
    if (step < 2)  // overlap on the first steps; the last one exchanges everything in synchronize()
      for (std::size_t k = 4; k-- > 0;) dopt.sync().mark_ready(g[k]);
    GRADSYNC_CHECK_ALL(dopt.synchronize());
    dopt.clip_grad_norm(1e-3);  // below the norm: it scales (and applies the deferred local scale)
    dopt.apply();
  }
  bool nested = false;
  const std::vector<Pushed> log = replay(*t, nested);
  GRADSYNC_CHECK_ALL(nested);
  GRADSYNC_CHECK_ALL(t->errors() == 0);
  GRADSYNC_CHECK_ALL(t->depth() == 0);
  std::set<std::string> names;
  for (const Pushed& r : log) names.insert(r.name);
  std::string all;
  for (const std::string& n : names) all += n + " ";
  CAPTURE(all);
  for (const char* n : {"gradsync::broadcast_parameters", "gradsync::synchronize", "gradsync::arrival_check",
                        "gradsync::consistency_check", "gradsync::plan_build", "gradsync::mark_ready", "gradsync::pack",
                        "gradsync::reduce", "gradsync::unpack", "gradsync::clip", "gradsync::global_norm",
                        "gradsync::optimizer_update"}) {
    CAPTURE(n);
    GRADSYNC_CHECK_ALL(names.count(n) == 1);
  }
  // The tower's 1/n, deferred to the update, applied by clip before it scales (1 rank: nothing to scale).
  GRADSYNC_CHECK_ALL(any(log, "gradsync::local_scale", "gradsync::clip") == (world_size() > 1));
  for (const Pushed& r : log) {  // gradsync's own names only (the tool sees every region)
    CAPTURE(r.name);
    CHECK(r.name.rfind("gradsync::", 0) == 0);
  }
  // The exchange's phases inside the calls that run them; the last step's all inside synchronize().
  for (const char* n : {"gradsync::pack", "gradsync::reduce", "gradsync::unpack"}) {
    CAPTURE(n);
    GRADSYNC_CHECK_ALL(any(log, n, "gradsync::synchronize"));
    for (const Pushed& r : log)
      if (r.name == n) CHECK((r.inside("gradsync::synchronize") || r.inside("gradsync::mark_ready")));
  }
  GRADSYNC_CHECK_ALL(any(log, "gradsync::pack", "gradsync::mark_ready"));  // overlap: launched by a mark
  for (const Pushed& r : log)
    if (r.name == "gradsync::arrival_check" || r.name == "gradsync::plan_build") {
      CAPTURE(r.name);
      CHECK((r.inside("gradsync::synchronize") || r.inside("gradsync::mark_ready")));
    }
  GRADSYNC_CHECK_ALL(any(log, "gradsync::global_norm", "gradsync::clip"));
  for (const Pushed& r : log)
    if (r.name == "gradsync::synchronize" || r.name == "gradsync::optimizer_update" || r.name == "gradsync::clip")
      CHECK(r.around.empty());  // the user's calls: outermost
}

TEST_CASE("a step that throws leaves no gradsync region open") {
  const Tool* t = tool();
  if (!t) {
    MESSAGE("KOKKOS_TOOLS_LIBS / KOKKOS_PROFILE_LIBRARY not set: run through ctest (skipped)");
    return;
  }
  const int rank = world_rank(), victim = world_size() - 1;
  gradsync::Options o = opts();
  o.check_finite = true;
  std::vector<View> g;
  for (int k = 0; k < 4; ++k) g.emplace_back("g" + std::to_string(k), 128);
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    Sync s(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    for (std::size_t k = 0; k < g.size(); ++k) {
      s.add<Dense>(g[k], "g" + std::to_string(k));
      gradsync_test::fill_host(g[k], [&](std::size_t i) { return rank + 0.5 * double(i); });
    }
    GRADSYNC_CHECK_ALL(s.synchronize());  // a finite step first: the plan is built, the step's regions seen
    if (rank == victim) gradsync_test::set_value(g[1], 5, std::nan(""));
    t->clear();
    std::string what;
    try {
      if (overlap)
        for (std::size_t k = g.size(); k-- > 0;) s.mark_ready(g[k]);  // the victim throws at g1's chunk
      (void)s.synchronize();
    } catch (const gradsync::Error& e) {
      what = e.what();
    }
    CAPTURE(what);
    GRADSYNC_CHECK_ALL(has(what, "holds NaN or Inf on rank " + std::to_string(victim)));
    bool nested = false;
    const std::vector<Pushed> log = replay(*t, nested);
    GRADSYNC_CHECK_ALL(!log.empty());
    GRADSYNC_CHECK_ALL(nested);
    GRADSYNC_CHECK_ALL(t->depth() == 0);
    GRADSYNC_CHECK_ALL(t->errors() == 0);
  }
}
