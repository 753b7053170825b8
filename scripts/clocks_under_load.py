"""Runs one forward back to back for a few seconds per case and samples the SM clock and board
power with nvidia-smi meanwhile: whether a feature's cost in the benchmark comes from the GPU
slowing its clock under the load, not from the kernel's instructions.

  python scripts/clocks_under_load.py [--seconds 3] [--head-dim 128] [--full] [--no-dropout]
"""
import argparse
import subprocess
import time

import torch

import flash_attn_cute as fac


def sample():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip().split(",")
    return float(out[0]), float(out[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--head-dim", type=int, default=128, help="with 2048 / head dim heads")
    parser.add_argument("--full", action="store_true", help="non-causal")
    parser.add_argument("--no-dropout", action="store_true", help="for builds without the dropout kernels")
    args = parser.parse_args()
    s, d = 16384, args.head_dim
    h = 2048 // d
    mask = "full" if args.full else "causal"
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(h, device="cuda") * 0.3
    mods = [("", {}), (" + softcap 30", dict(softcap=30.0)), (" + ALiBi", dict(alibi_slopes=slopes)),
            (" + softcap + ALiBi", dict(softcap=30.0, alibi_slopes=slopes))]
    if not args.no_dropout:
        mods.append((" + dropout 0.1", dict(dropout_p=0.1)))
    cases = [(f"hdim {d} {mask}{suffix}", dict(causal=not args.full, **kw)) for suffix, kw in mods]
    print("| case | ms per call | SM MHz (median of samples) | power W |\n|---|---|---|---|")
    for name, kw in cases:
        fac.flash_attn_func(q, k, v, **kw)
        torch.cuda.synchronize()
        calls, clocks, powers = 0, [], []
        start = time.time()
        while time.time() - start < args.seconds:
            for _ in range(20):
                fac.flash_attn_func(q, k, v, **kw)
            calls += 20
            if time.time() - start > 0.5:
                mhz, watts = sample()
                clocks.append(mhz)
                powers.append(watts)
        torch.cuda.synchronize()
        ms = (time.time() - start) * 1e3 / calls
        clocks.sort()
        powers.sort()
        print(f"| {name} | {ms:.3f} | {clocks[len(clocks) // 2]:.0f} | {powers[len(powers) // 2]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
