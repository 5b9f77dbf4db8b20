# Spack package for moetrain (copy this directory into a Spack repository's
# packages/ directory: spack repo create, then packages/moetrain/package.py).

from spack.package import *


class Moetrain(AutotoolsPackage, CudaPackage):
    """moetrain trains Mixture-of-Experts language models (Qwen3-MoE, Mixtral)
    on GPU clusters with tensor, sequence, expert, pipeline and data
    parallelism, configured by Fortran namelists; a CPU backend runs anywhere."""

    # moetrain has no public address yet: set homepage and url here and in
    # configure.ac's AC_INIT when it has one.
    homepage = "https://moetrain.invalid/"
    url = "https://moetrain.invalid/releases/moetrain-0.1.0.tar.gz"

    license("BSD-3-Clause")

    # The release's checksum: spack checksum moetrain 0.1.0
    version("0.1.0")

    # CudaPackage gives +cuda and cuda_arch=...; the CUDA backend is built as SASS
    # for each (sm_90, sm_100: Hopper, Blackwell, GB300's sm_103 included) and as PTX
    # for the newest, which the driver compiles for newer GPUs.
    variant("nccl", default=True, when="+cuda", description="GPU collectives through NCCL")
    variant("mpi", default=True, description="CPU multi-rank collectives through MPI")
    variant("pmix", default=True, description="Bootstrap under srun --mpi=pmix and mpirun through PMIx")
    variant("numa", default=True, description="NUMA memory binding through libnuma")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("pkgconfig", type="build")

    depends_on("hwloc@2:")
    depends_on("blas")
    depends_on("pmix@4:", when="+pmix")
    depends_on("mpi", when="+mpi")
    depends_on("numactl", when="+numa")
    depends_on("cuda@12.8:", when="+cuda")
    depends_on("nccl", when="+nccl")
    for arch in CudaPackage.cuda_arch_values:
        depends_on(f"nccl cuda_arch={arch}", when=f"+nccl cuda_arch={arch}")

    # The kernels are developed and checked for Hopper and Blackwell only.
    conflicts("cuda_arch=none", when="+cuda", msg="moetrain's CUDA backend needs cuda_arch=90 or 100")
    for arch in CudaPackage.cuda_arch_values:
        if arch not in ("90", "90a", "100", "100a"):
            conflicts(f"cuda_arch={arch}", when="+cuda", msg="moetrain's CUDA backend supports cuda_arch 90 and 100")

    def configure_args(self):
        spec = self.spec
        args = [
            f"--with-hwloc={spec['hwloc'].prefix}",
            # Spack writes its own module files.
            "--without-modulefiles-dir",
            "--disable-fuzz",
        ]
        args += self.with_or_without("mpi", activation_value=lambda _: spec["mpi"].prefix)
        args += self.with_or_without("pmix", activation_value="prefix")
        args += self.with_or_without("numa", variant="numa", activation_value=lambda _: spec["numactl"].prefix)
        if spec.satisfies("^[virtuals=blas] openblas"):
            args.append(f"--with-blas={spec['openblas'].prefix}")
        if spec.satisfies("+cuda"):
            nums = sorted({int(a.rstrip("a")) for a in spec.variants["cuda_arch"].value})
            archs = " ".join([f"sm_{n}" for n in nums] + [f"compute_{nums[-1]}"])
            args += [f"--with-cuda={spec['cuda'].prefix}", f"--with-cuda-arch={archs}"]
            args += self.with_or_without("nccl", activation_value=lambda _: spec["nccl"].prefix)
        else:
            args += ["--without-cuda", "--without-nccl"]
        return args

    def setup_run_environment(self, env):
        env.set("MOETRAIN_ROOT", self.prefix)
        env.set("MOETRAIN_DATADIR", self.prefix.share.moetrain)
        env.set("MOETRAIN_NAMELISTS", self.prefix.share.moetrain.namelists)
