// Sgd, Adam and AdamW against trajectories produced by PyTorch 1.13's torch.optim (the script and
// its output are in tests/reference/): every parameter after every step, to 1e-12 in double (rel_err:
// relative to the value, absolute below 1).
#include <algorithm>
#include <cstdint>
#include <gradsync/gradsync.hpp>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "gradsync_test.hpp"
#include "reference/optimizer_refs.hpp"

using gradsync_test::fill_host;
using gradsync_test::host_copy;
using gradsync_test::rel_err;

namespace {

template <class Opt>
Opt make_optimizer(const gradsync_ref::OptimizerCase& c) {
  if constexpr (std::is_same_v<Opt, gradsync::Sgd<typename Opt::tensor_type>>) {
    gradsync::SgdOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.weight_decay = c.weight_decay;
    o.nesterov = c.nesterov;
    o.maximize = c.maximize;
    return Opt(o);
  } else {
    gradsync::AdamOptions o;
    o.lr = c.lr;
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.weight_decay;
    o.amsgrad = c.amsgrad;
    o.maximize = c.maximize;
    if constexpr (std::is_same_v<Opt, gradsync::AdamW<typename Opt::tensor_type>>) {
      gradsync::AdamWOptions w;
      static_cast<gradsync::AdamOptions&>(w) = o;
      return Opt(w);
    } else {
      return Opt(o);
    }
  }
}

// Runs one reference case; returns the largest relative error over every parameter and step.
template <class T, template <class> class OptT>
double run_case(const gradsync_ref::OptimizerCase& c) {
  using View = Kokkos::View<T*>;
  using Opt = OptT<View>;
  Opt opt = make_optimizer<Opt>(c);
  std::vector<View> params, grads;
  std::size_t total = 0;
  for (int n : gradsync_ref::optimizer_sizes) {
    params.emplace_back("p", n);
    grads.emplace_back("g", n);
    fill_host(params.back(), [&](std::size_t i) { return c.init[total + i]; });
    total += std::size_t(n);
  }
  for (std::size_t k = 0; k < params.size(); ++k) CHECK(opt.add(params[k], grads[k]) == k);
  double worst = 0;
  for (int step = 0; step < gradsync_ref::optimizer_steps; ++step) {
    std::size_t off = std::size_t(step) * total;
    for (auto& g : grads) fill_host(g, [&](std::size_t) { return c.grads[off++]; });
    opt.step();
    off = std::size_t(step) * total;
    for (auto& p : params) {
      const auto h = host_copy(p);
      for (std::size_t i = 0; i < h.size(); ++i) worst = std::max(worst, rel_err(double(h(i)), c.expected[off++]));
    }
    for (std::size_t k = 0; k < params.size(); ++k) CHECK(opt.step_count(k) == step + 1);
  }
  return worst;
}

template <class T>
double run_any(const gradsync_ref::OptimizerCase& c) {
  const std::string kind = c.kind;
  if (kind == "sgd") return run_case<T, gradsync::Sgd>(c);
  if (kind == "adam") return run_case<T, gradsync::Adam>(c);
  if (kind == "adamw") return run_case<T, gradsync::AdamW>(c);
  FAIL("unknown optimizer kind in the reference data: " << kind);
  return std::numeric_limits<double>::infinity();
}

}  // namespace

TEST_CASE("Sgd, Adam and AdamW follow PyTorch's trajectories") {
  int checked = 0;
  for (const auto& c : gradsync_ref::optimizer_cases) {
    const std::string name = c.name;
    CAPTURE(name);
    if (c.single) {
      // PyTorch computed in float32: a few float ulps over six steps.
      const double err = run_any<float>(c);
      CAPTURE(err);
      CHECK(err <= 1e-6);
    } else {
      const double err = run_any<double>(c);
      CAPTURE(err);
      CHECK(err <= 1e-12);
    }
    ++checked;
  }
  CHECK(checked == 16);
}

