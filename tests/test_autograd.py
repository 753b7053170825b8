"""flash_attn_func's eager autograd. Head dims that are multiples of 8 take the C++ autograd function
(csrc/autograd.cpp), whose backward runs without Python; torch.compile and padded head dims take the
Python one (interface._FlashAttnFunc).

CPU: csrc/autograd.cpp built against stand-in ops (tests/cpp/autograd_stub_ops.cpp: float64 math on
the CPU) with torch's C++ extension loader: what the function saves, passes to the backward and
returns, against autograd through the same math. GPU: on the same inputs the two functions run the
same kernels and must agree bit for bit (the deterministic backward's dq included); test_bwd.py,
test_dropout.py and test_score_mods.py hold either to the float32 reference."""
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import flash_attn_cute as fac
from flash_attn_cute.interface import _FlashAttnFunc

ROOT = Path(__file__).resolve().parent.parent
F16, BF16 = torch.float16, torch.bfloat16


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


# ---- CPU: the C++ autograd function over stand-in ops ----

@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    from torch.utils import cpp_extension
    cuda_include = Path(cpp_extension.CUDA_HOME or "/usr/local/cuda") / "include"
    if not (cuda_include / "cuda_runtime_api.h").exists() or shutil.which("ninja") is None:
        pytest.skip("needs the CUDA toolkit's headers (csrc/glue.h) and ninja")
    module = cpp_extension.load(
        name="flash_attn_cute_autograd_stub", sources=[str(ROOT / "csrc" / "autograd.cpp"),
                                                       str(ROOT / "tests" / "cpp" / "autograd_stub_ops.cpp")],
        extra_include_paths=[str(ROOT / "csrc"), str(ROOT / "include"), str(cuda_include)],
        extra_cflags=["-O1", "-std=c++20", r'-DFLASH_ATTN_CUTE_OPS=\"flash_attn_cute_stub\"'],  # a shell reads it
        build_directory=str(tmp_path_factory.mktemp("autograd_stub")))
    return module


def _stub_call(stub, q, k, v, causal=False, dropout_p=0.0, scale=0.3):
    return stub.attention(q, k, v, None, None, q.size(1), k.size(1), scale, causal, -1, 0 if causal else -1, 0.0,
                          None, None, dropout_p, False)


def _reference(q, k, v, causal, dropout_p, seed, scale=0.3):
    """The stand-in's math with autograd: its dropout mask from a CPU generator seeded with `seed`."""
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    if causal:
        row, col = torch.arange(q.size(1))[:, None], torch.arange(k.size(1))[None]
        s = s.masked_fill(col > row + k.size(1) - q.size(1), -math.inf)
    p = s.softmax(-1)
    if dropout_p:
        keep = torch.empty_like(s).uniform_(0.0, 1.0, generator=torch.Generator().manual_seed(seed)) >= dropout_p
        p = p * keep / (1 - dropout_p)
    return torch.einsum("bhqk,bkhd->bqhd", p, v.double()).to(q.dtype)


def _in_layout(shape, layout):
    """A leaf of `shape` (batch, seqlen, heads, dim) in `layout`, its strides kept."""
    b, n, h, d = shape
    if layout == "contiguous":
        x = torch.randn(shape)
    elif layout == "readable":  # strided, but a layout the kernels read (one of a packed pair)
        x = torch.randn(b, n, 2, h, d)[:, :, 0]
    elif layout == "last_dim_strided":
        x = torch.randn(b, n, h, 2 * d)[..., ::2]
    elif layout == "head_stride_20":
        x = torch.randn(b, n, h, d + 4)[..., :d]
    else:  # misaligned: contiguous, 4 bytes past a 16-byte boundary
        x = torch.randn(b * n * h * d + 1)[1:].view(shape)
    return x.detach().requires_grad_()


