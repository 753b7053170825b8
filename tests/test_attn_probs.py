"""return_attn_probs' S_dmask in flash-attn 2.x's encoding, on CPU: exp(s - M_b) per key block
(M_b the running row maximum over blocks b..last), negated where dropout dropped the entry. The
probabilities come back through an independent normalize step (the one flash-attn's tests apply,
normalize_flash_attn_S) and match the float32 reference; masked entries and rows are 0."""
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute import interface
from flash_attn_cute.reference import attention_probs_ref

F16, BF16 = torch.float16, torch.bfloat16


def normalize_flash_attn_S(S, scores, block_n):
    """The probabilities from S_dmask values S (..., seqlen_k) and the logits `scores` (-inf where
    masked, any per-row constant added): block b of |S| times exp(M_b - lse), M_b the maximum of the
    row's block maxima from block b to the last (what flash-attn's test helper computes)."""
    blocks = scores.float().split(block_n, dim=-1)
    lse = torch.logsumexp(torch.stack([torch.logsumexp(b, dim=-1) for b in blocks], dim=-1), dim=-1)
    lse = lse.masked_fill(lse == -math.inf, math.inf)  # rows with no key: exp(m - lse) = 0, not NaN
    block_max = torch.stack([b.amax(dim=-1) for b in blocks], dim=-1)
    suffix_max = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1).unbind(dim=-1)
    return torch.cat([a * torch.exp(m - lse).unsqueeze(-1) for a, m in zip(S.abs().split(block_n, dim=-1), suffix_max)],
                     dim=-1)