TEST_CASE("optimizer state: allocated once, in the parameters' memory space, visited for broadcast") {
  Kokkos::View<double*> p("p", 3), g("g", 3);
  gradsync::SgdOptions so;
  so.momentum = 0.9;
  gradsync::Sgd<Kokkos::View<double*>> sgd(so);
  sgd.add(p, g);
  int buffers = 0, counters = 0;
  sgd.for_each_state(0, [&](auto* data, std::size_t n) {
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, double>)
      buffers += n == 3;
    else
      counters += n == 1 && *data == 0;  // the step count: a host-side counter
  });
  CHECK(buffers == 1);
  CHECK(counters == 1);

  gradsync::AdamOptions ao;
  ao.amsgrad = true;
  gradsync::Adam<Kokkos::View<double*>> adam(ao);
  adam.add(p, g);
  buffers = 0;
  adam.for_each_state(0, [&](auto* data, std::size_t n) {
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, double>) buffers += n == 3;
  });
  CHECK(buffers == 3);

  // Plain SGD keeps no state buffer, only its step count.
  gradsync::Sgd<Kokkos::View<double*>> plain;
  plain.add(p, g);
  buffers = 0;
  plain.for_each_state(0, [&](auto* data, std::size_t) {
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, double>) ++buffers;
  });
  CHECK(buffers == 0);
}

TEST_CASE("optimizer misuse is reported") {
  Kokkos::View<double*> p("p", 3), g("g", 4), g3("g3", 3);
  gradsync::Sgd<Kokkos::View<double*>> sgd;
  CHECK_THROWS_AS(sgd.add(p, g), gradsync::Error);
  sgd.add(p, g3);
  CHECK_THROWS_AS(sgd.add(p, g3), gradsync::Error);  // the same parameter twice
  gradsync::SgdOptions bad;
  bad.nesterov = true;
  CHECK_THROWS_AS(gradsync::Sgd<Kokkos::View<double*>>{bad}, gradsync::ConfigError);
  gradsync::AdamOptions beta;
  beta.beta2 = 1.0;
  CHECK_THROWS_AS(gradsync::Adam<Kokkos::View<double*>>{beta}, gradsync::ConfigError);
  // Switching momentum on after registration would need a buffer that was never allocated.
  sgd.options().momentum = 0.5;
  CHECK_THROWS_AS(sgd.step(), gradsync::ConfigError);
}

TEST_CASE("a learning-rate schedule takes effect at the next step; std::vector parameters work") {
  std::vector<double> p{1.0, 2.0}, g{0.5, -1.0};
  gradsync::Sgd<std::vector<double>> sgd;
  sgd.options().lr = 0.1;
  sgd.add(p, g);
  sgd.step();
  sgd.options().lr = 0.2;
  sgd.step();
  CHECK(rel_err(p[0], 1.0 - 0.3 * 0.5) < 1e-15);
  CHECK(rel_err(p[1], 2.0 + 0.3) < 1e-15);
}

TEST_CASE("parameters with different step counts (after a broadcast) each get their own bias correction") {
  using View = Kokkos::View<double*>;
  View p("p", 4), q("q", 3), q2("q2", 3), gp("gp", 4), gq("gq", 3);
  fill_host(p, [](std::size_t i) { return 0.1 * double(i); });
  fill_host(gp, [](std::size_t i) { return 0.3 - 0.2 * double(i); });
  fill_host(q, [](std::size_t i) { return 1 - 0.2 * double(i); });
  fill_host(q2, [](std::size_t i) { return 1 - 0.2 * double(i); });
  fill_host(gq, [](std::size_t i) { return 0.05 * double(i) - 0.1; });
  gradsync::AdamW<View> both, alone;
  both.add(p, gp);
  both.add(q, gq);
  alone.add(q2, gq);
  auto set_count = [](auto& opt, std::size_t slot, std::int64_t n) {
    opt.for_each_state(slot, [&](auto* data, std::size_t) {  // the step count is a host-side counter
      if constexpr (std::is_same_v<std::remove_pointer_t<decltype(data)>, std::int64_t>) *data = n;
    });
  };
  set_count(both, 1, 5);
  set_count(alone, 0, 5);
  both.step();
  alone.step();
  bool same = true;
  const auto qh = host_copy(q), q2h = host_copy(q2);
  for (int i = 0; i < 3; ++i) same = same && qh(i) == q2h(i);
  CHECK(same);
  CHECK(both.step_count(0) == 1);
  CHECK(both.step_count(1) == 6);
}

