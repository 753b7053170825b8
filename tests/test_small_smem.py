"""The SM80 kernels on their small tiles (tile_size.h fwd_small_smem, bwd_small_smem), which GPUs that
allow a block less shared memory than the default tiles take: the backward on sm_86 / sm_89 (99 KB) up
to head dim 192 and on sm_80 (163 KB) at 256 (on sm_86 / sm_89 with V in registers, no dropout), the forward on sm_86 / sm_89 at head dim 256 (full,
dropout). FLASH_ATTN_CUTE_SMEM_LIMIT plays such a GPU on any other, where the build has them for it
(on Hopper: FLASH_ATTN_CUTE_SMALL_SMEM=1). Against the float32 reference: odd head dims and sequence
lengths, causal with seqlen_q above seqlen_k, GQA / MQA, deterministic, varlen with empty sequences, the
score mods and dropout."""
import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute._ops import (BUILT_BWD_KERNELS, BUILT_BWD_SMALL_KERNELS, BUILT_FWD_SMALL_KERNELS,
                                  SMALL_SMEM_RUNS_ON_HOPPER, kernel_head_dim)
from flash_attn_cute.reference import attention_ref, attention_varlen_ref

from test_bwd import _check_grads, _dense_ref, _grads_of, _varlen_case
from test_fwd import HEADS, _check, _randn
from test_fwd_sm90 import _kernel_names

pytestmark = pytest.mark.cuda

SM86_SMEM = 99 * 1024
SM80_SMEM = 163 * 1024


def _require_small(dtype, head_dim, causal, variant="plain", built=BUILT_BWD_SMALL_KERNELS):
    name = "fp16" if dtype == torch.float16 else "bf16"
    if (name, kernel_head_dim(head_dim), causal, variant) not in built:
        pytest.skip(f"this build has no small-tile kernel for {name} hdim {head_dim} ({variant})")
    if torch.cuda.get_device_capability()[0] >= 9 and not SMALL_SMEM_RUNS_ON_HOPPER:
        pytest.skip("the small-tile kernels are built for GPUs below sm_90 only")


@pytest.fixture
def small_gpu(monkeypatch):
    """Skips unless the build has the small-tile kernel of (dtype, head_dim, causal, variant) in
    `built` for this GPU, then plays a GPU that allows a block `limit` bytes of shared memory (by
    default 99 KB up to head dim 192, sm_80's 163 KB above)."""
    def play(dtype, head_dim, causal, variant="plain", built=BUILT_BWD_SMALL_KERNELS, limit=None):
        _require_small(dtype, head_dim, causal, variant, built)
        monkeypatch.setenv("FLASH_ATTN_CUTE_SMEM_LIMIT", str(limit or _limit_for(head_dim)))
    return play


def _limit_for(head_dim):
    return SM86_SMEM if kernel_head_dim(head_dim) <= 192 else SM80_SMEM


def _takes_small_kernel(names, head_dim):
    tag = f"BwdKernelTraits<{kernel_head_dim(head_dim)}, cutlass::"
    return any("flash_bwd_kernel" in n and tag in n and "_t, true, false>" in n for n in names)


def _takes_small_forward(names, head_dim):
    tag = f"FwdKernelTraits<{kernel_head_dim(head_dim)}, "
    return any("flash_fwd_kernel" in n and tag in n and ", true>" in n for n in names)


SEQLENS = [(1, 239), (113, 203), (127, 513), (512, 256), (1023, 1024)]


@pytest.mark.parametrize("heads", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"{a}x{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 40, 64, 80, 96, 111, 128, 160, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_small_bwd_matches_reference(small_gpu, dtype, head_dim, causal, seqlens, heads):
    small_gpu(dtype, head_dim, causal)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS[heads]
    torch.manual_seed(0)
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    k, v = (_randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    dout = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    assert _takes_small_kernel(_kernel_names(lambda: _grads_of(fn, (q, k, v), dout)), head_dim)
    _check_grads(_grads_of(fn, (q, k, v), dout), _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_small_bwd_deterministic_is_bitwise_repeatable(small_gpu, head_dim, causal):
    """The dQ counters follow the small tiles' row blocks (bwd_api.cpp sizes them on the same tile)."""
    small_gpu(torch.bfloat16, head_dim, causal)
    torch.manual_seed(2)
    q, k, v, dout = (_randn(2, 777, 4, head_dim, dtype=torch.bfloat16) for _ in range(4))
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal, deterministic=True)  # noqa: E731
    first = _grads_of(fn, (q, k, v), dout)
    for name, a, b in zip(("dq", "dk", "dv"), first, _grads_of(fn, (q, k, v), dout)):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    _check_grads(first, _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_small_bwd_varlen_with_empty_sequences(small_gpu, head_dim, causal):
    small_gpu(torch.bfloat16, head_dim, causal)
    torch.manual_seed(3)
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 3]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 1]
    q, k, v, dout, cu_q, cu_k = _varlen_case(torch.bfloat16, head_dim, seqlens_q, seqlens_k)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    causal=causal)
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


