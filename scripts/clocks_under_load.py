"""Runs one forward back to back for a few seconds per case and samples the SM clock and board
power with nvidia-smi meanwhile: whether a feature's cost in the benchmark comes from the GPU
slowing its clock under the load, not from the kernel's instructions.

  python scripts/clocks_under_load.py [--seconds 3]
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
    args = parser.parse_args()
    s, h, d = 16384, 16, 128
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.rand(h, device="cuda") * 0.3
    cases = [("causal", dict(causal=True)), ("causal + softcap 30", dict(causal=True, softcap=30.0)),
             ("causal + ALiBi", dict(causal=True, alibi_slopes=slopes)),
             ("causal + softcap + ALiBi", dict(causal=True, softcap=30.0, alibi_slopes=slopes)),
             ("causal + dropout 0.1", dict(causal=True, dropout_p=0.1))]
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
