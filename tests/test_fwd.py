"""Forward kernels against the float32 reference (GPU only).

Accuracy rule (FlashAttention's): max |out - ref_fp32| <= 2 * max |ref_lowp - ref_fp32| + 1e-5, where
ref_lowp is the same math done in the input dtype.
"""
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute.reference import attention_ref, attention_varlen_ref

pytestmark = pytest.mark.cuda

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [(1, 239), (3, 799), (127, 513), (113, 203), (108, 256), (512, 256), (1023, 1024), (1024, 1023),
           (2048, 2048)]
HEADS = {"mha": (6, 6), "gqa": (6, 2), "mqa": (6, 1)}


def _randn(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def _assert_close_rule(out, ref, ref_lowp):
    assert not out.isnan().any(), "NaN in output"
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (ref_lowp.float() - ref).abs().max().item() + 1e-5
    assert err <= bound, f"max error {err:.3e} > bound {bound:.3e}"


def _assert_lse_close(lse, lse_ref):
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "LSE is finite exactly where the reference is"
    assert (lse[~finite] == math.inf).all(), "rows that see no key have LSE +inf"
    torch.testing.assert_close(lse[finite], lse_ref[finite], atol=1e-3, rtol=1e-4)


def _check(q, k, v, causal, out, lse, scale=None, **mods):
    """out and lse against the reference; mods: window_size / softcap / alibi_slopes."""
    ref, lse_ref = attention_ref(q, k, v, causal=causal, softmax_scale=scale, **mods)
    ref_lowp, _ = attention_ref(q, k, v, causal=causal, softmax_scale=scale, upcast=False, reorder_ops=True, **mods)
    _assert_close_rule(out, ref, ref_lowp)
    _assert_lse_close(lse, lse_ref)


def _check_varlen(q, k, v, cu_q, cu_k, out, lse=None, **mods):
    """_check for the varlen forms (cu_seqlens_q / _k); mods: causal and the score mods, dropout's
    mask. lse None: out alone."""
    ref, lse_ref = attention_varlen_ref(q, k, v, cu_q, cu_k, **mods)
    ref_lowp, _ = attention_varlen_ref(q, k, v, cu_q, cu_k, upcast=False, reorder_ops=True, **mods)
    _assert_close_rule(out, ref, ref_lowp)
    if lse is not None:
        _assert_lse_close(lse, lse_ref)


def attention_grid(test):
    """The issue's grid: dtype x head dim x (seqlen_q, seqlen_k) x causal x MHA/GQA/MQA."""
    for name, values, ids in (("dtype", DTYPES, ["fp16", "bf16"]), ("head_dim", HEAD_DIMS, None),
                              ("seqlens", SEQLENS, [f"{a}x{b}" for a, b in SEQLENS]),
                              ("causal", [False, True], ["full", "causal"]), ("heads", HEADS, list(HEADS))):
        test = pytest.mark.parametrize(name, values, ids=ids)(test)
    return test


@attention_grid
def test_fwd_matches_reference(dtype, head_dim, seqlens, causal, heads):
    seqlen_q, seqlen_k = seqlens
    nheads, nheads_k = HEADS[heads]
    batch = 2
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    out, lse, _ = fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == dtype
    _check(q, k, v, causal, out, lse)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fwd_writes_every_output_element(head_dim, causal):
    """out is poisoned with NaN first: every element must be overwritten (rows with no key too)."""
    q = _randn(3, 300, 4, head_dim, dtype=torch.bfloat16)
    k = _randn(3, 200, 4, head_dim, dtype=torch.bfloat16)
    v = _randn(3, 200, 4, head_dim, dtype=torch.bfloat16)
    out = torch.full_like(q, math.nan)
    out2, lse = fac.fwd(q, k, v, out=out, causal=causal)
    assert out2 is out
    _check(q, k, v, causal, out, lse)
    if causal:  # rows 0..99 see no key (seqlen_q > seqlen_k, bottom-right aligned)
        assert (out[:, :100] == 0).all() and (lse[:, :, :100] == math.inf).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [59, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_varlen_uneven_and_empty_sequences(dtype, head_dim, causal):
    seqlens_q = [0, 17, 128, 1, 300, 0, 255]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513]
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), 4, head_dim, dtype=dtype)
    k = _randn(int(cu_k[-1]), 2, head_dim, dtype=dtype)
    v = _randn(int(cu_k[-1]), 2, head_dim, dtype=dtype)
    out, lse, _ = fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                             return_attn_probs=True)
    assert lse.shape == (4, q.size(0))
    _check_varlen(q, k, v, cu_q, cu_k, out, lse, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_cu_seqlens_past_the_tensors_stay_inside(head_dim):
    """The host does not read cu_seqlens on the device: wrong ones (a last entry past q's or k's
    rows, a decreasing pair) must not take the kernels outside the tensors (BlockInfo cuts each
    sequence to q's and k's rows). The forward and backward finish without a CUDA error, a
    well-formed sequence keeps its result, and q, k, v (views into guarded buffers) keep their
    guard rows. The sequences still cover every row, so every gradient row is written."""
    torch.manual_seed(0)
    total_q, total_k, guard, dtype = 300, 400, 64, torch.bfloat16
    cu_q = torch.tensor([0, 100, 250, 280, 1000], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 150, 120, 300, 5000], device="cuda", dtype=torch.int32)
    buffers = [_randn(n + 2 * guard, 4, head_dim, dtype=dtype) for n in (total_q, total_k, total_k)]
    q, k, v = (b[guard:-guard].requires_grad_() for b in buffers)
    saved = [b.clone() for b in buffers]
    out = fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 720, 4850, causal=False)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    for b, before in zip(buffers, saved):
        assert torch.equal(b[:guard], before[:guard]) and torch.equal(b[-guard:], before[-guard:])
    ref, _ = attention_ref(q[None, :100].detach(), k[None, :150].detach(), v[None, :150].detach())
    ref_lowp, _ = attention_ref(q[None, :100].detach(), k[None, :150].detach(), v[None, :150].detach(),
                                upcast=False, reorder_ops=True)
    _assert_close_rule(out[None, :100], ref, ref_lowp)
    assert all(torch.isfinite(g).all() for g in (q.grad, k.grad, v.grad))
    assert torch.isfinite(torch.ones(8, device="cuda").sum())  # the context still runs kernels


