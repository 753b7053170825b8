"""flash-attn 2.x compatible functions: same names, argument order, defaults and return values."""
import math

import torch
import torch.nn.functional as F

from . import validation as V
from ._ops import bwd, fwd


def _round_up_head_dim(x):
    """Pads the last dim to a multiple of 8 (the kernels move 16-byte vectors)."""
    pad = -x.size(-1) % V.ALIGN_ELEMENTS
    return F.pad(x, (0, pad)) if pad else x


def _kernel_layout(x):
    """x itself if the kernels take its layout, else a contiguous copy (for gradients, whose
    layout the caller does not choose). torch.compile cannot trace storage_offset() (nor a data
    pointer) in a backward graph, so there the gradient is simply made contiguous (a no-op for the
    usual contiguous one)."""
    if torch.compiler.is_compiling():
        return x.contiguous()
    ok = x.data_ptr() % 16 == 0 and V.layout_problem("dout", x) is None
    return x if ok else x.contiguous()


class _FlashAttnFunc(torch.autograd.Function):
    """fwd / bwd on inputs padded to a head dim that is a multiple of 8; gradients come back
    unpadded."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                deterministic, window_size, softcap, alibi_slopes, seqused_k):
        head_dim = q.size(-1)
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(head_dim)
        q, k, v = (_round_up_head_dim(x) for x in (q, k, v))
        mods = dict(window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, seqused_k=seqused_k)
        out, lse = fwd(q, k, v, softmax_scale=softmax_scale, causal=causal, cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **mods)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k)
        ctx.args = (head_dim, softmax_scale, causal, max_seqlen_q, max_seqlen_k, deterministic, window_size, softcap)
        ctx.mark_non_differentiable(lse)
        return out[..., :head_dim], lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k = ctx.saved_tensors
        head_dim, softmax_scale, causal, max_seqlen_q, max_seqlen_k, deterministic, window_size, softcap = ctx.args
        dout = _kernel_layout(_round_up_head_dim(dout))
        dq, dk, dv = bwd(dout, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, deterministic=deterministic, window_size=window_size,
                         softcap=softcap, alibi_slopes=alibi_slopes, seqused_k=seqused_k)
        return (dq[..., :head_dim], dk[..., :head_dim], dv[..., :head_dim]) + (None,) * 11


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
               window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None,
               varlen=False, seqused_k=None):
    if varlen:
        V.require_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    V.check_qkv(q, k, v, varlen)
    V.check_not_implemented(dropout_p, block_table)
    # window_size, softcap and alibi_slopes are checked by fwd, after the varlen arguments.
    out, lse = _FlashAttnFunc.apply(q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, bool(deterministic), window_size, softcap, alibi_slopes, seqused_k)
    return (out, lse, None) if return_attn_probs else out


def _unpack(packed, dim, n, name):
    if not isinstance(packed, torch.Tensor) or packed.dim() <= dim or packed.size(dim) != n:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        V._fail(f"{name} must have size {n} in dimension {dim}, got {shape}")
    return packed.unbind(dim)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, d); k, v: (batch, seqlen_k, nheads_k, d). Returns out like q,
    or (out, softmax_lse, None) with return_attn_probs."""
    return _attention(q, k, v, None, None, None, None, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv: (batch, seqlen, 3, nheads, d)."""
    q, k, v = _unpack(qkv, 2, 3, "qkv")
    return _attention(q, k, v, None, None, None, None, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, d); kv: (batch, seqlen_k, 2, nheads_k, d)."""
    k, v = _unpack(kv, 2, 2, "kv")
    return _attention(q, k, v, None, None, None, None, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
                           seqused_k=None):
    """q: (total_q, nheads, d); k, v: (total_k, nheads_k, d); cu_seqlens_*: int32 (batch + 1).
    softmax_lse is (nheads, total_q). seqused_k (int32 (batch,), an extension of flash-attn 2.x's
    low-level API): sequence b attends to only the first seqused_k[b] of its keys."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                      varlen=True, seqused_k=seqused_k)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):
    """qkv: (total, 3, nheads, d)."""
    q, k, v = _unpack(qkv, 1, 3, "qkv")
    return _attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, return_attn_probs, varlen=True)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (total_q, nheads, d); kv: (total_k, 2, nheads_k, d)."""
    k, v = _unpack(kv, 1, 2, "kv")
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, varlen=True)
