# GradSync::hdf5: gradsync/checkpoint.hpp with parallel HDF5 (Debian's libhdf5-openmpi-dev), when a
# parallel HDF5 is found. Header-only like the rest: an INTERFACE target that adds HDF5 to
# GradSync::gradsync. A serial HDF5 is refused: the checkpoint file is written collectively (MPI-IO).
option(GRADSYNC_ENABLE_HDF5 "Build GradSync::hdf5 (checkpoints) when a parallel HDF5 is found" ON)
set(GRADSYNC_HAVE_HDF5 OFF)
set(GRADSYNC_HDF5_WHY "GRADSYNC_ENABLE_HDF5=OFF")
if(GRADSYNC_ENABLE_HDF5)
  # FindHDF5 compiles a C test program; gradsync's project is C++ only. Included at file scope.
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    # Debian installs the serial and the Open MPI flavours side by side: ask for the parallel one.
    set(HDF5_PREFER_PARALLEL ON)
    find_package(HDF5 QUIET COMPONENTS C)
  endif()
  if(NOT CMAKE_C_COMPILER)
    set(GRADSYNC_HDF5_WHY "no C compiler to run FindHDF5 with")
  elseif(NOT HDF5_FOUND)
    set(GRADSYNC_HDF5_WHY "no HDF5 found (Debian: apt-get install libhdf5-openmpi-dev)")
  elseif(NOT HDF5_IS_PARALLEL)
    set(GRADSYNC_HDF5_WHY "HDF5 ${HDF5_VERSION} is serial; checkpoints need a parallel HDF5 built with the MPI "
                          "gradsync uses (Debian: libhdf5-openmpi-dev; or set HDF5_ROOT)")
  else()
    set(GRADSYNC_HAVE_HDF5 ON)
    set(GRADSYNC_HDF5_WHY "")
    add_library(gradsync_hdf5 INTERFACE)
    add_library(GradSync::hdf5 ALIAS gradsync_hdf5)
    set_target_properties(gradsync_hdf5 PROPERTIES EXPORT_NAME hdf5)
    # The found paths themselves, not FindHDF5's hdf5::hdf5: a consumer of the installed package then
    # needs no C compiler nor FindHDF5 (as GradSync::nccl names its library).
    target_include_directories(gradsync_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
    target_compile_definitions(gradsync_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
    target_link_libraries(gradsync_hdf5 INTERFACE gradsync ${HDF5_C_LIBRARIES})
    target_compile_definitions(gradsync_hdf5 INTERFACE GRADSYNC_HAVE_HDF5=1)
    install(TARGETS gradsync_hdf5 EXPORT GradSyncTargets)
  endif()
endif()
if(GRADSYNC_HAVE_HDF5)
  message(STATUS "gradsync: parallel HDF5 ON (${HDF5_VERSION}: ${HDF5_C_INCLUDE_DIRS})")
else()
  message(STATUS "gradsync: parallel HDF5 OFF: ${GRADSYNC_HDF5_WHY}")
endif()
