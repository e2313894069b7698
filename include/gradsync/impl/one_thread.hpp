// gradsync internals: impl::OneThread, the guard that keeps a GradientSync to one thread at a time.
//
// Two threads inside one sync would interleave its collectives (MPI_ERR_TRUNCATE, or a crash), so a
// call made while another thread is inside the same sync is refused before it touches anything. The
// thread inside may re-enter (DistributedOptimizer calls the sync's own calls). Two syncs in two
// threads stay independent. Costs two atomic operations per call.
#pragma once

#include <atomic>
#include <thread>

#include "../error.hpp"

namespace gradsync::impl {

class OneThread {
 public:
  OneThread() = default;
  // A moved or copied sync starts with nobody inside (moving one that is in use is the caller's race).
  OneThread(const OneThread&) noexcept {}
  OneThread& operator=(const OneThread&) = delete;

  // Held for one call; `call` is a string literal, named to a thread that is refused.
  class Scope {
   public:
    Scope(OneThread& g, const char* call, int rank) : g_(g) {
      std::thread::id none;
      const std::thread::id me = std::this_thread::get_id();
      if (g_.owner_.compare_exchange_strong(none, me, std::memory_order_acquire)) {
        g_.call_.store(call, std::memory_order_relaxed);
        owns_ = true;
      } else if (none != me) {
        throw Error(cat(call, " on rank ", rank, " was called while another thread is inside ",
                        g_.call_.load(std::memory_order_relaxed),
                        " of the same GradientSync: a sync is used from one thread at a time (two syncs may run in "
                        "two threads, with MPI_THREAD_MULTIPLE)"));
      }
    }
    ~Scope() {
      if (owns_) g_.owner_.store(std::thread::id(), std::memory_order_release);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OneThread& g_;
    bool owns_ = false;
  };

 private:
  std::atomic<std::thread::id> owner_{};
  std::atomic<const char*> call_{"a call"};
};

}  // namespace gradsync::impl
