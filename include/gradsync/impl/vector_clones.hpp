// gradsync internals: host loops built for the widest vectors the CPU has.
//
// Why: a header-only library is compiled with its user's flags, on x86-64 usually the baseline
// (SSE2), while Open MPI's MPI_SUM picks AVX at run time. The ring's own host passes (the average's
// last addition, the 16-bit conversions) took 2.5x the instructions of MPI's sum (callgrind, DLRM
// step). GCC builds a function marked GRADSYNC_IMPL_VECTOR_CLONES for AVX-512, AVX2 and the
// baseline and picks one at load time (an ifunc). The loops marked have no reductions whose order
// a wider vector could change and no a * b + c for FMA to fuse, so every version gives the same bits.
#pragma once

#include <cstddef>  // defines __GLIBC__ where glibc is the C library: ifuncs need it (not musl)

#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__INTEL_LLVM_COMPILER) && !defined(GRADSYNC_NO_VECTOR_CLONES)
#define GRADSYNC_IMPL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GRADSYNC_IMPL_VECTOR_CLONES
#endif