def naive_scores(q, k, causal=False, window=(-1, -1), slopes=None):
    """float64 logits with flash-attn's test conventions: bottom-right masks, ALiBi's causal bias
    slope * (j - seqlen_k + 1) (the kernels' slope * j less a per-row constant)."""
    q, k = q.double(), k.double()
    sq, sk, d = q.size(1), k.size(1), q.size(-1)
    k = k.repeat_interleave(q.size(2) // k.size(2), dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k)
    row, col = torch.arange(sq).view(-1, 1), torch.arange(sk)
    left, right = window[0], 0 if causal else window[1]
    if slopes is not None:
        bias = (col - sk + 1).expand(sq, -1) if causal and left < 0 else -(row + sk - sq - col).abs()
        scores = scores + slopes.double().view(1, -1, 1, 1) * bias
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    if right >= 0:
        hidden |= col > row + sk - sq + right
    if left >= 0:
        hidden |= col < row + sk - sq - left
    return scores.masked_fill(hidden, -math.inf)


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


CASES = {  # (seqlen_q, seqlen_k, nheads, nheads_k, head dim, causal, window, alibi)
    "plain_hdim64": (77, 200, 2, 2, 64, False, (-1, -1), False),
    "causal_rows_without_keys": (150, 90, 2, 1, 64, True, (-1, -1), False),
    "hdim32_block128": (40, 300, 2, 2, 32, True, (-1, -1), False),
    "hdim128_block32": (33, 129, 4, 2, 128, False, (-1, -1), False),
    "window": (100, 257, 2, 2, 96, False, (30, 5), False),
    "alibi_causal": (64, 200, 2, 2, 64, True, (-1, -1), True),
    "alibi_window": (64, 200, 2, 1, 40, False, (20, 20), True),
    "hdim256": (20, 70, 1, 1, 256, False, (-1, -1), False),
}


@pytest.mark.parametrize("case", CASES)
def test_encoding_recovers_the_probabilities(case):
    sq, sk, h, hk, d, causal, window, alibi = CASES[case]
    q, k = _randn(2, sq, h, d, seed=0), _randn(2, sk, hk, d, seed=1)
    slopes = torch.rand(h, generator=torch.Generator().manual_seed(2)) * 0.3 if alibi else None
    keep = torch.rand(2, h, sq, sk, generator=torch.Generator().manual_seed(3)) > 0.17
    S = interface._attn_probs(q, k, None, None, None, None, keep, 1 / math.sqrt(d), causal, window, 0.0, slopes, None)
    assert S.shape == (2, h, sq, sk) and S.dtype == torch.float32 and not S.isnan().any()
    assert torch.equal(S.signbit(), ~keep), "negative exactly where dropout dropped the entry"
    block_n = interface._get_block_size_n("cpu", d, True, causal)
    scores = naive_scores(q, k, causal, window, slopes)
    probs = normalize_flash_attn_S(S, scores, block_n)
    want = attention_probs_ref(q, k, causal=causal, window_size=window, alibi_slopes=slopes)
    assert (probs - want).abs().max().item() <= 2e-6
    assert (S[scores.isinf().expand_as(S)] == 0).all(), "masked entries are 0"
    # Not the normalized probabilities (the old encoding): the blocks keep their own scales.
    assert (S.abs() - want).abs().max().item() > 1e-3


def test_encoding_is_relative_to_the_suffix_block_maximum():
    """One row by hand: blocks of 2 keys, logits (0, 5 | 1, 2 | 9, -inf): M = (9, 9, 9) from the right;
    with logits (9, 0 | 1, 2 | 3, -inf): M = (9, 3, 3)."""
    inf = math.inf
    for logits, maxima in (([0.0, 5.0, 1.0, 2.0, 9.0, -inf], [9, 9, 9, 9, 9, 9]),
                           ([9.0, 0.0, 1.0, 2.0, 3.0, -inf], [9, 9, 3, 3, 3, 3])):
        s = torch.tensor([logits])
        want = torch.tensor([[math.exp(x - m) if x > -inf else 0.0 for x, m in zip(logits, maxima)]])
        torch.testing.assert_close(interface._flash_attn_S(s, 2), want)
    assert torch.equal(interface._flash_attn_S(torch.full((3, 5), -inf), 2), torch.zeros(3, 5)), "rows with no key"
    assert interface._flash_attn_S(torch.zeros(4, 0), 64).shape == (4, 0)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_encoding(causal):
    """Varlen: each sequence encoded on its own (its keys' blocks from its first key), 0 past its
    lengths and for empty sequences; seqused_k cuts a sequence's keys."""
    seqlens_q, seqlens_k, h, d = [5, 0, 70, 33], [130, 4, 0, 97], 2, 64
    cu_q = torch.tensor([0] + seqlens_q).cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k).cumsum(0).int()
    q, k = _randn(int(cu_q[-1]), h, d, seed=4), _randn(int(cu_k[-1]), h, d, seed=5)
    max_q, max_k = max(seqlens_q), max(seqlens_k)
    keep = torch.rand(4, h, max_q, max_k, generator=torch.Generator().manual_seed(6)) > 0.3
    used = torch.tensor([100, 4, 0, 97], dtype=torch.int32)
    S = interface._attn_probs(q, k, cu_q, cu_k, max_q, max_k, keep, 1 / math.sqrt(d), causal, (-1, -1), 0.0, None, used)
    assert S.shape == (4, h, max_q, max_k) and not S.isnan().any()
    block_n = interface._get_block_size_n("cpu", d, True, causal)
    for b, (lq, lk) in enumerate(zip(seqlens_q, seqlens_k)):
        lk = min(lk, int(used[b]))
        qb, kb = q[None, cu_q[b]:cu_q[b] + lq], k[None, cu_k[b]:cu_k[b] + lk]
        if lq and lk:
            got = normalize_flash_attn_S(S[b:b + 1, :, :lq, :lk], naive_scores(qb, kb, causal), block_n)
            assert (got - attention_probs_ref(qb, kb, causal=causal)).abs().max().item() <= 2e-6, f"sequence {b}"
        rest = S[b].clone()
        rest[:, :lq, :lk] = 0
        assert (rest == 0).all(), f"sequence {b}: nonzero past its lengths"


