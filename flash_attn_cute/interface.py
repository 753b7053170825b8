"""flash-attn 2.x compatible functions: same names, argument order, defaults and return values."""
import math

import torch
import torch.nn.functional as F

from . import validation as V
from ._ops import (EAGER_CPP_AUTOGRAD, _require_kernel, bwd, check_fwd, dropout_mask, kernel_input, run_attention,
                   run_bwd, run_fwd)
from .reference import attention_scores_ref


def maybe_contiguous(x):
    """x, or a contiguous copy when its last dim is strided (None stays None), as flash-attn 2.x's
    helper of that name."""
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


def round_multiple(x, m):
    """x rounded up to a multiple of m."""
    return (x + m - 1) // m * m


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block width of flash-attn 2.x's forward kernels on `device` (its table, by compute
    capability; a non-CUDA device takes sm_80's): the blocks the S_dmask encoding of
    return_attn_probs (_flash_attn_S) is relative to, and flash-attn's tests split by."""
    if head_dim > V.MAX_HEAD_DIM:
        V._fail(f"head dim must be in [1, {V.MAX_HEAD_DIM}], got {head_dim}")
    device = torch.device(device)
    major, minor = torch.cuda.get_device_capability(device) if device.type == "cuda" else (8, 0)
    sm8x = major == 8 and minor > 0  # sm_86 / sm_89, not sm_80
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        if sm8x:
            return 64 if is_causal and not is_dropout else 32
        return 32 if is_dropout else 64
    if head_dim <= 160:
        return 64 if sm8x else 32
    return 64


def _round_up_head_dim(x):
    """Pads the last dim to a multiple of 8 (the kernels move 16-byte vectors)."""
    pad = -x.size(-1) % V.ALIGN_ELEMENTS
    return F.pad(x, (0, pad)) if pad else x


def _unpad_head_dim(x, head_dim):
    """x without the head-dim padding _round_up_head_dim added (x itself where there is none)."""
    return x if x.size(-1) == head_dim else x[..., :head_dim]


def _kernel_layout(x):
    """x itself if the kernels take its layout, else a copy (kernel_input; for gradients, whose
    layout the caller does not choose). torch.compile cannot trace storage_offset() (nor a data
    pointer) in a backward graph, so there the gradient is simply made contiguous (a no-op for the
    usual contiguous one)."""
    if torch.compiler.is_compiling():
        return x.contiguous()
    return kernel_input(x)


def _padded_forward(q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window,
                    softcap, alibi_slopes, seqused_k, dropout_p, keep_residual):
    """run_fwd on q, k, v padded to a head dim that is a multiple of 8 (or copied where the kernels
    cannot take their layout). Returns the padded q, k, v, out (padded), lse, rng_state (None
    without dropout) and, with dropout and keep_residual, out's rounding residual, which makes the
    backward's row sums exact (_ops.fwd)."""
    if q.size(-1) % V.ALIGN_ELEMENTS:
        q, k, v = (_round_up_head_dim(x) for x in (q, k, v))
    else:
        q, k, v = (kernel_input(x) for x in (q, k, v))
    residual = torch.empty_like(q) if dropout_p and keep_residual else None
    out, lse, *rng_state = run_fwd(q, k, v, None, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, window, softcap, alibi_slopes, seqused_k, dropout_p,
                                   out_residual=residual)
    return q, k, v, out, lse, (rng_state[0] if rng_state else None), residual


