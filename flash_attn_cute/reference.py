"""Independent PyTorch reference for (Flash)Attention, used to check the kernels.

Torch-only on purpose: nothing else from ``flash_attn_cute`` is imported, so the
reference stays usable (and testable on CPU) while the CUDA side is being built.

Conventions follow flash-attn 2.x:
  * q: (batch, seqlen_q, nheads, d); k: (batch, seqlen_k, nheads_k, d);
    v: (batch, seqlen_k, nheads_k, d_v).  GQA/MQA: query head h reads kv head
    h // (nheads // nheads_k).
  * causal masks are bottom-right aligned (flash-attn >= 2.1): query row i sees
    key j iff j <= i + seqlen_k - seqlen_q.
  * lse is the natural-log logsumexp of the *scaled* scores over visible keys,
    float32, shape (batch, nheads, seqlen_q).  A row that sees no key has
    output exactly 0 and lse = +inf (never NaN).
"""
import math

import torch

__all__ = ["attention_probs_ref", "attention_ref", "attention_scores_ref", "attention_varlen_ref", "rotary_ref"]


def _compute_dtype(dtype, upcast):
    """float32 when upcasting (float64 inputs stay float64), else the input dtype."""
    if not upcast:
        return dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, reorder_ops=False, window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_mask=None):
    """Reference attention for padded (batch, seqlen, nheads, d) tensors.

    Args:
        q: (batch, seqlen_q, nheads, d).
        k: (batch, seqlen_k, nheads_k, d), nheads % nheads_k == 0.
        v: (batch, seqlen_k, nheads_k, d_v); d_v may differ from d.
        causal: apply the bottom-right aligned causal mask.
        softmax_scale: defaults to 1 / sqrt(d).
        upcast: compute (and return ``out``) in float32 (float64 inputs stay
            float64).  If False, matmuls and softmax run in the inputs' dtype,
            like flash-attn's "low-precision reference", and ``out`` has that dtype.
        reorder_ops: multiply q by the scale before QK^T instead of scaling the
            scores afterwards (changes rounding only).
        window_size: (left, right); query i sees key j only if
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1: that
            side unbounded). causal is right = 0.
        softcap: > 0 replaces each scaled score s by softcap * tanh(s / softcap).
        alibi_slopes: (nheads,) or (batch, nheads); adds -slope * |i + seqlen_k - seqlen_q - j|
            to the (scaled, capped) score of query i and key j, or, causal without a left window,
            slope * j: flash-attn 2.x's kernel convention (the same output, as the two differ by a
            constant per row; the LSE carries that constant).
        dropout_p, dropout_mask: dropout of the probabilities: bool (batch, nheads, seqlen_q,
            seqlen_k), True where kept; kept probabilities are scaled by 1 / (1 - dropout_p). The
            LSE is that of the probabilities before dropout.

    Returns:
        (out, lse): out (batch, seqlen_q, nheads, d_v); lse (batch, nheads, seqlen_q)
        float32, +inf for rows that see no key.
    """
    assert q.dim() == k.dim() == v.dim() == 4, "expected (batch, seqlen, nheads, d) tensors"
    assert v.shape[:3] == k.shape[:3], "k and v must share (batch, seqlen_k, nheads_k)"
    dtype = _compute_dtype(q.dtype, upcast)
    attn, lse = _probs(q.to(dtype), k.to(dtype), causal, softmax_scale, reorder_ops, window_size, softcap, alibi_slopes)
    if dropout_mask is not None:
        attn = attn.masked_fill(~dropout_mask, 0.0) / (1 - dropout_p)
    groups = q.shape[2] // k.shape[2]
    v = v.to(dtype).repeat_interleave(groups, dim=2)  # GQA/MQA: kv head h // groups serves query head h
    out = torch.einsum("bhts,bshd->bthd", attn.to(v.dtype), v)
    return out, lse


def attention_probs_ref(q, k, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None):
    """The attention probabilities of :func:`attention_ref` in float32: (batch, nheads, seqlen_q,
    seqlen_k), rows that see no key all 0."""
    dtype = _compute_dtype(q.dtype, True)
    return _probs(q.to(dtype), k.to(dtype), causal, softmax_scale, False, window_size, softcap, alibi_slopes)[0]


def attention_scores_ref(q, k, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None):
    """The logits whose softmax :func:`attention_probs_ref` takes, in float32: (batch, nheads,
    seqlen_q, seqlen_k), scaled, capped, ALiBi-biased, -inf where the mask hides the key."""
    dtype = _compute_dtype(q.dtype, True)
    return _scores(q.to(dtype), k.to(dtype), causal, softmax_scale, False, window_size, softcap, alibi_slopes)[0]


def _probs(q, k, causal, softmax_scale, reorder_ops, window_size, softcap, alibi_slopes):
    """(softmax probabilities (batch, nheads, seqlen_q, seqlen_k), lse) in q's dtype (lse float32)."""
    scores, row_empty = _scores(q, k, causal, softmax_scale, reorder_ops, window_size, softcap, alibi_slopes)
    lse = torch.logsumexp(scores.float(), dim=-1)  # -inf for empty rows
    lse = lse.masked_fill(row_empty.view(1, 1, -1), float("inf"))

    # Fully masked rows would give softmax NaN (and NaN gradients): softmax a row of zeros instead
    # and zero its probabilities, so the output and every gradient of such a row are exactly 0.
    empty = row_empty.view(1, 1, -1, 1)
    attn = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return attn, lse


