"""The Hopper backward (bwd_kernel_sm90.h), which calls take on compute capability 9.0 (deterministic
ones too), against the float32 reference with the kernel forced
(FLASH_ATTN_CUTE_SM90_BWD=1): kernel head dims 32, 64, 96, 128, 192 and 256 (and the head dims that
round up to them), causal or
not, MHA / GQA / MQA, seqlen_q above and below seqlen_k, varlen, the score mods (softcap, ALiBi,
windows, combined) and dropout. Also the default dispatch, and the SM80 backward on
the same device (FLASH_ATTN_CUTE_SM90_BWD=0), which Ampere runs."""
import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute._ops import BUILT_BWD_SM90_KERNELS, kernel_head_dim
from flash_attn_cute.reference import attention_ref, attention_varlen_ref

from test_bwd import _check_grads, _dense_ref, _grads_of
from test_fwd import _randn
from test_fwd_sm90 import _kernel_names, _layout

pytestmark = [pytest.mark.cuda, pytest.mark.sm90]

SEQLENS = [(1, 239), (113, 203), (127, 513), (512, 256), (1023, 1024), (2048, 2048)]
HEADS = {"mha": (8, 8), "gqa": (8, 2), "mqa": (8, 1)}


@pytest.fixture(autouse=True)
def hopper_backward_forced(monkeypatch):
    """Every call that the Hopper kernel is built for takes it (tests may switch it off)."""
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_BWD", "1")


def _require_built(dtype, head_dim, causal, variant="plain"):
    name = "fp16" if dtype == torch.float16 else "bf16"
    if (name, kernel_head_dim(head_dim), causal, variant) not in BUILT_BWD_SM90_KERNELS:
        pytest.skip(f"this build has no Hopper backward for {name} hdim {head_dim} ({variant})")


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [24, 32, 40, 64, 80, 96, 111, 128, 160, 192, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_hopper_bwd_matches_reference(dtype, head_dim, causal, seqlens, heads):
    _require_built(dtype, head_dim, causal)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS[heads]
    torch.manual_seed(0)
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    k = _randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype)
    dout = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    names = _kernel_names(lambda: _grads_of(fn, (q, k, v), dout))
    assert any("flash_bwd_sm90_kernel" in n for n in names)
    _check_grads(_grads_of(fn, (q, k, v), dout), _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 96, 128, 192, 256])
def test_hopper_bwd_varlen_uneven_and_empty_sequences(head_dim, causal):
    _require_built(torch.bfloat16, head_dim, causal)
    torch.manual_seed(1)
    seqlens_q, seqlens_k = [5, 0, 300, 129, 1], [17, 9, 0, 300, 64]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), 8, head_dim, dtype=torch.bfloat16)
    k = _randn(int(cu_k[-1]), 2, head_dim, dtype=torch.bfloat16)
    v = _randn(int(cu_k[-1]), 2, head_dim, dtype=torch.bfloat16)
    dout = _randn(*q.shape, dtype=torch.bfloat16)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    causal=causal)
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(lambda: _grads_of(fn, (q, k, v), dout)))
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("left", [0, 100, 511])
def test_hopper_bwd_causal_left_window(left):
    """Causal with a left window runs the plain causal kernel, its left edge masked at run time."""
    _require_built(torch.bfloat16, 128, True)
    torch.manual_seed(2)
    q, k, v, dout = (_randn(2, 1000, 8, 128, dtype=torch.bfloat16) for _ in range(4))
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=True, window_size=(left, 0))  # noqa: E731
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(lambda: _grads_of(fn, (q, k, v), dout)))
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=True, window_size=(left, 0), **kw)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


# (seqlen_q, seqlen_k) of the deterministic tests and the dQ order each takes at head dim 128 (64-row,
# 128-key blocks; at 64 128-row): not causal, 1000, 2000 x 300 and 1024 x 2048 rotate
# (bwd_dq_rotate: as many key blocks as row blocks at most, and at most half the SMs' worth), 300 x
# 2000 goes from the first key block up in the same grid, 9000 (71 key blocks, over 132 SMs / 2)
# runs key-block-major; causal, every one key-block-major.
DET_SEQLENS = [(1000, 1000), (2000, 300), (1024, 2048), (300, 2000), (9000, 9000)]


