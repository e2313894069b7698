// gradsync internals: the backend members that name MPI types (backend.hpp lists them).
//
// A backend over an MPI communicator offers comm() (and MpiBackend notice_comm()); the side channel
// (impl/stall.hpp) is built on them. Detecting them needs MPI_Comm, so these two traits live here,
// with the MPI code that uses them, and backend.hpp stays free of <mpi.h>.
#pragma once

#include <mpi.h>

#include <type_traits>
#include <utility>

#include "../backend.hpp"

namespace gradsync::impl {

template <class B, class = void>
struct detects_mpi_comm : std::false_type {};
template <class B>
struct detects_mpi_comm<B, std::enable_if_t<std::is_same_v<decltype(std::declval<const B&>().comm()), MPI_Comm>>>
    : std::true_type {};
template <class B>
struct has_mpi_comm : std::bool_constant<declares<B>(Capability::comm)> {};

// MPI_Comm notice_comm() const: the group's notice communicator (impl/notice_comm.hpp), where a
// sync that ends tells its peers; without it, they learn at the deadline.
template <class B, class = void>
struct detects_notice_comm : std::false_type {};
template <class B>
struct detects_notice_comm<B,
                           std::enable_if_t<std::is_same_v<decltype(std::declval<const B&>().notice_comm()), MPI_Comm>>>
    : std::true_type {};
template <class B>
struct has_notice_comm : std::bool_constant<declares<B>(Capability::notice_comm)> {};

// The two capabilities that name MPI types, checked as backend.hpp checks the others.
template <class B>
constexpr bool check_mpi_capabilities() {
  GRADSYNC_CHECK_CAPABILITY(comm, detects_mpi_comm<B>::value, "MPI_Comm comm() const");
  GRADSYNC_CHECK_CAPABILITY(notice_comm, detects_notice_comm<B>::value, "MPI_Comm notice_comm() const");
  return true;
}

}  // namespace gradsync::impl