def test_packed_and_strided_inputs():
    dtype, (b, s, h, d) = torch.bfloat16, (2, 333, 4, 64)
    qkv = _randn(b, s, 3, h, d, dtype=dtype)
    q, k, v = qkv.unbind(2)
    for causal in (False, True):
        out = fac.flash_attn_qkvpacked_func(qkv, causal=causal)
        _check(q, k, v, causal, out, fac.fwd(q, k, v, causal=causal)[1])
        kv = qkv[:, :, 1:]
        out_kv = fac.flash_attn_kvpacked_func(q, kv, causal=causal)
        assert torch.equal(out, out_kv)
    # a head-dim slice of a wider tensor: row and head strides differ from the contiguous ones
    wide = _randn(b, s, h, 2 * d, dtype=dtype)
    q2 = wide[..., :d]
    out = fac.flash_attn_func(q2, k, v)
    ref, _ = attention_ref(q2, k, v)
    ref_lowp, _ = attention_ref(q2, k, v, upcast=False, reorder_ops=True)
    _assert_close_rule(out, ref, ref_lowp)


def test_varlen_packed():
    seqlens = [3, 0, 200, 64]
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    qkv = _randn(int(cu[-1]), 3, 4, 64, dtype=torch.float16)
    out = fac.flash_attn_varlen_qkvpacked_func(qkv, cu, max(seqlens), causal=True)
    q, k, v = qkv.unbind(1)
    _check_varlen(q, k, v, cu, cu, out, causal=True)
    out_kv = fac.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, max(seqlens), max(seqlens), causal=True)
    assert torch.equal(out, out_kv)


