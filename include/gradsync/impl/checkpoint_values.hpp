// gradsync internals: a dataset's values as a checkpoint file holds them.
//
// Save and load see a dataset the same way: its HDF5 type, its values on the host (the memory
// itself, or a copy of device memory), and a row shard's checksum, which sums per-row checksums so
// that a table split into any shards sums to the same value.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "checkpoint_catalog.hpp"
#include "hash.hpp"

namespace gradsync::impl {

// A row-sharded dataset's checksum: the sum over its rows of each row's checksum, seeded by the
// FNV-1a of the row's number, so that any split into shards sums to the same value.
inline std::uint64_t rows_checksum(const void* p, std::uint64_t first_row, std::uint64_t rows, std::size_t row_bytes) {
  std::uint64_t sum = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t at = first_row + r;
    sum += checksum_words(static_cast<const char*>(p) + r * row_bytes, row_bytes, fnv1a(&at, sizeof at));
  }
  return sum;
}

inline hid_t h5_type(CkptType t) {
  return t == CkptType::f64 ? H5T_NATIVE_DOUBLE : t == CkptType::f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64;
}

// A dataset's values on the host: the memory itself when the host can read it, else a copy.
struct HostValues {
  std::vector<char> copy;
  const void* p = nullptr;
  explicit HostValues(const CkptData& d) {
    if (d.host) {
      p = d.host;
    } else {
      copy.resize(std::size_t(d.count) * ckpt_type_size(d.type));
      d.get(copy.data());
      p = copy.data();
    }
  }
};

}  // namespace gradsync::impl
