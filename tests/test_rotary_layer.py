"""flash_attn_cute.layers.rotary.apply_rotary_emb (flash-attn 2.x's, which its tests import) on CPU,
against the rotation written as complex multiplication."""
import pytest
import torch

from flash_attn_cute.layers.rotary import apply_rotary_emb


def _rotated(x, cos, sin, positions, interleaved):
    """x (rows, nheads, d) float64, each row's first 2 * cos.size(1) columns turned by the angle of
    its position: pairs (2j, 2j + 1) or (j, j + r / 2) as complex numbers times cos + i sin."""
    r = 2 * cos.size(1)
    xr = x[..., :r]
    pairs = xr.unflatten(-1, (-1, 2)) if interleaved else torch.stack(xr.chunk(2, dim=-1), dim=-1)
    turn = torch.complex(cos[positions], sin[positions])
    z = torch.view_as_complex(pairs.contiguous()) * turn[:, None, :]
    out = torch.view_as_real(z)
    out = out.flatten(-2) if interleaved else torch.cat(out.unbind(-1), dim=-1)
    return torch.cat((out, x[..., r:]), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", ["none", "int", "tensor"])
def test_dense_matches_the_rotation(interleaved, offsets):
    torch.manual_seed(0)
    batch, seqlen, nheads, d, r = 3, 6, 2, 16, 8
    x = torch.randn(batch, seqlen, nheads, d, dtype=torch.float64)
    cos, sin = torch.randn(20, r // 2, dtype=torch.float64), torch.randn(20, r // 2, dtype=torch.float64)
    shift = {"none": 0, "int": 4, "tensor": torch.tensor([0, 7, 2])}[offsets]
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=shift)
    for b in range(batch):
        s = shift if isinstance(shift, int) else int(shift[b])
        want = _rotated(x[b], cos, sin, torch.arange(seqlen) + s, interleaved)
        torch.testing.assert_close(out[b], want.to(out.dtype), rtol=1e-5, atol=1e-5)


def test_varlen_matches_dense_sequences_and_positions_past_the_table_pass():
    torch.manual_seed(1)
    lengths, nheads, d = [3, 0, 5], 2, 8
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    x = torch.randn(10, nheads, d)  # rows 8 and 9 belong to no sequence: unchanged
    cos, sin = torch.randn(6, 4), torch.randn(6, 4)
    shift = torch.tensor([1, 0, 2])
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=shift, cu_seqlens=cu, max_seqlen=5)
    torch.testing.assert_close(out[:3], apply_rotary_emb(x[None, :3], cos, sin, seqlen_offsets=1)[0])
    # the last sequence's rows 4 and 5 would take positions 6 and 7, past the table: unchanged
    torch.testing.assert_close(out[3:7], apply_rotary_emb(x[None, 3:7], cos, sin, seqlen_offsets=2)[0])
    torch.testing.assert_close(out[7:], x[7:])
    assert not torch.equal(out[6], x[6])


def test_inplace_and_gradients():
    torch.manual_seed(2)
    x = torch.randn(2, 4, 2, 8, dtype=torch.bfloat16)
    cos, sin = torch.randn(4, 2), torch.randn(4, 2)
    want = apply_rotary_emb(x, cos, sin)
    assert want.dtype == torch.bfloat16
    y = x.clone()
    assert apply_rotary_emb(y, cos, sin, inplace=True) is y and torch.equal(y, want)
    xg = x.float().requires_grad_()
    apply_rotary_emb(xg, cos, sin).sum().backward()
    assert torch.isfinite(xg.grad).all() and not torch.equal(xg.grad, torch.ones_like(xg.grad))
