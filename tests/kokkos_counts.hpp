// What each test case asks of Kokkos, counted through Kokkos Tools callbacks set in-process by the
// test main (issue 34): deep copies, kernel launches and allocations.
//
// Why: on a Kokkos build with CUDA every default View is device memory, and a deep copy is a
// synchronous device <-> host transfer of 10 to 30 us where the host build copies nothing. A test
// that reads values one element at a time passes in a second here and runs past its timeout on a
// GPU. The counts are the same on both builds (every Kokkos::deep_copy reaches the callback, also
// when source and destination are one host View), so the suite checks them on the CPU: a test
// case whose estimated device time is over budget fails here first, with its counts.
#pragma once

#include <string>

namespace gradsync_test {

/// Kokkos events so far in this process (all zero where counting is off: a Kokkos Tools library
/// loaded by the environment owns the callbacks then).
struct KokkosCounts {
  long deep_copies = 0;   ///< every Kokkos::deep_copy
  long small_copies = 0;  ///< those of at most 16 bytes: one value
  long launches = 0;      ///< parallel_for, parallel_reduce, parallel_scan
  long allocations = 0;   ///< Kokkos allocations of at least one byte (see kokkos_counts.cpp)

  KokkosCounts operator+(const KokkosCounts& o) const {
    return {deep_copies + o.deep_copies, small_copies + o.small_copies, launches + o.launches,
            allocations + o.allocations};
  }
  KokkosCounts operator-(const KokkosCounts& o) const {
    return {deep_copies - o.deep_copies, small_copies - o.small_copies, launches - o.launches,
            allocations - o.allocations};
  }
  /// Device time these events would take on a GPU build, in seconds: a deep copy is a fence and a
  /// transfer (taken as 25 us), a launch about 6 us, an allocation (cudaMalloc) about 50 us.
  double device_seconds() const {
    return 25e-6 * double(deep_copies) + 6e-6 * double(launches) + 50e-6 * double(allocations);
  }
};

/// The counts so far.
KokkosCounts kokkos_counts();

/// Whether the callbacks are the test main's (false under a Kokkos Tools library from the environment).
bool kokkos_counting();

/// "<space> '<label>' <bytes> bytes" of the last counted allocation, or "none".
std::string last_kokkos_allocation();

/// Stops counting deep copies while alive. Kokkos passes a copy's View labels to the callback as
/// std::string values, a heap allocation for a label over 15 characters: tests that prove a code path
/// allocates nothing on the heap hold one of these around the counted region.
class DeepCopiesUncounted {
 public:
  DeepCopiesUncounted();
  ~DeepCopiesUncounted();
  DeepCopiesUncounted(const DeepCopiesUncounted&) = delete;
  DeepCopiesUncounted& operator=(const DeepCopiesUncounted&) = delete;

 private:
  bool was_ = false;
};

/// Tells Kokkos, before Kokkos::initialize, that the counting callbacks need no fences around the
/// events they count. Called by the test main.
void prepare_kokkos_counting();

/// Installs the callbacks (after Kokkos::initialize, once). Called by the test main.
void start_kokkos_counting();

}  // namespace gradsync_test
