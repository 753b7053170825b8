"""CPU tests for flash_attn_cute.reference (the oracle the kernel tests compare against)."""
import math

import pytest
import torch
import torch.nn.functional as F

from flash_attn_cute.reference import (attention_probs_ref, attention_ref, attention_scores_ref, attention_varlen_ref,
                                      rotary_ref)


def _randn(*shape, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, d, d_v=None, seed=0, dtype=torch.float64):
    q = _randn(batch, seqlen_q, nheads, d, seed=seed, dtype=dtype)
    k = _randn(batch, seqlen_k, nheads_k, d, seed=seed + 1, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, d_v or d, seed=seed + 2, dtype=dtype)
    return q, k, v


def _naive(q, k, v, causal, scale, window=(-1, -1), softcap=0.0, slopes=None):
    """Per-row loop, float64, bottom-right causal / window; returns (out, lse) like attention_ref."""
    batch, sq, nheads, _ = q.shape
    sk, nheads_k = k.shape[1], k.shape[2]
    g = nheads // nheads_k
    out = torch.zeros(batch, sq, nheads, v.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, nheads, sq), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            for i in range(sq):
                diag = i + sk - sq
                lo = diag - window[0] if window[0] >= 0 else 0
                hi = diag if causal else (diag + window[1] if window[1] >= 0 else sk - 1)
                keys = [j for j in range(max(lo, 0), min(hi, sk - 1) + 1)]
                if not keys:
                    continue
                s = []
                for j in keys:
                    x = float(q[b, i, h] @ k[b, j, h // g]) * scale
                    if softcap:
                        x = softcap * math.tanh(x / softcap)
                    if slopes is not None:  # flash-attn's kernel convention: +slope * j when causal
                        causal_form = window[0] < 0 and (causal or window[1] == 0)
                        x += float(slopes[h]) * (j if causal_form else -abs(diag - j))
                    s.append(x)
                m = max(s)
                w = [math.exp(x - m) for x in s]
                tot = sum(w)
                lse[b, h, i] = m + math.log(tot)
                out[b, i, h] = sum(wj / tot * v[b, j, h // g] for j, wj in zip(keys, w))
    return out, lse


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen,d,d_v,scale", [(1, 32, 32, None), (17, 64, 64, None),
                                                 (64, 32, 48, None), (33, 16, 16, 0.3)])
def test_matches_sdpa(dtype, atol, causal, seqlen, d, d_v, scale):
    q, k, v = _qkv(2, seqlen, seqlen, 3, 3, d, d_v, seed=seqlen + d, dtype=dtype)
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale)
    assert out.dtype == dtype and out.shape == (2, seqlen, 3, d_v)
    assert lse.dtype == torch.float32 and lse.shape == (2, 3, seqlen)
    # SDPA's is_causal is top-left aligned == bottom-right only because seqlen_q == seqlen_k here.
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal, scale=scale).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 9), (9, 5), (1, 7), (7, 1), (4, 4), (1, 1)])
def test_matches_naive_loop(causal, seqlen_q, seqlen_k):
    q, k, v = _qkv(2, seqlen_q, seqlen_k, 4, 2, 8, 6, seed=7 * seqlen_q + seqlen_k)
    out, lse = attention_ref(q, k, v, causal=causal)
    out_n, lse_n = _naive(q, k, v, causal, 1 / math.sqrt(8))
    torch.testing.assert_close(out, out_n, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse.double(), lse_n, atol=1e-5, rtol=1e-6)  # lse is float32


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (2, -1), (-1, 3), (3, 1), (20, 20)], ids=str)
@pytest.mark.parametrize("softcap, alibi", [(0.0, False), (0.0, True), (1.5, False), (1.5, True)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 9), (9, 5), (1, 7)])
def test_score_mods_match_naive_loop(causal, window, softcap, alibi, seqlen_q, seqlen_k):
    """Local windows (bottom-right aligned, with causal), softcap and ALiBi against a per-key loop."""
    q, k, v = _qkv(2, seqlen_q, seqlen_k, 4, 2, 8, 6, seed=3 * seqlen_q + seqlen_k)
    slopes = torch.tensor([0.5, 0.25, 0.125, 1.0], dtype=torch.float32) if alibi else None
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    out_n, lse_n = _naive(q, k, v, causal, 1 / math.sqrt(8), window, softcap, slopes)
    torch.testing.assert_close(out, out_n, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse.double(), lse_n, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("causal, window, alibi", [(False, (-1, -1), False), (True, (3, -1), True), (False, (2, 1), True)])
def test_scores_are_the_logits_of_the_probabilities(causal, window, alibi):
    """attention_scores_ref: float32 logits, -inf exactly where the mask hides the key, whose softmax
    is attention_probs_ref and whose logsumexp is attention_ref's LSE."""
    q, k, v = _qkv(2, 9, 6, 4, 2, 8, seed=5, dtype=torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25, 0.125, 1.0]) if alibi else None
    mods = dict(causal=causal, window_size=window, alibi_slopes=slopes)
    scores = attention_scores_ref(q, k, **mods)
    assert scores.dtype == torch.float32 and scores.shape == (2, 4, 9, 6)
    probs = attention_probs_ref(q, k, **mods)
    seen = ~scores.isinf().all(-1, keepdim=True)
    torch.testing.assert_close(torch.where(seen, scores.softmax(-1), 0.0), probs)
    assert torch.equal(scores.isinf(), (probs == 0) & scores.isinf())
    lse = attention_ref(q, k, v, **mods)[1]
    torch.testing.assert_close(torch.where(seen[..., 0], scores.logsumexp(-1), math.inf), lse)


