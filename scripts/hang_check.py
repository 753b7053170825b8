#!/usr/bin/env python
"""Runs the forward a few times on each shape, in a process of its own with a time limit, and reports the
shapes that hang: for changes to the warp-specialized forward's barriers, whose hangs can depend on
timing (session 36: a branch hung on 8 x 1024 causal and a 16k window, with many short tiles per
CTA, but not on long tiles, nor under compute-sanitizer). A tree is a folder holding a built
flash_attn_cute package (scripts/build_offline_ext.sh leaves one in .offline/).

  python scripts/hang_check.py --tree /tmp/trees/X [--repeat 3] [--timeout 20]

Exit status 1 if any shape hung or failed.
"""
import argparse
import subprocess
import sys

# (batch, seqlen, heads, keyword arguments of flash_attn_func), head dim 128, bf16
SHAPES = [
    (8, 1024, 16, "causal=True"),
    (16, 1024, 16, "causal=True"),
    (16, 1024, 16, "causal=True, softcap=60.0"),
    (1, 16384, 16, "window_size=(1024, 0)"),
    (1, 16384, 16, "causal=True"),
    (1, 16384, 16, ""),
    (64, 256, 16, "causal=True"),
]

RUN = """
import sys, torch
sys.path.insert(0, {tree!r})
import flash_attn_cute as fac
q, k, v = (torch.randn({b}, {s}, {h}, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range({repeat}):
    o = fac.flash_attn_func(q, k, v, {kw})
torch.cuda.synchronize()
assert bool(o.isfinite().all())
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", required=True)
    parser.add_argument("--repeat", type=int, default=3, help="calls per process")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per process")
    args = parser.parse_args()
    bad = 0
    for b, s, h, kw in SHAPES:
        code = RUN.format(tree=args.tree, b=b, s=s, h=h, kw=kw, repeat=args.repeat)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=args.timeout)
            status = "ok" if out.returncode == 0 else "FAILED: " + out.stderr.strip().splitlines()[-1]
        except subprocess.TimeoutExpired:
            status = "HANG"
        bad += status != "ok"
        print(f"{b} x {s}, {h} heads, {kw or 'full'}: {status}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