@pytest.mark.parametrize("heads", ["mha", "mqa"])
@pytest.mark.parametrize("seqlens", DET_SEQLENS, ids=[f"{a}x{b}" for a, b in DET_SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_hopper_bwd_deterministic(head_dim, causal, seqlens, heads):
    """deterministic=True runs the Hopper kernel's deterministic one (by default too: plain, up to head
    dim 128), and dq is bitwise the same over runs in every dQ order."""
    _require_built(torch.bfloat16, head_dim, causal)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS[heads]
    batch = 2 if seqlen_q < 9000 else 1  # the float32 reference holds seqlen_q * seqlen_k per head
    if seqlen_q >= 9000:
        nheads, nheads_k = nheads // 4, max(1, nheads_k // 4)
    torch.manual_seed(4)
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(batch, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(batch, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    out, lse = fac.fwd(q, k, v, causal=causal)
    bwd = lambda: fac.bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True)  # noqa: E731
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(bwd))
    det = [bwd() for _ in range(6)]
    for grads in det[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), grads, det[0]):
            assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    _check_grads(det[0], _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("variant", ["plain", "mods", "dropout"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "packed"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 120, 128, 192, 256])
def test_hopper_bwd_tma_and_cp_async_loads_agree(head_dim, causal, layout, variant, monkeypatch):
    """The Hopper backward loads Q and dO by TMA where the tensors allow it and with cp.async
    elsewhere (FLASH_ATTN_CUTE_SM90_TMA=0 forces cp.async, =require fails a launch that cannot use
    TMA): both fill shared memory alike (zeros past seqlen_q and past head_dim), so dK and dV are
    bitwise equal, dQ too where deterministic (plain, up to head dim 128), and right."""
    _require_built(torch.bfloat16, head_dim, causal, variant)
    torch.manual_seed(2)
    q, dout = (_layout(layout, 2, 1023, 8, head_dim, torch.bfloat16) for _ in range(2))
    k, v = (_layout(layout, 2, 777, 2, head_dim, torch.bfloat16) for _ in range(2))
    kw = dict(softcap=20.0, window_size=(300, -1 if not causal else 0)) if variant == "mods" else {}
    p = 0.15 if variant == "dropout" else 0.0
    out, lse, *rng = fac.fwd(q, k, v, causal=causal, dropout_p=p, **kw)
    bwd_kw = dict(kw, dropout_p=p, rng_state=rng[0] if rng else None)
    deterministic = variant == "plain" and head_dim <= 128
    bwd = lambda det: fac.bwd(dout, q, k, v, out, lse, causal=causal, deterministic=det, **bwd_kw)  # noqa: E731
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "require")
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(lambda: bwd(False)))
    grads = bwd(False), bwd(True) if deterministic else None
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "0")
    grads_cp_async = bwd(False), bwd(True) if deterministic else None
    for name, a, b in zip(("dk", "dv"), grads[0][1:], grads_cp_async[0][1:]):
        assert torch.equal(a, b), f"{name}: TMA and cp.async loads differ"
    if deterministic:
        for name, a, b in zip(("dq", "dk", "dv"), grads[1], grads_cp_async[1]):
            assert torch.equal(a, b), f"{name} (deterministic): TMA and cp.async loads differ"
    if variant == "plain":
        _check_grads(grads[0], _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("variant", ["plain", "mods", "dropout"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_hopper_bwd_varlen_tma_loads(dtype, head_dim, causal, variant, monkeypatch):
    """Varlen, the Hopper backward loads Q and dO by TMA too. A sequence's last row block reads the
    next sequence's first rows there, and the kernel zeroes them. So dK and dV equal cp.async's
    bitwise (dQ too where deterministic). A non-finite value in one sequence's Q or dO reaches no
    other sequence's gradients."""
    _require_built(dtype, head_dim, causal, variant)
    torch.manual_seed(3)
    seqlens_q, seqlens_k = [100, 0, 300, 77, 513], [90, 40, 300, 200, 600]
    cu_q, cu_k = (torch.tensor([0] + s, device="cuda").cumsum(0).int() for s in (seqlens_q, seqlens_k))
    q, dout = (_randn(int(cu_q[-1]), 4, head_dim, dtype=dtype) for _ in range(2))
    k, v = (_randn(int(cu_k[-1]), 2, head_dim, dtype=dtype) for _ in range(2))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k),
              causal=causal)
    if variant == "mods":
        kw.update(softcap=20.0, window_size=(150, -1 if not causal else 0))
    p = 0.15 if variant == "dropout" else 0.0
    out, lse, *rng = fac.fwd(q, k, v, dropout_p=p, **kw)
    bwd_kw = dict(kw, dropout_p=p, rng_state=rng[0] if rng else None)
    deterministic = variant == "plain" and head_dim <= 128

    def grads(q, dout, det=False):
        return fac.bwd(dout, q, k, v, out, lse, deterministic=det, **bwd_kw)

    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "require")  # a launch that cannot use TMA fails
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(lambda: grads(q, dout)))
    tma = grads(q, dout), grads(q, dout, True) if deterministic else None
    # Row 0 of sequence 2 sits in sequence 0's last row block (100 rows): non-finite there.
    row = int(cu_q[2])
    q_bad, dout_bad = q.clone(), dout.clone()
    q_bad[row, 0, 0], dout_bad[row, 1, 1] = float("inf"), float("nan")
    bad = grads(q_bad, dout_bad)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_TMA", "0")
    cp_async = grads(q, dout), grads(q, dout, True) if deterministic else None
    for name, a, b in zip(("dk", "dv"), tma[0][1:], cp_async[0][1:]):
        assert torch.equal(a, b), f"{name}: TMA and cp.async loads differ"
    if deterministic:
        for name, a, b in zip(("dq", "dk", "dv"), tma[1], cp_async[1]):
            assert torch.equal(a, b), f"{name} (deterministic): TMA and cp.async loads differ"
    others = torch.ones(k.size(0), dtype=torch.bool, device="cuda")
    others[int(cu_k[2]):int(cu_k[3])] = False
    for name, a, b in zip(("dk", "dv"), bad[1:], tma[0][1:]):
        assert torch.equal(a[others], b[others]), f"{name}: sequence 2's non-finite rows reached another sequence"
    if variant == "plain":
        ref = lambda q, k, v, **r: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **r)[0]  # noqa: E731
        _check_grads(tma[0], ref, (q, k, v), dout)