@pytest.mark.parametrize("dtype,upcast", [(torch.float32, True), (torch.bfloat16, False), (torch.float16, True)])
def test_rows_without_keys(dtype, upcast):
    q, k, v = _qkv(2, 8, 3, 2, 1, 16, seed=3, dtype=dtype)  # bottom-right: rows 0..4 see nothing
    out, lse = attention_ref(q, k, v, causal=True, upcast=upcast)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :5] == 0).all() and (lse[..., :5] == math.inf).all()
    assert out[:, 5:].abs().amax() > 0 and lse[..., 5:].isfinite().all()
    # Empty K (seqlen_k == 0), non-causal: every row sees nothing.
    out0, lse0 = attention_ref(q, k[:, :0], v[:, :0], causal=False, upcast=upcast)
    assert out0.shape == (2, 8, 2, 16) and (out0 == 0).all() and (lse0 == math.inf).all()


@pytest.mark.parametrize("nheads_k", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(nheads_k, causal):
    q, k, v = _qkv(2, 6, 9, 6, nheads_k, 16, 8, seed=11 + nheads_k)
    g = 6 // nheads_k
    out, lse = attention_ref(q, k, v, causal=causal)
    out_r, lse_r = attention_ref(q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2), causal=causal)
    torch.testing.assert_close(out, out_r, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_r, atol=0, rtol=0)
    for h in range(6):  # query head h uses kv head h // g
        o_h, _ = attention_ref(q[:, :, h:h + 1], k[:, :, h // g:h // g + 1], v[:, :, h // g:h // g + 1], causal=causal)
        torch.testing.assert_close(out[:, :, h:h + 1], o_h, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reorder_ops", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(12, 12), (7, 20), (20, 7)])
def test_lse_is_logsumexp(causal, reorder_ops, seqlen_q, seqlen_k):
    q, k, v = _qkv(2, seqlen_q, seqlen_k, 3, 3, 32, seed=seqlen_q * seqlen_k)
    scale = 0.2
    _, lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale, reorder_ops=reorder_ops)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        i = torch.arange(seqlen_q)[:, None]
        j = torch.arange(seqlen_k)[None, :]
        scores = scores.masked_fill(j > i + seqlen_k - seqlen_q, -math.inf)
    expected = torch.logsumexp(scores, dim=-1)
    expected = torch.where(expected == -math.inf, math.inf, expected)  # empty rows -> +inf
    torch.testing.assert_close(lse.double(), expected, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence(causal):
    lens_q, lens_k = [3, 0, 7, 1, 5], [4, 5, 0, 6, 2]  # includes empty Q and empty K sequences
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q = _randn(sum(lens_q), 4, 16, seed=21, dtype=torch.float32)
    k = _randn(sum(lens_k), 2, 16, seed=22, dtype=torch.float32)
    v = _randn(sum(lens_k), 2, 12, seed=23, dtype=torch.float32)
    out, lse = attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal)
    assert out.shape == (sum(lens_q), 4, 12) and lse.shape == (4, sum(lens_q))
    assert not out.isnan().any() and not lse.isnan().any()
    for b in range(len(lens_q)):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0:
            continue
        o_b, lse_b = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal)
        torch.testing.assert_close(out[q0:q1], o_b[0], atol=0, rtol=0)
        torch.testing.assert_close(lse[:, q0:q1], lse_b[0], atol=0, rtol=0)
        if k1 == k0:  # empty K sequence
            assert (out[q0:q1] == 0).all() and (lse[:, q0:q1] == math.inf).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reorder_ops", [False, True])
def test_low_precision_reference_is_close_but_not_exact(dtype, causal, reorder_ops):
    q, k, v = _qkv(2, 64, 64, 4, 2, 64, seed=31, dtype=dtype)
    out_lp, lse_lp = attention_ref(q, k, v, causal=causal, upcast=False, reorder_ops=reorder_ops)
    out_fp, _ = attention_ref(q, k, v, causal=causal)
    assert out_lp.dtype == dtype and out_fp.dtype == torch.float32 and lse_lp.dtype == torch.float32
    err = (out_lp.float() - out_fp).abs().max().item()
    eps = torch.finfo(dtype).eps
    assert 0 < err < 16 * eps, err  # rounding noise only: a few ulps of the dtype


def _bwd_formulas(q, k, v, dout, causal, scale):
    """The FlashAttention backward, written out in float64 on expanded heads:
    P = softmax(scale * Q K^T), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D),
    dQ = scale * dS K, dK = scale * dS^T Q; GQA sums dK, dV over each group's query heads."""
    g = q.size(2) // k.size(2)
    ke, ve = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bthd,bshd->bhts", q, ke) * scale
    sq, sk = q.size(1), k.size(1)
    if causal:
        hidden = torch.arange(sk).view(1, -1) > torch.arange(sq).view(-1, 1) + (sk - sq)
        s = s.masked_fill(hidden, -math.inf)
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    out = torch.einsum("bhts,bshd->bthd", p, ve)
    dv = torch.einsum("bhts,bthd->bshd", p, dout)
    dp = torch.einsum("bthd,bshd->bhts", dout, ve)
    d = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, t, 1)
    ds = p * (dp - d)
    dq = torch.einsum("bhts,bshd->bthd", ds, ke) * scale
    dk = torch.einsum("bhts,bthd->bshd", ds, q) * scale
    fold = lambda x: x.unflatten(2, (k.size(2), g)).sum(3)  # noqa: E731
    return dq, fold(dk), fold(dv)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k,nheads_k", [(7, 7, 4), (9, 5, 2), (5, 9, 1), (1, 6, 4)])