@pytest.mark.parametrize("scale", [8.0, 30.0])
def test_large_magnitude_inputs(scale):
    q = _randn(2, 512, 4, 128, dtype=torch.bfloat16, scale=scale)
    k = _randn(2, 512, 4, 128, dtype=torch.bfloat16, scale=scale)
    v = _randn(2, 512, 4, 128, dtype=torch.bfloat16, scale=scale)
    out, lse, _ = fac.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    _check(q, k, v, True, out, lse)


def test_custom_softmax_scale():
    q, k, v = (_randn(1, 200, 2, 96, dtype=torch.float16) for _ in range(3))
    out, lse, _ = fac.flash_attn_func(q, k, v, softmax_scale=0.37, return_attn_probs=True)
    _check(q, k, v, False, out, lse, scale=0.37)


def test_bad_input_leaves_cuda_usable():
    q = _randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="dtype"):
        fac.flash_attn_func(q, q.float(), q)
    with pytest.raises(ValueError, match="head dim"):
        fac.flash_attn_func(*(_randn(1, 16, 2, 264, dtype=torch.float16),) * 3)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.flash_attn_cute.fwd(q[..., :60], q[..., :60], q[..., :60], torch.empty_like(q[..., :60]),
                                      None, None, 16, 16, 0.1, False, -1, -1, 0.0, None, None, 0.0, None, None, None)
    out = fac.flash_attn_func(q, q, q)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


def test_meta_tensor_beside_cuda_ones_rejected():
    """The forward op checks its arguments itself (the Python checks name the problem when it
    raises), but a meta tensor among CUDA ones dispatches it to its fake implementation (the Meta key
    wins), which would return empty results: it refuses, and the call names the tensor."""
    q = _randn(1, 16, 2, 64, dtype=torch.float16)
    meta = torch.empty_like(q, device="meta")
    with pytest.raises(fac.FlashAttnInputError, match=r"k is on meta; flash_attn_cute needs CUDA tensors"):
        fac.flash_attn_func(q, meta, q)
    with pytest.raises(fac.FlashAttnInputError, match=r"q is on meta; flash_attn_cute needs CUDA tensors"):
        fac.flash_attn_func(meta, meta, meta)
    with pytest.raises(fac.FlashAttnInputError, match=r"k_cache is on meta; flash_attn_cute needs CUDA tensors"):
        fac.flash_attn_with_kvcache(q[:, :1], meta, q)


def test_large_tensor_no_index_overflow():
    """q holds more than 2^31 elements: offsets must be 64-bit."""
    b, s, h, d = 1, 2**17 + 64, 128, 128  # 2^31 + 2^20 elements of q
    q = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16).normal_()
    k = _randn(b, 128, h, d, dtype=torch.bfloat16)
    v = _randn(b, 128, h, d, dtype=torch.bfloat16)
    out = fac.flash_attn_func(q, k, v)
    tail = slice(s - 256, s)  # the rows past 2^31 elements
    ref, _ = attention_ref(q[:, tail], k, v)
    ref_lowp, _ = attention_ref(q[:, tail], k, v, upcast=False, reorder_ops=True)
    _assert_close_rule(out[:, tail], ref, ref_lowp)


def test_torch_compile_fullgraph():
    q, k, v = (_randn(2, 256, 4, 64, dtype=torch.bfloat16) for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return fac.flash_attn_func(q, k, v, causal=True) * 2

    torch.testing.assert_close(f(q, k, v), 2 * fac.flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", [(1, 8192), (4, 8192), (1, 100000), (3, 777)], ids=str)
@pytest.mark.parametrize("heads", [(4, 4), (8, 1)], ids=["mha", "mqa"])
def test_decode_shapes_split_kv(seqlens, causal, heads):
    """Few query rows over many keys: the grid is too small for the SMs and the forward splits the
    keys across CTAs (split_kv.h), then combines the partial results."""
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, heads
    q = _randn(1, seqlen_q, nheads, 128, dtype=torch.bfloat16)
    k = _randn(1, seqlen_k, nheads_k, 128, dtype=torch.bfloat16)
    v = _randn(1, seqlen_k, nheads_k, 128, dtype=torch.bfloat16)
    out, lse, _ = fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    _check(q, k, v, causal, out, lse)
