# GradSync::torch: gradsync/torch.hpp with LibTorch (find_package(Torch)), when LibTorch is found.
# Header-only like the rest: an INTERFACE target that adds LibTorch to GradSync::gradsync.
option(GRADSYNC_ENABLE_TORCH "Build GradSync::torch when LibTorch (find_package(Torch)) is found" ON)
set(GRADSYNC_HAVE_TORCH OFF)
set(GRADSYNC_TORCH_WHY "GRADSYNC_ENABLE_TORCH=OFF")
if(GRADSYNC_ENABLE_TORCH)
  find_package(Torch QUIET)
  set(GRADSYNC_TORCH_WHY "no LibTorch found (set Torch_DIR)")
  if(Torch_FOUND AND TARGET torch)
    set(GRADSYNC_HAVE_TORCH ON)
    add_library(gradsync_torch INTERFACE)
    add_library(GradSync::torch ALIAS gradsync_torch)
    set_target_properties(gradsync_torch PROPERTIES EXPORT_NAME torch)
    # TORCH_LIBRARIES: the torch target and c10 (Debian's TorchConfig lists c10 only there).
    target_link_libraries(gradsync_torch INTERFACE gradsync ${TORCH_LIBRARIES})
    install(TARGETS gradsync_torch EXPORT GradSyncTargets)
  endif()
endif()
message(STATUS "gradsync: LibTorch ${GRADSYNC_HAVE_TORCH}")

# GradSyncConfig.cmake includes this before the exported targets (GradSync::torch names LibTorch's).
configure_file("${CMAKE_CURRENT_LIST_DIR}/GradSyncOptional.cmake.in" "${PROJECT_BINARY_DIR}/GradSyncOptional.cmake" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/GradSyncOptional.cmake" DESTINATION "${GRADSYNC_CMAKE_DIR}")
