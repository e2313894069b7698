// gradsync: LibTorch tensors as gradients, and every parameter of a torch::nn::Module in one call.
//
// Optional: include it (it is not in gradsync.hpp) and link GradSync::torch, which brings LibTorch:
//   find_package(GradSync CONFIG REQUIRED COMPONENTS torch)
//   target_link_libraries(app PRIVATE GradSync::torch)
//
//   gradsync::GradientSync<gradsync::MpiBackend, torch::Tensor> sync(gradsync::MpiBackend(comm));
//   sync.add<Dense>(layer->weight.mutable_grad(), "layer.weight");        // float tensors
//   gradsync::GradientSync<gradsync::MpiBackend, gradsync::TorchTensor<double>> sync64(...);
//   sync64.add<Dense>(gradsync::TorchTensor<double>(t));                   // double tensors
//   gradsync::TorchParameters reg = gradsync::add_parameters<Trunk, Head>(sync, *net,
//       [](const std::string& name) { return name.rfind("head.", 0) == 0; });  // true: Head
//   ... loss.backward(); reg.check(); if (sync.synchronize()) optimizer.step();
//
// A torch::Tensor's value type is a run-time property, a GradientSync's a compile-time one:
// torch::Tensor stands for a float tensor, TorchTensor<T> for a T tensor. Only contiguous CPU
// tensors of that type are accepted; anything else is a gradsync::Error naming the tensor. (CUDA
// tensors are refused for now: see docs/TORCH.md.) gradsync reduces the tensors' memory in place,
// so a gradient must keep its storage while registered: zero it in place (optimizer.zero_grad(),
// module.zero_grad(false)), never set it to None. TorchParameters::check() tells.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "error.hpp"
#include "gradient_sync.hpp"
#include "tensor_traits.hpp"

namespace gradsync {

/// A LibTorch tensor of value type T (float or double). torch::Tensor itself stands for float.
template <class T>
struct TorchTensor {
  static_assert(is_supported_value_v<T>, "gradsync::TorchTensor<T>: T must be float or double");
  at::Tensor tensor;  ///< The tensor (a handle: copies share its storage).
  TorchTensor() = default;
  /// Wraps `t`; its type and device are checked when it is registered. Allocates nothing.
  explicit TorchTensor(at::Tensor t) : tensor(std::move(t)) {}
};

namespace impl {
template <class T>
constexpr at::ScalarType torch_scalar_type() {
  return std::is_same_v<T, float> ? at::kFloat : at::kDouble;
}

inline std::string torch_describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::string s = cat(t.scalar_type(), " tensor of shape [");
  for (std::size_t i = 0; i < std::size_t(t.dim()); ++i) s += cat(i ? ", " : "", t.size(int64_t(i)));
  return cat(s, "] on ", t.device());
}

// The one place a torch tensor becomes a pointer: everything gradsync cannot reduce in place is refused.
template <class T>
T* torch_data(const at::Tensor& t) {
  if (!t.defined())
    throw Error(
        "a LibTorch gradient is undefined (no backward pass yet, or set to None): give it storage first, "
        "e.g. p.mutable_grad() = torch::zeros_like(p)");
  if (t.scalar_type() != torch_scalar_type<T>())
    throw Error(cat("a LibTorch gradient is a ", torch_describe(t), ", this GradientSync reduces ",
                    std::is_same_v<T, float> ? "float (torch::Tensor)" : "double (gradsync::TorchTensor<double>)",
                    ": use a sync of its type"));
  if (!t.device().is_cpu())
    throw Error(cat("a LibTorch gradient is a ", torch_describe(t), ": only CPU tensors are supported"));
  if (t.is_sparse() || t.is_quantized() || t.is_complex())
    throw Error(cat("a LibTorch gradient is a ", torch_describe(t), ": only dense real tensors are supported"));
  return const_cast<T*>(t.template data_ptr<T>());
}
}  // namespace impl

/// torch::Tensor (at::Tensor): a float tensor.
template <>
struct TensorTraits<at::Tensor> {
  static constexpr bool is_tensor = true;                     ///< A tensor.
  using value_type = float;                                   ///< float only.
  using memory_space = Kokkos::HostSpace;                     ///< CPU tensors only.
  using execution_space = Kokkos::DefaultHostExecutionSpace;  ///< Kernels run on the host.
  static constexpr bool is_writable = true;                   ///< Always writable.
  /// The values; an Error for an undefined, non-float, non-CPU, sparse or complex tensor.
  static float* data(const at::Tensor& t) { return impl::torch_data<float>(t); }
  /// The number of values (0 when undefined).
  static std::size_t size(const at::Tensor& t) { return t.defined() ? std::size_t(t.numel()) : 0; }
  /// at::Tensor::is_contiguous().
  static bool is_contiguous(const at::Tensor& t) { return t.is_contiguous(); }
};

