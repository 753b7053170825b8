"""flash_attn_func's eager autograd (GPU only): head dims that are multiples of 8 take the C++ autograd
function (csrc/autograd.cpp), whose backward runs without Python; torch.compile and padded head dims
take the Python one (interface._FlashAttnFunc). Both run the same kernels, so on the same inputs
they must agree bit for bit (the deterministic backward's dq included); the reference tests of
test_bwd.py / test_dropout.py / test_score_mods.py hold either to the float32 reference."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import flash_attn_cute as fac
from flash_attn_cute.interface import _FlashAttnFunc
from test_fwd import _randn

pytestmark = pytest.mark.cuda

F16, BF16 = torch.float16, torch.bfloat16


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _python_function(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                     dropout_p=0.0, deterministic=True, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None, seqused_k=None):
    """The Python autograd function on checked arguments, as torch.compile's trace runs it."""
    scale = softmax_scale if softmax_scale is not None else q.size(-1) ** -0.5
    if cu_seqlens_q is None:
        max_seqlen_q, max_seqlen_k = q.size(1), k.size(1)
    window = tuple(max(int(x), -1) for x in window_size)
    out, _, _ = _FlashAttnFunc.apply(q, k, v, scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     deterministic, window, softcap, alibi_slopes, seqused_k, dropout_p)
    return out


def _varlen(kw, seqlens_q, seqlens_k, used):
    cu = lambda lens: torch.tensor([0] + lens, device="cuda").cumsum(0).int()  # noqa: E731
    return dict(kw, cu_seqlens_q=cu(seqlens_q), cu_seqlens_k=cu(seqlens_k), max_seqlen_q=max(seqlens_q),
                max_seqlen_k=max(seqlens_k), seqused_k=torch.tensor(used, device="cuda", dtype=torch.int32))


CASES = {
    "causal_gqa": dict(dtype=F16, shapes=((2, 300, 6, 64), (2, 257, 2, 64)), kw=dict(causal=True)),
    "full_hdim128": dict(dtype=BF16, shapes=((2, 129, 4, 128), (2, 400, 4, 128)), kw=dict()),
    "window_softcap_alibi": dict(dtype=F16, shapes=((2, 333, 4, 64), (2, 333, 4, 64)),
                                 kw=dict(window_size=(100, 20), softcap=20.0, alibi=True)),
    "dropout_causal": dict(dtype=F16, shapes=((2, 255, 4, 128), (2, 255, 4, 128)), kw=dict(causal=True, dropout_p=0.2)),
    "varlen_seqused_k": dict(dtype=F16, shapes=((300, 4, 64), (380, 2, 64)), kw=dict(causal=True),
                             varlen=([0, 120, 180], [100, 0, 280], [90, 0, 200])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_and_python_autograd_agree_bitwise(case):
    c = CASES[case]
    (shape_q, shape_k), kw = c["shapes"], dict(c["kw"])
    torch.manual_seed(3)
    q = _randn(*shape_q, dtype=c["dtype"])
    k, v = (_randn(*shape_k, dtype=c["dtype"]) for _ in range(2))
    dout = _randn(*shape_q, dtype=c["dtype"])
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(q.size(-2), device="cuda") * 0.3
    if "varlen" in c:
        kw = _varlen(kw, *c["varlen"])
        func = fac.flash_attn_varlen_func
    else:
        func = fac.flash_attn_func
    results = []
    for fn in (func, _python_function):
        leaves = _leaves(q, k, v)
        torch.manual_seed(7)  # the dropout draws the same mask
        out = fn(*leaves, deterministic=True, **kw)
        results.append((out.detach(), *torch.autograd.grad(out, leaves, dout)))
    assert "AttentionFunction" in type(func(*_leaves(q, k, v), **kw).grad_fn).__name__
    for name, cpp, py in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(cpp, py), f"{name}: the C++ and Python autograd functions differ"
    assert all(g.isfinite().all() for g in results[0])


def test_python_function_takes_padded_head_dims():
    q, k, v = _leaves(*(_randn(1, 64, 2, 59, dtype=F16) for _ in range(3)))
    out = fac.flash_attn_func(q, k, v, causal=True)
    assert type(out.grad_fn).__name__ == "_FlashAttnFuncBackward" and out.shape == q.shape
    out.sum().backward()
    assert q.grad.shape == q.shape and q.grad.isfinite().all()


def test_outputs_without_grad_and_non_differentiable_lse():
    q, k, v = (_randn(1, 100, 2, 64, dtype=F16) for _ in range(3))
    out = fac.flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        assert fac.flash_attn_func(*_leaves(q, k, v)).grad_fn is None
    out, lse, _ = fac.flash_attn_func(*_leaves(q, k, v), dropout_p=0.1, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def test_checkpoint_and_saved_tensor_hooks():
    """Activation checkpointing recomputes the forward (the same dropout mask: checkpoint restores the
    RNG state) and the saved tensors pass through saved_tensors_hooks, as with any torch op."""
    q, k, v = (_randn(2, 200, 4, 64, dtype=F16) for _ in range(3))
    dout = _randn(2, 200, 4, 64, dtype=F16)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, causal=True, dropout_p=0.1, deterministic=True)  # noqa: E731
    leaves = _leaves(q, k, v)
    torch.manual_seed(5)
    plain = torch.autograd.grad(fn(*leaves), leaves, dout)
    leaves = _leaves(q, k, v)
    torch.manual_seed(5)
    checkpointed = torch.autograd.grad(checkpoint(fn, *leaves, use_reentrant=False), leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed))
    packed = []
    leaves = _leaves(q, k, v)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = fac.flash_attn_func(*leaves, causal=True)
    assert len(packed) >= 5  # q, k, v, out, lse
    torch.autograd.grad(out, leaves, dout)


def test_output_modified_in_place_is_caught():
    leaves = _leaves(*(_randn(1, 64, 2, 64, dtype=F16) for _ in range(3)))
    out = fac.flash_attn_func(*leaves)
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
