// Helpers of the CUDA tests: device selection agreed across ranks, and device arrays filled from and
// read back to host vectors (plain cudaMemcpy: the tests need no kernels of their own).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradsync_test {

struct GpuSetup {
  int devices = 0;       // CUDA devices every rank sees (0 on a machine without a GPU or driver)
  bool nccl_ok = false;  // one device per rank on every node: NCCL refuses two ranks on one device
  std::string why;       // why there are none, for the skip message
};

// Picks device (node-local rank % devices) once; every rank gets the same answer.
inline const GpuSetup& gpu_setup() {
  static const GpuSetup g = [] {
    GpuSetup s;
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      count = 0;
      s.why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
      cudaGetLastError();
    } else if (count == 0) {
      s.why = "no CUDA device";
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local_rank = 0, local_size = 1;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    if (count > 0) cudaSetDevice(local_rank % count);
    int min_count = count;
    MPI_Allreduce(MPI_IN_PLACE, &min_count, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int distinct = count >= local_size ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &distinct, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    s.devices = min_count;
    s.nccl_ok = min_count > 0 && distinct == 1;
    if (min_count > 0 && !s.nccl_ok) s.why = "fewer CUDA devices than ranks on a node (NCCL needs one each)";
    return s;
  }();
  return g;
}

inline void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// n values of T in device memory.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n) cuda_ok(cudaMalloc(&p_, n * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) { upload(v); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray& operator=(DeviceArray&&) = delete;

  T* data() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    if (n_) cuda_ok(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    // A pageable upload may still be in flight on return: make it visible to non-blocking streams.
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_) cuda_ok(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace gradsync_test