class _FlashAttnFunc(torch.autograd.Function):
    """The forward and backward kernels on arguments _attention checked, with the head dim padded
    to a multiple of 8; gradients come back unpadded."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                deterministic, window, softcap, alibi_slopes, seqused_k, dropout_p):
        head_dim = q.size(-1)
        q, k, v, out, lse, rng_state, residual = _padded_forward(
            q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, softcap,
            alibi_slopes, seqused_k, dropout_p, keep_residual=True)
        # Always a tensor (empty without dropout): torch.compile's backward takes no None output.
        if rng_state is None:
            rng_state = torch.empty(0, dtype=torch.int64, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k, rng_state,
                              residual)
        ctx.args = (head_dim, softmax_scale, causal, max_seqlen_q, max_seqlen_k, deterministic, window, softcap,
                    dropout_p)
        ctx.mark_non_differentiable(lse, rng_state)
        return _unpad_head_dim(out, head_dim), lse, rng_state

    @staticmethod
    def backward(ctx, dout, dlse, drng_state):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, seqused_k, rng_state, residual = ctx.saved_tensors
        (head_dim, softmax_scale, causal, max_seqlen_q, max_seqlen_k, deterministic, window, softcap,
         dropout_p) = ctx.args
        _require_kernel(q.dtype, head_dim, causal, window, softcap, alibi_slopes, max_seqlen_k, dropout_p, "backward")
        dout = _kernel_layout(_round_up_head_dim(dout))
        dq, dk, dv = run_bwd(dout, q, k, v, out, lse, None, None, None, softmax_scale, causal, cu_seqlens_q,
                             cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic, window, softcap, alibi_slopes,
                             seqused_k, dropout_p, rng_state if dropout_p else None, residual)
        return tuple(_unpad_head_dim(g, head_dim) for g in (dq, dk, dv)) + (None,) * 12


def _flash_attn_S(scores, block_n):
    """flash-attn 2.x's S_dmask values for the logits `scores` (float32 (..., seqlen_k), -inf where
    masked): exp(s - M_b), where M_b is the row's running maximum when its kernel, walking the key
    blocks of width block_n from the last to the first, has reached the block b of s (the maximum
    over blocks b..last); 0 where masked. Multiplying block b by exp(M_b - lse) (flash-attn's test
    helper normalize_flash_attn_S) recovers the probabilities."""
    seqlen_k = scores.size(-1)
    nblocks = -(-seqlen_k // block_n)
    blocks = F.pad(scores, (0, nblocks * block_n - seqlen_k), value=-math.inf).unflatten(-1, (nblocks, block_n))
    running_max = blocks.amax(-1).flip(-1).cummax(-1).values.flip(-1)
    running_max = running_max.masked_fill(running_max == -math.inf, 0.0)  # no key from block b on: exp(-inf) = 0
    # The exponential in float64, rounded once to float32: torch's float32 exp on the CPU gave results
    # off by up to 1e-4 (2e-5 relative) in 3 of 12 fresh processes under load (session 64's CI).
    return (blocks - running_max.unsqueeze(-1)).double().exp().float().flatten(-2)[..., :seqlen_k]


def _attn_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, keep, softmax_scale, causal, window,
                softcap, alibi_slopes, seqused_k):
    """return_attn_probs' S_dmask with dropout, in flash-attn 2.x's encoding: float32 (batch, nheads,
    max_seqlen_q, max_seqlen_k) holding exp(s - M_b) (_flash_attn_S, on the logits s recomputed in
    float32, block width _get_block_size_n(q.device, head dim, True, causal)), negated where dropout
    dropped the entry (keep: the bool keep mask), 0 outside the mask and past each sequence's
    lengths. For tests: O(seqlen^2) memory, and varlen reads cu_seqlens on the host."""
    block_n = _get_block_size_n(q.device, q.size(-1), True, causal)
    mods = dict(causal=causal, softmax_scale=softmax_scale, window_size=window, softcap=softcap)
    if cu_seqlens_q is None:
        probs = _flash_attn_S(attention_scores_ref(q, k, alibi_slopes=alibi_slopes, **mods), block_n)
    else:
        batch = cu_seqlens_q.numel() - 1
        probs = q.new_zeros((batch, q.size(-2), max_seqlen_q, max_seqlen_k), dtype=torch.float32)
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        used = seqused_k.tolist() if seqused_k is not None else None
        for b in range(batch):
            len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            if used is not None:
                len_k = max(0, min(len_k, used[b]))
            slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
            scores = attention_scores_ref(q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b] + len_k],
                                          alibi_slopes=slopes, **mods)
            probs[b, :, :len_q, :len_k] = _flash_attn_S(scores, block_n)[0]
    return torch.where(keep, probs, -probs)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
               window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None,
               varlen=False, seqused_k=None):
    if varlen:
        V.require_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    if block_table is not None:
        return _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                                block_table, seqused_k)
    checked = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_size, softcap,
               alibi_slopes, seqused_k, dropout_p)
    if not _op_checks(q, varlen, max_seqlen_q, max_seqlen_k, dropout_p):
        max_seqlen_q, max_seqlen_k, window = check_fwd(*checked, pads=True, softmax_scale=softmax_scale)
        return _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                       causal, window, softcap, alibi_slopes, deterministic, return_attn_probs, seqused_k)
    # The forward op checks every argument before it writes anything (csrc/fwd_api.cpp), so check_fwd
    # (9-16 us of a small call's ~32 on an H100 host) runs only to name the problem it raised.
    try:
        batch = cu_seqlens_q.size(0) - 1 if varlen else q.size(0)
        window = V.check_score_mods(window_size, softcap, alibi_slopes, batch, q.size(-2), q.device, softmax_scale)
        if not varlen:
            max_seqlen_q, max_seqlen_k = q.size(1), k.size(1)
        return _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                       causal, window, softcap, alibi_slopes, deterministic, return_attn_probs, seqused_k)
    except Exception as failure:
        V.raise_named(failure, check_fwd, *checked, pads=True, softmax_scale=softmax_scale)


def _op_checks(q, varlen, max_seqlen_q, max_seqlen_k, dropout_p):
    """Whether the forward op's own checks cover the call: outside torch.compile's tracing (where the
    Python checks cost nothing at run time), q a tensor of the right rank and a head dim that is a
    multiple of 8 (else the padded copies), the max lengths and dropout_p of the types the op takes."""
    return (not torch.compiler.is_compiling() and isinstance(q, torch.Tensor) and q.dim() == (3 if varlen else 4)
            and q.size(-1) % V.ALIGN_ELEMENTS == 0 and type(dropout_p) in (int, float)
            and (not varlen or (type(max_seqlen_q) is int and type(max_seqlen_k) is int)))


def _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window,
            softcap, alibi_slopes, deterministic, return_attn_probs, seqused_k):
    """The forward (through an autograd function where an input requires grad) on arguments checked
    or left to the op to check; window as check_score_mods returns it. Eager calls on head dims that
    are multiples of 8 take the C++ autograd function (_ops.run_attention: its backward runs without
    Python); torch.compile traces the Python one, which pads other head dims."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))  # the caller's head dim, not the padded one
    if EAGER_CPP_AUTOGRAD and not torch.compiler.is_compiling() and q.size(-1) % V.ALIGN_ELEMENTS == 0:
        out, lse, *rng_state = run_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                             softmax_scale, causal, window, softcap, alibi_slopes, seqused_k,
                                             dropout_p, deterministic)
        rng_state = rng_state[0] if rng_state else None
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse, rng_state = _FlashAttnFunc.apply(q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k,
                                                   max_seqlen_q, max_seqlen_k, bool(deterministic), window, softcap,
                                                   alibi_slopes, seqused_k, dropout_p)
    else:  # nothing to differentiate: no autograd function (its apply costs host time)
        *_, out, lse, rng_state, _ = _padded_forward(q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k, window, softcap, alibi_slopes,
                                                     seqused_k, dropout_p, keep_residual=False)
        out = _unpad_head_dim(out, q.size(-1))
    if not return_attn_probs:
        return out
    if not dropout_p:
        return out, lse, _no_attn_probs(q)
    return out, lse, _dropout_attn_probs(q.detach(), k.detach(), rng_state, dropout_p, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q, max_seqlen_k, softmax_scale, causal, window, softcap,
                                         alibi_slopes, seqused_k)


