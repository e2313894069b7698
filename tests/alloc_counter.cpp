// Replaces the global operator new of a test program to count heap allocations, so a test can
// prove that a code path allocates nothing. Kept in its own translation unit: the compiler must
// not see malloc and delete meet across an inlined call.
#include <atomic>
#include <cstdlib>
#include <new>

namespace gradsync_test {
std::atomic<long> g_heap_allocations{0};
long heap_allocations() { return g_heap_allocations.load(); }
}  // namespace gradsync_test

// nvcc (nvcc_wrapper with a Kokkos-CUDA build compiles .cpp files as CUDA) treats operator new as
// host and device code, and device code cannot throw: its device pass sees no throw.
void* operator new(std::size_t n) {
#if defined(__CUDA_ARCH__)
  return std::malloc(n ? n : 1);
#else
  ++gradsync_test::g_heap_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
#endif
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