MODS = {
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi=True),
    "window": dict(window_size=(100, 37)),
    "window+alibi+softcap": dict(window_size=(64, 0), softcap=10.0, alibi=True),
}


@pytest.mark.parametrize("mods", list(MODS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [59, 128])
def test_small_bwd_score_mods(small_gpu, head_dim, causal, mods):
    small_gpu(torch.bfloat16, head_dim, causal, "mods")
    kw = dict(MODS[mods])
    if causal and "window_size" in kw:
        kw["window_size"] = (kw["window_size"][0], 0)
    torch.manual_seed(4)
    nheads, nheads_k = HEADS["gqa"]
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(2, nheads, device="cuda", dtype=torch.float32) * 0.3
    q = _randn(2, 300, nheads, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(2, 203, nheads_k, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(*q.shape, dtype=torch.bfloat16)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal, **kw)  # noqa: E731
    assert _takes_small_kernel(_kernel_names(lambda: _grads_of(fn, (q, k, v), dout)), head_dim)
    ref = lambda q, k, v, **r: attention_ref(q, k, v, causal=causal, **kw, **r)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_small_bwd_dropout(small_gpu, head_dim, causal):
    """The forward's mask (returned with the probabilities) in the reference."""
    small_gpu(torch.bfloat16, head_dim, causal, "dropout")
    torch.manual_seed(5)
    q = _randn(2, 300, 4, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(2, 257, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(*q.shape, dtype=torch.bfloat16)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, _, probs = fac.flash_attn_func(*leaves, dropout_p=0.17, causal=causal, return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    mods = dict(dropout_p=0.17, dropout_mask=~probs.signbit())
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, **mods, **kw)[0]  # noqa: E731
    _check_grads(grads, ref, (q, k, v), dout)


def _takes_v_in_regs_kernel(names):
    return any("flash_bwd_kernel" in n and "BwdKernelTraits<256, cutlass::" in n and "_t, true, true>" in n
               for n in names)


V_IN_REGS_MODS = {"plain": {}, "softcap+alibi": dict(softcap=30.0, alibi=True), "window": dict(window_size=(100, 37))}
V_IN_REGS_SEQLENS = [(1, 239), (127, 513), (512, 256), (1023, 1024)]


@pytest.mark.parametrize("mods", list(V_IN_REGS_MODS))
@pytest.mark.parametrize("seqlens", V_IN_REGS_SEQLENS, ids=[f"{a}x{b}" for a, b in V_IN_REGS_SEQLENS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [224, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_v_in_regs_bwd_matches_reference(small_gpu, dtype, head_dim, causal, seqlens, mods):
    """Head dim 256 on a 99 KB GPU (sm_86 / sm_89): the V-in-registers tile (tile_size.h
    bwd_v_in_regs_tile_shape), whose warps hold 16 key columns of S each, V in registers, P and dS in
    V's shared memory. GQA, score mods, seqlen_q above and below seqlen_k."""
    kw = dict(V_IN_REGS_MODS[mods])
    small_gpu(dtype, head_dim, causal, "mods" if kw else "plain", limit=SM86_SMEM)
    if causal and "window_size" in kw:
        kw["window_size"] = (kw["window_size"][0], 0)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, HEADS["gqa"]
    torch.manual_seed(10)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(2, nheads, device="cuda", dtype=torch.float32) * 0.3
    q = _randn(2, seqlen_q, nheads, head_dim, dtype=dtype)
    k, v = (_randn(2, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    dout = _randn(*q.shape, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal, **kw)  # noqa: E731
    assert _takes_v_in_regs_kernel(_kernel_names(lambda: _grads_of(fn, (q, k, v), dout)))
    ref = lambda q, k, v, **r: attention_ref(q, k, v, causal=causal, **kw, **r)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_v_in_regs_bwd_deterministic_and_varlen(small_gpu, causal):
    small_gpu(torch.bfloat16, 256, causal, limit=SM86_SMEM)
    torch.manual_seed(11)
    q, k, v, dout = (_randn(2, 333, 4, 256, dtype=torch.bfloat16) for _ in range(4))
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal, deterministic=True)  # noqa: E731
    first = _grads_of(fn, (q, k, v), dout)
    for name, a, b in zip(("dq", "dk", "dv"), first, _grads_of(fn, (q, k, v), dout)):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    _check_grads(first, _dense_ref(causal), (q, k, v), dout)
    seqlens_q, seqlens_k = [0, 17, 129, 1, 300], [5, 0, 128, 77, 299]
    q, k, v, dout, cu_q, cu_k = _varlen_case(torch.bfloat16, 256, seqlens_q, seqlens_k)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    causal=causal)
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
    _check_grads(_grads_of(fn, (q, k, v), dout), ref, (q, k, v), dout)


def test_small_gpu_dropout_at_hdim_256_is_a_clear_error(small_gpu):
    """Dropout at head dim 256 on a 99 KB GPU: the V-in-registers tile runs no dropout and no other
    fits (as flash-attn 2.x); the error names the head dim, dropout and the limit. Causal: the forward's
    default tile fits 99 KB."""
    if ("bf16", 256, True, "dropout") not in BUILT_BWD_KERNELS:
        pytest.skip("this build has no head dim 256 dropout backward")
    small_gpu(torch.bfloat16, 256, True, "dropout", limit=SM86_SMEM)
    q, k, v = (_randn(1, 64, 2, 256, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    out = fac.flash_attn_func(q, k, v, dropout_p=0.1, causal=True)
    with pytest.raises(RuntimeError, match=r"head dim 256 with dropout needs more shared memory per block than this "
                                           r"GPU's 99 KB"):
        out.sum().backward()


FWD_MODS = {"plain": {}, "softcap+alibi": dict(softcap=20.0, alibi=True), "window": dict(window_size=(90, 40))}
FWD_SEQLENS = [(129, 1000), (300, 203), (1023, 1024)]


@pytest.mark.parametrize("mods", list(FWD_MODS))
@pytest.mark.parametrize("seqlens", FWD_SEQLENS, ids=[f"{a}x{b}" for a, b in FWD_SEQLENS])
@pytest.mark.parametrize("head_dim", [224, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_small_fwd_matches_reference(small_gpu, dtype, head_dim, seqlens, mods):
    """Head dim 256 without causal masking: 128 KB tiles, over sm_86 / sm_89's 99 KB. Batch 4 of 16
    heads: enough row blocks that the calls take the whole-row kernel, not split-KV (glue.cpp
    choose_splits), whose tiles are small anyway."""
    kw = dict(FWD_MODS[mods])
    small_gpu(dtype, head_dim, False, "plain" if not kw else "mods", BUILT_FWD_SMALL_KERNELS, SM86_SMEM)
    (seqlen_q, seqlen_k), (nheads, nheads_k), batch = seqlens, (16, 4), 4
    torch.manual_seed(8)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(batch, nheads, device="cuda", dtype=torch.float32) * 0.3
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k, v = (_randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype) for _ in range(2))
    names = _kernel_names(lambda: fac.flash_attn_func(q, k, v, **kw))
    assert _takes_small_forward(names, head_dim), names
    out, lse, _ = fac.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    _check(q, k, v, False, out, lse, **kw)


def test_small_fwd_dropout(small_gpu):
    small_gpu(torch.bfloat16, 256, False, "dropout", BUILT_FWD_SMALL_KERNELS, SM86_SMEM)
    torch.manual_seed(9)
    q = _randn(2, 300, 4, 256, dtype=torch.bfloat16)
    k, v = (_randn(2, 257, 2, 256, dtype=torch.bfloat16) for _ in range(2))
    assert _takes_small_forward(_kernel_names(lambda: fac.flash_attn_func(q, k, v, dropout_p=0.17)), 256)
    out, lse, probs = fac.flash_attn_func(q, k, v, dropout_p=0.17, return_attn_probs=True)
    _check(q, k, v, False, out, lse, dropout_p=0.17, dropout_mask=~probs.signbit())
