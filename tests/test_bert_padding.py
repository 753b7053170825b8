"""flash_attn_cute.bert_padding (flash-attn 2.6+'s helpers, pure torch) on CPU: unpad / pad round trips,
the varlen arguments they produce, and their gradients."""
import pytest
import torch

from flash_attn_cute.bert_padding import index_first_axis, index_put_first_axis, pad_input, unpad_input
from flash_attn_cute.reference import attention_ref, attention_varlen_ref


def _mask(lengths, seqlen, dtype=torch.bool):
    return (torch.arange(seqlen) < torch.tensor(lengths).unsqueeze(1)).to(dtype)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.int64], ids=str)
def test_unpad_pad_round_trip(mask_dtype):
    lengths, seqlen = [3, 0, 7, 5], 7
    x = torch.randn(4, seqlen, 2, 3, dtype=torch.float64)
    mask = _mask(lengths, seqlen, mask_dtype)
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    assert x_unpad.shape == (15, 2, 3) and indices.dtype == torch.int64
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 3, 10, 15]
    assert type(max_seqlen) is int and max_seqlen == 7
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths
    assert torch.equal(x_unpad, torch.cat([x[b, :n] for b, n in enumerate(lengths)]))
    assert torch.equal(indices, torch.cat([b * seqlen + torch.arange(n) for b, n in enumerate(lengths)]))
    padded = pad_input(x_unpad, indices, 4, seqlen)
    assert torch.equal(padded, x * mask.bool()[:, :, None, None])


def test_unused_mask_rows_are_kept_but_not_used():
    """unused_mask marks slots allocated but unused: kept in the rows and cu_seqlens, not in seqused."""
    attention_mask = _mask([2, 4], 6)
    unused_mask = _mask([3, 6], 6) & ~attention_mask
    x = torch.arange(12.0).view(2, 6, 1)
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask, unused_mask)
    assert cu_seqlens.tolist() == [0, 3, 9] and max_seqlen == 6 and seqused.tolist() == [2, 4]
    assert x_unpad.flatten().tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11]


def test_gradients():
    lengths, seqlen = [4, 1, 6], 6
    mask = _mask(lengths, seqlen)
    x = torch.randn(3, seqlen, 5, dtype=torch.float64, requires_grad=True)
    x_unpad, indices, *_ = unpad_input(x, mask)
    weights = torch.randn_like(x_unpad)
    (grad,) = torch.autograd.grad((x_unpad * weights).sum(), x)
    assert torch.equal(grad, pad_input(weights, indices, 3, seqlen)), "the rows' gradients, 0 at padding"
    rows = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r: pad_input(r, indices, 3, seqlen), (rows,))
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (x.detach().flatten(0, 1).requires_grad_(),))
    assert torch.autograd.gradcheck(lambda r: index_put_first_axis(r, indices, 18), (rows,))


def test_index_helpers_keep_trailing_dims():
    x = torch.randn(10, 2, 3, 4)
    idx = torch.tensor([7, 0, 3])
    assert torch.equal(index_first_axis(x, idx), x[idx])
    out = index_put_first_axis(x[idx], idx, 10)
    assert out.shape == x.shape and torch.equal(out[idx], x[idx]) and (out.sum((1, 2, 3)) != 0).sum() == 3


def test_varlen_through_unpad_matches_padded_attention():
    """The varlen arguments unpad_input produces drive the varlen reference to the padded answer (the
    way flash-attn's tests build their varlen cases)."""
    torch.manual_seed(0)
    lengths_q, lengths_k, sq, sk = [5, 9, 1], [7, 3, 9], 9, 9
    q, k, v = torch.randn(3, sq, 4, 8), torch.randn(3, sk, 2, 8), torch.randn(3, sk, 2, 8)
    q_unpad, idx_q, cu_q, max_q, _ = unpad_input(q, _mask(lengths_q, sq))
    k_unpad, _, cu_k, max_k, _ = unpad_input(k, _mask(lengths_k, sk))
    v_unpad = unpad_input(v, _mask(lengths_k, sk))[0]
    assert (max_q, max_k) == (9, 9)
    out_unpad, _ = attention_varlen_ref(q_unpad, k_unpad, v_unpad, cu_q, cu_k, causal=True)
    out = pad_input(out_unpad, idx_q, 3, sq)
    for b in range(3):
        want, _ = attention_ref(q[b:b + 1, :lengths_q[b]], k[b:b + 1, :lengths_k[b]], v[b:b + 1, :lengths_k[b]],
                                causal=True)
        torch.testing.assert_close(out[b, :lengths_q[b]], want[0])
        assert (out[b, lengths_q[b]:] == 0).all()
