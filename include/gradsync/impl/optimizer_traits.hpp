// gradsync internals: the optional members of the optimizer interface (optimizers.hpp).
//
// DistributedOptimizer wraps any type with the optimizer interface; a few members are optional
// (a state visitor for broadcasts and checkpoints, a gradient factor, a step counter). These
// traits find them, so that the class asks one question per member instead of a SFINAE test each.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gradsync::impl {

// Detects the optional state visitor of the optimizer interface.
struct StateProbe {
  template <class T>
  void operator()(T*, std::size_t) const {}
};
template <class O, class = void>
struct has_state_visitor : std::false_type {};
template <class O>
struct has_state_visitor<
    O, std::void_t<decltype(std::declval<O&>().for_each_state(std::size_t(0), std::declval<StateProbe&>()))>>
    : std::true_type {};

// Whether the optimizer's add() takes S (gradsync::Span): a sharded DistributedOptimizer's slots are
// slices of parameters.
template <class O, class S, class = void>
struct adds_spans : std::false_type {};
template <class O, class S>
struct adds_spans<O, S,
                  std::void_t<decltype(std::declval<O&>().add(std::declval<const S&>(), std::declval<const S&>()))>>
    : std::true_type {};

template <class O, class T, class = void>
struct has_grad_scale : std::false_type {};
template <class O, class T>
struct has_grad_scale<O, T, std::void_t<decltype(std::declval<O&>().set_grad_scale(std::size_t(0), std::declval<T>()))>>
    : std::true_type {};

template <class O, class = void>
struct has_step : std::false_type {};
template <class O>
struct has_step<O, std::void_t<decltype(std::declval<O&>().step())>> : std::true_type {};

template <class O, class = void>
struct has_step_slots : std::false_type {};
template <class O>
struct has_step_slots<O, std::void_t<decltype(std::declval<O&>().step_slots(std::size_t(0), std::size_t(0)))>>
    : std::true_type {};

}  // namespace gradsync::impl
