// Helpers shared by gradsync's tests: rank queries, assertions agreed across ranks, and host access
// to Views, which on a Kokkos build with CUDA live in device memory (Kokkos::View<T*> is in
// CudaSpace there): tests read and write values through host mirrors, which are the Views
// themselves when the memory is the host's (no copy, no allocation: host builds run as before).
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <gradsync/error.hpp>

#include "kokkos_counts.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace gradsync_test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// True on every rank when `ok` holds on every rank: assertions on this never diverge.
inline bool all_ranks(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, comm);
  return v != 0;
}

/// Records that the running test case cannot run at this world size, which is below `ranks`, and
/// why. The test main (test_main.cpp) lists what was skipped instead of counting it as passed, and
/// a program none of whose selected cases ran exits 77, which ctest reports as skipped
/// (SKIP_RETURN_CODE). Use GRADSYNC_SKIP_BELOW_RANKS.
void skip_case(int ranks, const char* why);
/// Whether the running SUBCASE can run at this world size (at least `ranks`); when not, records it
/// as skipped, and why. Use GRADSYNC_SUBCASE_FROM_RANKS.
bool subcase_runs(int ranks, const char* why);

/// Heap allocations so far (operator new calls), in programs linking alloc_counter.cpp.
long heap_allocations();

/// Largest value over ranks.
inline double max_over_ranks(double x, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, comm);
  return x;
}

/// Whether `s` contains `part` (error messages).
inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// |a - b| relative to max(|b|, 1): the error measure of every value comparison.
inline double rel_err(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1.0); }

/// A host View with v's values: v itself when v is in host memory, else a new copy (after a fence).
template <class V>
auto host_copy(const V& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
}

/// A host View to write v's values into before upload(v, it): v itself when v is in host memory.
template <class V>
auto host_mirror(const V& v) {
  return Kokkos::create_mirror_view(Kokkos::HostSpace(), v);
}

/// Copies h, a host_mirror(v), into v; nothing when h is v (no fence: on the host there is nothing
/// to wait for, and Kokkos 4's fence labels would be heap allocations inside allocation tests).
template <class V, class M>
void upload(const V& v, const M& h) {
  if (h.data() != v.data()) Kokkos::deep_copy(v, h);
}

/// Copies v into h, its host_mirror(v); nothing when h is v.
template <class M, class V>
void download(const M& h, const V& v) {
  if (h.data() != v.data()) Kokkos::deep_copy(h, v);
}

/// Sets the i-th value in memory order of the contiguous View v to f(i), on the host.
template <class V, class F>
void fill_host(const V& v, F&& f) {
  using T = typename V::non_const_value_type;
  const auto h = host_mirror(v);
  T* d = h.data();
  for (std::size_t i = 0; i < h.size(); ++i) d[i] = T(f(i));
  upload(v, h);
}

/// Sets element i of the 1-D View v to x (one value copied, wherever v lives).
template <class V, class X>
void set_value(const V& v, std::size_t i, X x) {
  Kokkos::deep_copy(Kokkos::subview(v, i), typename V::non_const_value_type(x));
}

/// Element i of the 1-D View v, read on the host (one value copied).
template <class V>
typename V::non_const_value_type value_at(const V& v, std::size_t i) {
  typename V::non_const_value_type x{};
  Kokkos::deep_copy(x, Kokkos::subview(v, i));
  return x;
}

/// The values of a contiguous View, in memory order, on the host.
template <class V>
std::vector<typename V::non_const_value_type> host_values(const V& v) {
  const auto h = host_copy(v);
  return std::vector<typename V::non_const_value_type>(h.data(), h.data() + h.size());
}

/// n values at p in MemorySpace, copied to the host (an optimizer's state buffer, for example).
template <class MemorySpace, class T>
std::vector<T> host_values_at(const T* p, std::size_t n) {
  std::vector<T> out(n);
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(out.data(), n),
                    Kokkos::View<const T*, MemorySpace, Unmanaged>(p, n));
  return out;
}

