// gradsync: the C interface (include/gradsync/gradsync_c.h), compiled once by GradSync::c.
//
// A handle holds two GradientSyncs over one MpiBackend, one for float and one for double buffers,
// and always synchronizes both in the same order on every rank: which value types a rank's *local*
// buffers use may differ from rank to rank, so creating a sync only when a type is first added
// would leave the ranks calling different collectives. Groups are three fixed tag types, one per
// gradsync_kind. Every entry point catches everything: no exception crosses into C or Fortran.
#include "gradsync/gradsync_c.h"

#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>

#include <gradsync/gradsync.hpp>

namespace gradsync::impl::c_api {
struct DataParallel {};
struct LocalScaled {};
struct LocalUnscaled {};
}  // namespace gradsync::impl::c_api

template <>
struct gradsync::LocalVarPolicy<gradsync::impl::c_api::LocalScaled>
    : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};
template <>
struct gradsync::LocalVarPolicy<gradsync::impl::c_api::LocalUnscaled>
    : gradsync::KeepLocal<gradsync::LocalScale::none> {};

struct gradsync_sync {
  gradsync::GradientSync<gradsync::MpiBackend, gradsync::Span<float>> f;
  gradsync::GradientSync<gradsync::MpiBackend, gradsync::Span<double>> d;
  gradsync_sync(const gradsync::MpiBackend& b, const gradsync::Options& o) : f(b, o), d(b, o) {}
};

namespace {
using namespace gradsync::impl::c_api;

thread_local std::string last_error;

// Live handles: a stale or foreign pointer is reported, never dereferenced.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<const gradsync_sync*>& registry() {
  static std::set<const gradsync_sync*> s;
  return s;
}
bool is_live(const gradsync_sync* h) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return h != nullptr && registry().count(h) != 0;
}

int fail(int status, std::string msg) {
  last_error = std::move(msg);
  return status;
}

// Runs f, turning every exception into a status and message.
template <class F>
int guarded(const char* fn, F&& f) {
  try {
    return f();
  } catch (const gradsync::MismatchError& e) {
    return fail(GRADSYNC_ERR_MISMATCH, e.what());
  } catch (const gradsync::StallError& e) {
    return fail(GRADSYNC_ERR_STALL, e.what());
  } catch (const gradsync::ConfigError& e) {
    return fail(GRADSYNC_ERR_CONFIG, e.what());
  } catch (const gradsync::Error& e) {
    return fail(GRADSYNC_ERR_RUNTIME, e.what());
  } catch (const std::bad_alloc&) {
    return fail(GRADSYNC_ERR_RUNTIME, std::string("gradsync: ") + fn + ": out of memory");
  } catch (const std::exception& e) {
    return fail(GRADSYNC_ERR_INTERNAL, std::string("gradsync: ") + fn + ": unexpected exception: " + e.what());
  } catch (...) {
    return fail(GRADSYNC_ERR_INTERNAL, std::string("gradsync: ") + fn + ": unexpected non-standard exception");
  }
}

int bad_handle(const char* fn, const void* h) {
  if (!h) return fail(GRADSYNC_ERR_INVALID_HANDLE, gradsync::impl::cat("gradsync: ", fn, ": the handle is NULL"));
  return fail(GRADSYNC_ERR_INVALID_HANDLE,
              gradsync::impl::cat("gradsync: ", fn, ": handle ", h,
                                  " is not a live gradsync handle (destroyed, or never created)"));
}

// gradsync needs Kokkos; a C or Fortran code usually does not initialize it. Then the first
// gradsync_create does, and Kokkos is finalized at exit (Kokkos cannot be initialized twice).
void ensure_kokkos() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Kokkos::is_initialized()) return;
    Kokkos::initialize();
    std::atexit([] {
      if (Kokkos::is_initialized()) Kokkos::finalize();
    });
  });
}

template <class Sync, class T>
void add_to(Sync& s, T* data, std::size_t n, int kind, std::string name) {
  gradsync::Span<T> span(data, n);
  if (kind == GRADSYNC_DATA_PARALLEL)
    s.template add<DataParallel>(span, std::move(name));
  else if (kind == GRADSYNC_LOCAL_SCALED)
    s.template add<LocalScaled>(span, std::move(name));
  else
    s.template add<LocalUnscaled>(span, std::move(name));
}
}  // namespace

