# Which MPI implementation a set of include directories belongs to, from its mpi.h: openmpi, mpich
# (and its derivatives: Intel MPI, MVAPICH, Cray MPICH) or unknown. Used at gradsync's build and by
# the installed GradSyncConfig.cmake, which binds a consumer to the MPI gradsync was built with.
function(gradsync_mpi_flavor out)
  set(_flavor unknown)
  unset(_gradsync_mpi_h CACHE)
  find_file(_gradsync_mpi_h mpi.h PATHS ${ARGN} NO_DEFAULT_PATH)
  if(_gradsync_mpi_h)
    file(STRINGS "${_gradsync_mpi_h}" _defs REGEX "#define (OPEN_MPI|MPICH_VERSION|MPICH) ")
    if(_defs MATCHES "OPEN_MPI")
      set(_flavor openmpi)
    elseif(_defs MATCHES "MPICH")
      set(_flavor mpich)
    endif()
  endif()
  unset(_gradsync_mpi_h CACHE)
  set(${out} ${_flavor} PARENT_SCOPE)
endfunction()

# The Fortran wrapper of the MPI whose C++ wrapper is `cxx`: Debian-style installs name them with
# the implementation as a suffix (mpicxx.mpich -> mpifort.mpich), and a bare mpicxx goes with a
# bare mpifort; FindMPI would otherwise take the first mpif90 on the PATH, maybe another MPI's.
function(gradsync_mpi_fortran_wrapper out cxx)
  set(${out} "" PARENT_SCOPE)
  get_filename_component(_dir "${cxx}" DIRECTORY)
  get_filename_component(_name "${cxx}" NAME)
  if(NOT _name MATCHES "^mpi(cxx|c\\+\\+|CC|icpc|icpx)(.*)$")
    return()
  endif()
  set(_suffix "${CMAKE_MATCH_2}")
  unset(_gradsync_mpifort CACHE)
  find_program(_gradsync_mpifort NAMES mpifort${_suffix} mpif90${_suffix} mpiifort${_suffix} HINTS "${_dir}"
               NO_DEFAULT_PATH)
  if(_gradsync_mpifort)
    set(${out} "${_gradsync_mpifort}" PARENT_SCOPE)
  endif()
  unset(_gradsync_mpifort CACHE)
endfunction()