def _dropout_attn_probs(q, k, rng_state, dropout_p, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, causal, window, softcap, alibi_slopes, seqused_k):
    """_attn_probs under the keep mask the forward that returned rng_state applied, on arguments
    check_fwd passed (max_seqlen_q / _k are q's and k's lengths without cu_seqlens)."""
    batch = q.size(0) if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    keep = dropout_mask(rng_state, dropout_p, batch, q.size(-2), max_seqlen_q, max_seqlen_k, cu_seqlens_q,
                        cu_seqlens_k)
    return _attn_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, keep, softmax_scale, causal,
                       window, softcap, alibi_slopes, seqused_k)


def _no_attn_probs(q):
    """return_attn_probs' third value without dropout: an empty tensor of q's dtype, as flash-attn
    2.7+ returns (its kernels write the probabilities only with dropout)."""
    return q.new_empty((0,))


def _paged_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window,
                   softcap, alibi_slopes, seqused_k, block_table):
    """run_fwd over a paged K / V on arguments check_fwd passed, the head dim padded to a multiple of
    8 (q and every page) as flash-attn 2.x pads it; returns (out, lse), out unpadded."""
    head_dim = q.size(-1)
    if head_dim % V.ALIGN_ELEMENTS:
        q, k, v = (_round_up_head_dim(x) for x in (q, k, v))
    else:
        q, k, v = (kernel_input(x) for x in (q, k, v))
    out, lse = run_fwd(q, k, v, None, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       window, softcap, alibi_slopes, seqused_k, 0.0, block_table)
    return _unpad_head_dim(out, head_dim), lse


