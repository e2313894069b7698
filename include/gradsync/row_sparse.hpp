// gradsync: row-sparse gradients, the rows of a large table that one step touched.
//
//   Kokkos::View<float**> rows("rows", capacity, dim);     // up to `capacity` rows of the gradient
//   Kokkos::View<int*> ids("ids", capacity);               // their row numbers in the table
//   gradsync::RowSparse g(rows, ids, table_rows);          // a table of table_rows x dim
//   sync.add<Tables>(g);                                   // any group, local or data-parallel
//   ... backward fills rows(0 .. k-1, :) and ids(0 .. k-1) ...
//   g.set_rows(k);                                         // this step's row count (a shared handle)
//   if (sync.synchronize()) { ... }                        // then g holds the synchronized rows
//
// The cost of a sync follows the rows touched, never the table's size:
// - local group: the group's factor (1/world_size) is applied to the k given rows only;
// - data-parallel group: the rows of every rank are summed (rows several ranks hold are added,
//   in rank order) and scaled as a dense gradient would be (op, prescale, postscale); g then holds
//   the union of the ranks' rows, ascending, without duplicates, and its row count. Per step and
//   tensor, the ranks exchange their row counts (one small allgather for all row-sparse tensors)
//   and all pick the cheaper exchange: an allgather of row numbers and rows (Horovod's
//   IndexedSlices, DDP's sparse gradients), or, when the rows cover much of the table, an
//   allreduce of the densified table with a count column that marks the rows in the union.
// Row-sparse gradients are exchanged after the fused dense chunks, in registration order, with
// collectives of their own, waited under the stall watchdog (impl::Watched: the backend's
// nonblocking forms; blocking only on a backend that has none). The capacity must hold the union (at
// most the sum of every rank's rows, and the table's rows): every rank checks every rank's capacity
// and row numbers from the counts exchange and throws the same error, naming the tensor and the
// ranks at fault.
// global_norm and clip_grad_norm count and scale the rows() rows a gradient holds after the sync (a
// local one's as given: a row number given twice counts as two rows, not as their sum).
// Limits: backward_passes_per_step must be 1.
//
// This file holds the public type; the exchange lives in impl/row_sparse_set.hpp (the protocol),
// impl/row_sparse_erasure.hpp (the View types erased) and impl/row_sparse_kernels.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "impl/row_sparse_set.hpp"  // the exchange: its kernels, type erasure and protocol

namespace gradsync {

/// Rows of a table's gradient: `values` holds up to `capacity` rows of `row_width` values
/// ([capacity][width] LayoutRight, or capacity * width values), `indices` their row numbers in a
/// table of `table_rows` rows. Copies share the row count (set_rows), as Views share their data.
template <class ValuesView, class IndexView>
class RowSparse {
  static_assert(Kokkos::is_view<ValuesView>::value && Kokkos::is_view<IndexView>::value,
                "gradsync::RowSparse<ValuesView, IndexView>: values and indices must be Kokkos::Views");
  static_assert(ValuesView::rank == 1 || ValuesView::rank == 2,
                "gradsync::RowSparse: values are [capacity][row width] (rank 2) or capacity * row width (rank 1)");
  static_assert(IndexView::rank == 1, "gradsync::RowSparse: indices are one row number per row (rank 1)");
  static_assert(std::is_integral_v<typename IndexView::non_const_value_type>,
                "gradsync::RowSparse: row numbers must be integers");
  static_assert(std::is_same_v<typename ValuesView::memory_space, typename IndexView::memory_space>,
                "gradsync::RowSparse: values and indices must live in the same memory space");
  static_assert(!std::is_const_v<typename ValuesView::value_type> && !std::is_const_v<typename IndexView::value_type>,
                "gradsync::RowSparse: values and indices must be writable (a data-parallel sync writes the summed "
                "rows back)");

 public:
  using values_view = ValuesView;                                ///< The rows' View type.
  using index_view = IndexView;                                  ///< The row numbers' View type.
  using value_type = typename ValuesView::non_const_value_type;  ///< The rows' value type.
  using index_type = typename IndexView::non_const_value_type;   ///< The row numbers' integer type.
  using memory_space = typename ValuesView::memory_space;        ///< Where values and indices live.
  using execution_space = typename ValuesView::execution_space;  ///< Where its kernels run.

  /// An empty handle, to assign to later.
  RowSparse() = default;

  /// Rows `values` numbered by `indices` in a table of `table_rows` rows, `rows` of them in use.
  /// An Error when the shapes disagree or a View is not contiguous. Local; allocates the shared
  /// row count only.
  RowSparse(ValuesView values, IndexView indices, std::int64_t table_rows, std::int64_t rows = 0)
      : values_(std::move(values)),
        indices_(std::move(indices)),
        table_rows_(table_rows),
        count_(std::make_shared<std::int64_t>(0)) {
    capacity_ = std::int64_t(indices_.extent(0));
    if constexpr (ValuesView::rank == 2) {
      width_ = std::int64_t(values_.extent(1));
      if (std::int64_t(values_.extent(0)) != capacity_)
        throw Error(impl::cat("RowSparse: values hold ", values_.extent(0), " rows but indices ", capacity_));
    } else {
      width_ = capacity_ > 0 ? std::int64_t(values_.size()) / capacity_ : 0;
      if (width_ * capacity_ != std::int64_t(values_.size()))
        throw Error(impl::cat("RowSparse: ", values_.size(), " values are not a whole number of rows for ", capacity_,
                              " indices"));
    }
    if (capacity_ < 1 || width_ < 1) throw Error("RowSparse: values and indices must hold at least one row");
    if (table_rows_ < 1) throw Error(impl::cat("RowSparse: the table must have at least one row, got ", table_rows_));
    const auto contiguous = [](const auto& v) { return v.span_is_contiguous() && v.span() == v.size(); };
    if (!contiguous(values_) || !contiguous(indices_))
      throw Error("RowSparse: values and indices must be contiguous Views");
    set_rows(rows);
  }

  /// Rows in use now (the first rows() of values and indices).
  std::int64_t rows() const { return count_ ? *count_ : 0; }
  /// This step's row count; shared by every copy (the sync keeps one). Local; set it before the
  /// step's synchronize() (a data-parallel sync then sets it to the union's count); allocates nothing.
  void set_rows(std::int64_t n) const {
    if (!count_)
      throw Error(impl::cat("RowSparse::set_rows(", n,
                            ") on an empty handle (default-constructed): assign it a RowSparse built from values "
                            "and indices first"));
    if (n < 0 || n > capacity_)
      throw Error(impl::cat("RowSparse::set_rows(", n, "): the capacity is ", capacity_, " rows"));
    *count_ = n;
  }
  std::int64_t capacity() const { return capacity_; }      ///< The most rows it holds.
  std::int64_t row_width() const { return width_; }        ///< Values per row.
  std::int64_t table_rows() const { return table_rows_; }  ///< Rows of the whole table.
  const ValuesView& values() const { return values_; }     ///< The rows' values.
  const IndexView& indices() const { return indices_; }    ///< The rows' numbers in the table.

 private:
  ValuesView values_;
  IndexView indices_;
  std::int64_t table_rows_ = 0, capacity_ = 0, width_ = 0;
  std::shared_ptr<std::int64_t> count_;
};

template <class T>
struct is_row_sparse : std::false_type {};
template <class V, class I>
struct is_row_sparse<RowSparse<V, I>> : std::true_type {};
/// Whether T is a RowSparse.
template <class T>
inline constexpr bool is_row_sparse_v = is_row_sparse<T>::value;

}  // namespace gradsync
