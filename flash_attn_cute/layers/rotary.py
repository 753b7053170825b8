"""flash-attn 2.x's ``flash_attn.layers.rotary.apply_rotary_emb`` in torch operations (differentiable;
flash-attn's tests build their rotary reference with it)."""
import torch

from ..reference import rotary_ref

__all__ = ["apply_rotary_emb"]


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """Rotary embedding of x's first rotary_dim = 2 * cos.size(1) columns, as flash-attn 2.x's.

    x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (int32 (batch +
    1,)). cos, sin: (seqlen_rotary, rotary_dim / 2). Row i of a sequence takes the angles of position
    i + seqlen_offsets (an int or a (batch,) tensor); a position past seqlen_rotary is left as it is.
    interleaved rotates columns (2j, 2j + 1) (GPT-J), otherwise (j, j + rotary_dim / 2) (GPT-NeoX).
    Computed in float32 and returned in x's dtype; inplace writes the result into x and returns it.
    max_seqlen is accepted for flash-attn's signature."""
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        positions = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
        sequence = torch.arange(batch, device=x.device)[:, None].expand(batch, seqlen)
        flat = x.reshape(batch * seqlen, *x.shape[2:])
    else:  # rows outside [cu_seqlens[0], cu_seqlens[-1]) belong to no sequence and stay as they are
        cu = cu_seqlens.long().to(x.device)
        rows = torch.arange(x.size(0), device=x.device)
        sequence = (torch.searchsorted(cu, rows, right=True) - 1).clamp(0, cu.numel() - 2)
        positions = torch.where((rows >= cu[0]) & (rows < cu[-1]), rows - cu[sequence], cos.size(0))
        flat = x
    if isinstance(seqlen_offsets, torch.Tensor):
        positions = positions + seqlen_offsets.to(x.device).long()[sequence]
    else:
        positions = positions + int(seqlen_offsets)
    positions = positions.reshape(-1)
    inside = positions < cos.size(0)
    rotated = rotary_ref(flat, cos, sin, positions.clamp(0, cos.size(0) - 1), interleaved=interleaved)
    out = torch.where(inside[:, None, None], rotated, flat.float()).to(x.dtype).reshape(x.shape)
    return x.copy_(out) if inplace else out
