# GradSync::c: the C interface (include/gradsync/gradsync_c.h), the one part of gradsync that is
# compiled: src/gradsync_c.cpp into a static library. GradSync::fortran: the Fortran module over it
# (include/gradsync/fortran/gradsync.f90), built when a Fortran compiler is found.
option(GRADSYNC_ENABLE_C "Build GradSync::c, the C interface" ON)
option(GRADSYNC_ENABLE_FORTRAN "Build GradSync::fortran when a Fortran compiler is found" ON)
set(GRADSYNC_HAVE_C OFF)
set(GRADSYNC_HAVE_FORTRAN OFF)
set(GRADSYNC_C_WHY "GRADSYNC_ENABLE_C=OFF")
set(GRADSYNC_FORTRAN_WHY "GRADSYNC_ENABLE_FORTRAN=OFF or GRADSYNC_ENABLE_C=OFF (the module is built on the C interface)")
if(GRADSYNC_ENABLE_C)
  set(GRADSYNC_HAVE_C ON)
  add_library(gradsync_c STATIC "${PROJECT_SOURCE_DIR}/src/gradsync_c.cpp")
  add_library(GradSync::c ALIAS gradsync_c)
  set_target_properties(gradsync_c PROPERTIES EXPORT_NAME c OUTPUT_NAME gradsync_c POSITION_INDEPENDENT_CODE ON)
  # gradsync (Kokkos, MPI) is PUBLIC: the static library needs them at the user's link; mpi.h comes with it.
  target_link_libraries(gradsync_c PUBLIC gradsync)
  target_compile_options(gradsync_c PRIVATE ${GRADSYNC_WARNINGS})
  if(GRADSYNC_SANITIZE)
    # Compiled with the sanitizers (GradSyncWarnings.cmake, CI's second pass): whoever links the
    # static library, the installed one included, needs their runtimes.
    target_link_options(gradsync_c INTERFACE -fsanitize=address,undefined)
  endif()
  install(TARGETS gradsync_c EXPORT GradSyncTargets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")

  include(CheckLanguage)
  if(GRADSYNC_ENABLE_FORTRAN)
    check_language(Fortran)
    set(GRADSYNC_FORTRAN_WHY "no Fortran compiler found (set CMAKE_Fortran_COMPILER)")
  endif()
  if(GRADSYNC_ENABLE_FORTRAN AND CMAKE_Fortran_COMPILER)
    enable_language(Fortran)
    set(GRADSYNC_HAVE_FORTRAN ON)
    add_library(gradsync_fortran STATIC "${PROJECT_SOURCE_DIR}/include/gradsync/fortran/gradsync.f90")
    add_library(GradSync::fortran ALIAS gradsync_fortran)
    set(_gradsync_moddir "${PROJECT_BINARY_DIR}/fortran_modules")
    set_target_properties(gradsync_fortran PROPERTIES EXPORT_NAME fortran Fortran_MODULE_DIRECTORY "${_gradsync_moddir}"
                                                      POSITION_INDEPENDENT_CODE ON)
    # .mod files are compiler-specific: installed for this compiler; the module's source is installed too.
    set(_gradsync_modinst "${CMAKE_INSTALL_INCLUDEDIR}/gradsync/fortran/${CMAKE_Fortran_COMPILER_ID}-${CMAKE_Fortran_COMPILER_VERSION}")
    target_include_directories(gradsync_fortran INTERFACE $<BUILD_INTERFACE:${_gradsync_moddir}>
                                                          $<INSTALL_INTERFACE:${_gradsync_modinst}>)
    target_link_libraries(gradsync_fortran PUBLIC gradsync_c)
    if(GRADSYNC_WARNINGS)  # gradsync's own build: Fortran's share of the warning flags
      target_compile_options(gradsync_fortran PRIVATE -Wall -Wextra $<$<BOOL:${GRADSYNC_WERROR}>:-Werror>)
    endif()
    install(TARGETS gradsync_fortran EXPORT GradSyncTargets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
    install(DIRECTORY "${_gradsync_moddir}/" DESTINATION "${_gradsync_modinst}" FILES_MATCHING PATTERN "*.mod")
  endif()
endif()
message(STATUS "gradsync: C interface ${GRADSYNC_HAVE_C}, Fortran module ${GRADSYNC_HAVE_FORTRAN}")