@pytest.mark.parametrize("head_dim, variant", [(64, "plain"), (128, "plain"), (64, "mods"), (128, "dropout"),
                                               (256, "plain")])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_varlen_on_hopper(head_dim, causal, variant):
    """Deterministic over varlen sequences with more and fewer key blocks than row blocks, no rows, no
    keys: the Hopper kernel where bwd_sm90_deterministic says (plain up to head dim 128), else the
    SM80 one; bitwise repeatable and right either way."""
    _require_built(torch.bfloat16, head_dim, causal, variant)
    torch.manual_seed(9)
    seqlens_q, seqlens_k = [1000, 0, 300, 2000, 17, 40], [1000, 5, 2000, 300, 900, 0]
    cu_q, cu_k = (torch.tensor([0] + s, device="cuda").cumsum(0).int() for s in (seqlens_q, seqlens_k))
    q, dout = (_randn(int(cu_q[-1]), 4, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k, v = (_randn(int(cu_k[-1]), 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    kw = {}
    if variant == "mods":
        kw = dict(softcap=15.0, alibi_slopes=torch.rand(4, device="cuda") * 0.2)
    if variant == "dropout":
        kw = dict(dropout_p=0.1, return_attn_probs=True)
    if not causal and variant != "plain":
        kw["window_size"] = (700, 300)

    def run():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        res = fac.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                         deterministic=True, **kw)
        out = res[0] if variant == "dropout" else res
        return res, torch.autograd.grad(out, leaves, dout)

    torch.manual_seed(10)
    names = _kernel_names(run)
    hopper = variant == "plain" and head_dim <= 128
    assert any(("flash_bwd_sm90_kernel" if hopper else "flash_bwd_kernel") in n for n in names), names
    assert hopper or not any("flash_bwd_sm90_kernel" in n for n in names), names
    runs = []
    for _ in range(4):
        torch.manual_seed(10)  # the same dropout mask
        runs.append(run())
    for _, grads in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), grads, runs[0][1]):
            assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    ref_kw = {key: val for key, val in kw.items() if key != "return_attn_probs"}
    if variant == "dropout":
        ref_kw["dropout_mask"] = ~runs[0][0][2].signbit()
    ref = lambda q, k, v, **r: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **ref_kw, **r)[0]  # noqa: E731
    _check_grads(runs[0][1], ref, (q, k, v), dout)


