# Repairs an imported Kokkos::kokkos whose include directory does not exist.
#
# Debian's libtrilinos-kokkos-dev (Kokkos 3.4) computes INTERFACE_INCLUDE_DIRECTORIES as
# <prefix>/lib/include, a path that does not exist; the headers are in Kokkos_INCLUDE_DIRS
# (/usr/include/trilinos). The repair runs only when a configured path is missing, so a correct
# Kokkos (any 4.x install) is left untouched.
function(gradsync_repair_kokkos)
  if(NOT TARGET Kokkos::kokkos)
    return()
  endif()
  get_target_property(_aliased Kokkos::kokkos ALIASED_TARGET)
  if(_aliased)
    return()
  endif()
  get_target_property(_dirs Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _dirs)
    set(_dirs "")
  endif()
  set(_kept "")
  set(_missing "")
  foreach(_d IN LISTS _dirs)
    if(_d MATCHES "^\\$<" OR EXISTS "${_d}")
      list(APPEND _kept "${_d}")
    else()
      list(APPEND _missing "${_d}")
    endif()
  endforeach()
  if(NOT _missing)
    return()
  endif()
  foreach(_d IN LISTS Kokkos_INCLUDE_DIRS KokkosCore_INCLUDE_DIRS)
    get_filename_component(_real "${_d}" REALPATH)
    if(EXISTS "${_real}/Kokkos_Core.hpp")
      list(APPEND _kept "${_real}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _kept)
  if(NOT _kept)
    message(FATAL_ERROR "gradsync: Kokkos::kokkos points at missing include directories (${_missing}) "
                        "and Kokkos_INCLUDE_DIRS holds no Kokkos_Core.hpp")
  endif()
  set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_kept}")
  message(STATUS "gradsync: repaired Kokkos::kokkos include path: ${_missing} -> ${_kept}")
endfunction()

# Kokkos gives its OpenMP flag to C++ sources only (OpenMP::OpenMP_CXX), but a .cu file that includes
# gradsync.hpp, hence Kokkos_Core.hpp, needs it too: Kokkos' OpenMP headers refuse to compile
# without it. Gives nvcc's host pass the same flag through `target`'s interface (in the build tree
# only with BUILD_INTERFACE: the installed package decides from the consumer's Kokkos).
function(gradsync_kokkos_cuda_flags target)
  if(NOT TARGET ${target} OR NOT Kokkos_ENABLE_OPENMP)
    return()
  endif()
  get_target_property(_aliased ${target} ALIASED_TARGET)
  if(_aliased)
    set(target ${_aliased})
  endif()
  set(_flag "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fopenmp>")
  if(ARGV1 STREQUAL "BUILD_INTERFACE")
    set(_flag "$<BUILD_INTERFACE:${_flag}>")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS "${_flag}")
endfunction()
