# A Spack package for gradsync, in a package repository of its own (Spack 1.x layout, which Spack
# 0.2x reads too):
#   spack repo add /path/to/gradsync/cmake/spack/spack_repo/gradsync
#   spack install gradsync@main +cuda cuda_arch=90 +nccl
# or, from a checkout:  spack dev-build -d /path/to/gradsync gradsync@main +hdf5
# tests/spack.sh installs it from a checkout and builds a consumer against it; docs/COMPATIBILITY.md
# says with which Spack and what ran.

import spack.directives
from spack.package import *

try:  # Spack 1.x: the build systems live in the builtin package repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.x: spack.package exports them
    pass


def _knows_language(name):
    # Spack's development snapshots of mid-2024 (0.23.0.dev0) took cxx and fortran as languages but
    # not c yet: a dependency on "c" failed to concretize there. Later Spack has all three.
    langs = getattr(spack.directives, "SUPPORTED_LANGUAGES", None)
    return langs is None or name in langs


class Gradsync(CMakePackage, CudaPackage):
    """Header-only C++17 library that synchronizes gradients across MPI ranks for Kokkos codes that
    train models beside their simulation: data-parallel groups averaged through fused buffers (MPI
    or NCCL), model-parallel groups kept on their rank and scaled so that hybrid models follow the
    gradient of one global mean loss."""

    git = "https://example.invalid/gradsync.git"  # set to where your site mirrors the repository

    license("BSD-3-Clause")

    version("main", branch="main")

    variant("c", default=True, description="The C interface (GradSync::c), a compiled library")
    variant("fortran", default=False, description="The Fortran module (GradSync::fortran); needs +c")
    variant("nccl", default=False, description="NcclBackend (GradSync::nccl); needs +cuda")
    variant("torch", default=False, description="The LibTorch adapter (GradSync::torch)")
    variant("hdf5", default=False, description="Checkpoints in one parallel HDF5 file (GradSync::hdf5)")

    depends_on("cxx", type="build")
    # FindHDF5 compiles a C program (cmake/GradSyncHdf5.cmake); the C interface itself is C++.
    if _knows_language("c"):
        depends_on("c", type="build", when="+hdf5")
    depends_on("fortran", type="build", when="+fortran")
    depends_on("cmake@3.16:", type="build")

    depends_on("mpi")
    depends_on("kokkos@3.4:")
    # Kokkos' nvcc_wrapper compiles gradsync's CUDA builds (the CMake argument below), for the same
    # GPU: each cuda_arch passed on to Kokkos and NCCL.
    depends_on("kokkos+cuda+wrapper", when="+cuda")
    depends_on("nccl", when="+nccl")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
        depends_on(f"nccl cuda_arch={_arch}", when=f"+nccl cuda_arch={_arch}")
    depends_on("py-torch", when="+torch")
    depends_on("hdf5+mpi", when="+hdf5")

    conflicts("+fortran", when="~c", msg="the Fortran module is built on the C interface")
    conflicts("+nccl", when="~cuda", msg="NcclBackend needs CUDA")
    conflicts("cuda_arch=none", when="+cuda", msg="+cuda needs the GPU's cuda_arch (90 for H100 and H200)")

    def cmake_args(self):
        on_off = lambda v: "ON" if self.spec.satisfies(v) else "OFF"
        args = [
            # Header-only: the package is the headers and the CMake package; tests stay in the
            # repository's own CI.
            self.define("GRADSYNC_BUILD_TESTS", False),
            self.define("GRADSYNC_BUILD_EXAMPLES", False),
            self.define("GRADSYNC_BUILD_BENCHMARKS", False),
            self.define_from_variant("GRADSYNC_ENABLE_C", "c"),
            self.define_from_variant("GRADSYNC_ENABLE_FORTRAN", "fortran"),
            self.define_from_variant("GRADSYNC_ENABLE_TORCH", "torch"),
            self.define_from_variant("GRADSYNC_ENABLE_HDF5", "hdf5"),
            # AUTO/ON/OFF options: the variant decides, never what the build machine happens to have.
            self.define("GRADSYNC_ENABLE_CUDA", on_off("+cuda")),
            self.define("GRADSYNC_ENABLE_NCCL", on_off("+nccl")),
            # The components asked for must be built: their absence is a configure error, not a
            # smaller installation.
            self.define("GRADSYNC_REQUIRE", [c for c in ("c", "fortran", "torch", "hdf5", "cuda", "nccl")
                                             if self.spec.satisfies("+" + c)]),
            # The MPI Spack chose is the one the installed package binds consumers to.
            self.define("MPI_CXX_COMPILER", self.spec["mpi"].mpicxx),
        ]
        if self.spec.satisfies("+cuda"):
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        return args
