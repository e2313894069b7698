// gradsync: the public types of checkpoints: the format versions, CheckpointError, RowShard and
// CheckpointState, what a program hands save_checkpoint() and load_checkpoint() besides its model.
//
// Part of checkpoint.hpp, the header to include (it checks for parallel HDF5 first); kept apart
// so that the types a program builds read without the save and load machinery around them.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "error.hpp"
#include "impl/checkpoint_catalog.hpp"

namespace gradsync {

/// The layout version save_checkpoint() writes. load_checkpoint() reads it and every older one
/// down to checkpoint_oldest_format_version (1: no row-sharded tables, no process-set replicas).
inline constexpr int checkpoint_format_version = 2;
/// The oldest layout load_checkpoint() reads.
inline constexpr int checkpoint_oldest_format_version = 1;

/// A checkpoint that cannot be written or loaded: every rank of the sync throws it, with the same
/// message (the lowest failing rank's, naming the tensor, its group and that rank).
class CheckpointError : public Error {
 public:
  using Error::Error;  ///< Error's constructor.
};

/// Where a row shard of a table sits in the whole table: the checkpoint keys the table by name and
/// places each shard at its rows, so that shards saved by 4 ranks load into 2 or 3.
struct RowShard {
  std::uint64_t first_row = 0;    ///< the shard's first row in the whole table
  std::uint64_t global_rows = 0;  ///< the whole table's rows
  std::uint64_t row_length = 0;   ///< values per row; 0: the View's values per first index
};

namespace impl {
struct CheckpointStateAccess;
}

/// What a checkpoint holds besides (or instead of) a DistributedOptimizer's parameters: the
/// parameters of a program that updates them itself (a bare GradientSync), its own state (step
/// counters, a data cursor), and the row shards among the parameters. It keeps copies of the Views
/// (their memory stays alive) and the addresses of scalars (which must outlive the save or load).
/// Every rank builds its own; the same calls in the same order on every rank for the data-parallel
/// and replicated entries.
class CheckpointState {
 public:
  /// A parameter whose gradient the sync holds under `name`: data-parallel, local or replicated over
  /// a process set (ReduceOver), as that gradient's group says; the sizes must match.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& parameter(const View& v, std::string name) {
    params_.push_back(Param{false, RowShard{}, view_data("param", v, name)});
    return *this;
  }
  /// The same for a row shard of a table (its gradient is local or a process set's): its rows are
  /// [shard.first_row, shard.first_row + rows) of a table of shard.global_rows rows.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& parameter(const View& v, std::string name, RowShard shard) {
    if (shard.row_length == 0) shard.row_length = row_length_of(v);
    params_.push_back(Param{true, shard, view_data("param", v, name)});
    return *this;
  }
  /// Program state alike on every rank (a step counter, a learning-rate schedule's position):
  /// written once, read by every rank. The same entries on every rank.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& replicated(const View& v, std::string name) {
    return user(impl::CkptKind::data_parallel, view_data("value", v, name));
  }
  /// A scalar alike on every rank (double, float or std::int64_t), read back into it.
  template <class T, class = std::enable_if_t<impl::is_ckpt_value_v<T>>>
  CheckpointState& replicated(T& x, std::string name) {
    return user(impl::CkptKind::data_parallel, scalar_data(x, std::move(name)));
  }
  /// Program state of this rank alone, under a name unique across ranks; at load it goes to
  /// whichever rank declares that name.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  CheckpointState& local(const View& v, std::string name) {
    return user(impl::CkptKind::local, view_data("value", v, name));
  }
  /// A scalar of this rank alone.
  template <class T, class = std::enable_if_t<impl::is_ckpt_value_v<T>>>
  CheckpointState& local(T& x, std::string name) {
    return user(impl::CkptKind::local, scalar_data(x, std::move(name)));
  }
  /// For a DistributedOptimizer: its parameter `name` (local or a process set's) is a row shard of
  /// a table; its optimizer state is sharded alike (the step counters are the table's).
  CheckpointState& shard(std::string name, RowShard shard) {
    shards_[std::move(name)] = shard;
    return *this;
  }

 private:
  friend struct impl::CheckpointStateAccess;
  struct Param {
    bool sharded = false;
    RowShard shard;
    impl::CkptData data;  // its name is the parameter's until the item is built
  };

  template <class View>
  static std::uint64_t row_length_of(const View& v) {
    return v.extent(0) == 0 ? 1 : std::uint64_t(v.size() / v.extent(0));
  }
  template <class View>
  static impl::CkptData view_data(const char* dataset, const View& v, const std::string& name) {
    using T = typename View::non_const_value_type;
    static_assert(impl::is_ckpt_value_v<T>, "gradsync::CheckpointState: Views of double, float or std::int64_t");
    if (!v.span_is_contiguous())
      throw ConfigError(impl::cat("CheckpointState: '", name,
                                  "' is a View that is not contiguous (a strided subview?): ",
                                  "checkpoints copy contiguous memory; register a contiguous View"));
    impl::CkptData d = impl::ckpt_data<T, typename View::memory_space>(dataset, v.data(), v.size(), false,
                                                                       std::make_shared<const View>(v));
    d.name = name;  // the entry's name until the item is built; then the dataset's
    return d;
  }
  template <class T>
  static impl::CkptData scalar_data(T& x, std::string name) {
    impl::CkptData d = impl::ckpt_data<T, Kokkos::HostSpace>("value", &x, 1);
    d.name = std::move(name);
    return d;
  }
  CheckpointState& user(impl::CkptKind kind, impl::CkptData d) {
    impl::CkptItem it;
    it.name = std::move(d.name);
    it.group = "user";
    it.kind = kind;
    d.name = "value";
    it.data.push_back(std::move(d));
    user_.push_back(std::move(it));
    return *this;
  }

  std::vector<Param> params_;
  std::vector<impl::CkptItem> user_;
  std::map<std::string, RowShard> shards_;
};

}  // namespace gradsync
