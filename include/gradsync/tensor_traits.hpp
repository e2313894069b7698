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
  using value_type = T;              ///< The values' type (const for a read-only span).
  using memory_space = MemorySpace;  ///< Where the values live.
  T* ptr = nullptr;                  ///< The first value.
  std::size_t count = 0;             ///< The number of values.

  constexpr Span() = default;
  /// The `n` values at `p`; the caller keeps them alive as long as the span is used.
  constexpr Span(T* p, std::size_t n) : ptr(p), count(n) {}
  constexpr T* data() const { return ptr; }             ///< The first value.
  constexpr std::size_t size() const { return count; }  ///< The number of values.
};

/// How gradsync reaches a tensor type's values. The primary template: not a tensor. A
/// specialisation has is_tensor = true, value_type, memory_space, execution_space, is_writable, and
/// static data(t), size(t) and is_contiguous(t); a container type (registered by reference) also
/// has owns_values = true.
template <class T, class Enable = void>
struct TensorTraits {
  static constexpr bool is_tensor = false;  ///< Not a tensor gradsync knows.
};

/// Whether gradsync knows T as a tensor (a TensorTraits specialisation).
template <class T>
inline constexpr bool is_tensor_v = TensorTraits<T>::is_tensor;

/// Kokkos::View of any rank. Contiguity is checked at run time: a LayoutStride view may still
/// cover a contiguous span, and a subview of a LayoutRight view may not.
template <class V>
struct TensorTraits<V, std::enable_if_t<Kokkos::is_view<V>::value>> {
  static constexpr bool is_tensor = true;               ///< A tensor.
  using value_type = typename V::non_const_value_type;  ///< The View's value type, without const.
  using memory_space = typename V::memory_space;        ///< The View's memory space.
  using execution_space = typename V::execution_space;  ///< The View's execution space.
  /// False for a View of const values.
  static constexpr bool is_writable = !std::is_const<typename V::value_type>::value;
  /// The View's first value.
  static value_type* data(const V& v) { return const_cast<value_type*>(v.data()); }
  /// The View's number of values (all ranks).
  static std::size_t size(const V& v) { return v.size(); }
  /// Whether its values fill [data, data + size) without gaps.
  static bool is_contiguous(const V& v) { return v.size() == 0 || (v.span_is_contiguous() && v.span() == v.size()); }
};

/// std::vector in host memory: registered by reference (a sync re-reads its data and size), so
/// never as a temporary.
template <class T, class A>
struct TensorTraits<std::vector<T, A>> {
  static constexpr bool is_tensor = true;                     ///< A tensor.
  static constexpr bool owns_values = true;                   ///< A container: never a temporary.
  using value_type = T;                                       ///< The element type.
  using memory_space = Kokkos::HostSpace;                     ///< Host memory.
  using execution_space = Kokkos::DefaultHostExecutionSpace;  ///< Kernels on it run on the host.
  static constexpr bool is_writable = true;                   ///< Always writable.
  /// The first value.
  static value_type* data(const std::vector<T, A>& v) { return const_cast<T*>(v.data()); }
  /// The number of values.
  static std::size_t size(const std::vector<T, A>& v) { return v.size(); }
  /// Always contiguous.
  static bool is_contiguous(const std::vector<T, A>&) { return true; }
};

/// Span<T, M>: a pointer and a size in M; writable unless T is const.
template <class T, class M>
struct TensorTraits<Span<T, M>> {
  static constexpr bool is_tensor = true;                        ///< A tensor.
  using value_type = std::remove_const_t<T>;                     ///< T without const.
  using memory_space = M;                                        ///< The span's memory space.
  using execution_space = typename M::execution_space;           ///< M's execution space.
  static constexpr bool is_writable = !std::is_const<T>::value;  ///< False for a span of const values.
  /// The first value.
  static value_type* data(const Span<T, M>& s) { return const_cast<value_type*>(s.data()); }
  /// The number of values.
  static std::size_t size(const Span<T, M>& s) { return s.size(); }
  /// Always contiguous.
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
