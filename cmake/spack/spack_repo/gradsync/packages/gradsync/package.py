# A Spack package for gradsync, in a package repository of its own (Spack 1.x layout):
#   spack repo add /path/to/gradsync/cmake/spack/spack_repo/gradsync
#   spack install gradsync@main +cuda cuda_arch=90 +nccl ^kokkos+cuda+wrapper
# or, from a checkout:  spack dev-build -d /path/to/gradsync gradsync@main
# Untested: Spack could not be brought onto the machine this was written on (docs/COMPATIBILITY.md).

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *


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
    depends_on("c", type="build", when="+c")
    depends_on("fortran", type="build", when="+fortran")
    depends_on("cmake@3.16:", type="build")

    depends_on("mpi")
    depends_on("kokkos@3.4:")
    depends_on("kokkos+cuda", when="+cuda")
    depends_on("nccl", when="+nccl")
    depends_on("py-torch", when="+torch")
    depends_on("hdf5+mpi", when="+hdf5")

    conflicts("+fortran", when="~c", msg="the Fortran module is built on the C interface")
    conflicts("+nccl", when="~cuda", msg="NcclBackend needs CUDA")

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
            # The MPI Spack chose is the one the installed package binds consumers to.
            self.define("MPI_CXX_COMPILER", self.spec["mpi"].mpicxx),
        ]
        if self.spec.satisfies("+cuda"):
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
        if self.spec.satisfies("+torch"):
            args.append(self.define("Torch_DIR", join_path(self.spec["py-torch"].package.cmake_prefix_paths[0], "Torch")))
        return args
