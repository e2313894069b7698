// gradsync internals: one registered row-sparse gradient, its View types erased.
//
// A sync holds row-sparse gradients of many RowSparse<ValuesView, IndexView> types in one list; the
// exchange (impl/row_sparse_set.hpp) needs only their value type and memory space. So each is kept
// behind SparseTensorBase, whose few virtual calls launch the kernels that must see the real index
// type (impl/row_sparse_kernels.hpp); everything else reads its plain fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../config.hpp"
#include "../process_set.hpp"  // SetScale
#include "fusion_kernels.hpp"  // step_range
#include "row_sparse_kernels.hpp"
#include "sample_weights.hpp"

namespace gradsync::impl {

// One registered row-sparse gradient, its View types erased.
template <class T, class MemorySpace, class ExecutionSpace>
struct SparseTensorBase {
  using I64 = Kokkos::View<std::int64_t*, MemorySpace>;
  using Vals = Kokkos::View<T*, MemorySpace>;
  virtual ~SparseTensorBase() = default;
  std::string group, name;
  std::size_t index_in_group = 0;
  bool named = false, local = false;
  T local_factor = T(1);
  SampleWeighting weighting = SampleWeighting::none;  // set_samples(): its group's weights
  std::string set_tag;                                // reduced over this process set (ReduceOver), else empty
  SetScale set_scale = SetScale::world_size;
  std::int64_t capacity = 0, width = 0, table_rows = 0;

  virtual std::int64_t rows() const = 0;
  virtual void set_rows(std::int64_t n) const = 0;
  virtual T* values() const = 0;
  virtual void count_bad(const ExecutionSpace& exec, std::int64_t* bad) const = 0;
  virtual void read_indices(const ExecutionSpace& exec, const I64& dst, std::int64_t pad) const = 0;
  virtual void write_merged(const ExecutionSpace& exec, const I64& uniq, const I64& begin, const I64& src,
                            const Vals& recv, std::int64_t u, T f) const = 0;
  virtual void write_compacted(const ExecutionSpace& exec, const Vals& dense, T f, std::int64_t* total) const = 0;
};

template <class RS, class ExecutionSpace>
struct SparseTensor final : SparseTensorBase<typename RS::value_type, typename RS::memory_space, ExecutionSpace> {
  using T = typename RS::value_type;
  using I = typename RS::index_type;
  using Base = SparseTensorBase<T, typename RS::memory_space, ExecutionSpace>;
  using typename Base::I64;
  using typename Base::Vals;
  RS rs;

  explicit SparseTensor(const RS& r) : rs(r) {}
  std::int64_t rows() const override { return rs.rows(); }
  void set_rows(std::int64_t n) const override { rs.set_rows(n); }
  T* values() const override { return rs.values().data(); }
  I* idx() const { return rs.indices().data(); }

  void count_bad(const ExecutionSpace& exec, std::int64_t* bad) const override {
    if (rows() > 0)
      Kokkos::parallel_for(label_row_sparse_check(), step_range(exec, rows()),
                           SparseCountBad<I>{idx(), this->table_rows, bad});
  }
  void read_indices(const ExecutionSpace& exec, const I64& dst, std::int64_t pad) const override {
    if (pad > 0)
      Kokkos::parallel_for(label_row_sparse_indices(), step_range(exec, pad),
                           SparseReadIndices<I>{idx(), dst.data(), rows()});
  }
  void write_merged(const ExecutionSpace& exec, const I64& uniq, const I64& begin, const I64& src, const Vals& recv,
                    std::int64_t u, T f) const override {
    if (u > 0)
      Kokkos::parallel_for(
          label_row_sparse_merge(), step_range(exec, u * this->width),
          SparseMerge<T, I>{uniq.data(), begin.data(), src.data(), recv.data(), values(), idx(), this->width, f});
  }
  void write_compacted(const ExecutionSpace& exec, const Vals& dense, T f, std::int64_t* total) const override {
    Kokkos::parallel_scan(label_row_sparse_compact(), step_range(exec, this->table_rows),
                          SparseCompact<T, I>{dense.data(), values(), idx(), this->width, this->table_rows, f, total});
  }
};

}  // namespace gradsync::impl
