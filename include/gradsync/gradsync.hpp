// gradsync: the whole public API.
#pragma once

/// \namespace gradsync
/// gradsync's public API: GradientSync (the fused synchronization of a model's gradients), its
/// backends (MpiBackend, SelfBackend, NcclBackend), DistributedOptimizer and the optimizers, the
/// global norm, process sets, row-sparse gradients and compression. gradsync::impl is internal.

#include "backend.hpp"
#include "backend_traits.hpp"
#include "compression.hpp"
#include "config.hpp"
#include "describe.hpp"
#include "distributed_optimizer.hpp"
#include "env.hpp"
#include "error.hpp"
#include "global_norm.hpp"
#include "gradient_arena.hpp"
#include "gradient_sync.hpp"
#include "local_var_policy.hpp"
#include "mpi_backend.hpp"
#include "optimizers.hpp"
#include "options.hpp"
#include "registrations.hpp"
#include "self_backend.hpp"
#include "shard.hpp"
#include "stats.hpp"
#include "tensor_traits.hpp"
#include "watch.hpp"

// The CUDA parts, when the build found them (GradSync::cuda and GradSync::nccl define these).
#if defined(GRADSYNC_HAVE_CUDA)
#include "cuda_space.hpp"
#endif
#if defined(GRADSYNC_HAVE_NCCL)
#include "nccl_backend.hpp"
#endif
// Checkpoints in parallel HDF5, when the build links GradSync::hdf5 (which defines this).
#if defined(GRADSYNC_HAVE_HDF5)
#include "checkpoint.hpp"
#endif