@pytest.mark.parametrize("heads", ["mha", "gqa"])
@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024)], ids=["113x203", "1023x1024"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
def test_sm80_bwd_on_hopper_when_switched_off(monkeypatch, head_dim, causal, seqlens, heads):
    """FLASH_ATTN_CUTE_SM90_BWD=0 keeps the SM80 backward (Ampere's), which must stay right here too."""
    _require_built(torch.bfloat16, head_dim, causal)
    monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_BWD", "0")
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS[heads]
    torch.manual_seed(3)
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(2, seqlen_k, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(2, seqlen_q, nheads, head_dim, dtype=torch.bfloat16)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    names = _kernel_names(lambda: _grads_of(fn, (q, k, v), dout))
    assert not any("flash_bwd_sm90_kernel" in n for n in names) and any("flash_bwd_kernel" in n for n in names)
    _check_grads(_grads_of(fn, (q, k, v), dout), _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("causal, seqlen", [(True, 512), (True, 1025), (False, 512)])
def test_default_dispatch_takes_the_hopper_kernel(monkeypatch, causal, seqlen):
    """Unset, FLASH_ATTN_CUTE_SM90_BWD sends every call to the Hopper kernel, short causal ones too
    (dispatch.cpp, bwd_takes_sm90); deterministic ones: test_hopper_bwd_deterministic."""
    _require_built(torch.bfloat16, 128, causal)
    monkeypatch.delenv("FLASH_ATTN_CUTE_SM90_BWD")
    torch.manual_seed(5)
    q, k, v, dout = (_randn(1, seqlen, 4, 128, dtype=torch.bfloat16) for _ in range(4))
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    names = _kernel_names(lambda: _grads_of(fn, (q, k, v), dout))
    assert any("flash_bwd_sm90_kernel" in n for n in names) and not any("flash_bwd_kernel" in n for n in names), names
    _check_grads(_grads_of(fn, (q, k, v), dout), _dense_ref(causal), (q, k, v), dout)


MODS = {
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi=True),
    "window": dict(window_size=(100, 37)),
    "left-window": dict(window_size=(200, -1)),
    "softcap+alibi": dict(softcap=5.0, alibi=True),
    "window+alibi+softcap": dict(window_size=(64, 0), softcap=10.0, alibi=True),
}


@pytest.mark.parametrize("mods", list(MODS))
@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024), (300, 129)], ids=["113x203", "1023x1024", "300x129"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [24, 59, 80, 128, 176, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_hopper_bwd_score_mods(dtype, head_dim, causal, seqlens, mods):
    """Softcap (the cap's derivative), ALiBi (flash-attn 2.x's bias), windows and their combinations,
    GQA, against the float32 reference."""
    _require_built(dtype, head_dim, causal, "mods")
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS["gqa"]
    kw = dict(MODS[mods])
    if causal and "window_size" in kw:
        kw["window_size"] = (kw["window_size"][0], 0)  # causal: a right window of 0
    torch.manual_seed(6)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(2, nheads, device="cuda", dtype=torch.float32) * 0.3
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    k, v = (_randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    dout = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal, **kw)  # noqa: E731
    names = _kernel_names(lambda: _grads_of(fn, (q, k, v), dout))
    assert any("flash_bwd_sm90_kernel" in n for n in names), names
    ref = lambda q, k, v, **r: attention_ref(q, k, v, causal=causal, **kw, **r)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_bwd_score_mods_varlen(causal):
    _require_built(torch.bfloat16, 128, causal, "mods")
    torch.manual_seed(7)
    seqlens_q, seqlens_k = [5, 0, 300, 129, 1], [17, 9, 0, 300, 64]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), 8, 128, dtype=torch.bfloat16)
    k, v = (_randn(int(cu_k[-1]), 2, 128, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(*q.shape, dtype=torch.bfloat16)
    kw = dict(softcap=20.0, alibi_slopes=torch.rand(8, device="cuda") * 0.2, window_size=(90, 0 if causal else 40))
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    causal=causal, **kw)
    ref = lambda q, k, v, **r: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw, **r)[0]  # noqa: E731
    assert any("flash_bwd_sm90_kernel" in n for n in _kernel_names(lambda: _grads_of(fn, (q, k, v), dout)))
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("mods", [{}, dict(softcap=20.0), dict(alibi=True, window_size=(90, 40))],
                         ids=["plain", "softcap", "alibi+window"])
@pytest.mark.parametrize("seqlens", [(113, 203), (1023, 1024), (300, 129)], ids=["113x203", "1023x1024", "300x129"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [24, 59, 80, 128, 136, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_hopper_bwd_dropout(dtype, head_dim, causal, seqlens, mods):
    """Dropout: the reference applies the mask the forward reports (return_attn_probs), which the
    Hopper backward must redraw from the forward's rng_state, with and without score mods."""
    _require_built(dtype, head_dim, causal, "dropout")
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS["gqa"]
    kw = dict(mods)
    if causal and "window_size" in kw:
        kw["window_size"] = (kw["window_size"][0], 0)  # causal: a right window of 0
    torch.manual_seed(8)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(nheads, device="cuda", dtype=torch.float32) * 0.3
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    k, v = (_randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    dout = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, dropout_p=0.17, causal=causal,  # noqa: E731
                                             return_attn_probs=True, **kw)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    names = _kernel_names(lambda: torch.autograd.grad(fn(*leaves)[0], leaves, dout))
    assert any("flash_bwd_sm90_kernel" in n for n in names), names
    out, _, probs = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    keep = ~probs.signbit()
    ref = lambda q, k, v, **r: attention_ref(q, k, v, causal=causal, dropout_p=0.17, dropout_mask=keep,  # noqa: E731
                                             **kw, **r)[0]
    _check_grads(grads, ref, (q, k, v), dout)