TEST_CASE("a parameter longer than one kernel segment (2^20 values) is updated everywhere") {
  using View = Kokkos::View<double*>;
  const std::size_t n = (std::size_t(1) << 20) * 2 + 7;
  View p("p", n), g("g", n);
  Kokkos::deep_copy(p, 1.0);
  Kokkos::deep_copy(g, 2.0);
  gradsync::SgdOptions o;
  o.lr = 0.25;
  o.momentum = 0.5;
  gradsync::Sgd<View> sgd(o);
  sgd.add(p, g);
  sgd.step();  // buf = g, p = 1 - 0.25 * 2
  sgd.step();  // buf = 0.5 * 2 + 2, p = 0.5 - 0.25 * 3
  std::size_t wrong = 0;
  const auto ph = host_copy(p);
  for (std::size_t i = 0; i < n; ++i) wrong += ph(i) != -0.25;
  CHECK(wrong == 0);
}

TEST_CASE("step_slots(first, last) updates those slots only; in ranges it equals step()") {
  using View = Kokkos::View<double*>;
  const std::size_t sizes[] = {5, 3, 7};
  std::vector<View> p1, p2, g;
  gradsync::AdamOptions ao;
  ao.lr = 0.05;
  gradsync::Adam<View> whole(ao), ranged(ao);
  gradsync::SgdOptions so;
  so.momentum = 0.9;
  gradsync::Sgd<View> sgd_whole(so), sgd_ranged(so);
  std::vector<View> s1, s2;
  for (std::size_t k = 0; k < 3; ++k) {
    for (auto* v : {&p1, &p2, &s1, &s2}) {
      v->emplace_back("p", sizes[k]);
      fill_host(v->back(), [&](std::size_t i) { return 0.1 * double(i) - 0.2 * double(k); });
    }
    g.emplace_back("g", sizes[k]);
    fill_host(g.back(), [&](std::size_t i) { return 0.3 - 0.07 * double(i * (k + 1)); });
    whole.add(p1[k], g[k]);
    ranged.add(p2[k], g[k]);
    sgd_whole.add(s1[k], g[k]);
    sgd_ranged.add(s2[k], g[k]);
  }
  // Slot 2 alone first: it moves, the others do not.
  const auto before = host_copy(p2[0]);
  ranged.step_slots(2, 3);
  CHECK(ranged.step_count(2) == 1);
  CHECK(ranged.step_count(0) == 0);
  const auto after = host_copy(p2[0]);
  bool untouched = true;
  for (std::size_t i = 0; i < sizes[0]; ++i) untouched = untouched && before(i) == after(i);
  CHECK(untouched);
  ranged.step_slots(0, 2);  // the same first step for the others
  whole.step();
  for (int s = 0; s < 3; ++s) {
    whole.step();
    ranged.step_slots(0, 1);
    ranged.step_slots(1, 3);
    sgd_whole.step();
    sgd_ranged.step_slots(0, 2);
    sgd_ranged.step_slots(2, 3);
  }
  bool same = true;
  for (std::size_t k = 0; k < 3; ++k) {
    const auto a = host_copy(p1[k]), b = host_copy(p2[k]), c = host_copy(s1[k]), d = host_copy(s2[k]);
    for (std::size_t i = 0; i < sizes[k]; ++i) same = same && a(i) == b(i) && c(i) == d(i);
  }
  CHECK(same);
  CHECK(ranged.step_count(1) == 4);
  CHECK(gradsync_test::error_of([&] { ranged.step_slots(2, 1); }).find("not a range of slots") != std::string::npos);
}
