"""The compiled ops (torch.ops.flash_attn_cute.*), their fake implementations, and the low-level
`fwd` entry point."""
import math

import torch

from . import validation as V

try:
    from . import _C  # noqa: F401  (registers torch.ops.flash_attn_cute.*)
    _IMPORT_ERROR = None
except ImportError as exc:  # a CPU-only install: the pure-Python parts still work
    _C = None
    _IMPORT_ERROR = exc

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # include/flash_attn_cute/tile_size.h


def kernel_head_dim(head_dim):
    """The kernel a (multiple-of-8) head dim runs on."""
    return next(d for d in _KERNEL_HEAD_DIMS if head_dim <= d)


# {(dtype name, kernel head dim, causal)} compiled into this install (empty without CUDA); read
# once so that torch.compile sees a constant.
BUILT_FWD_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_fwd_kernels())


def _require_kernel(dtype, head_dim, causal):
    if _C is None:
        raise RuntimeError("flash_attn_cute was installed without its CUDA extension "
                           f"(import failed: {_IMPORT_ERROR}); reinstall on a machine with CUDA torch")
    key = (_DTYPE_NAMES[dtype], kernel_head_dim(head_dim), causal)
    if key not in BUILT_FWD_KERNELS:
        raise NotImplementedError(
            f"flash_attn_cute: this build has no forward kernel for {key[0]}, head dim {head_dim} "
            f"(kernel {key[1]}), causal={causal}; rebuild with FLASH_ATTN_CUTE_HDIMS / FLASH_ATTN_CUTE_DTYPES")


if _C is not None:
    @torch.library.register_fake("flash_attn_cute::fwd")
    def _fwd_fake(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal):
        if cu_seqlens_q is not None:
            return q.new_empty((q.size(1), q.size(0)), dtype=torch.float32)
        return q.new_empty((q.size(0), q.size(2), q.size(1)), dtype=torch.float32)


def fwd(q, k, v, out=None, softmax_scale=None, causal=False, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=None, max_seqlen_k=None):
    """Low-level forward: returns (out, softmax_lse).

    q: (batch, seqlen_q, nheads, d), k/v: (batch, seqlen_k, nheads_k, d); or, with cu_seqlens_q/k
    (int32, batch + 1) and max_seqlen_q/k, the varlen forms (total, nheads, d). d must be a multiple
    of 8 and at most 256 (the flash_attn_* functions pad other head dims). softmax_lse is fp32
    (batch, nheads, seqlen_q), or (nheads, total_q) for varlen; rows that see no key get out = 0 and
    lse = +inf. `out`, if given, is written in place.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    V.check_qkv(q, k, v, varlen)
    if q.size(-1) % V.ALIGN_ELEMENTS:
        V._fail(f"fwd needs a head dim that is a multiple of {V.ALIGN_ELEMENTS}, got {q.size(-1)} "
                "(flash_attn_func pads it for you)")
    if varlen:
        V.check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    else:
        max_seqlen_q, max_seqlen_k = q.size(1), k.size(1)
    if out is not None:
        V.check_out(out, q)
    tensors = dict(q=q, k=k, v=v, out=out)
    V.check_layout(**{n: t for n, t in tensors.items() if t is not None})
    V.check_device(**tensors, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _require_kernel(q.dtype, q.size(-1), bool(causal))
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))
    if out is None:
        out = torch.empty_like(q)
    lse = torch.ops.flash_attn_cute.fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        float(softmax_scale), bool(causal))
    return out, lse
