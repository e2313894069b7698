// gradsync: gradients carved from one allocation.
//
// Why: GradientSync reduces gradients that are neighbours in memory as one region, in place, in
// pieces of fusion_threshold_bytes: no copy through the fusion buffer and few, large messages.
// One allocation per tensor makes every tensor of 64 KiB and more a message of its own instead,
// and on 4 KiB pages a slower one (Options::tuning.huge_pages moves them onto huge pages, which needs
// Linux 6.1; docs/BENCHMARKS.md has the measurements). The arena's pages are huge from the start on
// any kernel with THP.
// PyTorch DDP's gradient_as_bucket_view makes the same trade. Carve the gradients in the order
// they are registered (or its reverse): consecutive carves are neighbours.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "config.hpp"
#include "error.hpp"
#include "impl/huge_pages.hpp"

namespace gradsync {

/// An arena of values of type T in a Kokkos::View<T*, Properties...> (so the default device's
/// memory unless Properties name another space, as for any View). Rank-local: nothing in it
/// communicates, and it allocates only in its constructor.
template <class T, class... Properties>
class GradientArena {
 public:
  using storage_type = Kokkos::View<T*, Properties...>;      ///< The one allocation's View type.
  using value_type = T;                                      ///< The values' type.
  using memory_space = typename storage_type::memory_space;  ///< Where the arena lives.

  GradientArena() = default;

  /// One zero-filled allocation of `capacity` values, labelled `label` (Kokkos tools, errors).
  /// In host memory, an arena of 2 MiB or more starts on a 2 MiB boundary and asks for transparent
  /// huge pages (`huge_pages`), which make MPI's shared-memory copies cheaper. Local; the arena's
  /// only allocation.
  GradientArena(const std::string& label, std::size_t capacity, bool huge_pages = true) {
    if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace>) {
      if (huge_pages && capacity * sizeof(T) >= impl::huge_page_bytes) {
        storage_ = impl::allocate_on_huge_pages<storage_type>(label, capacity);
        Kokkos::deep_copy(storage_, T(0));
        return;
      }
    }
    storage_ = storage_type(label, capacity);
  }

  /// The next `n` values, as a View that shares ownership of the allocation. An Error when fewer
  /// are left. Allocates nothing.
  storage_type carve(std::size_t n) {
    const std::size_t at = take(n);
    return Kokkos::subview(storage_, std::make_pair(at, at + n));
  }

  /// The next values, as many as the extents hold, viewed as `View` of any rank (for example
  /// Kokkos::View<float**> with extents rows, cols). The result does not own its memory: the
  /// arena must outlive it. An Error when fewer values are left. Allocates nothing.
  template <class View, class... Extents>
  View carve_as(Extents... extents) {
    static_assert(Kokkos::is_view<View>::value, "gradsync::GradientArena::carve_as: View must be a Kokkos::View");
    static_assert(std::is_same_v<typename View::non_const_value_type, T>,
                  "gradsync::GradientArena::carve_as: the View's value type must be the arena's");
    static_assert(std::is_same_v<typename View::memory_space, memory_space>,
                  "gradsync::GradientArena::carve_as: the View's memory space must be the arena's");
    static_assert(sizeof...(Extents) == std::size_t(View::rank_dynamic),
                  "gradsync::GradientArena::carve_as: give one extent per dynamic dimension of View");
    std::size_t n = 1;
    ((n *= std::size_t(extents)), ...);
    return View(storage_.data() + take(n), std::size_t(extents)...);
  }

  std::size_t capacity() const { return storage_.size(); }  ///< Values in the allocation.
  std::size_t used() const { return used_; }                ///< Values carved so far.
  /// The whole allocation: every gradient at once (to zero them in one kernel, for example).
  const storage_type& storage() const { return storage_; }

 private:
  std::size_t take(std::size_t n) {
    if (n > capacity() - used_)
      throw Error(impl::cat("gradient arena '", storage_.label(), "': ", n, " values asked for, ", capacity() - used_,
                            " of ", capacity(), " left"));
    used_ += n;
    return used_ - n;
  }

  storage_type storage_;
  std::size_t used_ = 0;
};

}  // namespace gradsync