class _PagedAttnFunc(torch.autograd.Function):
    """The paged forward for inputs that require grad: its output joins the autograd graph (as
    flash-attn 2.x's does), and its backward raises, as flash-attn 2.x has none over a paged K / V."""

    @staticmethod
    def forward(ctx, q, k, v, *args):
        out, lse = _paged_forward(q, k, v, *args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise NotImplementedError("flash_attn_cute: flash_attn_varlen_func with block_table (a paged K / V) has no "
                                  "backward, as in flash-attn 2.x: the forward ran, but gradients cannot flow "
                                  "through it")


def _paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, seqused_k):
    """flash_attn_varlen_func over a paged K / V: forward only, like flash-attn 2.x."""
    max_seqlen_q, max_seqlen_k, window = check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, window_size, softcap, alibi_slopes, seqused_k, dropout_p,
                                                   block_table, pads=True, softmax_scale=softmax_scale)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))  # the caller's head dim, not the padded one
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window, softcap,
            alibi_slopes, seqused_k, block_table)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _PagedAttnFunc.apply(q, k, v, *args)
    else:
        out, lse = _paged_forward(q, k, v, *args)
    return (out, lse, _no_attn_probs(q)) if return_attn_probs else out


def _unpack(packed, dim, n, name):
    if not isinstance(packed, torch.Tensor) or packed.dim() <= dim or packed.size(dim) != n:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        V._fail(f"{name} must have size {n} in dimension {dim}, got {shape}")
    return packed.unbind(dim)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, d); k, v: (batch, seqlen_k, nheads_k, d). Returns out like q,
    or with return_attn_probs (out, softmax_lse, S_dmask). With dropout_p > 0, S_dmask is float32
    (batch, nheads, seqlen_q, seqlen_k) in flash-attn 2.x's encoding: exp(s - M_b) for the logit s
    (scaled, capped, ALiBi-biased) of each visible entry, where M_b is the row's maximum logit over
    key blocks b..last (blocks of _get_block_size_n(q.device, d, True, causal) keys), negated where
    dropout dropped the entry, 0 where masked; block b times exp(M_b - softmax_lse) gives the
    probabilities (flash-attn's test helper normalize_flash_attn_S). For tests: recomputed in
    O(seqlen^2) memory. Without dropout S_dmask is an empty tensor, as in flash-attn 2.7+.
    dropout_p drops attention probabilities (training) with torch's CUDA generator: torch.manual_seed
    reproduces a run, and the backward redraws the same mask."""
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
    low-level API): sequence b attends to only the first seqused_k[b] of its keys. block_table (int32
    (batch, max_blocks_per_seq)): k, v are a paged cache (num_blocks, page_size, nheads_k, d), page
    size a multiple of 16, and sequence b's cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys sit in pages
    block_table[b]; forward only, as in flash-attn 2.x (inputs may require grad; a backward through
    the output raises NotImplementedError)."""
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


# --- flash-attn 2.7+'s low-level helpers (flash_attn_interface._flash_attn_*), over fwd / bwd ---
def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                        alibi_slopes, return_softmax):
    """q: (batch, seqlen_q, nheads, d), k, v: (batch, seqlen_k, nheads_k, d), d a multiple of 8 (the
    callers pad, as flash-attn's do). Returns (out, softmax_lse, S_dmask, rng_state): S_dmask as
    return_attn_probs' (return_softmax needs dropout_p > 0), else an empty tensor; rng_state int64
    (2,) (unset without dropout), for _flash_attn_backward."""
    return _low_level_forward(q, k, v, None, None, None, None, dropout_p, softmax_scale, causal,
                              (window_size_left, window_size_right), softcap, alibi_slopes, return_softmax)


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False):
    """_flash_attn_forward's varlen form: q (total_q, nheads, d), k, v (total_k, nheads_k, d), or paged
    (num_blocks, page_size, nheads_k, d) with block_table. zero_tensors changes nothing: every row of
    out and softmax_lse is written (rows outside every sequence: 0 and +inf). leftpad_k (int32
    (batch,)): sequence b's keys start leftpad_k[b] rows into its cu_seqlens_k range, without a
    paged K / V or dropout (fwd's leftpad_k)."""
    return _low_level_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                              softmax_scale, causal, (window_size_left, window_size_right), softcap, alibi_slopes,
                              return_softmax, block_table, seqused_k, leftpad_k)