/// TorchTensor<T>: a T tensor, checked as torch::Tensor is.
template <class T>
struct TensorTraits<TorchTensor<T>> {
  static constexpr bool is_tensor = true;                     ///< A tensor.
  using value_type = T;                                       ///< float or double.
  using memory_space = Kokkos::HostSpace;                     ///< CPU tensors only.
  using execution_space = Kokkos::DefaultHostExecutionSpace;  ///< Kernels run on the host.
  static constexpr bool is_writable = true;                   ///< Always writable.
  /// The values; an Error for an undefined tensor, another dtype or device, sparse or complex.
  static T* data(const TorchTensor<T>& t) { return impl::torch_data<T>(t.tensor); }
  /// The number of values (0 when undefined).
  static std::size_t size(const TorchTensor<T>& t) { return t.tensor.defined() ? std::size_t(t.tensor.numel()) : 0; }
  /// at::Tensor::is_contiguous().
  static bool is_contiguous(const TorchTensor<T>& t) { return t.tensor.is_contiguous(); }
};

/// What add_parameters registered: the parameters, their gradients' storage at registration, and
/// which group took each. check() throws if a gradient lost or changed its storage since.
class TorchParameters {
 public:
  /// One registered parameter.
  struct Entry {
    std::string name;                 ///< its name in named_parameters()
    at::Tensor parameter;             ///< the parameter (a handle)
    const void* grad_data = nullptr;  ///< its gradient's storage when registered
    /// whether it went to the local group
    bool local = false;
  };
  /// The registered parameters, in named_parameters() order. Local.
  const std::vector<Entry>& entries() const { return entries_; }
  /// How many were registered. Local.
  std::size_t size() const { return entries_.size(); }
  /// How many of them went to the local group. Local.
  std::size_t local_count() const {
    std::size_t n = 0;
    for (const Entry& e : entries_) n += e.local ? 1 : 0;
    return n;
  }

  /// Cheap (a pointer compare per parameter): call it before synchronize() when unsure. Local;
  /// allocates nothing.
  void check() const {
    for (const Entry& e : entries_) {
      const at::Tensor& g = e.parameter.grad();
      if (!g.defined() || g.data_ptr() != e.grad_data)
        throw Error(impl::cat("the gradient of parameter '", e.name, "' ",
                              g.defined() ? "was reallocated" : "was set to None",
                              " after add_parameters registered it: zero gradients in place (optimizer.zero_grad(), "
                              "module.zero_grad(false)), or register again"));
    }
  }

 private:
  template <class, class, class B, class Tn, class P>
  friend TorchParameters add_parameters(GradientSync<B, Tn>&, const torch::nn::Module&, P&&);
  std::vector<Entry> entries_;
};

namespace impl {
template <class Tensor>
struct torch_sync_value;
template <>
struct torch_sync_value<at::Tensor> {
  using type = float;
  static at::Tensor wrap(const at::Tensor& t) { return t; }
};
template <class T>
struct torch_sync_value<TorchTensor<T>> {
  using type = T;
  static TorchTensor<T> wrap(const at::Tensor& t) { return TorchTensor<T>(t); }
};
}  // namespace impl

/// Registers every parameter of `module` (recursively, in named_parameters() order) that requires
/// a gradient: in `LocalGroup` when is_local(name) is true, else in `SharedGroup`. A gradient not yet
/// allocated is allocated (zeros) here, so registration may precede the first backward pass. Each
/// tensor is registered under its parameter name. Parameters of another dtype than the sync's, or
/// not on the CPU, are an Error naming the parameter. Local, like GradientSync::add: between steps
/// only; allocates the missing gradients and the returned list.
template <class SharedGroup, class LocalGroup, class Backend, class Tensor, class Pred>
TorchParameters add_parameters(GradientSync<Backend, Tensor>& sync, const torch::nn::Module& module, Pred&& is_local) {
  using W = impl::torch_sync_value<Tensor>;
  static_assert(std::is_invocable_r_v<bool, Pred&, const std::string&>,
                "gradsync::add_parameters: is_local must be callable as bool(const std::string& parameter_name)");
  TorchParameters reg;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor p = item.value();
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
    const at::Tensor& g = p.grad();
    const bool local = is_local(name);
    try {
      if (local)
        sync.template add<LocalGroup>(W::wrap(g), name);
      else
        sync.template add<SharedGroup>(W::wrap(g), name);
    } catch (const Error& e) {
      // the traits do not know the name: say which parameter
      const std::string what = e.what();
      if (what.find("'" + name + "'") != std::string::npos) throw;
      throw Error(impl::cat("parameter '", name, "' (", local ? "local" : "shared", " group ",
                            local ? impl::type_name<LocalGroup>() : impl::type_name<SharedGroup>(),
                            "): ", what.substr(what.find(": ") + 2)));
    }
    reg.entries_.push_back({name, p, g.data_ptr(), local});
  }
  return reg;
}

/// Every parameter in one group (as above: local, between steps only).
template <class Group, class Backend, class Tensor>
TorchParameters add_parameters(GradientSync<Backend, Tensor>& sync, const torch::nn::Module& module) {
  return add_parameters<Group, Group>(sync, module, [](const std::string&) { return false; });
}

}  // namespace gradsync