def test_gradients_match_flash_formulas(causal, seqlen_q, seqlen_k, nheads_k):
    """Autograd through attention_ref (what the kernel tests use) equals the formulas the backward
    kernel implements, empty rows (causal, seqlen_q > seqlen_k) included."""
    q, k, v = _qkv(2, seqlen_q, seqlen_k, 4, nheads_k, 8, seed=5 * seqlen_q + seqlen_k)
    dout = _randn(*q.shape, seed=99)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, _ = attention_ref(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    expected = _bwd_formulas(q.detach(), k.detach(), v.detach(), dout, causal, 1 / math.sqrt(8))
    for name, got, want in zip("qkv", grads, expected):
        assert got.isfinite().all(), f"d{name} has non-finite values"
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"d{name}")


@pytest.mark.parametrize("upcast,dtype", [(True, torch.float64), (False, torch.bfloat16)])
def test_gradients_of_rows_without_keys_are_zero(upcast, dtype):
    q, k, v = _qkv(1, 8, 3, 2, 1, 16, seed=4, dtype=dtype)  # rows 0..4 see no key
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, _ = attention_ref(q, k, v, causal=True, upcast=upcast)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(g.isfinite().all() for g in (dq, dk, dv))
    assert (dq[:, :5] == 0).all() and dq[:, 5:].abs().amax() > 0


def test_gradcheck_float64():
    q, k, v = _qkv(1, 5, 4, 2, 1, 4, seed=21)
    for causal in (False, True):
        torch.autograd.gradcheck(lambda q, k, v: attention_ref(q, k, v, causal=causal)[0],
                                 tuple(x.clone().requires_grad_() for x in (q, k, v)))


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_ref_rotates_pairs(interleaved):
    """Rotary embedding against its definition: each pair (x1, x2) becomes its complex product with
    exp(i * theta); columns past rotary_dim pass through; the pair norms are kept."""
    torch.manual_seed(0)
    seqlen, nheads, d, rotary_dim = 5, 3, 32, 16
    theta = torch.rand(50, rotary_dim // 2) * 6.3
    cos, sin = theta.cos(), theta.sin()
    positions = torch.tensor([0, 7, 7, 49, 3])
    x = torch.randn(seqlen, nheads, d)
    out = rotary_ref(x, cos, sin, positions, interleaved)
    half = rotary_dim // 2
    pairs = [(2 * j, 2 * j + 1) if interleaved else (j, j + half) for j in range(half)]
    for i, pos in enumerate(positions.tolist()):
        for j, (a, b) in enumerate(pairs):
            z = torch.complex(x[i, :, a], x[i, :, b]) * torch.polar(torch.ones(()), theta[pos, j])
            torch.testing.assert_close(out[i, :, a], z.real)
            torch.testing.assert_close(out[i, :, b], z.imag)
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