def _low_level_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, return_softmax, block_table=None, seqused_k=None,
                       leftpad_k=None):
    if return_softmax and not dropout_p:
        V._fail("return_softmax needs dropout_p > 0 (S_dmask is written only with dropout, as in flash-attn 2.x)")
    q, k, v = (kernel_input(x) if isinstance(x, torch.Tensor) else x for x in (q, k, v))
    max_seqlen_q, max_seqlen_k, window = check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, window_size, softcap, alibi_slopes, seqused_k, dropout_p,
                                                   block_table, leftpad_k=leftpad_k, softmax_scale=softmax_scale)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))
    out, lse, *rng_state = run_fwd(q, k, v, None, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, window, softcap, alibi_slopes, seqused_k, dropout_p, block_table,
                                   leftpad_k=leftpad_k)
    rng_state = rng_state[0] if rng_state else torch.empty(2, dtype=torch.int64, device=q.device)
    if not return_softmax:
        return out, lse, _no_attn_probs(q), rng_state
    S_dmask = _dropout_attn_probs(q, k, rng_state, dropout_p, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  softmax_scale, causal, window, softcap, alibi_slopes, seqused_k)
    return out, lse, S_dmask, rng_state


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """The backward of _flash_attn_forward: writes the gradients into dq, dk, dv (like q, k, v; a
    layout the kernels take) and returns softmax_d, flash-attn 2.x's float32 (batch, nheads,
    round_multiple(seqlen_q, 128)) row sums D = rowsum(dout * out) * (1 - dropout_p) (0 past seqlen_q).
    With dropout, D comes from the rounded out, as in flash-attn 2.x (flash_attn_func's backward
    also adds out's rounding residual, which this signature has no room for)."""
    _low_level_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, None, None, None, None, dropout_p, softmax_scale,
                        causal, (window_size_left, window_size_right), softcap, alibi_slopes, deterministic, rng_state)
    return _softmax_d(dout, out, dropout_p, None)


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None, zero_tensors=False):
    """_flash_attn_backward's varlen form; softmax_d is (nheads, total_q + 128 * batch), sequence b's
    rows from column cu_seqlens_q[b] + 128 * b, as flash-attn 2.x lays it out. zero_tensors changes
    nothing (every gradient row is written)."""
    _low_level_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, dropout_p, softmax_scale, causal, (window_size_left, window_size_right), softcap,
                        alibi_slopes, deterministic, rng_state)
    return _softmax_d(dout, out, dropout_p, cu_seqlens_q)


def _low_level_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                        deterministic, rng_state):
    dout, q, k, v, out = (kernel_input(x) if isinstance(x, torch.Tensor) else x for x in (dout, q, k, v, out))
    bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale=softmax_scale, causal=causal,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        deterministic=deterministic, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        dropout_p=dropout_p, rng_state=rng_state if dropout_p else None)


def _softmax_d(dout, out, dropout_p, cu_seqlens_q):
    """flash-attn 2.x's softmax_d: rowsum(dout * out) * (1 - dropout_p) in float32, (batch, nheads,
    seqlen_q rounded up to 128) or varlen (nheads, total_q + 128 * batch), 0 where no row maps."""
    rows = (dout.float() * out.float()).sum(-1) * (1 - dropout_p)  # (batch, seqlen_q, nheads) / (total_q, nheads)
    if cu_seqlens_q is None:
        rows = rows.transpose(1, 2)
        return F.pad(rows, (0, round_multiple(rows.size(-1), 128) - rows.size(-1)))
    total_q, batch = rows.size(0), cu_seqlens_q.numel() - 1
    index = torch.arange(total_q, device=rows.device, dtype=cu_seqlens_q.dtype)
    sequence = torch.searchsorted(cu_seqlens_q[1:], index, right=True)  # rows past cu_seqlens_q[-1]: batch
    softmax_d = rows.new_zeros(rows.size(1), total_q + 128 * batch)
    softmax_d[:, index + 128 * sequence] = rows.t()
    return softmax_d
