"""Builds flash_attn_cute: the Python package plus, where torch has CUDA, its kernel extension.

Build options (environment variables):
  FLASH_ATTN_CUTE_HDIMS   kernel head dims to compile, e.g. "64,128" (default: all)
  FLASH_ATTN_CUTE_DTYPES  "fp16", "bf16" or both (default: both)
  FLASH_ATTN_CUTE_ARCHS   CUDA archs, e.g. "90" or "80;90" (default: 80;90)
  FLASH_ATTN_CUTE_SKIP_CUDA_BUILD=1   install the Python layer only
  FLASH_ATTN_CUTE_PTXAS_VERBOSE=1     print registers / spills per kernel
  MAX_JOBS                parallel nvcc jobs (default: CPU count, at most one per 4 GB of free memory)
  CUTLASS_PATH            a CUTLASS checkout to use instead of the nvidia-cutlass wheel
"""
import os
import sys
import warnings
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "csrc"))
import features  # noqa: E402  (csrc/features.py: the feature table)


def cutlass_include_dir():
    found, looked_in = features.find_cutlass_include()
    if found is None:
        raise RuntimeError(
            "flash_attn_cute: CuTe headers not found. `pip install nvidia-cutlass==4.2.0.0` "
            "or set CUTLASS_PATH to a CUTLASS checkout. Looked in: " + ", ".join(map(str, looked_in)))
    return found


def use_prebuilt(kernel_sources, archs):
    """With FLASH_ATTN_CUTE_PREBUILT=<dir> (filled by scripts/prebuild_kernels.py), kernel files whose
    object there has a matching key are linked instead of compiled. Returns (sources, objects)."""
    folder = os.environ.get("FLASH_ATTN_CUTE_PREBUILT")
    if not folder:
        return kernel_sources, []
    nvcc_version = features.nvcc_version()
    sources, objects = [], []
    for src in kernel_sources:
        obj = Path(folder) / (Path(src).stem + ".o")
        key = obj.with_suffix(".key")
        fresh = obj.exists() and key.exists() and key.read_text().strip() == features.prebuilt_key(
            ROOT / src, archs, nvcc_version)
        (objects if fresh else sources).append(str(obj.resolve()) if fresh else src)
    print(f"flash_attn_cute: {len(objects)} prebuilt kernel objects from {folder}, {len(sources)} to compile")
    return sources, objects


def cuda_extensions():
    if os.environ.get("FLASH_ATTN_CUTE_SKIP_CUDA_BUILD") == "1":
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    if torch.version.cuda is None:
        warnings.warn("flash_attn_cute: torch has no CUDA; installing the Python layer only")
        return [], {}
    os.environ.setdefault("MAX_JOBS", str(features.default_max_jobs(os.cpu_count() or 1,
                                                                    features.mem_available_bytes())))
    _, _, archs = features.selected()
    kernel_sources = [str(p.relative_to(ROOT)) for p in features.generate()]
    nvcc_flags = features.nvcc_flags(archs)
    kernel_sources, prebuilt_objects = use_prebuilt(kernel_sources, archs)
    if os.environ.get("FLASH_ATTN_CUTE_PTXAS_VERBOSE") == "1":
        nvcc_flags.append("-Xptxas=-v")
    ext = CUDAExtension(
        name="flash_attn_cute._C",
        sources=["csrc/ops.cpp", "csrc/glue.cpp", "csrc/fwd_api.cpp", "csrc/bwd_api.cpp", "csrc/kvcache_api.cpp",
                 "csrc/autograd.cpp", "csrc/dispatch.cpp"] + kernel_sources,
        include_dirs=[str(ROOT / "include"), str(ROOT / "csrc"), cutlass_include_dir()],
        extra_objects=prebuilt_objects,
        extra_compile_args={"cxx": ["-O3"], "nvcc": nvcc_flags},
    )
    class BuildExtensionLongestFirst(BuildExtension):
        """distutils sorts an extension's sources by name and ninja starts them in that order; this
        hands them to the compiler longest expected compile first (features.compile_order), so that
        the build does not end on a long kernel file started last."""

        def build_extension(self, extension):
            compile_sources = self.compiler.compile
            self.compiler.compile = lambda sources, *args, **kwargs: compile_sources(
                features.compile_order(sources), *args, **kwargs)
            try:
                super().build_extension(extension)
            finally:
                self.compiler.compile = compile_sources

    return [ext], {"build_ext": BuildExtensionLongestFirst}


ext_modules, cmdclass = cuda_extensions()
setup(
    packages=find_packages(include=["flash_attn_cute", "flash_attn_cute.*"]),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
