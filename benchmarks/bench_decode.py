#!/usr/bin/env python
"""Decode benchmark: one query row per sequence over a KV cache (flash_attn_with_kvcache).

Grid (issue 4): batch {1, 8, 32, 64} x cache length {1k, 8k, 32k, 128k}, 32 query heads over 8 KV
heads, hdim 128 (--hdim), bf16 (--dtype), a contiguous cache and a paged one (page size 256
(--page-size), pages shuffled).
Reported per point: microseconds per call (triton.testing.do_bench median of a CUDA graph of 20
calls, as decoders run: GPU time without Python overhead; --eager: back-to-back calls from Python,
host time included), GB/s of K/V read, that
rate as a % of the device-to-device copy bandwidth measured in the same run, and the speed ratio
against torch SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends (enable_gqa=True) on the
same contiguous cache. Examples:
  python benchmarks/bench_decode.py --out benchmarks/results/h200_decode
  python benchmarks/bench_decode.py --batches 8 --lengths 8192 --layouts paged
  python benchmarks/bench_decode.py --batches 1 --profile   (GPU time per kernel of each call)
  python benchmarks/bench_decode.py --append 1   (a decoder's step: append one rotated key / value, then attend)
"""
import argparse
import json
import math
import sys
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NHEADS, NHEADS_K = 32, 8
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SDPA = {"FA2": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION}


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int_list, default=[1, 8, 32, 64])
    p.add_argument("--lengths", type=int_list, default=[1024, 8192, 32768, 131072])
    p.add_argument("--layouts", default="contiguous,paged", help="comma list of contiguous,paged")
    p.add_argument("--hdim", type=int, default=128, help="head dim (the issue's grid: 128)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--page-size", type=int, default=256,
                   help="the paged layout's page size (below the kernel's key block, rows are looked up one by one)")
    p.add_argument("--out", metavar="PREFIX", help="write <PREFIX>.md and <PREFIX>.json")
    p.add_argument("--num-splits", type=int, default=0, help="flash_attn_with_kvcache's num_splits (0: heuristic)")
    p.add_argument("--append", type=int, default=0, metavar="N",
                   help="a decoder's step: each call also appends N new keys and values (the last N of the cache "
                        "length) for N query rows, with rotary embedding on k and q, causal (SDPA: the attention "
                        "alone, not causal)")
    p.add_argument("--eager", action="store_true",
                   help="time back-to-back calls launched one by one from Python (host time included where it "
                        "exceeds the GPU's) instead of replayed from a CUDA graph")
    p.add_argument("--profile", action="store_true",
                   help="also print each kernel's GPU time per flash_attn_cute call (torch.profiler)")
    return p.parse_args(argv)


def bench(fn):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # us


def bench_eager(fn, calls=50, repeats=7):
    """Microseconds per call of `calls` back-to-back calls of fn launched from Python (median of
    `repeats`), as an eager decode loop runs them: the host's time per call where it exceeds the GPU's."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def bench_graph(fn, calls=20):
    """Microseconds per call of fn replayed from a CUDA graph of `calls` calls, as a decoder runs it:
    GPU time only, without the Python and launch overhead between calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return bench(graph.replay) / calls


def copy_bandwidth():
    """Device-to-device copy rate in GB/s (bytes read + written), 1 GiB buffers."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = bench(lambda: dst.copy_(src))
    return 2 * src.numel() / us / 1e3


def kernel_times(fn, calls=20):
    """{kernel name: microseconds per call} of fn, from torch.profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.key] = times.get(event.key, 0.0) + event.device_time_total / calls
    return times


