"""Smoke test of each kernel path with a watchdog: prints a line per path, and every thread's stack
if a step hangs (faulthandler). Run from outside the source tree: python3 /path/to/scripts/smoke.py"""
import faulthandler
import sys

import torch

import flash_attn_cute as fac

LIMIT = float(sys.argv[1]) if len(sys.argv) > 1 else 30
print("flash_attn_cute from", fac.__file__, "kernels", len(fac.BUILT_FWD_KERNELS), flush=True)
dev, bf16 = "cuda", torch.bfloat16


def step(name, fn):
    faulthandler.dump_traceback_later(LIMIT, exit=True)  # per step
    print(f"{name} ...", flush=True)
    out = fn()
    torch.cuda.synchronize()
    print(f"{name}: ok, finite={bool(torch.isfinite(out).all())}", flush=True)


def r(*s):
    return torch.randn(*s, device=dev, dtype=bf16)


step("plain fwd", lambda: fac.flash_attn_func(r(8, 1024, 16, 128), r(8, 1024, 16, 128), r(8, 1024, 16, 128)))
kc, vc = r(2, 512, 8, 128), r(2, 512, 8, 128)
step("kvcache one split (plain kernel)", lambda: fac.flash_attn_with_kvcache(r(2, 1, 8, 128), kc, vc, cache_seqlens=100,
                                                                            num_splits=1))
pc = r(64, 16, 8, 128)
table = torch.arange(64, device=dev, dtype=torch.int32).view(2, 32)
step("kvcache paged one split (split kernel alone)",
     lambda: fac.flash_attn_with_kvcache(r(2, 1, 8, 128), pc, pc, cache_seqlens=100, block_table=table, num_splits=1))
step("small fwd (split kernel + combine)", lambda: fac.flash_attn_func(r(1, 128, 8, 128), r(1, 128, 8, 128),
                                                                       r(1, 128, 8, 128)))
step("split fwd (decode shape)", lambda: fac.flash_attn_func(r(1, 1, 8, 128), r(1, 4096, 8, 128), r(1, 4096, 8, 128)))
step("gqa packed split", lambda: fac.flash_attn_func(r(1, 1, 32, 128), r(1, 4096, 8, 128), r(1, 4096, 8, 128)))
step("kvcache dense", lambda: fac.flash_attn_with_kvcache(r(2, 1, 8, 128), kc, vc, cache_seqlens=100))
step("kvcache append", lambda: fac.flash_attn_with_kvcache(r(2, 1, 8, 128), kc, vc, r(2, 2, 8, 128), r(2, 2, 8, 128),
                                                            cache_seqlens=100))
step("kvcache paged", lambda: fac.flash_attn_with_kvcache(r(2, 1, 8, 128), pc, pc, cache_seqlens=100, block_table=table))


def backward():
    q, k, v = (r(1, 256, 8, 128).requires_grad_() for _ in range(3))
    fac.flash_attn_func(q, k, v, causal=True).sum().backward()
    return q.grad


step("bwd", backward)


def dropout():
    q, k, v = (r(1, 256, 8, 128).requires_grad_() for _ in range(3))
    fac.flash_attn_func(q, k, v, causal=True, dropout_p=0.1).sum().backward()
    return q.grad


step("dropout fwd + bwd", dropout)