@pytest.mark.parametrize("major, minor", [(8, 0), (8, 6), (9, 0)])
def test_block_size_n_table(major, minor, monkeypatch):
    """flash-attn 2.x's table: its key block width by head dim, dropout, causal and capability."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    sm8x = (major, minor) == (8, 6)
    table = {  # head dim: (no dropout, not causal), (no dropout, causal), (dropout, either)
        32: (128, 128, 128), 64: (128, 128, 64), 96: (64, 64, 64),
        128: ((32, 64, 32) if sm8x else (64, 64, 32)), 160: ((64, 64, 64) if sm8x else (32, 32, 32)),
        192: (64, 64, 64), 224: (64, 64, 64), 256: (64, 64, 64)}
    for d, (plain, causal, dropout) in table.items():
        for head_dim in (d - 7, d):
            assert interface._get_block_size_n("cuda", head_dim, False, False) == plain
            assert interface._get_block_size_n(torch.device("cuda", 0), head_dim, False, True) == causal
            assert interface._get_block_size_n("cuda", head_dim, True, True) == dropout
            assert interface._get_block_size_n("cuda", head_dim, True, False) == dropout
    with pytest.raises(fac.FlashAttnInputError):
        interface._get_block_size_n("cpu", 264, False, False)


def test_round_multiple_and_maybe_contiguous():
    assert [interface.round_multiple(x, 128) for x in (0, 1, 128, 129)] == [0, 128, 128, 256]
    x = torch.zeros(4, 6)
    assert interface.maybe_contiguous(x) is x and interface.maybe_contiguous(None) is None
    assert interface.maybe_contiguous(x[:, ::2]).is_contiguous()
    assert interface.maybe_contiguous(x.t()).stride(-1) == 1


def _fake_forward(monkeypatch, keep_seed=7):
    """flash_attn_* on CPU with the kernels and the dropout mask replaced: out zeros, a random keep
    mask (returned, to compare)."""
    from flash_attn_cute import _ops, validation
    masks = []

    def fake_run_fwd(q, k, v, out, *args, **kwargs):
        lse = torch.zeros(q.size(1), q.size(0)) if q.dim() == 3 else torch.zeros(q.size(0), q.size(2), q.size(1))
        return (torch.zeros_like(q), lse, torch.zeros(2, dtype=torch.int64))

    def fake_dropout_mask(rng_state, p, batch, heads, sq, sk, cu_q=None, cu_k=None):
        masks.append(torch.rand(batch, heads, sq, sk, generator=torch.Generator().manual_seed(keep_seed)) > p)
        return masks[-1]

    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    monkeypatch.setattr(interface, "dropout_mask", fake_dropout_mask)
    return masks


@pytest.mark.parametrize("window", [(-1, -1), (-5, 17)], ids=str)
def test_flash_attn_func_returns_the_encoding(window, monkeypatch):
    """flash_attn_func(dropout_p > 0, return_attn_probs=True) returns the encoding of its own
    arguments (a negative window side is unbounded there too); without dropout the third value is
    an empty tensor of q's dtype (flash-attn 2.7+'s)."""
    masks = _fake_forward(monkeypatch)
    q, k, v = _randn(2, 70, 4, 59, seed=8), _randn(2, 130, 2, 59, seed=9), _randn(2, 130, 2, 59, seed=10)
    out, lse, S = fac.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, window_size=window, return_attn_probs=True)
    (keep,) = masks
    assert torch.equal(S.signbit(), ~keep)
    unbounded = (-1, -1 if window[1] < 0 else window[1])
    probs = normalize_flash_attn_S(S, naive_scores(q, k, True, unbounded), interface._get_block_size_n("cpu", 59, True, True))
    assert (probs - attention_probs_ref(q, k, causal=True, window_size=unbounded)).abs().max().item() <= 2e-6
    _, _, none = fac.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert none.shape == (0,) and none.dtype == q.dtype
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    _, _, none = fac.flash_attn_varlen_func(q[0, :10], k[0, :10], v[0, :10], cu, cu, 7, 7, return_attn_probs=True)
    assert none.shape == (0,) and none.dtype == q.dtype