def _scores(q, k, causal, softmax_scale, reorder_ops, window_size, softcap, alibi_slopes):
    """(the masked logits (batch, nheads, seqlen_q, seqlen_k) in q's dtype, -inf where hidden; the
    rows that see no key, bool (seqlen_q,))."""
    batch, seqlen_q, nheads, d = q.shape
    _, seqlen_k, nheads_k, _ = k.shape
    assert k.shape[0] == batch and k.shape[3] == d
    assert nheads % nheads_k == 0, "nheads must be a multiple of nheads_k"
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    groups = nheads // nheads_k
    if groups > 1:  # GQA/MQA: kv head h // groups serves query head h
        k = k.repeat_interleave(groups, dim=2)

    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q * softmax_scale, k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k) * softmax_scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap

    row = torch.arange(seqlen_q, device=q.device).view(-1, 1)
    col = torch.arange(seqlen_k, device=q.device).view(1, -1)
    offset = row + (seqlen_k - seqlen_q) - col  # (seqlen_q, seqlen_k): how far key j lies left of the diagonal
    left, right = window_size
    if causal:
        right = 0
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(scores.dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, nheads, 1, 1)
        causal_form = left < 0 and right == 0
        bias = col.expand(seqlen_q, -1) if causal_form else -offset.abs()
        scores = scores + slopes * bias.to(scores.dtype)
    masked = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device)  # True = hidden
    if right >= 0:
        masked |= offset < -right
    if left >= 0:
        masked |= offset > left
    scores = scores.masked_fill(masked, float("-inf"))
    row_empty = masked.all(dim=-1) if seqlen_k else torch.ones(seqlen_q, dtype=torch.bool, device=q.device)
    return scores, row_empty


def attention_varlen_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False,
                         softmax_scale=None, upcast=True, reorder_ops=False, window_size=(-1, -1), softcap=0.0,
                         alibi_slopes=None, dropout_p=0.0, dropout_mask=None):
    """Reference attention for packed variable-length batches.

    Args:
        q: (total_q, nheads, d); k: (total_k, nheads_k, d); v: (total_k, nheads_k, d_v).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) cumulative sequence offsets.
            Sequences of length 0 (either side) are allowed.
        causal, softmax_scale, upcast, reorder_ops, window_size, softcap, alibi_slopes, dropout_p:
            as in :func:`attention_ref`, applied per sequence (bottom-right aligned per sequence;
            (batch, nheads) slopes give sequence b row b).
        dropout_mask: bool (batch, nheads, max_seqlen_q, max_seqlen_k); sequence b uses
            dropout_mask[b, :, :seqlen_q_b, :seqlen_k_b].

    Returns:
        (out, lse): out (total_q, nheads, d_v); lse (nheads, total_q) float32
        (flash-attn 2.x varlen layout).  Query rows with an empty key sequence
        (or hidden by the causal mask) give out 0 and lse +inf.
    """
    assert q.dim() == k.dim() == v.dim() == 3, "expected (total, nheads, d) tensors"
    cu_q = [int(x) for x in cu_seqlens_q.tolist()]
    cu_k = [int(x) for x in cu_seqlens_k.tolist()]
    assert len(cu_q) == len(cu_k) >= 1, "cu_seqlens_q / cu_seqlens_k must both have batch + 1 entries"
    total_q, nheads, _ = q.shape
    out = torch.zeros(total_q, nheads, v.shape[-1], dtype=_compute_dtype(q.dtype, upcast), device=q.device)
    lse = torch.full((nheads, total_q), float("inf"), dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0:
            continue
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        mask = None if dropout_mask is None else dropout_mask[b:b + 1, :, :q1 - q0, :k1 - k0]
        o_b, lse_b = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                                   softmax_scale=softmax_scale, upcast=upcast, reorder_ops=reorder_ops,
                                   window_size=window_size, softcap=softcap, alibi_slopes=slopes,
                                   dropout_p=dropout_p, dropout_mask=mask)
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = lse_b[0]
    return out, lse


def rotary_ref(x, cos, sin, positions, interleaved=True):
    """Rotary embedding of x (seqlen, nheads, d) in float32: row i is rotated by the angles of
    position positions[i], i.e. by cos[positions[i]] / sin[positions[i]] (each (rotary_dim / 2,)),
    on its first rotary_dim = 2 * cos.size(1) columns; the rest pass through. interleaved pairs
    columns (2j, 2j + 1), otherwise (j, j + rotary_dim / 2) (GPT-NeoX style)."""
    rotary_dim = 2 * cos.size(1)
    x = x.float()
    c = cos[positions].float().unsqueeze(1)  # (seqlen, 1, rotary_dim / 2)
    s = sin[positions].float().unsqueeze(1)
    xr = x[..., :rotary_dim]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, dim=-1)
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