def run_point(fac, batch, length, layout, hdim=128, num_splits=0, profile=False, dtype=torch.bfloat16,
              page_size=256, append=0, eager=False):
    """{name: microseconds} for one grid point, plus the max |difference| of cute against FA2 (not
    measured with append, whose rotary embedding SDPA does not apply)."""
    q = torch.randn(batch, max(append, 1), NHEADS, hdim, device="cuda", dtype=dtype)
    seqlens = torch.full((batch,), length - append, device="cuda", dtype=torch.int32)
    times, diff = {}, float("nan")
    if layout == "paged":
        pages_per_seq = math.ceil(length / page_size)
        capacity = pages_per_seq * page_size
        k_cache = torch.randn(batch * pages_per_seq, page_size, NHEADS_K, hdim, device="cuda", dtype=dtype)
        table = torch.randperm(batch * pages_per_seq, device="cuda").view(batch, pages_per_seq).to(torch.int32)
    else:
        capacity = length
        k_cache = torch.randn(batch, length, NHEADS_K, hdim, device="cuda", dtype=dtype)
        table = None
    v_cache = torch.randn_like(k_cache)
    kwargs = {}
    if append:
        angles = torch.outer(torch.arange(capacity, device="cuda", dtype=torch.float32),
                             10000.0 ** -(torch.arange(0, hdim, 2, device="cuda", dtype=torch.float32) / hdim))
        kwargs = dict(k=torch.randn(batch, append, NHEADS_K, hdim, device="cuda", dtype=dtype),
                      v=torch.randn(batch, append, NHEADS_K, hdim, device="cuda", dtype=dtype),
                      rotary_cos=angles.cos().to(dtype), rotary_sin=angles.sin().to(dtype), causal=True)
    call = lambda: fac.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                              num_splits=num_splits, **kwargs)
    out = call()
    timer = bench_eager if eager else bench_graph
    times["cute"] = timer(call)
    if profile:
        print_kernel_times(batch, length, layout, call)
    if layout == "paged":  # SDPA has no paged form
        return times, diff
    qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    for name, backend in SDPA.items():
        try:
            with sdpa_kernel(backend):
                ref = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                times[name] = timer(sdpa)
                if profile:
                    print_kernel_times(batch, length, name, sdpa)
            if name == "FA2" and not append:
                diff = (ref.transpose(1, 2).float() - out.float()).abs().max().item()
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            print(f"  {name} b{batch} L{length}: {str(exc).splitlines()[0][:100]}", file=sys.stderr)
    return times, diff


def print_kernel_times(batch, length, layout, call):
    for name, us in sorted(kernel_times(call).items(), key=lambda kv: -kv[1]):
        print(f"  profile {layout} b{batch} L{length}: {us:7.1f} us  {name[:110]}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    import flash_attn_cute as fac

    copy_gbs = copy_bandwidth()
    rows = []
    for layout in args.layouts.split(","):
        for batch in args.batches:
            for length in args.lengths:
                times, diff = run_point(fac, batch, length, layout, args.hdim, args.num_splits, args.profile,
                                        DTYPES[args.dtype], args.page_size, args.append, args.eager)
                kv_bytes = 2 * batch * length * NHEADS_K * args.hdim * 2
                gbs = kv_bytes / times["cute"] / 1e3
                row = dict(layout=layout, batch=batch, length=length, us=times["cute"], gbs=gbs,
                           pct_copy=100 * gbs / copy_gbs, kv_mb=kv_bytes / 1e6, maxdiff=diff,
                           **{f"vs_{n}": times[n] / times["cute"] for n in SDPA if n in times})
                rows.append(row)
                print(f"{layout:10s} b{batch:3d} L{length:6d}: {row['us']:8.1f} us {gbs:7.0f} GB/s "
                      f"({row['pct_copy']:5.1f}% of copy) " +
                      " ".join(f"vs {n} {row['vs_' + n]:.2f}x" for n in SDPA if 'vs_' + n in row), flush=True)
                torch.cuda.empty_cache()
    lines = [f"# Decode benchmark ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{torch.cuda.get_device_name()})", "",
             f"{NHEADS} query heads, {NHEADS_K} KV heads, hdim {args.hdim}, {args.dtype}, seqlen_q {max(args.append, 1)}; paged: page size "
             f"{args.page_size}. Copy bandwidth measured in this run: {copy_gbs:.0f} GB/s. Ratios are speedups "
             "(SDPA time / cute time) on the contiguous cache." +
             (" Calls launched one by one (--eager), not from a CUDA graph." if args.eager else "") +
             (f" Each cute call appends {args.append} rotated keys / values (the cache's last rows) and rotates q; "
              "SDPA only attends." if args.append else ""), "",
             "| layout | batch | cache len | K/V MB | us | GB/s | % copy BW | vs FA2 | vs cuDNN | max diff vs FA2 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = {n: f"{r['vs_' + n]:.2f}" if "vs_" + n in r else "-" for n in SDPA}
        lines.append(f"| {r['layout']} | {r['batch']} | {r['length']} | {r['kv_mb']:.0f} | {r['us']:.1f} | "
                     f"{r['gbs']:.0f} | {r['pct_copy']:.1f} | {ratio['FA2']} | {ratio['cuDNN']} | "
                     f"{r['maxdiff']:.1e} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(args.out + ".json", "w") as f:
            json.dump(dict(copy_gbs=copy_gbs, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
