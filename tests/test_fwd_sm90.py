"""The Hopper forward (sm_90a warpgroup MMAs) against the float32 reference, the calls that take it,
and the SM80 forward on the same device (FLASH_ATTN_CUTE_SM90=0). Dropout on it: test_dropout.py
(dropout never takes the split-KV kernel, so on Hopper every dropout test runs it). The shapes give the plain kernel
grid enough row blocks to fill the SMs: smaller problems take the split-KV kernel (test_fwd.py)."""
import math
import threading

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute._ops import BUILT_FWD_SM90_KERNELS, kernel_causal, kernel_head_dim, kernel_variant
from flash_attn_cute.reference import attention_ref

from test_bwd import _check_grads, _varlen_case
from test_dropout import _run_with_probs
from test_fwd import DTYPES, _assert_close_rule, _assert_lse_close, _check, _check_varlen, _randn

pytestmark = [pytest.mark.cuda, pytest.mark.sm90]

SEQLENS = [(113, 203), (127, 513), (333, 1023), (512, 256), (1023, 1024), (2048, 2048)]
HEADS = {"mha": (16, 16), "gqa": (16, 2), "mqa": (16, 1)}
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _kernel_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA}


def _takes_hopper_kernel(fn, ws=False):
    """Whether fn runs a Hopper forward kernel (ws: the warp-specialized one)."""
    kernel = "flash_fwd_sm90_ws_kernel" if ws else "flash_fwd_sm90"
    return any(kernel in name for name in _kernel_names(fn))


def _takes_three_cta_kernel(fn):
    """Whether fn runs the three-CTA Hopper forward (flash_fwd_sm90_kernel, not the _ws_ one)."""
    return any("flash_fwd_sm90_kernel" in name for name in _kernel_names(fn))


def _ws_consumers(fn):
    """The consumer warpgroups of the warp-specialized kernel of one loop per tile that fn runs
    (kThreeConsumers, the last template argument of its traits, FwdKernelTraitsSm90Ws)."""
    names = [n for n in _kernel_names(fn) if "flash_fwd_sm90_ws_kernel" in n]
    assert len(names) == 1 and "(flash_attn_cute::Sm90Loops)0" in names[0], names
    return 3 if "(flash_attn_cute::Sm90Loops)0, true>" in names[0] else 2


@pytest.fixture(params=["three_cta", "ws", "ws3"])
def hopper_kernel(request, monkeypatch):
    """Which Hopper forward runs, forced: the three-CTA kernel (FLASH_ATTN_CUTE_SM90_WS=0) or the
    warp-specialized one (=1; it exists for kernel head dims from 64 on, tile_size.h), whose plain
    and score-mod kernels at head dim 64 come with two consumer warpgroups (ws) and three (ws3:
    FLASH_ATTN_CUTE_SM90_WS_CONSUMERS). The dispatcher's choices: test_kernel_choice_by_row_length,
    test_three_consumers_by_row_length."""
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "0" if request.param == "three_cta" else "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", "3" if request.param == "ws3" else "2")
    return request.param


def _require_kernel(hopper_kernel, head_dim, per_tile=True):
    """per_tile: whether the call runs a kernel of one loop per tile (not bf16 softcap's fixed-offset
    ones, which have three consumers either way)."""
    if hopper_kernel != "three_cta" and kernel_head_dim(head_dim) < 64:
        pytest.skip(f"no warp-specialized Hopper forward for head dim {head_dim}")
    if hopper_kernel == "ws3" and (not per_tile or kernel_head_dim(head_dim) != 64):
        pytest.skip("three consumers: the plain and score-mod kernels at head dim 64 only")
    return hopper_kernel != "three_cta"


def _ws_only(head_dim, variant):
    """The Hopper variants built warp-specialized only (tile_size.h's fwd_sm90_ws_only): score mods and
    dropout at kernel head dim 256, whose calls take the SM80 kernel where rows see too few keys."""
    return kernel_head_dim(head_dim) > 192 and variant != "plain"


def _require_built(dtype, head_dim, causal, variant="plain"):
    if (DTYPE_NAMES[dtype], kernel_head_dim(head_dim), causal, variant) not in BUILT_FWD_SM90_KERNELS:
        pytest.skip(f"this build has no Hopper forward for {DTYPE_NAMES[dtype]} hdim {head_dim} {variant}")


def _batch_filling_sms(seqlen_q, nheads):
    """Enough batch entries for the plain kernel's row blocks (128 rows) to fill 132 SMs."""
    return max(1, math.ceil(132 / (nheads * math.ceil(seqlen_q / 128))))


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 200, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_hopper_forward_matches_reference(dtype, head_dim, causal, seqlens, heads, hopper_kernel):
    _require_built(dtype, head_dim, causal)
    ws = _require_kernel(hopper_kernel, head_dim)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS[heads]
    batch = _batch_filling_sms(seqlen_q, nheads)
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    call = lambda: fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert _takes_hopper_kernel(call, ws)
    out, lse, _ = call()
    _check(q, k, v, causal, out, lse)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [56, 128, 192, 256])
def test_hopper_forward_writes_every_output_element(head_dim, causal, hopper_kernel):
    _require_built(torch.bfloat16, head_dim, causal)
    ws = _require_kernel(hopper_kernel, head_dim)
    q, k, v = (_randn(8, 333, 16, head_dim, dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    assert _takes_hopper_kernel(lambda: fac.fwd(q, k, v, out=out, causal=causal), ws)
    out.fill_(float("nan"))
    _, lse = fac.fwd(q, k, v, out=out, causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [59, 128, 192, 256])
def test_hopper_forward_varlen_uneven_and_empty_sequences(head_dim, causal, hopper_kernel):
    _require_built(torch.bfloat16, head_dim, causal)
    ws = _require_kernel(hopper_kernel, head_dim)
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 700]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 650]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), 16, head_dim, dtype=torch.bfloat16)
    k = _randn(int(cu_k[-1]), 4, head_dim, dtype=torch.bfloat16)
    v = _randn(int(cu_k[-1]), 4, head_dim, dtype=torch.bfloat16)
    call = lambda: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                              return_attn_probs=True)
    assert _takes_hopper_kernel(call, ws)
    out, lse, _ = call()
    _check_varlen(q, k, v, cu_q, cu_k, out, lse, causal=causal)


# (window_size, causal, softcap, ALiBi): each score mod alone and combined, windows on either side.
MODS = [((-1, -1), False, 30.0, None), ((-1, -1), True, 5.0, None), ((-1, -1), False, 0.0, "per_head"),
        ((-1, -1), True, 0.0, "per_batch"), ((-1, -1), True, 30.0, "per_head"), ((100, 30), False, 0.0, None),
        ((0, 64), False, 0.0, None), ((256, -1), True, 0.0, None), ((64, 0), False, 0.0, None),
        ((48, 0), False, 30.0, "per_head")]


