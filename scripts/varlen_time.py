#!/usr/bin/env python
"""Varlen against dense on the same tokens (a GPU machine). Times, on tokens // seqlen sequences of
seqlen tokens:
  varlen: flash_attn_varlen_func over them packed (total, heads, dim);
  dense:  flash_attn_func over them as (batch, seqlen, heads, dim);
  SDPA:   torch SDPA (FLASH_ATTENTION, CUDNN_ATTENTION) on those.
Forward and forward + backward, milliseconds (triton.testing.do_bench medians) and each as a ratio
against SDPA FLASH_ATTENTION's.
  python scripts/varlen_time.py [--hdim 128] [--dtype fp16] [--tokens 32768] [--seqlens 512,2048]
"""
import argparse
import contextlib

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_cute as fac


def median_ms(fn, grads=()):
    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=list(grads), return_mode="median")


def providers(batch, seqlen, heads, hdim, dtype, causal):
    q, k, v, dout = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    cu = torch.arange(0, (batch + 1) * seqlen, seqlen, device="cuda", dtype=torch.int32)
    packed = [x.detach().reshape(batch * seqlen, heads, hdim).requires_grad_() for x in (q, k, v)]
    sdpa = [x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    return {
        "varlen": (lambda: fac.flash_attn_varlen_func(*packed, cu, cu, seqlen, seqlen, causal=causal), packed,
                   dout.reshape(batch * seqlen, heads, hdim), None),
        "dense": (lambda: fac.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout, None),
        "SDPA FA2": (lambda: F.scaled_dot_product_attention(*sdpa, is_causal=causal), sdpa, dout.transpose(1, 2),
                     SDPBackend.FLASH_ATTENTION),
        "SDPA cuDNN": (lambda: F.scaled_dot_product_attention(*sdpa, is_causal=causal), sdpa, dout.transpose(1, 2),
                       SDPBackend.CUDNN_ATTENTION),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--seqlens", default="512,2048")
    args = parser.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    heads = 2048 // args.hdim
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, hdim {args.hdim}, {heads} heads, {args.tokens} tokens")
    print(f"{'seqlen':>6} {'causal':>6} {'provider':>10} {'fwd ms':>8} {'ratio':>6} {'fwd+bwd ms':>10} {'ratio':>6}")
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        for causal in (False, True):
            rows = {}
            for name, (fn, leaves, dout, backend) in providers(args.tokens // seqlen, seqlen, heads, args.hdim,
                                                                 dtype, causal).items():
                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    with torch.no_grad():
                        fwd = median_ms(fn)
                    step = median_ms(lambda: fn().backward(dout), leaves)
                rows[name] = (fwd, step)
            base = rows["SDPA FA2"]
            for name, (fwd, step) in rows.items():
                print(f"{seqlen:>6} {str(causal):>6} {name:>10} {fwd:8.3f} {fwd / base[0]:6.3f} {step:10.3f} "
                      f"{step / base[1]:6.3f}")


if __name__ == "__main__":
    main()
