// Helpers shared by gradsync's tests: rank queries and assertions agreed across ranks.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>

#include <gradsync/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

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

/// Heap allocations so far (operator new calls), in programs linking alloc_counter.cpp.
long heap_allocations();

/// Largest value over ranks.
inline double max_over_ranks(double x, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, comm);
  return x;
}

/// |a - b| relative to max(|b|, 1): the error measure of every value comparison.
inline double rel_err(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1.0); }

/// Largest rel_err of views[k](i) against the average over n ranks of value(k, i, r): the analytic
/// result of averaging gradients whose rank-r values are value(k, i, r).
template <class Views, class Value>
double worst_vs_rank_average(const Views& views, int n, Value value) {
  double worst = 0;
  for (std::size_t k = 0; k < views.size(); ++k)
    for (std::size_t i = 0; i < views[k].size(); ++i) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += value(k, i, r);
      worst = std::max(worst, rel_err(views[k](i), sum / n));
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

/// Tolerance of a value type: a few ulps of the arithmetic the sync does.
template <class T>
constexpr double tol() {
  return sizeof(T) == 4 ? 2e-6 : 1e-13;
}

}  // namespace gradsync_test

// CHECKs that `cond` holds on every rank; every rank sees the same outcome.
#define GRADSYNC_CHECK_ALL(cond) CHECK(::gradsync_test::all_ranks(static_cast<bool>(cond)))