@pytest.mark.parametrize("window, causal, softcap, alibi", MODS, ids=[str(m) for m in MODS])
@pytest.mark.parametrize("seqlens", [(113, 203), (333, 1023), (1023, 1024)], ids=str)
@pytest.mark.parametrize("head_dim", [59, 96, 128, 160, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_hopper_score_mods_match_reference(dtype, head_dim, seqlens, window, causal, softcap, alibi, hopper_kernel):
    """Softcap, ALiBi (its causal form's LSE too) and windows on the Hopper kernel; causal windows
    (left, 0) run on the plain causal kernel, the rest on the score-mod one."""
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, (16, 4)
    variant = kernel_variant(window, softcap, alibi, causal, seqlen_k)
    _require_built(dtype, head_dim, kernel_causal(causal, window), variant)
    ws = _require_kernel(hopper_kernel, head_dim, per_tile=not (softcap and dtype == torch.bfloat16))
    batch = _batch_filling_sms(seqlen_q, nheads)
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, scale=3.0)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    shape = (batch, nheads) if alibi == "per_batch" else (nheads,)
    slopes = torch.rand(*shape, device="cuda", dtype=torch.float32) * 0.3 if alibi else None
    mods = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    call = lambda: fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **mods)
    if _ws_only(head_dim, variant) and not ws:  # a Hopper kernel runs only where it is the WS one
        assert _takes_hopper_kernel(call) == _takes_hopper_kernel(call, ws=True)
    else:
        assert _takes_hopper_kernel(call, ws)
    out, lse, _ = call()
    _check(q, k, v, causal, out, lse, **mods)


