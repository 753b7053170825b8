"""Local (sliding-window) attention, softcap and ALiBi against the float32 reference (GPU only), alone
and combined, forward and backward, dense, varlen and through the KV cache, with the accuracy rule
of test_fwd / test_bwd.
"""
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute.reference import attention_ref, attention_varlen_ref
from test_bwd import _check_grads, _grads_of, _varlen_case
from test_fwd import _check, _check_varlen, _randn

pytestmark = pytest.mark.cuda

BF16, F16 = torch.bfloat16, torch.float16
# (window_size, causal): local on either or both sides, causal + window, a window wider than the keys.
WINDOWS = [((-1, -1), False), ((64, 0), False), ((0, 64), False), ((100, 30), False), ((17, -1), False),
           ((-1, 5), False), ((256, -1), True), ((0, 0), False), ((5000, 5000), False)]


def _slopes(batch, nheads, per_batch):
    shape = (batch, nheads) if per_batch else (nheads,)
    return torch.rand(*shape, device="cuda", dtype=torch.float32) * 0.3


def _mods_case(window, causal, softcap, alibi, batch, nheads):
    return dict(window_size=window, causal=causal, softcap=softcap,
                alibi_slopes=_slopes(batch, nheads, alibi == "per_batch") if alibi else None)


def _check_fwd_bwd(q, k, v, **mods):
    """flash_attn_func(q, k, v, **mods): out and LSE, then the gradients for a random dout, against
    the reference. mods: causal, window_size, softcap, alibi_slopes."""
    out, lse, _ = fac.flash_attn_func(q, k, v, return_attn_probs=True, **mods)
    _check(q, k, v, out=out, lse=lse, **mods)
    dout = _randn(*q.shape, dtype=q.dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, **mods)  # noqa: E731
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, **mods, **kw)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("window, causal", WINDOWS, ids=[f"{w}{'-causal' if c else ''}" for w, c in WINDOWS])
@pytest.mark.parametrize("seqlens", [(128, 128), (113, 203), (300, 97), (1, 512), (1024, 1023)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_window_fwd_bwd(window, causal, seqlens, head_dim):
    torch.manual_seed(0)
    (seqlen_q, seqlen_k), batch, nheads, nheads_k = seqlens, 2, 4, 2
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=BF16)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=BF16)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=BF16)
    _check_fwd_bwd(q, k, v, causal=causal, window_size=window)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("softcap", [0.0, 5.0, 30.0])