extern "C" {

int gradsync_options_init(gradsync_options* o) {
  if (!o) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_options_init: options is NULL");
  const gradsync::Options d;
  o->op = d.op == gradsync::ReduceOp::sum ? GRADSYNC_SUM : GRADSYNC_AVERAGE;
  o->backward_passes_per_step = d.backward_passes_per_step;
  o->average_aggregated_gradients = d.average_aggregated_gradients ? 1 : 0;
  o->read_environment = d.tuning.read_environment ? 1 : 0;
  o->prescale_factor = d.prescale_factor;
  o->postscale_factor = d.postscale_factor;
  return GRADSYNC_OK;
}

int gradsync_create(MPI_Fint comm, const gradsync_options* options, gradsync_handle* out) {
  if (!out) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_create: out is NULL");
  *out = nullptr;
  return guarded("gradsync_create", [&] {
    gradsync::Options o;
    if (options) {
      const gradsync_options& c = *options;
      if (c.op != GRADSYNC_AVERAGE && c.op != GRADSYNC_SUM)
        return fail(GRADSYNC_ERR_INVALID_ARGUMENT,
                    gradsync::impl::cat("gradsync: gradsync_create: op ", c.op,
                                        " is neither GRADSYNC_AVERAGE (0) nor GRADSYNC_SUM (1)"));
      if (c.backward_passes_per_step < 1)
        return fail(GRADSYNC_ERR_INVALID_ARGUMENT,
                    gradsync::impl::cat("gradsync: gradsync_create: backward_passes_per_step is ",
                                        c.backward_passes_per_step, ", must be >= 1"));
      o.op = c.op == GRADSYNC_SUM ? gradsync::ReduceOp::sum : gradsync::ReduceOp::average;
      o.backward_passes_per_step = c.backward_passes_per_step;
      o.average_aggregated_gradients = c.average_aggregated_gradients != 0;
      o.tuning.read_environment = c.read_environment != 0;
      o.prescale_factor = c.prescale_factor;
      o.postscale_factor = c.postscale_factor;
    }
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      return fail(GRADSYNC_ERR_RUNTIME, "gradsync: gradsync_create: MPI is not initialized (call MPI_Init first)");
    ensure_kokkos();
    const MPI_Comm c = MPI_Comm_f2c(comm);
    if (c == MPI_COMM_NULL)
      return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_create: the communicator is MPI_COMM_NULL");
    auto h = std::make_unique<gradsync_sync>(gradsync::MpiBackend(c), o);
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      registry().insert(h.get());
    }
    *out = h.release();
    return int(GRADSYNC_OK);
  });
}

int gradsync_add(gradsync_handle h, void* data, int64_t count, int32_t dtype, int32_t kind, const char* name) {
  if (!is_live(h)) return bad_handle("gradsync_add", h);
  const std::string nm = name ? name : "";
  const std::string who = nm.empty() ? std::string("an unnamed buffer") : "buffer '" + nm + "'";
  if (dtype != GRADSYNC_FLOAT && dtype != GRADSYNC_DOUBLE)
    return fail(GRADSYNC_ERR_INVALID_ARGUMENT,
                gradsync::impl::cat("gradsync: gradsync_add: ", who, ": dtype ", dtype,
                                    " is neither GRADSYNC_FLOAT (1) nor GRADSYNC_DOUBLE (2)"));
  if (kind != GRADSYNC_DATA_PARALLEL && kind != GRADSYNC_LOCAL_SCALED && kind != GRADSYNC_LOCAL)
    return fail(
        GRADSYNC_ERR_INVALID_ARGUMENT,
        gradsync::impl::cat("gradsync: gradsync_add: ", who, ": kind ", kind,
                            " is not GRADSYNC_DATA_PARALLEL (0), GRADSYNC_LOCAL_SCALED (1) or GRADSYNC_LOCAL (2)"));
  if (count < 0)
    return fail(GRADSYNC_ERR_INVALID_ARGUMENT,
                gradsync::impl::cat("gradsync: gradsync_add: ", who, ": count is negative (", count, ")"));
  if (!data && count > 0)
    return fail(GRADSYNC_ERR_INVALID_ARGUMENT,
                gradsync::impl::cat("gradsync: gradsync_add: ", who, ": data is NULL but count is ", count));
  return guarded("gradsync_add", [&] {
    if (dtype == GRADSYNC_FLOAT)
      add_to(h->f, static_cast<float*>(data), std::size_t(count), kind, nm);
    else
      add_to(h->d, static_cast<double*>(data), std::size_t(count), kind, nm);
    return int(GRADSYNC_OK);
  });
}

