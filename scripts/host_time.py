#!/usr/bin/env python
"""Host time of eager calls, piece by piece (a GPU machine): what a caller that launches each call
from Python pays beyond the GPU's own time.

Prints microseconds per call (time.perf_counter over back-to-back calls on shapes small enough that
the GPU keeps up, so this is the host's time), next to torch SDPA (FLASH_ATTENTION,
CUDNN_ATTENTION) on the same tensors:
  decode: flash_attn_with_kvcache with and without an append, each Python check, the op called
          directly; then the cProfile of the append call (batch 1, 32 query heads over 8 KV heads,
          hdim 128, bf16).
  decode_func: flash_attn_func on a decode step's shapes (no grad; bf16, hdim 128).
  train:  flash_attn_func forward (no grad) and forward + backward (batch 1, 128 rows, 16 heads,
          hdim 64 and 128, fp16), and their pieces.
  python scripts/host_time.py [--parts decode,decode_func,train] [--length 1024]
"""
import argparse
import contextlib
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_cute as fac
from flash_attn_cute import _ops
from flash_attn_cute import kvcache as K
from flash_attn_cute import validation as V


def host_us(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def print_rows(rows):
    """rows: (name, fn) or (name, fn, SDPA backend), timed inside sdpa_kernel(backend)."""
    for name, fn, *backend in rows:
        try:
            with sdpa_kernel(backend[0]) if backend else contextlib.nullcontext():
                print(f"{name:44s} {host_us(fn):8.2f}")
        except (RuntimeError, TypeError) as e:  # a tree with other ops or kernels
            print(f"{name:44s}      n/a ({str(e).splitlines()[0][:60]})")


def sdpa_rows(q, k, v, **kwargs):
    """SDPA's backends on q, k, v in flash-attn's (batch, seqlen, heads, dim) layout; out in it too."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, **kwargs).transpose(1, 2)  # noqa: E731
    return [("SDPA FLASH_ATTENTION", fn, SDPBackend.FLASH_ATTENTION),
            ("SDPA CUDNN_ATTENTION", fn, SDPBackend.CUDNN_ATTENTION)]


def train(args):
    dev, dt, b, s, h = "cuda", torch.float16, 1, 128, 16
    for d in (64, 128):
        q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)

        def fwd_bwd(fn):
            def step():
                q.grad = k.grad = v.grad = None
                fn().backward(dout)
            return step

        print(f"\nfp16 batch {b}, {s} rows, {h} heads, hdim {d}, causal: host microseconds per call")
        with torch.no_grad():
            print_rows([("flash_attn_func forward (no grad)", lambda: fac.flash_attn_func(q, k, v, causal=True)),
                        ("  check_fwd", lambda: _ops.check_fwd(q, k, v, None, None, None, None, True, (-1, -1), 0.0,
                                                              None, None, 0.0, pads=True)),
                        ("  fwd (the low-level call)", lambda: fac.fwd(q, k, v, causal=True))]
                       + sdpa_rows(q, k, v, is_causal=True))
        print_rows([("flash_attn_func forward + backward", fwd_bwd(lambda: fac.flash_attn_func(q, k, v, causal=True)))]
                   + [(name + ", forward + backward", fwd_bwd(fn), backend)
                      for name, fn, backend in sdpa_rows(q, k, v, is_causal=True)])


def decode_func(args):
    """flash_attn_func on a decode step's shapes (one query row over the cache's keys, no grad), as
    callers with their own cache (transformers) call it."""
    dev, dt, b, h, hk, d, n = "cuda", torch.bfloat16, 1, 32, 8, 128, args.length
    q = torch.randn(b, 1, h, d, device=dev, dtype=dt)
    k, v = (torch.randn(b, n, hk, d, device=dev, dtype=dt) for _ in range(2))
    print(f"\nbf16 batch {b}, one query row, {h} / {hk} heads, hdim {d}, {n} keys: host microseconds per call")
    print_rows([("flash_attn_func", lambda: fac.flash_attn_func(q, k, v, causal=True))]
               + sdpa_rows(q, k, v, enable_gqa=True))


def decode(args):
    dev, dt, b, h, hk, d, n = "cuda", torch.bfloat16, 1, 32, 8, 128, args.length
    q = torch.randn(b, 1, h, d, device=dev, dtype=dt)
    k_cache = torch.randn(b, n + 64, hk, d, device=dev, dtype=dt)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(b, 1, hk, d, device=dev, dtype=dt), torch.randn(b, 1, hk, d, device=dev, dtype=dt)
    cos = torch.randn(n + 64, d // 2, device=dev, dtype=dt)
    sin = torch.randn_like(cos)
    seqlens = torch.full((b,), n - 1, dtype=torch.int32, device=dev)
    seqused = torch.full((b,), n, dtype=torch.int32, device=dev)
    op = torch.ops.flash_attn_cute.fwd_kvcache.default

    plain = lambda: fac.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqused)
    append = lambda: fac.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens=seqlens,
                                                 causal=True)
    rows = [
        ("flash_attn_with_kvcache, no append", plain),
        ("flash_attn_with_kvcache, append + rotary", append),
        ("  check_score_mods", lambda: V.check_score_mods((-1, -1), 0.0, None, b, h, q.device, None)),
        ("  check_kvcache, no append", lambda: K.check_kvcache(q, k_cache, v_cache, None, None, None, None, seqused,
                                                               None, None, None, 0)),
        ("  check_kvcache, append + rotary", lambda: K.check_kvcache(q, k_cache, v_cache, k, v, cos, sin, seqlens,
                                                                     None, None, None, 0)),
        ("  _require_kernel", lambda: _ops._require_kernel(q.dtype, d, False, (-1, -1), 0.0, None, n + 64)),
        ("  kernel_input(q)", lambda: _ops.kernel_input(q)),
        ("  torch.empty(q.shape)", lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device)),
        ("  op fwd_kvcache, no append", lambda: op(q, k_cache, v_cache, None, None, None, None, seqused, 0, None,
                                                     None, None, d ** -0.5, False, -1, -1, 0.0, True, None, 0)),
        ("  op fwd_kvcache, append + rotary", lambda: op(q, k_cache, v_cache, k, v, cos, sin, seqlens, 0, None, None,
                                                           None, d ** -0.5, True, -1, -1, 0.0, True, None, 0)),
        ("  torch.ops.aten.empty.memory_format", lambda: torch.ops.aten.empty.memory_format(
            [b], dtype=torch.int32, device=q.device)),
    ]
    rows += sdpa_rows(q, k_cache[:, :n], v_cache[:, :n], enable_gqa=True)
    print(f"bf16 batch {b}, {h} / {hk} heads, hdim {d}, {n} keys: host microseconds per call")
    print_rows(rows)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        append()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="decode,decode_func,train")
    p.add_argument("--length", type=int, default=1024, help="decode: the cache's keys")
    args = p.parse_args()
    for part in args.parts.split(","):
        {"decode": decode, "decode_func": decode_func, "train": train}[part](args)


if __name__ == "__main__":
    main()