/// Copies of every state buffer and counter of an optimizer's slot, as doubles (the buffers in the
/// parameters' memory space, the step counters on the host).
template <class Opt>
std::vector<double> state_of(Opt& opt, std::size_t slot) {
  std::vector<double> out;
  opt.for_each_state(slot, [&](auto* data, std::size_t n) {
    using T = std::remove_pointer_t<decltype(data)>;
    using Space = std::conditional_t<std::is_same_v<T, std::int64_t>, Kokkos::HostSpace, typename Opt::memory_space>;
    for (T x : host_values_at<Space>(data, n)) out.push_back(double(x));
  });
  return out;
}

/// Largest rel_err of views[k](i) against the average over n ranks of value(k, i, r): the analytic
/// result of averaging gradients whose rank-r values are value(k, i, r).
template <class Views, class Value>
double worst_vs_rank_average(const Views& views, int n, Value value) {
  double worst = 0;
  for (std::size_t k = 0; k < views.size(); ++k) {
    const auto h = host_copy(views[k]);
    for (std::size_t i = 0; i < h.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += value(k, i, r);
      worst = std::max(worst, rel_err(h(i), sum / n));
    }
  }
  return worst;
}

/// The message of the E that f() throws, or "" when it throws none (another exception propagates).
template <class E = gradsync::Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

/// The stall deadline's promise (README, docs/ERRORS.md): the ranks that arrived throw at the
/// deadline (stall_timeout), never before it and never later than this factor of it (they wait a
/// short grace, at most 0.09 of it, for a peer that arrived just before it).
constexpr double kStallPromiseFactor = 1.1;
/// Seconds tests allow on top of that promise, which is about gradsync's own wait: ctest runs
/// several 2- to 6-rank programs at once on 2 cores, and a rank that is descheduled around its
/// deadline check counts the time it was away too.
constexpr double kSchedulingSlack_s = 0.5;

/// The seconds a StallError's message says its rank waited ("has waited 1.02 s"), -1 without it.
inline double reported_wait(const std::string& what) {
  const auto at = what.find("has waited ");
  return at == std::string::npos ? -1.0 : std::stod(what.substr(at + 11));
}

/// Tolerance of a value type: a few ulps of the arithmetic the sync does.
template <class T>
constexpr double tol() {
  return sizeof(T) == 4 ? 2e-6 : 1e-13;
}

}  // namespace gradsync_test

// Ends the running test case as skipped below `ranks` ranks, saying why: a run at too few ranks is
// reported, never a vacuous pass. It depends on the world size only, so every rank decides alike
// and none is left alone in a collective. At the top of a TEST_CASE, not in a SUBCASE: returning
// from one would hide the subcases after it from doctest (GRADSYNC_SUBCASE_FROM_RANKS is for them).
#define GRADSYNC_SKIP_BELOW_RANKS(ranks, why)      \
  do {                                             \
    if (::gradsync_test::world_size() < (ranks)) { \
      ::gradsync_test::skip_case((ranks), why);    \
      return;                                      \
    }                                              \
  } while (false)

// SUBCASE(name) whose body runs from `ranks` ranks on; below, it is reported skipped, saying why,
// and the subcases after it still run. The body is a loop's (run once): no break or continue in it.
#define GRADSYNC_SUBCASE_FROM_RANKS(ranks, name, why)                                         \
  SUBCASE(name)                                                                               \
  for (bool DOCTEST_CAT(gsync_runs_, __LINE__) = ::gradsync_test::subcase_runs((ranks), why); \
       DOCTEST_CAT(gsync_runs_, __LINE__); DOCTEST_CAT(gsync_runs_, __LINE__) = false)

// CHECKs that `cond` holds on every rank; every rank sees the same outcome.
#define GRADSYNC_CHECK_ALL(cond) CHECK(::gradsync_test::all_ranks(static_cast<bool>(cond)))