@pytest.mark.parametrize("window", [(-1, -1), (1024, 0)], ids=["causal", "causal-window1024"])
@pytest.mark.parametrize("head_dim", [96, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_causal_softcap_alibi_far_diagonals(dtype, head_dim, window, monkeypatch):
    """The causal kernels' ALiBi form after softcap (fwd_kernel_sm90_ws.h's alibi_col_ref) on rows
    whose diagonals lie 64k keys in, slopes up to 1: measured from column 0, the biases near a
    diagonal (slope * col) lost ~2^-24 of their size in every exponent, the windowed LSE ~7e-3.
    The low-precision reference takes the symmetric form (a left window past the keys), whose O is
    the same and whose biases near the diagonal are small. 2048 rows of 8 heads: enough row blocks
    that the call takes the whole-row kernel, not split-KV (glue.cpp choose_splits)."""
    _require_built(dtype, head_dim, True, "mods")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(0)
    seqlen_q, seqlen_k, nheads = 2048, 65536, 8
    q = _randn(1, seqlen_q, nheads, head_dim, dtype=dtype, scale=3.0)
    k = _randn(1, seqlen_k, nheads, head_dim, dtype=dtype)
    v = _randn(1, seqlen_k, nheads, head_dim, dtype=dtype)
    mods = dict(softcap=30.0, alibi_slopes=torch.tensor([1.0, 0.25] * 4, device="cuda"))
    call = lambda: fac.flash_attn_func(q, k, v, causal=True, window_size=window, return_attn_probs=True, **mods)
    assert _takes_hopper_kernel(call, ws=True)
    out, lse, _ = call()
    ref, lse_ref = attention_ref(q, k, v, causal=True, window_size=window, **mods)
    symmetric = window if window[0] >= 0 else (seqlen_k, 0)
    ref_lowp, _ = attention_ref(q, k, v, causal=True, window_size=symmetric, upcast=False, reorder_ops=True, **mods)
    _assert_close_rule(out, ref, ref_lowp)
    _assert_lse_close(lse, lse_ref)


@pytest.mark.parametrize("causal", [False, True])
def test_which_calls_take_the_hopper_kernel(causal, monkeypatch):
    _require_built(torch.bfloat16, 128, causal)
    q, k, v = (_randn(8, 1024, 16, 128, dtype=torch.bfloat16) for _ in range(3))
    assert _takes_hopper_kernel(lambda: fac.flash_attn_func(q, k, v, causal=causal))
    # Decoding shapes take the split-KV kernel; the score mods and dropout their Hopper kernels.
    assert not _takes_hopper_kernel(lambda: fac.flash_attn_func(q[:, :1], k, v, causal=causal))
    if ("bf16", 128, causal, "mods") in BUILT_FWD_SM90_KERNELS:
        assert _takes_hopper_kernel(lambda: fac.flash_attn_func(q, k, v, causal=causal, softcap=30.0))
    if ("bf16", 128, causal, "dropout") in BUILT_FWD_SM90_KERNELS:
        assert _takes_hopper_kernel(lambda: fac.flash_attn_func(q, k, v, causal=causal, dropout_p=0.1))
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90", "0")
    names = _kernel_names(lambda: fac.flash_attn_func(q, k, v, causal=causal))
    assert not any("sm90" in name for name in names) and any("flash_fwd_kernel" in name for name in names)


@pytest.mark.parametrize("causal", [False, True])
def test_kernel_choice_by_row_length(causal, monkeypatch):
    """Full rows (not causal, no window) take the warp-specialized kernel at every length (at head dim
    64 but softcap's), short sequences (256 keys) at head dim 128 too (but softcap's with a window
    edge), the rest where rows see 256 keys or more on average (512 at head dim 64, 1024 with cp.async
    loads); the others the three-CTA kernel. FLASH_ATTN_CUTE_SM90_WS=0 / 1 overrides the choice."""
    _require_built(torch.bfloat16, 128, causal)
    short = tuple(_randn(64, 128, 16, 128, dtype=torch.bfloat16) for _ in range(3))
    long = tuple(_randn(4, 1024, 16, 128, dtype=torch.bfloat16) for _ in range(3))
    run = lambda qkv, **kw: lambda: fac.flash_attn_func(*qkv, causal=causal, **kw)  # noqa: E731
    assert _takes_hopper_kernel(run(long), ws=True) and _takes_hopper_kernel(run(short), ws=True)
    if ("bf16", 128, causal, "mods") in BUILT_FWD_SM90_KERNELS:
        assert _takes_hopper_kernel(run(long, softcap=30.0), ws=True)
        assert _takes_hopper_kernel(run(short, alibi_slopes=torch.rand(16, device="cuda")), ws=True)
        assert _takes_hopper_kernel(run(short, window_size=(32, 32)), ws=True), "a short sequence"
        assert _takes_three_cta_kernel(run(long, window_size=(64, 64))), "a window's few keys in a long sequence"
        softcap_short = run(short, softcap=30.0)
        assert _takes_hopper_kernel(softcap_short, ws=True) if not causal else _takes_three_cta_kernel(softcap_short)
    if ("bf16", 64, causal, "plain") in BUILT_FWD_SM90_KERNELS:
        long64 = tuple(_randn(1, 4096, 16, 64, dtype=torch.bfloat16) for _ in range(3))
        short64 = tuple(_randn(16, 256, 16, 64, dtype=torch.bfloat16) for _ in range(3))
        assert _takes_hopper_kernel(run(long64), ws=True)
        assert _takes_three_cta_kernel(run(short64)) if causal else _takes_hopper_kernel(run(short64), ws=True)
        # Rows with a window edge keep the three-CTA kernel below 512 keys a row (fwd_sm90_ws_min_mean_keys:
        # 384 on average here); full rows take the warp-specialized one.
        cu = torch.tensor([0, 768, 1536], device="cuda", dtype=torch.int32)
        qkv = tuple(_randn(1536, 16, 64, dtype=torch.bfloat16) for _ in range(3))
        varlen = lambda: fac.flash_attn_varlen_func(*qkv, cu, cu, 768, 768, causal=causal)  # noqa: E731
        assert _takes_three_cta_kernel(varlen) if causal else _takes_hopper_kernel(varlen, ws=True)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "0")
    assert _takes_three_cta_kernel(run(long))
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    assert _takes_hopper_kernel(run(short), ws=True)


@pytest.mark.parametrize("causal", [False, True])
def test_three_consumers_by_row_length(causal, monkeypatch):
    """The plain, score-mod and dropout warp-specialized kernels at head dim 64 take three consumer
    warpgroups (192-row tiles) where rows see 512 keys or more, two elsewhere (tile_size.h's
    fwd_sm90_ws_three_consumers_pay); FLASH_ATTN_CUTE_SM90_WS_CONSUMERS overrides the choice."""
    _require_built(torch.bfloat16, 64, causal)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    run = lambda batch, seqlen, **kw: lambda: fac.flash_attn_func(  # noqa: E731
        *(_randn(batch, seqlen, 8, 64, dtype=torch.bfloat16) for _ in range(3)), causal=causal, **kw)
    assert _ws_consumers(run(1, 4096)) == 3
    assert _ws_consumers(run(1, 2048)) == 3, "causal 2048: 1024.5 keys a row on average"
    assert _ws_consumers(run(2, 1024)) == 3, "a causal 1024-row sequence: 512.5 keys a row"
    assert _ws_consumers(run(16, 256)) == 2
    if ("bf16", 64, causal, "mods") in BUILT_FWD_SM90_KERNELS:
        alibi = dict(alibi_slopes=torch.rand(8, device="cuda"))
        assert _ws_consumers(run(1, 4096, **alibi)) == 3
        assert _ws_consumers(run(16, 256, **alibi)) == 2
        assert _ws_consumers(run(1, 4096, window_size=(1024, 1024))) == 3
        assert _ws_consumers(run(1, 4096, window_size=(256, 0))) == 2, "257 keys a row"
    if ("bf16", 64, causal, "dropout") in BUILT_FWD_SM90_KERNELS:
        assert _ws_consumers(run(1, 4096, dropout_p=0.1)) == 3
        assert _ws_consumers(run(16, 256, dropout_p=0.1)) == 2
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", "3")
    assert _ws_consumers(run(2, 1024)) == 3
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", "2")
    assert _ws_consumers(run(1, 4096)) == 2


@pytest.mark.parametrize("causal", [False, True])
def test_kernel_choice_above_head_dim_128(causal):
    """At head dim 256 short sequences (256 keys) take the warp-specialized kernel on the plain
    kernels (causal, a left window), the score mods with a window edge the SM80 kernel, and a narrow
    window in a long sequence the three-CTA kernel; the outputs match the reference."""
    _require_built(torch.bfloat16, 256, causal)
    short = tuple(_randn(32, 256, 8, 256, dtype=torch.bfloat16) for _ in range(3))
    long = tuple(_randn(2, 1024, 8, 256, dtype=torch.bfloat16) for _ in range(3))
    run = lambda qkv, **kw: lambda: fac.flash_attn_func(*qkv, causal=causal, **kw)  # noqa: E731
    for qkv, mods, ws in ((short, {}, True), (short, dict(window_size=(64, 0)), True),
                          (long, dict(window_size=(64, 0)), False)):
        names = _kernel_names(run(qkv, **mods))
        assert any("flash_fwd_sm90_ws_kernel" in n for n in names) == ws, mods
        assert ws or any("flash_fwd_sm90_kernel" in n for n in names), mods
        out, lse = run(qkv, return_attn_probs=True, **mods)()[:2]
        _check(*qkv, causal, out, lse, **mods)
    if causal and ("bf16", 256, True, "mods") in BUILT_FWD_SM90_KERNELS:
        slopes = torch.rand(8, device="cuda") * 0.3
        names = _kernel_names(run(short, alibi_slopes=slopes))
        assert any("flash_fwd_kernel" in n for n in names) and not any("sm90" in n for n in names)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_three_cta_dropout_matches_reference(head_dim, causal, monkeypatch):
    """Dropout on the three-CTA kernel (FLASH_ATTN_CUTE_SM90_WS=0; by default short rows at head dim
    128 take the warp-specialized one): the reference applies the mask the kernel returns."""
    _require_built(torch.bfloat16, head_dim, causal, "dropout")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "0")
    torch.manual_seed(3)
    q = _randn(2, 200, 8, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(2, 333, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    call = lambda: fac.flash_attn_func(q, k, v, dropout_p=0.17, causal=causal, return_attn_probs=True)  # noqa: E731
    assert _takes_three_cta_kernel(call)
    out, lse, probs = call()
    _check(q, k, v, causal, out, lse, dropout_p=0.17, dropout_mask=~probs.signbit())


@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_warp_specialized_dropout_with_two_and_three_consumers(causal, consumers, monkeypatch):
    """Dropout on the warp-specialized kernel at head dim 64 with two and with three consumer
    warpgroups (the three draw their Philox words where they use them, fwd_kernel_sm90_ws.h); ragged
    row and key counts, GQA. The reference applies the mask the kernel returns."""
    _require_built(torch.bfloat16, 64, causal, "dropout")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", str(consumers))
    torch.manual_seed(5)
    q = _randn(2, 1100, 8, 64, dtype=torch.bfloat16)
    k, v = (_randn(2, 1237, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    call = lambda: fac.flash_attn_func(q, k, v, dropout_p=0.17, causal=causal, return_attn_probs=True)  # noqa: E731
    assert _ws_consumers(call) == consumers
    out, lse, probs = call()
    _check(q, k, v, causal, out, lse, dropout_p=0.17, dropout_mask=~probs.signbit())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dim_256_score_mods_and_dropout_take_the_warp_specialized_kernel(causal):
    """At head dim 256 the softcap, ALiBi, window and dropout calls on full rows (not causal, no
    window) or whose rows see 256 keys or more run the warp-specialized kernel, the others the SM80
    kernel (no three-CTA kernel there); both match the reference."""
    torch.manual_seed(3)
    slopes = torch.rand(8, device="cuda", dtype=torch.float32) * 0.3
    cases = [("mods", "softcap"), ("mods", "alibi"), ("dropout", "dropout")]
    if not causal:  # (a causal window runs the plain causal kernel)
        cases.append(("mods", "window"))
    for variant in ("mods", "dropout"):
        _require_built(torch.bfloat16, 256, causal, variant)
    for variant, name in cases:
        for seqlen, long_rows in ((1024, True), (160, False)):
            mods = {"softcap": dict(softcap=30.0), "alibi": dict(alibi_slopes=slopes), "dropout": dict(dropout_p=0.2),
                    "window": dict(window_size=(2 * seqlen // 5, 2 * seqlen // 5))}[name]  # local at both lengths
            batch = _batch_filling_sms(seqlen, 8)  # (fewer row blocks take the split-KV kernel)
            q, k, v = (_randn(batch, seqlen, 8, 256, dtype=torch.bfloat16) for _ in range(3))
            call = lambda: fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **mods)  # noqa: E731
            names = _kernel_names(call)
            ws = long_rows or (not causal and name != "window")
            assert any("flash_fwd_sm90_ws_kernel" in n for n in names) == ws, (mods, seqlen)
            assert ws or any("flash_fwd_kernel" in n for n in names), (mods, seqlen)
            assert not any("flash_fwd_sm90_kernel" in n for n in names), (mods, seqlen)
            out, lse, probs = call()
            ref_mods = dict(mods, dropout_mask=~probs.signbit()) if variant == "dropout" else mods
            _check(q, k, v, causal, out, lse, **ref_mods)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_warp_specialized_tiles_of_every_size(causal, head_dim, monkeypatch):
    """The persistent kernel's CTAs take their tiles from a counter that each launch leaves at 0
    for the next call on its stream (a graph capture gets a counter of its own): many tiles per SM
    of every size (varlen, causal, empty sequences, row blocks past a sequence's end), back-to-back
    calls of different tile counts, another stream and a CUDA graph's replays, then eager calls
    again, all give the reference's output. At head dim 64 on the three-consumer kernel (192-row
    tiles)."""
    _require_built(torch.bfloat16, head_dim, causal)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", "3")
    gen = torch.Generator().manual_seed(20)
    seqlens_q = torch.randint(0, 1200, (40,), generator=gen).tolist()
    seqlens_k = torch.randint(0, 1200, (40,), generator=gen).tolist()
    seqlens_q[3], seqlens_k[7], seqlens_q[11], seqlens_k[11] = 0, 0, 1, 1
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), 8, head_dim, dtype=torch.bfloat16)
    k = _randn(int(cu_k[-1]), 2, head_dim, dtype=torch.bfloat16)
    v = _randn(int(cu_k[-1]), 2, head_dim, dtype=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    call = lambda: fac.fwd(q, k, v, out=out, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,  # noqa: E731
                           max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k), causal=causal)
    assert _takes_hopper_kernel(call, ws=True) and (head_dim != 64 or _ws_consumers(call) == 3)

    def check(q):
        _check_varlen(q, k, v, cu_q, cu_k, out, causal=causal)

    q2 = _randn(3, 700, 8, head_dim, dtype=torch.bfloat16)  # 3 x 8 x 6 tiles between the varlen calls
    k2, v2 = (_randn(3, 900, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    other = lambda: fac.fwd(q2, k2, v2, causal=causal)  # noqa: E731
    other_first, other_lse = other()
    _check(q2, k2, v2, causal, other_first, other_lse)
    call()
    first = out.clone()
    check(q)
    for _ in range(3):
        assert torch.equal(other()[0], other_first), "a launch finds the counter its stream's last launch left at 0"
        out.fill_(float("nan"))
        call()
        assert torch.equal(out, first), "a launch finds the counter its stream's last launch left at 0"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(2):
        q.copy_(_randn(*q.shape, dtype=torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(q)
        assert torch.equal(other()[0], other_first), "eager calls after a replay"
    out.fill_(float("nan"))
    call()
    check(q)


# (causal, window_size, ALiBi) of test_warp_specialized_tiles_without_keys_among_tiles_with_keys
NO_KEY_TILES = [(True, (-1, -1), False), (False, (100, 10), False), (False, (100, 10), True)]


@pytest.mark.parametrize("causal, window, alibi", NO_KEY_TILES, ids=["causal", "window", "window_alibi"])
def test_warp_specialized_tiles_without_keys_among_tiles_with_keys(causal, window, alibi, monkeypatch):
    """Far fewer keys than queries (bottom-right aligned): the top six of each head's eight row
    blocks see no key (O = 0, LSE = +inf). With 1024 tiles over the persistent CTAs, a CTA's tiles
    with keys and without follow each other (causal: the bottom row blocks first; the window's
    tiles go head by head, so both ways). A tile without keys gets a Q buffer but no K or V, and
    the tiles after it must still find their own (fixed-length batches: TMA loads)."""
    seqlen_q, seqlen_k, nheads = 1024, 200, 16
    slopes = torch.rand(nheads, device="cuda", dtype=torch.float32) * 0.3 if alibi else None
    variant = kernel_variant(window, 0.0, "per_head" if alibi else None, causal, seqlen_k)
    _require_built(torch.bfloat16, 128, kernel_causal(causal, window), variant)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    q = _randn(8, seqlen_q, nheads, 128, dtype=torch.bfloat16)
    k, v = (_randn(8, seqlen_k, 4, 128, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    mods = dict(window_size=window, alibi_slopes=slopes)
    call = lambda: fac.fwd(q, k, v, out=out, causal=causal, **mods)  # noqa: E731
    assert _takes_hopper_kernel(call, ws=True)
    out.fill_(float("nan"))
    _, lse = call()
    assert (lse[:, :, : 6 * 128] == float("inf")).all(), "the top row blocks see no key"
    _check(q, k, v, causal, out, lse, **mods)


# Query lengths whose bottom tile leaves consumers without rows: on 128-row tiles (two consumers) 64
# and 130 (the second idle), on 192-row tiles (three) 64, 200 and 1024 (the second and third) and 130
# and 1050 (the third); 1050 on 128-row tiles too.
IDLE_SEQLENS_Q = [64, 130, 200, 1024, 1050]


@pytest.mark.parametrize("variant", ["plain", "alibi", "dropout"])
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_warp_specialized_consumers_without_rows(head_dim, causal, consumers, variant, monkeypatch):
    """A consumer whose rows all lie past the sequence's end takes its turns without the tile's work
    (fwd_ws_consume's idle_turns): the other consumers' rows, the next tiles' and the next calls' all
    match the reference. Each length alone (TMA loads, many such tiles in a row), then all of them in
    one varlen call (an empty sequence and a one-row one among them), into poisoned
    outputs."""
    if consumers == 3 and head_dim != 64:
        pytest.skip("three consumers: head dim 64 only")
    _require_built(torch.bfloat16, head_dim, causal, {"alibi": "mods"}.get(variant, variant))
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", str(consumers))
    torch.manual_seed(1)
    nheads, nheads_k, seqlen_k, p = 16, 4, 700, 0.17
    slopes = torch.rand(nheads, device="cuda", dtype=torch.float32) * 0.3 if variant == "alibi" else None
    mods = dict(alibi_slopes=slopes, dropout_p=p if variant == "dropout" else 0.0)

    def run_and_check(q, k, v, **varlen):
        out = torch.full_like(q, float("nan"))
        call = lambda: fac.fwd(q, k, v, out=out, causal=causal, **mods, **varlen)  # noqa: E731
        assert _takes_hopper_kernel(call, ws=True)
        if head_dim == 64:
            assert _ws_consumers(call) == consumers
        out.fill_(float("nan"))
        result = call()
        assert not out.isnan().any(), "every output element is written"
        ref_mods = dict(alibi_slopes=slopes)
        if variant == "dropout":
            shape = (len(varlen["cu_seqlens_q"]) - 1, nheads, varlen["max_seqlen_q"], varlen["max_seqlen_k"]) \
                if varlen else (q.size(0), nheads, q.size(1), k.size(1))
            keep = fac.dropout_mask(result[2], p, *shape, varlen.get("cu_seqlens_q"), varlen.get("cu_seqlens_k"))
            ref_mods = dict(dropout_p=p, dropout_mask=keep)
        if varlen:
            _check_varlen(q, k, v, varlen["cu_seqlens_q"], varlen["cu_seqlens_k"], out, result[1], causal=causal,
                          **ref_mods)
        else:
            _check(q, k, v, causal, out, result[1], **ref_mods)

    for seqlen_q in IDLE_SEQLENS_Q:
        batch = _batch_filling_sms(seqlen_q, nheads)
        q = _randn(batch, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
        k, v = (_randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
        run_and_check(q, k, v)
    seqlens_q = IDLE_SEQLENS_Q + [0, 1] + IDLE_SEQLENS_Q
    seqlens_k = [seqlen_k, 333, 1, 90, 1024, 700, 5, 64, 128, 1000, 200, 1050]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), nheads, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(int(cu_k[-1]), nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    run_and_check(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q),
                  max_seqlen_k=max(seqlens_k))


# (seqlen_q, seqlen_k, causal, mods) where the tile's top or bottom key blocks lie outside some
# consumer's rows' keys: causal diagonals 0, 64 and 100 keys right of the square's and 500 left of it
# (top consumers that see no key at all), windows narrower and wider than a tile; with dropout, ALiBi
# (its bias first), and bf16 softcap's fixed-offset (30) and checked (60) kernels.
SKIP_CASES = [(2048, 2048, True, {}), (1000, 1064, True, {}), (1500, 1600, True, {}), (1500, 1000, True, {}),
              (4096, 4096, False, {"window_size": (1024, 0)}), (3000, 3000, False, {"window_size": (512, 512)}),
              (2000, 2100, False, {"window_size": (90, 20)}),
              (2000, 2000, False, {"window_size": (300, 0), "dropout_p": 0.17}),
              (1500, 1600, True, {"alibi": True}), (2000, 2000, True, {"softcap": 30.0}),
              (2000, 2100, False, {"window_size": (300, 0), "softcap": 60.0}), (1500, 1000, True, {"softcap": 30.0})]
SKIP_IDS = [f"{a}x{b}-{'causal-' if c else ''}" + "-".join(f"{k}{v}" for k, v in mods.items())
            for a, b, c, mods in SKIP_CASES]


@pytest.mark.parametrize("case", SKIP_CASES, ids=SKIP_IDS)
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_warp_specialized_consumers_skip_blocks_their_rows_do_not_see(head_dim, consumers, case, monkeypatch):
    """A consumer of a tile whose rows see none of a key block of the tile (a causal diagonal or a
    window edge inside the tile) skips that step, issuing the P V its last block left pending in
    the skipped turn; a consumer whose rows see no key skips them all (O = 0, LSE = +inf). out and
    LSE against the reference, into a poisoned output, on two and three consumers (192-row tiles:
    the diagonal leaves the top consumers out of the tile's top block; bf16 softcap's kernels have
    three either way)."""
    seqlen_q, seqlen_k, causal, mods = case
    mods = dict(mods)
    p = mods.pop("dropout_p", 0.0)
    if consumers == 3 and head_dim != 64:
        pytest.skip("three consumers: head dim 64 only")
    if mods.pop("alibi", False):
        mods["alibi_slopes"] = torch.rand(8, device="cuda", dtype=torch.float32) * 0.3
    window = mods.get("window_size", (-1, -1))
    variant = kernel_variant(window, mods.get("softcap", 0.0), mods.get("alibi_slopes"), causal, seqlen_k, p)
    _require_built(torch.bfloat16, head_dim, kernel_causal(causal, window), variant)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS_CONSUMERS", str(consumers))
    torch.manual_seed(2)
    q = _randn(2, seqlen_q, 8, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(2, seqlen_k, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    call = lambda: fac.fwd(q, k, v, out=out, causal=causal, dropout_p=p, **mods)  # noqa: E731
    assert _takes_hopper_kernel(call, ws=True)
    if head_dim == 64 and not mods.get("softcap"):
        assert _ws_consumers(call) == consumers
    out.fill_(float("nan"))
    result = call()
    assert not out.isnan().any(), "every output element is written"
    if p > 0.0:
        mods.update(dropout_p=p, dropout_mask=fac.dropout_mask(result[2], p, 2, 8, seqlen_q, seqlen_k))
    _check(q, k, v, causal, out, result[1], **mods)


def _layout(layout, batch, seqlen, nheads, head_dim, dtype):
    """A (batch, seqlen, nheads, head_dim) tensor with the strides of one memory layout."""
    if layout == "bshd":
        return _randn(batch, seqlen, nheads, head_dim, dtype=dtype)
    if layout == "bhsd":
        return _randn(batch, nheads, seqlen, head_dim, dtype=dtype).transpose(1, 2)
    # "packed": one of three tensors interleaved per row, as a fused QKV projection leaves them
    return _randn(batch, seqlen, 3, nheads, head_dim, dtype=dtype)[:, :, 1]


@pytest.mark.parametrize("softcap", [0.0, 30.0, 60.0], ids=["plain", "softcap", "softcap60"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "packed"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 120, 128, 192, 256])
def test_warp_specialized_tma_and_cp_async_loads_agree(head_dim, causal, layout, softcap, monkeypatch):
    """The warp-specialized kernel loads Q, K and V by TMA where the tensors allow it and with cp.async
    elsewhere (FLASH_ATTN_CUTE_SM90_TMA=0 forces cp.async, =require fails a launch that cannot use
    TMA): both fill shared memory alike (zeros past each sequence's end and past head_dim), so the
    outputs and LSEs are bitwise equal, and right. Softcap 30 and 60: bf16's fixed-offset and checked
    kernels."""
    variant = "mods" if softcap else "plain"
    _require_built(torch.bfloat16, head_dim, causal, variant)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(1)
    q = _layout(layout, 2, 1023, 8, head_dim, torch.bfloat16)
    k = _layout(layout, 2, 1500, 2, head_dim, torch.bfloat16)
    v = _layout(layout, 2, 1500, 2, head_dim, torch.bfloat16)
    call = lambda: fac.fwd(q, k, v, causal=causal, softcap=softcap)  # noqa: E731
    assert _takes_hopper_kernel(call, ws=True)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "require")
    out, lse = call()
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "0")
    out_cp_async, lse_cp_async = call()
    assert torch.equal(out, out_cp_async)
    assert torch.equal(lse, lse_cp_async)
    _check(q, k, v, causal, out, lse, softcap=softcap)


@pytest.mark.parametrize("keys", ["cu_seqlens_k", "seqused_k"])
@pytest.mark.parametrize("variant", ["plain", "mods", "dropout"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 120, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_warp_specialized_varlen_tma_loads(dtype, head_dim, causal, variant, keys, monkeypatch):
    """Varlen, the warp-specialized kernel loads by TMA too. A sequence's last row block of Q and
    last key block of V read the next sequence's first rows there (seqused_k: the sequence's own
    keys past it), which the producer zeroes after they land, as cp.async leaves them. So the
    outputs and LSEs equal cp.async's bitwise, and non-finite values in one sequence's first query,
    key and value rows reach no other sequence's output."""
    _require_built(dtype, head_dim, causal, variant)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(5)
    seqlens_q, seqlens_k = [0, 17, 300, 1, 255, 700, 130], [5, 0, 299, 77, 513, 650, 1]
    cu_q, cu_k = (torch.tensor([0] + s, device="cuda").cumsum(0).int() for s in (seqlens_q, seqlens_k))
    q = _randn(int(cu_q[-1]), 8, head_dim, dtype=dtype)
    k, v = (_randn(int(cu_k[-1]), 2, head_dim, dtype=dtype) for _ in range(2))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k),
              causal=causal, dropout_p=0.1 if variant == "dropout" else 0.0)
    if keys == "seqused_k":  # each sequence's last 10 keys unused (some sequences have fewer)
        kw["seqused_k"] = (cu_k[1:] - cu_k[:-1] - 10).clamp(min=0).int()
    if variant == "mods":
        kw.update(softcap=20.0, window_size=(200, -1 if not causal else 0))

    def call(q, k, v):
        if variant == "dropout":
            torch.manual_seed(9)  # the same mask each call
        return fac.fwd(q, k, v, **kw)[:2]

    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "require")  # a launch that cannot use TMA fails
    assert _takes_hopper_kernel(lambda: call(q, k, v), ws=True)
    out, lse = call(q, k, v)
    # Sequence 4's first query, key and value rows follow sequences 2 and 3's last blocks: non-finite.
    q_bad, k_bad, v_bad = q.clone(), k.clone(), v.clone()
    q_bad[int(cu_q[4]), 0, 0], k_bad[int(cu_k[4]), 1, 1] = float("nan"), float("inf")
    v_bad[int(cu_k[4]) : int(cu_k[4]) + 2, :, 2] = float("inf")
    out_bad, lse_bad = call(q_bad, k_bad, v_bad)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "0")
    out_cp_async, lse_cp_async = call(q, k, v)
    assert torch.equal(out, out_cp_async) and torch.equal(lse, lse_cp_async), "TMA and cp.async loads differ"
    others = torch.ones(q.size(0), dtype=torch.bool, device="cuda")
    others[int(cu_q[4]) : int(cu_q[5])] = False
    assert torch.equal(out_bad[others], out[others]), "sequence 4's non-finite rows reached another sequence"
    assert torch.equal(lse_bad[:, others], lse[:, others])
    if variant == "plain":
        used = kw.get("seqused_k")
        if used is None:
            _check_varlen(q, k, v, cu_q, cu_k, out, lse, causal=causal)
        else:  # the reference on each sequence's used keys alone
            ends = cu_k[:-1] + used
            keep = torch.cat([torch.arange(int(a), int(b), device="cuda") for a, b in zip(cu_k[:-1], ends)])
            cu_used = torch.cat([used.new_zeros(1), used.cumsum(0)]).int()
            _check_varlen(q, k[keep], v[keep], cu_q, cu_used, out, lse, causal=causal)


@pytest.mark.parametrize("softcap", [0.0, 30.0, 60.0, 200.0], ids=["plain", "softcap", "softcap60", "softcap200"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_warp_specialized_rescales_o_as_later_key_blocks_score_higher(head_dim, causal, softcap, monkeypatch):
    """The kernel walks the key blocks from the last one down; here the scores grow toward the first
    keys, so the row max keeps outgrowing the exponent's offset and O is rescaled at later steps (the
    lazy rescale, which at head dim 128 waits for the previous block's P V while the step's
    exponentials run). Random scores rarely move the offset after the first block. bf16 softcap
    rescales only on the running max: at a cap of 200 (at 60 its kernel moves to the fixed offset at
    once, and the growing terms test that offset's bound from above; smaller caps take it always)."""
    variant = "mods" if softcap else "plain"
    _require_built(torch.bfloat16, head_dim, causal, variant)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(3)
    seqlen_q, seqlen_k = 1000, 1800  # 2 x 8 heads x 8 row blocks: enough to fill the SMs without split-KV
    q = _randn(2, seqlen_q, 8, head_dim, dtype=torch.bfloat16)
    growth = 1 + 6 * torch.linspace(1, 0, seqlen_k, device="cuda")  # 7x at key 0, 1x at the last key
    k = (_randn(2, seqlen_k, 2, head_dim, dtype=torch.float32) * growth[None, :, None, None]).to(torch.bfloat16)
    v = _randn(2, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
    call = lambda: fac.fwd(q, k, v, causal=causal, softcap=softcap)  # noqa: E731
    assert _takes_hopper_kernel(call, ws=True)
    out, lse = call()
    _check(q, k, v, causal, out, lse, softcap=softcap)


@pytest.mark.parametrize("softcap", [5.0, 30.0, 50.0, 57.0, 58.0, 200.0])
@pytest.mark.parametrize("scores", ["random", "all_near_minus_cap"])
@pytest.mark.parametrize("seqlens", [(333, 1023), (1023, 300)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_softcap_over_the_range_of_caps(head_dim, causal, seqlens, scores, softcap, hopper_kernel):
    """bf16 softcap needs no running max: its logits lie in (-cap, cap), so up to a cap of 57.5 the
    Hopper kernels exponentiate with one fixed offset (softmax.h's BoundedScores); larger caps start
    on the running max and move to that offset once each row has a term of 2^-86 or more under it
    (random logits at a cap of 58; not at 200, nor all_near_minus_cap). all_near_minus_cap: every
    logit of a row sits near -cap, where that offset gives the smallest terms (2^-86 at a cap of
    57.5; O is their weighted sum of V). Causal 1023 x 300: the first rows see no key (O = 0,
    LSE = +inf)."""
    _require_built(torch.bfloat16, head_dim, causal, "mods")
    ws = _require_kernel(hopper_kernel, head_dim, per_tile=False)
    torch.manual_seed(5)
    (seqlen_q, seqlen_k), (nheads, nheads_k), d = seqlens, (16, 4), head_dim
    batch = _batch_filling_sms(seqlen_q, nheads)
    bf16 = torch.bfloat16
    if scores == "random":
        q = _randn(batch, seqlen_q, nheads, d, dtype=bf16, scale=3.0)
        k = _randn(batch, seqlen_k, nheads_k, d, dtype=bf16)
    else:  # keys near one direction u, queries along -u: q.k / sqrt(d) about -30 sqrt(d) for every key
        u = _randn(1, 1, 1, d, dtype=torch.float32)
        q = (-30.0 * u + 0.1 * _randn(batch, seqlen_q, nheads, d, dtype=torch.float32)).to(bf16)
        k = (u + 0.1 * _randn(batch, seqlen_k, nheads_k, d, dtype=torch.float32)).to(bf16)
    v = _randn(batch, seqlen_k, nheads_k, d, dtype=bf16)
    call = lambda: fac.fwd(q, k, v, causal=causal, softcap=softcap)  # noqa: E731
    if _ws_only(head_dim, "mods") and not ws:  # a Hopper kernel runs only where it is the WS one
        assert _takes_hopper_kernel(call) == _takes_hopper_kernel(call, ws=True)
    else:
        assert _takes_hopper_kernel(call, ws)
    out, lse = call()
    _check(q, k, v, causal, out, lse, softcap=softcap)


def _mixed_logit_rows(batch, seqlen, nheads, nheads_k, d):
    """q, k, v whose query rows alternate, 64 at a time, between random logits and logits near -cap
    for every key (keys near one direction u, those queries along -u), some rows mixing both."""
    f32 = torch.float32
    u = _randn(1, 1, 1, d, dtype=f32)
    k = (u + 0.3 * _randn(batch, seqlen, nheads_k, d, dtype=f32)).to(torch.bfloat16)
    v = _randn(batch, seqlen, nheads_k, d, dtype=torch.bfloat16)
    rows = torch.arange(seqlen, device="cuda")
    low = ((rows // 64) % 2 == 0) | (rows % 97 == 5)  # (seqlen,): rows whose logits sit near -cap
    q = torch.where(low[None, :, None, None], -30.0 * u, 3.0 * _randn(batch, seqlen, nheads, d, dtype=f32))
    q = (q + 0.1 * _randn(batch, seqlen, nheads, d, dtype=f32)).to(torch.bfloat16)
    return q, k, v


@pytest.mark.parametrize("softcap", [58.0, 60.0, 100.0, 150.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_softcap_checked_offset_per_consumer(head_dim, causal, softcap, monkeypatch):
    """bf16 caps above 57.5, where the fixed offset holds only for rows with a term of 2^-86 or
    more under it. Up to a cap of 100 the fixed-offset kernel runs first and lists each tile with a
    consumer whose rows' sums do not show one (Softmax::sums_reach); the checked kernel then redoes
    the listed tiles. It alone takes larger caps: each tile starts on the running max and moves to
    the fixed offset once every row of a consumer's 64 shows it (Softmax::offsets_reach); a consumer
    with a row that never does stays on the running max. The rows of _mixed_logit_rows: in one tile
    some consumers hold and others do not."""
    _require_built(torch.bfloat16, head_dim, causal, "mods")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(8)
    q, k, v = _mixed_logit_rows(2, 1000, 8, 2, head_dim)
    call = lambda: fac.fwd(q, k, v, causal=causal, softcap=softcap)  # noqa: E731
    assert _takes_hopper_kernel(call, ws=True)
    out, lse = call()
    _check(q, k, v, causal, out, lse, softcap=softcap)


@pytest.mark.parametrize("alibi", [False, True], ids=["softcap", "softcap_alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softcap_listed_tiles_across_calls_and_graph_replays(causal, alibi, monkeypatch):
    """A cap of 100 takes two launches: the fixed-offset kernel, which lists the tiles to redo in the
    call's own list, and the checked kernel, which redoes them. At that cap a row near -cap has terms
    of about 2^-206 under the fixed offset, all flushed to 0: a tile not redone gives O = 0 there.
    Calls of different shapes whose tiles all hold, some hold, or none, back to back, then a graph's
    replays with new logits, then eager calls again: every output matches the reference."""
    _require_built(torch.bfloat16, 128, causal, "mods")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(9)
    cap = 100.0
    big = _mixed_logit_rows(3, 1500, 8, 2, 128)
    small = _mixed_logit_rows(1, 700, 8, 2, 128)
    low = big[0][:, :64].repeat(1, 24, 1, 1)[:, :1500].contiguous()  # every row as rows 0-63: near -cap
    rand = _randn(*big[0].shape, dtype=torch.bfloat16, scale=3.0)

    def run(q, k, v, out=None):
        slopes = torch.full((q.shape[2],), 0.05, device="cuda") if alibi else None
        return fac.fwd(q, k, v, out=out, causal=causal, softcap=cap, alibi_slopes=slopes), slopes

    def check(q, k, v, out=None):
        (out, lse), slopes = run(q, k, v, out)
        _check(q, k, v, causal, out, lse, softcap=cap, alibi_slopes=slopes)

    ws_kernels = [n for n in _kernel_names(lambda: run(*big)) if "flash_fwd_sm90_ws_kernel" in n]
    assert len(ws_kernels) == 2, "the fixed-offset kernel, then the checked one"
    for q, (_, k, v) in [(big[0], big), (small[0], small), (rand, big), (low, big), (small[0], small), (rand, big),
                         (big[0], big)]:
        check(q, k, v)
    q = big[0].clone()
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (_, lse), slopes = run(q, big[1], big[2], out)
    for new_q in [rand, big[0], low, big[0]]:
        q.copy_(new_q)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(q, big[1], big[2], causal, out, lse, softcap=cap, alibi_slopes=slopes)
    check(*small)


def test_softcap_listed_tiles_from_threads_sharing_a_stream(monkeypatch):
    """Two host threads calling on one stream (the default one) may interleave their listing and
    redo launches: each call lists into a list of its own, so every output equals the same call's
    output run alone."""
    _require_built(torch.bfloat16, 128, True, "mods")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(10)
    cases = [_mixed_logit_rows(2, 1000, 8, 2, 128), _mixed_logit_rows(1, 1500, 8, 2, 128)]
    alone = [fac.fwd(q, k, v, causal=True, softcap=100.0)[0] for q, k, v in cases]
    _check(*cases[0], True, alone[0], fac.fwd(*cases[0], causal=True, softcap=100.0)[1], softcap=100.0)
    mismatches = []

    def worker(i):
        q, k, v = cases[i]
        for _ in range(20):
            out = fac.fwd(q, k, v, causal=True, softcap=100.0)[0]
            torch.cuda.current_stream().synchronize()
            if not torch.equal(out, alone[i]):
                mismatches.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not mismatches, f"calls whose output differs from the same call alone: {mismatches}"


# ALiBi slopes of every size and sign: steep, none, negative (a row's farthest keys weigh most).
SIGNED_SLOPES = [1.0, 0.25, 2.0 ** -5, 0.0, -0.01, -2.0 ** -7, 0.5, 2.0 ** -8]


@pytest.mark.parametrize("softcap, scores", [(30.0, "random"), (57.0, "random"), (57.0, "all_near_minus_cap"),
                                             (58.0, "random"), (150.0, "random")], ids=str)
@pytest.mark.parametrize("window", [(-1, -1), (100, 30)], ids=["nowindow", "window100-30"])
@pytest.mark.parametrize("seqlens", [(333, 1023), (1023, 300), (1024, 1024), (700, 3000)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_softcap_alibi_over_slopes_and_windows(head_dim, causal, seqlens, window, softcap, scores, hopper_kernel):
    """bf16 softcap with ALiBi: up to a cap of 57.5 each row exponentiates with one fixed offset,
    BoundedScores' plus the row's largest bias (FwdMask::alibi_max_bias: on the visible key nearest
    the row's diagonal, or the farthest for a negative slope); a cap of 58 lists the tiles where
    that offset may not hold for the checked kernel (the running max, then that offset) to redo, and
    one of 150 takes the checked kernel throughout. Non-causal 1023 x 300: most rows' diagonals lie
    past the last key, so their nearest key is hundreds of positions away (with the window, many
    rows see no key: O = 0, LSE = +inf). Non-causal from head dim 96, the fixed offsets take ALiBi's
    side form on the key blocks after a tile's diagonal ones (700 x 3000: most of them, on both
    sides), but for the checked kernel at head dim 256."""
    _require_built(torch.bfloat16, head_dim, kernel_causal(causal, window), "mods")
    ws = _require_kernel(hopper_kernel, head_dim, per_tile=False)
    if not ws and _ws_only(head_dim, "mods"):
        pytest.skip(f"no three-CTA score-mod Hopper forward at head dim {head_dim}")
    torch.manual_seed(6)
    (seqlen_q, seqlen_k), (nheads, nheads_k), d, bf16 = seqlens, (16, 4), head_dim, torch.bfloat16
    batch = _batch_filling_sms(seqlen_q, nheads)
    if scores == "random":
        q = _randn(batch, seqlen_q, nheads, d, dtype=bf16, scale=3.0)
        k = _randn(batch, seqlen_k, nheads_k, d, dtype=bf16)
    else:  # every logit of a row near -cap, as in test_softcap_over_the_range_of_caps
        u = _randn(1, 1, 1, d, dtype=torch.float32)
        q = (-30.0 * u + 0.1 * _randn(batch, seqlen_q, nheads, d, dtype=torch.float32)).to(bf16)
        k = (u + 0.1 * _randn(batch, seqlen_k, nheads_k, d, dtype=torch.float32)).to(bf16)
    v = _randn(batch, seqlen_k, nheads_k, d, dtype=bf16)
    slopes = torch.tensor(SIGNED_SLOPES * (nheads // len(SIGNED_SLOPES)), device="cuda")
    slopes = slopes * (1.0 + torch.rand(batch, nheads, device="cuda"))  # (batch, heads)
    mods = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    call = lambda: fac.fwd(q, k, v, causal=causal, **mods)  # noqa: E731
    assert _takes_hopper_kernel(call, ws)
    out, lse = call()
    _check(q, k, v, causal, out, lse, **mods)


@pytest.mark.parametrize("mods", ["alibi", "alibi_window", "softcap_alibi", "softcap60_alibi"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_warp_specialized_alibi_walk_varlen(head_dim, dtype, mods, monkeypatch):
    """Non-causal ALiBi tiles walk their key blocks from their diagonal's block up, then down
    (KeyBlockWalk), the producer's loads in the same order (cp.async: varlen): sequences whose
    diagonals lie before, inside and past their keys, empty ones, slopes of both signs; softcap's
    fixed-offset ALiBi loop (bf16, cap 30), the online one (fp16) and the checked one (a cap of 60)
    too."""
    _require_built(dtype, head_dim, False, "mods")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(7)
    seqlens_q = [0, 17, 300, 513, 1, 1000, 700]
    seqlens_k = [5, 0, 1000, 513, 77, 300, 700]
    q, k, v, _, cu_q, cu_k = _varlen_case(dtype, head_dim, seqlens_q, seqlens_k, nheads=8, nheads_k=2)
    slopes = torch.tensor(SIGNED_SLOPES, device="cuda") * (1.0 + torch.rand(len(seqlens_q), 8, device="cuda"))
    kw = dict(alibi_slopes=slopes)
    if "window" in mods:
        kw.update(window_size=(200, 50))
    if "softcap" in mods:
        kw.update(softcap=60.0 if "60" in mods else 30.0)
    call = lambda: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                              return_attn_probs=True, **kw)
    assert _takes_hopper_kernel(call, ws=True)
    out, lse, _ = call()
    _check_varlen(q, k, v, cu_q, cu_k, out, lse, **kw)


@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 104, 128, 160, 192, 256])
def test_warp_specialized_dropout_matches_reference(head_dim, causal, seqlens, monkeypatch):
    """Dropout on the warp-specialized kernel: the reference applies the mask the kernel reports,
    forward and backward (test_dropout.py's check), and out_residual is O's rounding error."""
    _require_built(torch.bfloat16, head_dim, causal, "dropout")
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_WS", "1")
    torch.manual_seed(0)
    (seqlen_q, seqlen_k), p = seqlens, 0.17
    q = _randn(2, seqlen_q, 8, head_dim, dtype=torch.bfloat16)
    k = _randn(2, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
    v = _randn(2, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
    dout = _randn(2, seqlen_q, 8, head_dim, dtype=torch.bfloat16)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True)  # noqa: E731
    assert _takes_hopper_kernel(lambda: fn(q, k, v), ws=True)
    out, lse, keep, grads = _run_with_probs(fn, (q, k, v), dout)
    mods = dict(dropout_p=p, dropout_mask=keep)
    _check(q, k, v, causal, out, lse, **mods)
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, **mods, **kw)[0]  # noqa: E731
    _check_grads(grads, ref, (q, k, v), dout)
    residual = torch.full_like(q, float("nan"))
    out2, _, _ = fac.fwd(q, k, v, causal=causal, dropout_p=p, out_residual=residual)
    assert not residual.isnan().any(), "every residual element is written"
    assert (residual.float().abs() <= out2.float().abs() * 2.0 ** -8).all()


@pytest.mark.parametrize("heads", [(16, 16), (16, 1)], ids=["mha", "mqa"])
@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024), (512, 256)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [59, 128, 256])
def test_sm80_forward_on_hopper_matches_reference(head_dim, causal, seqlens, heads, monkeypatch):
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90", "0")
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, heads
    batch = _batch_filling_sms(seqlen_q, nheads)
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16)
    out, lse, _ = fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    _check(q, k, v, causal, out, lse)