@pytest.mark.parametrize("alibi", [None, "per_head", "per_batch"])
@pytest.mark.parametrize("window, causal", [((-1, -1), False), ((-1, -1), True), ((48, 0), False)],
                         ids=["full", "causal", "window48"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_softcap_alibi_fwd_bwd(dtype, softcap, alibi, window, causal, heads):
    if softcap == 0.0 and alibi is None:
        pytest.skip("plain kernels: test_fwd / test_bwd")
    torch.manual_seed(1)
    batch, seqlen_q, seqlen_k, head_dim = 2, 200, 333, 128
    nheads, nheads_k = heads
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, scale=3.0)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    _check_fwd_bwd(q, k, v, **_mods_case(window, causal, softcap, alibi, batch, nheads))


@pytest.mark.parametrize("seqlens", [(1, 1), (113, 37), (37, 113), (1023, 1023), (1024, 4096), (4096, 1024)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_alibi_seqlens(seqlens, causal, head_dim):
    """The forward adds ALiBi's symmetric form (as S's initial value) and shifts a causal row's LSE
    to flash-attn's causal form; the backward recomputes P from that LSE. Steep slopes over long
    rows, and causal rows that see no key (seqlen_q > seqlen_k: LSE +inf, zero gradient)."""
    torch.manual_seed(2)
    seqlen_q, seqlen_k = seqlens
    batch, nheads = 1, 4
    q, k, v = (_randn(batch, s, nheads, head_dim, dtype=BF16) for s in (seqlen_q, seqlen_k, seqlen_k))
    slopes = torch.tensor([1.0, 2.0 ** -2, 2.0 ** -5, 2.0 ** -8], device="cuda")
    _check_fwd_bwd(q, k, v, causal=causal, alibi_slopes=slopes)


@pytest.mark.parametrize("mods", ["window", "softcap_alibi", "all"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_score_mods(mods, deterministic):
    """Varlen with empty sequences: per-sequence windows (bottom-right aligned) and (batch, heads) ALiBi."""
    torch.manual_seed(2)
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 3]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 1]
    q, k, v, dout, cu_q, cu_k = _varlen_case(BF16, 128, seqlens_q, seqlens_k)
    kw = {}
    if mods in ("window", "all"):
        kw.update(window_size=(40, 8))
    if mods in ("softcap_alibi", "all"):
        kw.update(softcap=10.0, alibi_slopes=_slopes(len(seqlens_q), q.size(1), True))
    args = (cu_q, cu_k, max(seqlens_q), max(seqlens_k))
    out, lse, _ = fac.flash_attn_varlen_func(q, k, v, *args, return_attn_probs=True, **kw)
    _check_varlen(q, k, v, cu_q, cu_k, out, lse, **kw)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, *args, deterministic=deterministic, **kw)  # noqa: E731
    grads = _grads_of(fn, (q, k, v), dout)
    ref_fn = lambda q, k, v, **r: attention_varlen_ref(q, k, v, cu_q, cu_k, **kw, **r)[0]  # noqa: E731
    _check_grads(grads, ref_fn, (q, k, v), dout)
    if deterministic:
        again = _grads_of(fn, (q, k, v), dout)
        assert all(torch.equal(a, b) for a, b in zip(grads, again)), "deterministic gradients differ"


def test_window_cost_grows_with_the_window():
    """Blocks outside the window are never visited: a 1024 window over 16k keys runs far faster than
    full attention (the benchmark reports the ratio; this only guards against a full-cost window).
    32 heads: at 8, a windowed call's kernel (0.16 ms on an H200) was about as long as the call's
    host path (0.13-0.14 ms), so back-to-back calls timed the host (3.0-3.8x against 4.6-5.8x)."""
    q = _randn(1, 16384, 32, 128, dtype=BF16)
    k = _randn(1, 16384, 32, 128, dtype=BF16)

    def timed(**kw):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fac.flash_attn_func(q, k, k, **kw)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    # The best of three interleaved rounds each, after a warm-up of both: a clock still ramping up
    # from the small tests before this one read 3.8x once against about 6x measured alone.
    window, causal = [], []
    for _ in range(4):
        window.append(timed(window_size=(1024, 0)))
        causal.append(timed(causal=True))
    assert min(window[1:]) * 4 < min(causal[1:])


@pytest.mark.parametrize("mods", ["window", "softcap", "alibi", "window_softcap_alibi"])
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "page64"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_kvcache_score_mods(mods, page_size, seqlen_q):
    """The KV-cache path with window, softcap and ALiBi (split-KV and GQA included)."""
    from test_kvcache import Cache
    torch.manual_seed(3)
    batch, nheads, nheads_k, d, capacity = 3, 8, 2, 128, 2048
    cache = Cache(batch, capacity, nheads_k, d, BF16, page_size)
    lens = torch.tensor([2000, 1, 700], device="cuda", dtype=torch.int32)
    q = _randn(batch, seqlen_q, nheads, d, dtype=BF16)
    kw = dict(causal=seqlen_q > 1)
    if "window" in mods:
        kw.update(window_size=(300, 0 if seqlen_q > 1 else -1))
    if "softcap" in mods:
        kw.update(softcap=15.0)
    if "alibi" in mods:
        kw.update(alibi_slopes=_slopes(batch, nheads, True))
    out, lse = fac.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, block_table=cache.block_table,
                                           return_softmax_lse=True, **kw)
    for b in range(batch):
        keys = cache.dense(cache.k, b, b)[: lens[b]].unsqueeze(0)
        values = cache.dense(cache.v, b, b)[: lens[b]].unsqueeze(0)
        kw_b = dict(kw, alibi_slopes=kw["alibi_slopes"][b:b + 1]) if "alibi_slopes" in kw else kw
        _check(q[b:b + 1], keys, values, out=out[b:b + 1], lse=lse[b:b + 1], **kw_b)
    assert not math.isnan(out.float().sum().item())


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (40, 8)], ids=["full", "causal", "local"])
@pytest.mark.parametrize("seqused", [False, True], ids=["range", "seqused"])
def test_varlen_leftpad_k(window, seqused):
    """leftpad_k (flash_attn_interface._flash_attn_varlen_forward, as flash-attn 2.6+): sequence b's keys
    start leftpad_k[b] rows into its cu_seqlens_k range and end where the range does, or seqused_k[b]
    rows into it; pads past the end leave a sequence no keys."""
    from flash_attn_cute import flash_attn_interface as fai
    torch.manual_seed(5)
    seqlens_q = [0, 17, 128, 1, 300, 5, 9]
    seqlens_k = [5, 0, 128, 77, 299, 40, 30]
    pads = [2, 0, 100, 0, 13, 40, 31]
    used = [4, 0, 120, 77, 299, 40, 30]
    q, k, v, _, cu_q, cu_k = _varlen_case(BF16, 128, seqlens_q, seqlens_k)
    ends = used if seqused else seqlens_k
    counts = [max(e - p, 0) for e, p in zip(ends, pads)]
    kw = dict(seqused_k=torch.tensor(used, device="cuda", dtype=torch.int32)) if seqused else {}
    out, lse, _, _ = fai._flash_attn_varlen_forward(
        q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), 0.0, None, window == (-1, 0), *window,
        leftpad_k=torch.tensor(pads, device="cuda", dtype=torch.int32), **kw)
    keep = torch.cat([torch.arange(int(cu_k[b]) + pads[b], int(cu_k[b]) + pads[b] + counts[b], device="cuda")
                      for b in range(len(pads))])
    cu_kept = torch.tensor([0] + counts, device="cuda").cumsum(0).int()
    _check_varlen(q, k[keep], v[keep], cu_q, cu_kept, out, lse, causal=window == (-1, 0), window_size=window)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_seqused_k(causal):
    """seqused_k: sequence b attends to the first seqused_k[b] of its keys; the rest get zero gradients."""
    torch.manual_seed(4)
    seqlens_q = [0, 17, 128, 1, 300, 5]
    seqlens_k = [5, 0, 128, 77, 299, 40]
    used = [3, 0, 100, 77, 1, 0]
    q, k, v, dout, cu_q, cu_k = _varlen_case(BF16, 128, seqlens_q, seqlens_k)
    seqused = torch.tensor(used, device="cuda", dtype=torch.int32)
    args = (cu_q, cu_k, max(seqlens_q), max(seqlens_k))
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, *args, causal=causal, seqused_k=seqused)  # noqa: E731
    # The reference sees only the used keys: every sequence's prefix, packed.
    keep = torch.cat([torch.arange(int(cu_k[b]), int(cu_k[b]) + used[b], device="cuda") for b in range(len(used))])
    cu_used = torch.tensor([0] + used, device="cuda").cumsum(0).int()
    out = fn(q, k, v)
    _check_varlen(q, k[keep], v[keep], cu_q, cu_used, out, causal=causal)
    dq, dk, dv = _grads_of(fn, (q, k, v), dout)
    unused = torch.ones(k.size(0), dtype=torch.bool, device="cuda")
    unused[keep] = False
    assert (dk[unused] == 0).all() and (dv[unused] == 0).all(), "keys past seqused_k get zero gradients"
    ref_fn = lambda q, k_, v_, **r: attention_varlen_ref(q, k_, v_, cu_q, cu_used, causal=causal, **r)[0]  # noqa: E731
    _check_grads((dq, dk[keep], dv[keep]), ref_fn, (q, k[keep], v[keep]), dout)
