# Optional CUDA and NCCL parts of gradsync: gradsync::CudaDeviceSpace spans (cuda_space.hpp) and
# gradsync::NcclBackend (nccl_backend.hpp). GRADSYNC_ENABLE_CUDA / GRADSYNC_ENABLE_NCCL are AUTO (use
# them when found), ON (fail when not found) or OFF. Sets GRADSYNC_HAVE_CUDA and GRADSYNC_HAVE_NCCL.
# Must be included at file scope (it may call enable_language(CUDA)).
set(GRADSYNC_ENABLE_CUDA AUTO CACHE STRING "CUDA support: AUTO (when nvcc and the CUDA toolkit are found), ON or OFF")
set_property(CACHE GRADSYNC_ENABLE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(GRADSYNC_ENABLE_NCCL AUTO CACHE STRING "NcclBackend: AUTO (when CUDA and libnccl are found), ON or OFF")
set_property(CACHE GRADSYNC_ENABLE_NCCL PROPERTY STRINGS AUTO ON OFF)

# AUTO, or any CMake boolean (ON/OFF, TRUE/FALSE, 1/0...).
function(_gradsync_mode var out)
  string(TOUPPER "${${var}}" _v)
  if(_v STREQUAL "AUTO")
    set(${out} AUTO PARENT_SCOPE)
  elseif(${var})
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()
_gradsync_mode(GRADSYNC_ENABLE_CUDA _gradsync_cuda_mode)
_gradsync_mode(GRADSYNC_ENABLE_NCCL _gradsync_nccl_mode)

set(GRADSYNC_HAVE_CUDA OFF)
set(GRADSYNC_HAVE_NCCL OFF)
set(GRADSYNC_CUDA_WHY "GRADSYNC_ENABLE_CUDA=OFF, or no CUDA compiler and toolkit found")
set(GRADSYNC_NCCL_WHY "GRADSYNC_ENABLE_NCCL=OFF, no CUDA, or nccl.h/libnccl not found (set NCCL_HOME)")
if(NOT _gradsync_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS "/usr/local/cuda/bin/nvcc")
    set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc" CACHE FILEPATH "CUDA compiler")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit)
    # No architecture given: nvcc's default (sm_75 PTX with CUDA 13, JIT-compiled for newer GPUs).
    # tests/gpu/run.sh passes the GPU's own.
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES OFF)
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(GRADSYNC_HAVE_CUDA ON)
    message(STATUS "gradsync: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER})")
  elseif(_gradsync_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "gradsync: GRADSYNC_ENABLE_CUDA=ON but no CUDA compiler and toolkit were found "
                        "(put nvcc on PATH or set CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "gradsync: CUDA not found; CUDA parts off")
  endif()
endif()

if(GRADSYNC_HAVE_CUDA AND NOT _gradsync_nccl_mode STREQUAL "OFF")
  find_path(GRADSYNC_NCCL_INCLUDE_DIR nccl.h
            HINTS ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}" PATH_SUFFIXES include)
  find_library(GRADSYNC_NCCL_LIBRARY nccl
               HINTS ENV NCCL_HOME "${CUDAToolkit_LIBRARY_DIR}" "${CUDAToolkit_LIBRARY_ROOT}" PATH_SUFFIXES lib lib64)
  if(GRADSYNC_NCCL_INCLUDE_DIR AND GRADSYNC_NCCL_LIBRARY)
    set(GRADSYNC_HAVE_NCCL ON)
    message(STATUS "gradsync: NCCL ${GRADSYNC_NCCL_LIBRARY}")
  endif()
endif()
if(_gradsync_nccl_mode STREQUAL "ON" AND NOT GRADSYNC_HAVE_NCCL)
  message(FATAL_ERROR "gradsync: GRADSYNC_ENABLE_NCCL=ON but CUDA or nccl.h/libnccl were not found (set NCCL_HOME)")
endif()