@pytest.mark.parametrize("layout", ["contiguous", "readable", "last_dim_strided", "head_stride_20", "misaligned"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("causal", [False, True])
def test_cpp_function_saves_and_returns_what_autograd_needs(stub, causal, dropout_p, layout):
    """Outputs and gradients against autograd through the stand-in's math; the stand-ins refuse
    layouts the kernels cannot read, which the function copies; with dropout the backward must get
    the forward's rng_state (two forwards draw different seeds) and out_residual."""
    torch.manual_seed(0)
    leaves = [_in_layout((2, n, 3, 16), layout) for n in (7, 9, 9)]
    q, k, v = (x.detach() for x in leaves)
    dout = torch.randn(2, 7, 3, 16)
    other = _stub_call(stub, *_leaves(q, k, v), causal, dropout_p)  # a forward whose state must not be used
    out, lse, *rng_state = _stub_call(stub, *leaves, causal, dropout_p)
    assert len(rng_state) == (1 if dropout_p else 0) and not lse.requires_grad
    assert "AttentionFunction" in out.grad_fn.name()
    seed = int(rng_state[0][0]) if dropout_p else 0
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = _leaves(q, k, v)
    ref = _reference(*ref_leaves, causal, dropout_p, seed)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r, x in zip(grads, ref_grads, (q, k, v)):
        assert g.shape == x.shape
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    del other


def test_cpp_function_without_grad(stub):
    q, k, v = (torch.randn(1, 5, 2, 8) for _ in range(3))
    out, lse = _stub_call(stub, q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        out, lse = _stub_call(stub, *_leaves(q, k, v))
    assert out.grad_fn is None


def test_cpp_function_under_checkpoint_and_saved_tensor_hooks(stub):
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    dout = torch.randn(1, 6, 2, 8)
    fn = lambda q, k, v: _stub_call(stub, q, k, v, causal=True)[0]  # noqa: E731
    leaves = _leaves(q, k, v)
    plain = torch.autograd.grad(fn(*leaves), leaves, dout)
    leaves = _leaves(q, k, v)
    checkpointed = torch.autograd.grad(checkpoint(fn, *leaves, use_reentrant=False), leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed))
    packed = []
    leaves = _leaves(q, k, v)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = fn(*leaves)
    assert len(packed) == 5  # q, k, v, out, lse
    assert all(torch.equal(a, b) for a, b in zip(plain, torch.autograd.grad(out, leaves, dout)))


def test_cpp_function_under_compiled_autograd(stub):
    """A backward that compiled autograd traces (attention outside the compiled region) takes the node."""
    from torch._dynamo import compiled_autograd
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    dout = torch.randn(1, 6, 2, 8)
    leaves = _leaves(q, k, v)
    plain = torch.autograd.grad(_stub_call(stub, *leaves, causal=True)[0], leaves, dout)
    leaves = _leaves(q, k, v)
    out = _stub_call(stub, *leaves, causal=True)[0]
    with compiled_autograd._enable(torch.compile(backend="eager")):
        out.backward(dout)
    assert all(torch.equal(x.grad, g) for x, g in zip(leaves, plain))


def test_cpp_function_catches_an_output_modified_in_place(stub):
    out = _stub_call(stub, *_leaves(*(torch.randn(1, 4, 1, 8) for _ in range(3))))[0]
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_cpp_function_copies_an_expanded_gradient(stub):
    """out.sum().backward() hands the backward an expanded gradient (every stride 0)."""
    q, k, v = (torch.randn(1, 6, 2, 8) for _ in range(3))
    leaves = _leaves(q, k, v)
    _stub_call(stub, *leaves)[0].sum().backward()
    explicit = _leaves(q, k, v)
    out = _stub_call(stub, *explicit)[0]
    grads = torch.autograd.grad(out, explicit, torch.ones_like(out))
    assert all(torch.equal(x.grad, g) for x, g in zip(leaves, grads))


# ---- GPU: the C++ and Python functions on the real kernels ----

def _randn(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


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


@pytest.mark.cuda
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
    assert "AttentionFunction" in func(*_leaves(q, k, v), **kw).grad_fn.name()  # the C++ function's node
    for name, cpp, py in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(cpp, py), f"{name}: the C++ and Python autograd functions differ"
    assert all(g.isfinite().all() for g in results[0])


@pytest.mark.cuda
def test_python_function_takes_padded_head_dims():
    q, k, v = _leaves(*(_randn(1, 64, 2, 59, dtype=F16) for _ in range(3)))
    out = fac.flash_attn_func(q, k, v, causal=True)
    assert out.grad_fn.name() == "_FlashAttnFuncBackward" and out.shape == q.shape
    out.sum().backward()
    assert q.grad.shape == q.shape and q.grad.isfinite().all()


@pytest.mark.cuda
def test_dropout_under_checkpoint():
    """Activation checkpointing recomputes the forward with the RNG state it restores: the same mask."""
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
