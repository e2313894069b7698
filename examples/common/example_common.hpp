// What the MPI + Kokkos examples (hybrid_dlrm, online_closure) share: the kernels' basic types, the
// command-line walk, the MPI helpers and main()'s start-up and error handling.
#pragma once

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

using Real = double;  // the examples' 1e-10 checks are double-precision bounds
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Index = std::int64_t;

// The math functions left Kokkos::Experimental in 3.7.
#if KOKKOS_VERSION >= 30700
namespace math = ::Kokkos;
#else
namespace math = ::Kokkos::Experimental;
#endif

inline Kokkos::RangePolicy<Exec, Kokkos::IndexType<Index>> range(Index n) {
  return Kokkos::RangePolicy<Exec, Kokkos::IndexType<Index>>(0, n);
}

// ---- counter-based random numbers: the same value for the same key on every rank and device ----

KOKKOS_INLINE_FUNCTION std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform in (0, 1), never 0 or 1.
KOKKOS_INLINE_FUNCTION double uniform(std::uint64_t h) { return (double(h >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/// Walks the command line: `option(name, value)` handles one option (`value()` takes the next
/// argument, an error where there is none) and returns false for one it does not know. Kokkos'
/// --kokkos-* options are skipped. Returns false for --help (after `usage(argv[0])` when `print`).
template <class Usage, class Option>
bool parse_args(int argc, char** argv, bool print, Usage&& usage, Option&& option) {
  std::vector<std::string> a(argv + 1, argv + argc);
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= a.size()) throw std::runtime_error(a[i] + " needs a value");
      return a[++i];
    };
    const std::string& o = a[i];
    if (o == "--help" || o == "-h") {
      if (print) usage(argv[0]);
      return false;
    }
    if (o.rfind("--kokkos-", 0) == 0) continue;
    if (!option(o, value)) throw std::runtime_error("unknown option " + o + " (see --help)");
  }
  return true;
}

/// The value of a --*-scale option: true for world_size, false for none.
inline bool parse_scale(const std::string& option, const std::string& m) {
  if (m == "world_size") return true;
  if (m == "none") return false;
  throw std::runtime_error(option + " takes world_size or none, not " + m);
}

/// A View's values on the host, in a vector (a copy from any memory space).
template <class V>
std::vector<typename V::non_const_value_type> to_host(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<typename V::non_const_value_type>(h.data(), h.data() + h.size());
}

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

inline double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

inline double sum_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

/// main() of an example: the options first (Kokkos' own are left to Kokkos), so --help and a bad
/// option need no Kokkos: `parse(print)` returns false for --help; a bad option exits with 2.
/// Then `run()` between Kokkos::initialize and finalize; an exception on any rank aborts the job
/// (the other ranks may be waiting in a collective).
template <class Parse, class Run>
int mpi_main(const char* name, int& argc, char**& argv, Parse&& parse, Run&& run) {
  MPI_Init(&argc, &argv);
  // The test suite names the world size it launched (GSYNC_TEST_RANKS): a launcher of another
  // MPI starts separate 1-rank processes, whose checks would all pass alone.
  if (const char* want = std::getenv("GSYNC_TEST_RANKS"); want && *want && std::atoi(want) != world_size()) {
    std::fprintf(stderr, "%s: launched for %s ranks (GSYNC_TEST_RANKS) but MPI_COMM_WORLD has %d\n", name, want,
                 world_size());
    MPI_Finalize();
    return 2;
  }
  try {
    if (!parse(world_rank() == 0)) {
      MPI_Finalize();
      return 0;
    }
  } catch (const std::exception& e) {
    if (world_rank() == 0) std::fprintf(stderr, "%s: %s\n", name, e.what());
    MPI_Finalize();
    return 2;
  }
  Kokkos::initialize(argc, argv);
  int status = 0;
  try {
    status = run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s (rank %d): %s\n", name, world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  Kokkos::finalize();
  // the verdict must be out before MPI_Finalize: once a rank exits non-zero, mpirun kills the rest
  std::fflush(stdout);
  MPI_Finalize();
  return status;
}

}  // namespace examples
