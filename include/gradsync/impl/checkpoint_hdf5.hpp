// gradsync internals: the few HDF5 pieces checkpoint.hpp uses, with their errors made values.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradsync::impl {

// An HDF5 identifier closed by its own H5?close at scope exit.
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    reset();
    id_ = std::exchange(o.id_, H5I_INVALID_HID);
    close_ = o.close_;
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now; false when HDF5 refused (a collective close that failed). The identifier is not
  // tried again: HDF5 1.10 frees a file whose H5Fclose failed yet keeps its identifier, and a second
  // close (or the library's shutdown in MPI_Finalize) then crashes on the freed memory. What keeps
  // a checkpoint's close from failing is the order of its writes (impl::save_job).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && close_) ok = close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5 prints its error stack by default; gradsync reports its own errors instead.
class H5Quiet {
 public:
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5Quiet(const H5Quiet&) = delete;
  H5Quiet& operator=(const H5Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5 link names cannot hold '/', and "." is the group itself: those and '%' are escaped.
inline std::string h5_escape(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '/')
      out += "%2F";
    else if (c == '%')
      out += "%25";
    else
      out += c;
  }
  if (out == "." || out.empty()) out = "%2E" + out.substr(out.empty() ? 0 : 1);
  return out;
}

template <class T>
hid_t h5_native() {
  if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return H5T_NATIVE_UINT64;
  if constexpr (std::is_same_v<T, int>) return H5T_NATIVE_INT;
}

// Attributes: written collectively (every rank the same value), read by one rank.
inline bool h5_write_attr_string(hid_t obj, const char* key, const std::string& v) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.ok() || H5Tset_size(type.get(), v.empty() ? 1 : v.size()) < 0) return false;
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, key, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string buf = v.empty() ? std::string(1, '\0') : v;
  return a.ok() && H5Awrite(a.get(), type.get(), buf.data()) >= 0;
}
template <class T>
bool h5_write_attr(hid_t obj, const char* key, T v) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, key, h5_native<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Awrite(a.get(), h5_native<T>(), &v) >= 0;
}
// Sets an existing attribute in place (collectively, as it was written): its space is already the file's.
template <class T>
bool h5_update_attr(hid_t obj, const char* key, T v) {
  H5Handle a(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Awrite(a.get(), h5_native<T>(), &v) >= 0;
}
// False when the attribute is missing or is no string.
inline bool h5_read_attr_string(hid_t obj, const char* key, std::string& out) {
  if (H5Aexists(obj, key) <= 0) return false;
  H5Handle a(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return false;
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) return false;
  const std::size_t n = H5Tget_size(type.get());
  std::vector<char> buf(n + 1, '\0');
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tset_size(mem.get(), n) < 0 || H5Aread(a.get(), mem.get(), buf.data()) < 0) return false;
  out.assign(buf.data(), std::strlen(buf.data()));
  return true;
}
template <class T>
bool h5_read_attr(hid_t obj, const char* key, T& out) {
  if (H5Aexists(obj, key) <= 0) return false;
  H5Handle a(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Aread(a.get(), h5_native<T>(), &out) >= 0;
}

// The number of links in the group at `path` of `file`; -1 when there is no such group.
inline long long h5_group_size(hid_t file, const char* path) {
  if (H5Lexists(file, path, H5P_DEFAULT) <= 0) return -1;
  H5Handle g(H5Gopen2(file, path, H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  if (!g.ok() || H5Gget_info(g.get(), &info) < 0) return -1;
  return static_cast<long long>(info.nlinks);
}

// A 1-D selection [first, first + count) of a dataset's file space, and the matching memory space.
struct H5Slab {
  H5Handle file, mem;
  H5Slab(hid_t dataset, hsize_t first, hsize_t count)
      : file(H5Dget_space(dataset), H5Sclose), mem(H5Screate_simple(1, &count, nullptr), H5Sclose) {
    if (file.ok() && H5Sselect_hyperslab(file.get(), H5S_SELECT_SET, &first, nullptr, &count, nullptr) < 0)
      file.reset();
  }
  bool ok() const { return file.ok() && mem.ok(); }
};

}  // namespace gradsync::impl
