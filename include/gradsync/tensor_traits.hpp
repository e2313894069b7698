// gradsync: how to reach a gradient's data, size, value type and memory space.
//
// Supported out of the box: Kokkos Views of any rank with a contiguous layout, std::vector<T>,
// and gradsync::Span<T, MemorySpace> (a pointer and a size, e.g. device memory owned elsewhere).
// Specialise TensorTraits for other types.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "config.hpp"

namespace gradsync {

/// A contiguous run of `size` values of type T in MemorySpace, owned elsewhere.
template <class T, class MemorySpace = Kokkos::HostSpace>
struct Span {
  using value_type = T;
  using memory_space = MemorySpace;
  T* ptr = nullptr;
  std::size_t count = 0;

  constexpr Span() = default;
  constexpr Span(T* p, std::size_t n) : ptr(p), count(n) {}
  constexpr T* data() const { return ptr; }
  constexpr std::size_t size() const { return count; }
};

/// Primary template: not a tensor. `is_tensor_v` is false for it.
template <class T, class Enable = void>
struct TensorTraits {
  static constexpr bool is_tensor = false;
};

template <class T>
inline constexpr bool is_tensor_v = TensorTraits<T>::is_tensor;

/// Kokkos::View of any rank. Contiguity is checked at run time: a LayoutStride view may still
/// cover a contiguous span, and a subview of a LayoutRight view may not.
template <class V>
struct TensorTraits<V, std::enable_if_t<Kokkos::is_view<V>::value>> {
  static constexpr bool is_tensor = true;
  using value_type = typename V::non_const_value_type;
  using memory_space = typename V::memory_space;
  using execution_space = typename V::execution_space;
  static constexpr bool is_writable = !std::is_const<typename V::value_type>::value;
  static value_type* data(const V& v) { return const_cast<value_type*>(v.data()); }
  static std::size_t size(const V& v) { return v.size(); }
  static bool is_contiguous(const V& v) { return v.size() == 0 || (v.span_is_contiguous() && v.span() == v.size()); }
};

template <class T, class A>
struct TensorTraits<std::vector<T, A>> {
  static constexpr bool is_tensor = true;
  static constexpr bool owns_values = true;  // registered by reference: never a temporary
  using value_type = T;
  using memory_space = Kokkos::HostSpace;
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  static constexpr bool is_writable = true;
  static value_type* data(const std::vector<T, A>& v) { return const_cast<T*>(v.data()); }
  static std::size_t size(const std::vector<T, A>& v) { return v.size(); }
  static bool is_contiguous(const std::vector<T, A>&) { return true; }
};

template <class T, class M>
struct TensorTraits<Span<T, M>> {
  static constexpr bool is_tensor = true;
  using value_type = std::remove_const_t<T>;
  using memory_space = M;
  using execution_space = typename M::execution_space;
  static constexpr bool is_writable = !std::is_const<T>::value;
  static value_type* data(const Span<T, M>& s) { return const_cast<value_type*>(s.data()); }
  static std::size_t size(const Span<T, M>& s) { return s.size(); }
  static bool is_contiguous(const Span<T, M>&) { return true; }
};

namespace impl {
/// Whether a tensor type holds its values itself (a container: std::vector) rather than referring
/// to them (a handle: a View, a Span, a torch::Tensor). Registrations keep a pointer into a
/// container, so they refuse a temporary one at compile time. A TensorTraits specialisation of
/// another container says so with `static constexpr bool owns_values = true;`.
template <class T, class = void>
struct owns_values : std::false_type {};
template <class T>
struct owns_values<T, std::void_t<decltype(TensorTraits<T>::owns_values)>>
    : std::bool_constant<TensorTraits<T>::owns_values> {};
template <class T>
inline constexpr bool owns_values_v = owns_values<T>::value;

template <class T>
inline constexpr bool dependent_false_v = false;  // a static_assert that fires only when instantiated

/// Whether [a, a+na) and [b, b+nb) share an element; empty ranges overlap nothing.
template <class T>
constexpr bool overlaps(const T* a, std::size_t na, const T* b, std::size_t nb) {
  return na > 0 && nb > 0 && a < b + nb && b < a + na;
}
}  // namespace impl

/// The value types gradsync reduces: those with a built-in MPI and NCCL sum.
template <class T>
inline constexpr bool is_supported_value_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

}  // namespace gradsync