int gradsync_synchronize(gradsync_handle h, int32_t* step_completed) {
  if (step_completed) *step_completed = 0;
  // A bad handle on one rank only would leave the others waiting in the collective: nothing to
  // agree with here (no communicator), so it is the caller's to avoid; the status says which call.
  if (!is_live(h)) return bad_handle("gradsync_synchronize", h);
  return guarded("gradsync_synchronize", [&] {
    const bool a = h->f.synchronize();
    const bool b = h->d.synchronize();
    if (step_completed) *step_completed = (a && b) ? 1 : 0;
    return int(GRADSYNC_OK);
  });
}

int gradsync_get_stats(gradsync_handle h, gradsync_stats* out) {
  if (!is_live(h)) return bad_handle("gradsync_get_stats", h);
  if (!out) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_get_stats: out is NULL");
  return guarded("gradsync_get_stats", [&] {
    const gradsync::Stats f = h->f.stats(), d = h->d.stats();
    out->bytes_allreduced = f.bytes_allreduced + d.bytes_allreduced;
    out->allreduce_calls = f.allreduce_calls + d.allreduce_calls;
    out->passes = d.passes;  // both syncs see every call
    out->steps = d.steps;
    return int(GRADSYNC_OK);
  });
}

int gradsync_size(gradsync_handle h, int32_t* size) {
  if (!is_live(h)) return bad_handle("gradsync_size", h);
  if (!size) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_size: size is NULL");
  *size = h->d.backend().size();
  return GRADSYNC_OK;
}

int gradsync_rank(gradsync_handle h, int32_t* rank) {
  if (!is_live(h)) return bad_handle("gradsync_rank", h);
  if (!rank) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_rank: rank is NULL");
  *rank = h->d.backend().rank();
  return GRADSYNC_OK;
}

int gradsync_destroy(gradsync_handle* hp) {
  if (!hp) return fail(GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync: gradsync_destroy: the handle pointer is NULL");
  gradsync_handle h = *hp;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (h == nullptr || registry().erase(h) == 0) return bad_handle("gradsync_destroy", h);
  }
  *hp = nullptr;
  return guarded("gradsync_destroy", [&] {
    delete h;
    return int(GRADSYNC_OK);
  });
}

const char* gradsync_last_error(void) { return last_error.c_str(); }

const char* gradsync_status_name(int status) {
  switch (status) {
    case GRADSYNC_OK:
      return "GRADSYNC_OK";
    case GRADSYNC_ERR_INVALID_HANDLE:
      return "GRADSYNC_ERR_INVALID_HANDLE";
    case GRADSYNC_ERR_INVALID_ARGUMENT:
      return "GRADSYNC_ERR_INVALID_ARGUMENT";
    case GRADSYNC_ERR_MISMATCH:
      return "GRADSYNC_ERR_MISMATCH";
    case GRADSYNC_ERR_STALL:
      return "GRADSYNC_ERR_STALL";
    case GRADSYNC_ERR_CONFIG:
      return "GRADSYNC_ERR_CONFIG";
    case GRADSYNC_ERR_RUNTIME:
      return "GRADSYNC_ERR_RUNTIME";
    case GRADSYNC_ERR_INTERNAL:
      return "GRADSYNC_ERR_INTERNAL";
    default:
      return "GRADSYNC_ERR_UNKNOWN_STATUS";
  }
}

}  // extern "C"
