#!/usr/bin/env python
"""Compiles the selected kernel instantiations into a folder of objects that setup.py links instead
of compiling (FLASH_ATTN_CUTE_PREBUILT=<folder>). The kernels are torch-free, so a machine without
a GPU can build them for the GPU machine: same nvcc, same flags, same headers (each object carries
a key of all three; a stale object is simply compiled again by setup.py).

  FLASH_ATTN_CUTE_ARCHS=90 python scripts/prebuild_kernels.py --out .prebuilt -j 2
Honours FLASH_ATTN_CUTE_{HDIMS,DTYPES,ARCHS,PASSES}, like setup.py.
"""
import argparse
import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "csrc"))
import features  # noqa: E402


def build_one(src, out_dir, archs, nvcc_version, cutlass_include):
    obj = out_dir / (src.stem + ".o")
    key_path = obj.with_suffix(".key")
    key = features.prebuilt_key(src, archs, nvcc_version)
    if obj.exists() and key_path.exists() and key_path.read_text().strip() == key:
        return src.stem, "up to date", 0.0
    start = time.time()
    cmd = [features.nvcc_path(), "-c", "-std=c++17", "-Xcompiler", "-fPIC", *features.nvcc_flags(archs),
           "-I", str(ROOT / "include"), "-I", str(ROOT / "csrc"), "-I", cutlass_include, str(src), "-o", str(obj)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        return src.stem, "FAILED:\n" + result.stderr[-3000:], time.time() - start
    key_path.write_text(key + "\n")
    return src.stem, "built", time.time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / ".prebuilt"), help="object folder (default .prebuilt)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args()
    _, _, archs = features.selected()
    cutlass_include, looked_in = features.find_cutlass_include()
    if cutlass_include is None:
        sys.exit(f"CuTe headers not found in {looked_in}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = features.compile_order(features.generate())  # longest first, as setup.py
    version = features.nvcc_version()
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(build_one, s, out_dir, archs, version, cutlass_include) for s in sources]
        for job in concurrent.futures.as_completed(jobs):
            name, status, seconds = job.result()
            failed += status.startswith("FAILED")
            print(f"{name}: {status} ({seconds:.0f} s)", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
