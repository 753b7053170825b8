"""Input validation of every public entry point, on CPU: bad inputs raise FlashAttnInputError (or
NotImplementedError) with a "flash_attn_cute:" message naming the problem; valid inputs get as far as the
device check, the last one, which proves that every other check accepts them."""
import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute import FlashAttnInputError

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
B, S, H, D, T = 2, 8, 4, 64, 10  # batch, seqlen, nheads, head dim, varlen total
DEVICE_MSG = r"is on cpu; flash_attn_cute needs CUDA tensors"


def t(*shape, dtype=F16):
    return torch.zeros(*shape, dtype=dtype)


def cu(*vals, dtype=torch.int32):
    return torch.tensor(vals, dtype=dtype)


CU = cu(0, 3, 3, T)  # three sequences, the middle one empty


def raises(match, fn, exc=FlashAttnInputError):
    with pytest.raises(exc, match=match) as info:
        fn()
    assert str(info.value).startswith("flash_attn_cute: ")


def qkv(b=B, bk=None, sq=S, sk=S, sv=None, h=H, hk=H, d=D, dq=None, dv=None, dtype=F16, dtype_k=None):
    bk, dtype_k = bk or b, dtype_k or dtype
    return (t(b, sq, h, dq or d, dtype=dtype), t(bk, sk, hk, d, dtype=dtype_k),
            t(bk, sv or sk, hk, dv or d, dtype=dtype_k))


def vqkv(h=H, hk=H, d=D, dtype=F16, dtype_k=None):
    return t(T, h, d, dtype=dtype), t(T, hk, d, dtype=dtype_k or dtype), t(T, hk, d, dtype=dtype_k or dtype)


# (q, k, v) -> call, for the dense entry points; packed ones stack what they can.
DENSE = {
    "func": lambda q, k, v, **kw: fac.flash_attn_func(q, k, v, **kw),
    "fwd": lambda q, k, v, **kw: fac.fwd(q, k, v, **kw),
    "kvpacked": lambda q, k, v, **kw: fac.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw),
    "qkvpacked": lambda q, k, v, **kw: fac.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), **kw),
}
# (q, k, v, cu_q, cu_k, max_q, max_k) -> call, for the varlen entry points.
VARLEN = {
    "varlen": lambda *a: fac.flash_attn_varlen_func(*a),
    "fwd": lambda q, k, v, *a: fac.fwd(q, k, v, None, None, False, *a),
    "varlen_kvpacked": lambda q, k, v, *a: fac.flash_attn_varlen_kvpacked_func(q, torch.stack([k, v], 1), *a),
    "varlen_qkvpacked": lambda q, k, v, *a: fac.flash_attn_varlen_qkvpacked_func(torch.stack([q, k, v], 1), a[0], a[2]),
}
ALL_PACKED = ("func", "fwd", "kvpacked", "qkvpacked")
NO_QKV = ("func", "fwd", "kvpacked")  # q differs from k/v: cannot be one qkv tensor
SEPARATE = ("func", "fwd")  # k differs from v: needs separate tensors

DENSE_CASES = [
    ("float32", ALL_PACKED, dict(dtype=F32), r"dtype torch.float32; only torch.float16 and torch.bfloat16"),
    ("float64", ALL_PACKED, dict(dtype=torch.float64), r"q has dtype torch.float64"),
    ("mixed_dtype", NO_QKV, dict(dtype_k=BF16), r"k has dtype torch.bfloat16 but q has torch.float16"),
    ("head_dim_264", ALL_PACKED, dict(d=264), r"head dim must be in \[1, 256\], got 264"),
    ("qk_head_dim", NO_QKV, dict(d=32, dq=64), r"q head dim 64 and k head dim 32 differ"),
    ("v_head_dim", SEPARATE, dict(dv=32), r"q/k head dim 64 and v head dim 32 must be equal"),
    ("kv_seqlen", SEPARATE, dict(sv=9), r"k \(2, 8, 4, 64\) and v \(2, 9, 4, 64\) must agree in all but the last"),
    ("batch", NO_QKV, dict(bk=3), r"q batch 2 and k batch 3 differ"),
    ("nheads_6_4", NO_QKV, dict(h=6, hk=4), r"nheads \(6\) must be a multiple of nheads_k \(4\)"),
    ("hdim60", ("fwd",), dict(d=60), r"fwd needs a head dim that is a multiple of 8, got 60 \(flash_attn_func pads"),
]


def _cases(table):
    return [pytest.param(fn, kw, msg, id=f"{name}-{fn}") for name, fns, kw, msg in table for fn in fns]


@pytest.mark.parametrize("fn, kw, msg", _cases(DENSE_CASES))
def test_dense_bad_inputs(fn, kw, msg):
    raises(msg, lambda: DENSE[fn](*qkv(**kw)))


@pytest.mark.parametrize("fn", NO_QKV)
@pytest.mark.parametrize("q", [t(S, H, D), t(1, B, S, H, D)], ids=["3d", "5d"])
def test_dense_wrong_rank(fn, q):
    _, k, v = qkv()
    raises(r"q must be 4-D \(batch, seqlen, nheads, headdim\)", lambda: DENSE[fn](q, k, v))


@pytest.mark.parametrize("fn", SEPARATE)
def test_not_a_tensor(fn):
    raises(r"q must be a torch.Tensor, got list", lambda: DENSE[fn]([[0.0]], *qkv()[1:]))


# Layouts of q with a head dim that is a multiple of 8 (flash_attn_* pad and so copy the others).
LAYOUTS = {
    "transposed": (lambda: t(B, S, D, D).transpose(-1, -2), r"q must have a contiguous last dimension"),
    "step_2": (lambda: t(B, S, H, 2 * D)[..., ::2], r"contiguous last dimension \(stride\(-1\) == 1\)"),
    "head_stride_65": (lambda: t(B, S, H, D + 1)[..., :D], r"multiples of 8 elements \(16 bytes\)"),
    "row_stride_260": (lambda: torch.as_strided(t(B * S * 260), (B, S, H, D), (S * 260, 260, D, 1)),
                       r"q strides \(2080, 260, 64, 1\) must be multiples of 8 elements \(16 bytes\)"),
    "misaligned_ptr": (lambda: t(B * S * H * D + 1)[1:].view(B, S, H, D), r"q data pointer must be 16-byte aligned"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_layout(layout):
    """The low-level fwd takes only layouts the kernels can read (it writes no copies)."""
    q, msg = LAYOUTS[layout][0](), LAYOUTS[layout][1]
    raises(msg, lambda: fac.fwd(q, *qkv(b=q.size(0), h=q.size(2))[1:]))


def _fake_kernels(monkeypatch, seen):
    """run_fwd / run_bwd stand-ins that record the layout problems of what the kernels would get."""
    from flash_attn_cute import _ops, interface, validation

    def fake_run_fwd(q, k, v, *args, **kwargs):
        seen.append([validation.layout_problem(n, x) for n, x in (("q", q), ("k", k), ("v", v))])
        lse = torch.zeros(q.size(1), q.size(0)) if q.dim() == 3 else torch.zeros(q.size(0), q.size(2), q.size(1))
        return torch.zeros_like(q), lse

    def fake_run_bwd(dout, q, k, v, out, *args):
        seen.append([validation.layout_problem(n, x) for n, x in (("dout", dout), ("q", q), ("k", k), ("v", v))])
        return torch.ones_like(q), torch.ones_like(k), torch.ones_like(v)

    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    monkeypatch.setattr(interface, "run_bwd", fake_run_bwd)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_dout_is_copied_for_the_kernels(layout, monkeypatch):
    """The backward copies a gradient in a layout the kernels cannot read (a contiguous one at a
    misaligned address too, which contiguous() would return as it is)."""
    seen = []
    _fake_kernels(monkeypatch, seen)
    dout = LAYOUTS[layout][0]()
    q, k, v = (x.requires_grad_() for x in qkv(b=dout.size(0), h=dout.size(2)))
    fac.flash_attn_func(q, k, v).backward(dout)
    assert seen == [[None] * 3, [None] * 4]


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("fn", ["func", "kvpacked", "varlen"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs_are_copied_for_the_kernels(layout, fn, grad, monkeypatch):
    """flash_attn_* copy a q, k or v whose layout the kernels cannot take (flash-attn 2.x copies one
    whose last dim is strided) instead of refusing it; gradients come back to the caller's tensor."""
    from flash_attn_cute import validation
    seen = []
    _fake_kernels(monkeypatch, seen)
    q = LAYOUTS[layout][0]()
    if fn == "varlen":
        q = q.flatten(0, 1)[:T]  # (total, nheads, d), the same layout problem
        assert validation.layout_problem("q", q)
        args = (q, *vqkv()[1:], CU, CU, 7, 7)
        call = fac.flash_attn_varlen_func
    else:
        k, v = qkv(b=q.size(0), h=q.size(2))[1:]
        args = (q, k, v) if fn == "func" else (q, torch.stack([k, v], 2))
        call = fac.flash_attn_func if fn == "func" else fac.flash_attn_kvpacked_func
    q.requires_grad_(grad)
    out = call(*args)
    assert out.shape == q.shape
    if grad:
        out.backward(torch.ones_like(out))
        assert torch.equal(q.grad, torch.ones_like(q))
    assert seen == [[None] * len(x) for x in seen] and len(seen) == 1 + grad


def test_packed_bad_shapes():
    raises(r"qkv must have size 3 in dimension 2, got \(2, 8, 2, 4, 64\)",
           lambda: fac.flash_attn_qkvpacked_func(t(B, S, 2, H, D)))
    raises(r"qkv must have size 3 in dimension 2, got \(2, 8\)", lambda: fac.flash_attn_qkvpacked_func(t(B, S)))
    raises(r"qkv must have size 3 in dimension 2, got list", lambda: fac.flash_attn_qkvpacked_func([1, 2, 3]))
    raises(r"kv must have size 2 in dimension 2, got \(2, 8, 3, 4, 64\)",
           lambda: fac.flash_attn_kvpacked_func(t(B, S, H, D), t(B, S, 3, H, D)))
    raises(r"qkv must have size 3 in dimension 1, got \(10, 2, 4, 64\)",
           lambda: fac.flash_attn_varlen_qkvpacked_func(t(T, 2, H, D), CU, 7))
    raises(r"kv must have size 2 in dimension 1, got \(10, 3, 4, 64\)",
           lambda: fac.flash_attn_varlen_kvpacked_func(t(T, H, D), t(T, 3, H, D), CU, CU, 7, 7))
    # A strided last dimension is copied, not refused (test_strided_inputs_are_copied_for_the_kernels).
    raises(DEVICE_MSG, lambda: fac.flash_attn_qkvpacked_func(t(B, S, 3, H, 2 * D)[..., ::2]))
    raises(DEVICE_MSG, lambda: fac.flash_attn_varlen_qkvpacked_func(t(T, 3, H, 2 * D)[..., ::2], CU, 7))


@pytest.mark.parametrize("out, msg", [
    (t(B, S, H, 32), r"out must match q: shape \(2, 8, 4, 64\) dtype torch.float16, got \(2, 8, 4, 32\)"),
    (t(B, S, H, D, dtype=BF16), r"out must match q: .* got \(2, 8, 4, 64\) torch.bfloat16"),
    (t(B, S, H, D, dtype=F32), r"out must match q: .* got \(2, 8, 4, 64\) torch.float32"),
    (t(B, S, H, 2 * D)[..., ::2], r"out must have a contiguous last dimension"),
    (t(B, S, H, D + 1)[..., :D], r"out strides .* must be multiples of 8 elements \(16 bytes\)"),
    ("out", r"out must be a torch.Tensor, got str"),
], ids=["shape", "bf16", "fp32", "step_2", "stride_65", "str"])
def test_fwd_bad_out(out, msg):
    raises(msg, lambda: fac.fwd(*qkv(), out=out))


def _varlen_cases():
    i64, cu2d = cu(0, 3, 3, T, dtype=torch.int64), CU.view(1, 4)
    cases = [  # name, applies to, (cu_q, cu_k, max_q, max_k), message
        ("cu_q_int64", "all", (i64, CU, 7, 7), r"cu_seqlens_q must be torch.int32, got torch.int64"),
        ("cu_k_int64", "sep", (CU, i64, 7, 7), r"cu_seqlens_k must be torch.int32, got torch.int64"),
        ("cu_q_2d", "all", (cu2d, CU, 7, 7), r"cu_seqlens_q must be 1-D of length batch \+ 1, got shape \(1, 4\)"),
        ("cu_k_empty", "sep", (CU, cu(), 7, 7), r"cu_seqlens_k must be 1-D of length batch \+ 1, got shape \(0,\)"),
        ("cu_length", "sep", (CU, cu(0, 3, T), 7, 7),
         r"cu_seqlens_q \(4\) and cu_seqlens_k \(3\) must have the same length \(batch \+ 1\)"),
        ("cu_decreasing", "all", (cu(0, 5, 3, T), CU, 7, 7), r"cu_seqlens_q must start at 0, be non-decreasing"),
        ("cu_k_not_at_0", "sep", (CU, cu(1, 3, 3, T), 7, 7), r"cu_seqlens_k must start at 0"),
        ("cu_past_total", "all", (cu(0, 3, 3, T + 1), CU, 8, 7), r"cu_seqlens_q .* end at most at 10"),
        ("cu_list", "all", ([0, 3, 3, T], CU, 7, 7), r"cu_seqlens_q must be a torch.Tensor, got list"),
        ("max_q_negative", "all", (CU, CU, -1, 7), r"max_seqlen_q must be a non-negative int, got -1"),
        ("max_k_float", "sep", (CU, CU, 7, 7.0), r"max_seqlen_k must be a non-negative int, got 7.0"),
        ("max_q_float", "all", (CU, CU, 7.0, 7), r"max_seqlen_q must be a non-negative int, got 7.0"),
        ("max_q_1d_tensor", "all", (CU, CU, torch.tensor([7]), 7), r"max_seqlen_q must be a non-negative int, got tensor"),
        ("max_q_float_tensor", "all", (CU, CU, torch.tensor(7.0), 7), r"max_seqlen_q must be a non-negative int"),
        ("max_k_negative_tensor", "sep", (CU, CU, 7, torch.tensor(-1)), r"max_seqlen_k must be a non-negative int"),
        ("max_q_bool", "all", (CU, CU, True, 7), r"max_seqlen_q must be a non-negative int, got True"),
        ("max_q_str", "all", (CU, CU, "7", 7), r"max_seqlen_q must be a non-negative int, got '7'"),
    ]
    for name, scope, args, msg in cases:
        for fn in VARLEN:
            if scope == "all" or fn != "varlen_qkvpacked":
                yield pytest.param(fn, args, msg, id=f"{name}-{fn}")
    yield pytest.param("fwd", (CU, CU, None, 7), r"max_seqlen_q must be a non-negative int, got None", id="max_none")
    yield pytest.param("fwd", (CU, None, 7, 7), r"varlen needs both cu_seqlens_q and cu_seqlens_k", id="no_cu_k")
    yield pytest.param("varlen", (CU, None, 7, 7), r"varlen needs both", id="no_cu_k-varlen")


@pytest.mark.parametrize("fn, args, msg", list(_varlen_cases()))
def test_varlen_bad_cu_seqlens_and_max_seqlen(fn, args, msg):
    raises(msg, lambda: VARLEN[fn](*vqkv(), *args))


MAX_SEQLENS = {  # max_seqlen types flash-attn 2.x takes (transformers passes position_ids.max() + 1)
    "int64_tensor": lambda: torch.tensor(7),
    "int32_tensor": lambda: torch.tensor(7, dtype=torch.int32),
    "numpy_int64": lambda: __import__("numpy").int64(7),
}


@pytest.mark.parametrize("kind", MAX_SEQLENS)
@pytest.mark.parametrize("fn", VARLEN)
def test_max_seqlen_index_types(fn, kind):
    value = MAX_SEQLENS[kind]()
    raises(DEVICE_MSG, lambda: VARLEN[fn](*vqkv(), CU, CU, value, value))
    # They are range-checked as ints: 2 is below the longest sequence (7).
    too_short = torch.tensor(2) if isinstance(value, torch.Tensor) else type(value)(2)
    raises(r"max_seqlen_q \(2\) is smaller than the longest sequence", lambda: VARLEN[fn](*vqkv(), CU, CU, too_short, 7))


@pytest.mark.parametrize("fn", VARLEN)
def test_max_seqlen_past_32_bits_rejected(fn):
    """The kernels count a sequence's rows in int: int(2^32 + 7) would have wrapped to 7 keys."""
    raises(r"max_seqlen_q \(4294967303\) must be at most 2147482624",
           lambda: VARLEN[fn](*vqkv(), CU, CU, 2 ** 32 + 7, 2 ** 32 + 7))


def test_max_seqlen_is_a_python_int_for_the_kernels(monkeypatch):
    """A tensor max_seqlen reaches the kernels (and the autograd function's saved arguments) as an int."""
    from flash_attn_cute import _ops, interface, validation
    seen = []

    def fake_run_fwd(q, k, v, out, scale, causal, cu_q, cu_k, max_q, max_k, *args, **kwargs):
        seen.append((max_q, max_k))
        return torch.zeros_like(q), torch.zeros(q.size(1), q.size(0))

    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    fac.flash_attn_varlen_func(*vqkv(), CU, CU, torch.tensor(7), __import__("numpy").int32(7))
    assert seen == [(7, 7)] and all(type(x) is int for x in seen[0])


def test_max_seqlen_symint_under_torch_compile():
    """A dynamic shape passed as max_seqlen (a SymInt while torch.compile traces) passes every check:
    the call stops at the device check, not at max_seqlen's."""
    def f(q, cu):
        return fac.flash_attn_varlen_func(q, q, q, cu, cu, q.shape[0], q.shape[0])

    q = t(T, H, D)
    torch._dynamo.reset()
    torch._dynamo.mark_dynamic(q, 0)
    with pytest.raises(Exception) as info:
        torch.compile(f, backend="eager", fullgraph=True)(q, cu(0, 3, T))
    assert "is on cpu; flash_attn_cute needs CUDA tensors" in str(info.value), str(info.value)[-2000:]


VARLEN_QKV_CASES = [
    ("float32", VARLEN, dict(dtype=F32), r"q has dtype torch.float32; only torch.float16 and torch.bfloat16"),
    ("mixed_dtype", ("varlen", "fwd", "varlen_kvpacked"), dict(dtype=BF16, dtype_k=F16),
     r"k has dtype torch.float16 but q has torch.bfloat16"),
    ("head_dim_264", VARLEN, dict(d=264), r"head dim must be in \[1, 256\], got 264"),
    ("nheads_6_4", ("varlen", "fwd", "varlen_kvpacked"), dict(h=6, hk=4), r"nheads \(6\) must be a multiple"),
    ("hdim60", ("fwd",), dict(d=60), r"fwd needs a head dim that is a multiple of 8, got 60"),
]


@pytest.mark.parametrize("fn, kw, msg", _cases(VARLEN_QKV_CASES))
def test_varlen_bad_tensors(fn, kw, msg):
    raises(msg, lambda: VARLEN[fn](*vqkv(**kw), CU, CU, 7, 7))


@pytest.mark.parametrize("fn", ["varlen", "fwd"])
def test_varlen_wrong_rank_and_layout(fn):
    raises(r"q must be 3-D \(total, nheads, headdim\), got shape \(2, 8, 4, 64\)",
           lambda: VARLEN[fn](*qkv(), CU, CU, 7, 7))
    raises(r"v must be 3-D", lambda: VARLEN[fn](t(T, H, D), t(T, H, D), t(1, T, H, D), CU, CU, 7, 7))
    # fwd refuses layouts the kernels cannot read; flash_attn_varlen_func copies them.
    strided = fn == "fwd"
    raises(r"k strides \(260, 65, 1\) must be multiples of 8 elements \(16 bytes\)" if strided else DEVICE_MSG,
           lambda: VARLEN[fn](t(T, H, D), t(T, H, D + 1)[..., :D], t(T, H, D), CU, CU, 7, 7))
    raises(r"v must have a contiguous last dimension" if strided else DEVICE_MSG,
           lambda: VARLEN[fn](t(T, H, D), t(T, H, D), t(T, H, 2 * D)[..., ::2], CU, CU, 7, 7))


# --- features flash-attn 2.x has that this build refuses --------------------------------------------------
CALLS = {  # valid CPU inputs for each flash_attn_* function
    "func": lambda **kw: fac.flash_attn_func(*qkv(), **kw),
    "qkvpacked": lambda **kw: fac.flash_attn_qkvpacked_func(t(B, S, 3, H, D), **kw),
    "kvpacked": lambda **kw: fac.flash_attn_kvpacked_func(t(B, S, H, D), t(B, S, 2, H, D), **kw),
    "varlen": lambda **kw: fac.flash_attn_varlen_func(*vqkv(), CU, CU, 7, 7, **kw),
    "varlen_qkvpacked": lambda **kw: fac.flash_attn_varlen_qkvpacked_func(t(T, 3, H, D), CU, 7, **kw),
    "varlen_kvpacked": lambda **kw: fac.flash_attn_varlen_kvpacked_func(t(T, H, D), t(T, 2, H, D), CU, CU, 7, 7, **kw),
}
BAD_DROPOUT = {"negative": -0.1, "one": 1.0, "above_one": 1.5, "nan": float("nan"), "string": "0.1", "bool": True}


@pytest.mark.parametrize("value", BAD_DROPOUT, ids=list(BAD_DROPOUT))
@pytest.mark.parametrize("fn", CALLS)
def test_bad_dropout_p(fn, value):
    raises(r"dropout_p must be a number in \[0, 1\)", lambda: CALLS[fn](dropout_p=BAD_DROPOUT[value]))


def test_dropout_backward_needs_the_forwards_rng_state():
    q, k, v = qkv()
    out, lse = t(B, S, H, D), t(B, H, S, dtype=F32)
    raises(r"dropout_p > 0 needs rng_state", lambda: fac.bwd(t(B, S, H, D), q, k, v, out, lse, dropout_p=0.1))
    raises(r"rng_state must be the forward's contiguous int64 tensor of shape \(2,\)",
           lambda: fac.bwd(t(B, S, H, D), q, k, v, out, lse, dropout_p=0.1, rng_state=torch.zeros(3, dtype=torch.int64)))
    raises(r"rng_state is on cpu",
           lambda: fac.dropout_mask(torch.zeros(2, dtype=torch.int64), 0.1, B, H, S, S))


def _paged(pages=3, page_size=16, h=H, d=D, table=None):
    """flash_attn_varlen_func over a paged K / V (CPU tensors: the checks run before the device one)."""
    table = torch.zeros(len(CU) - 1, 2, dtype=torch.int32) if table is None else table
    return lambda **kw: fac.flash_attn_varlen_func(t(T, H, D), t(pages, page_size, h, d), t(pages, page_size, h, d),
                                                   CU, CU, 7, 7, block_table=table, **kw)


PAGED = {
    "k_not_4d": (lambda **kw: fac.flash_attn_varlen_func(*vqkv(), CU, CU, 7, 7, block_table=torch.zeros(
        len(CU) - 1, 1, dtype=torch.int32), **kw), r"with block_table, k must be 4-D"),
    "page_size": (_paged(page_size=8), r"page size \(k.size\(1\) = 8\) must be a positive multiple of 16"),
    "table_dtype": (_paged(table=torch.zeros(len(CU) - 1, 2)), r"block_table must be an int32 tensor"),
    "table_batch": (_paged(table=torch.zeros(7, 2, dtype=torch.int32)), r"block_table must be an int32 tensor"),
    "page_out_of_range": (_paged(table=torch.full((len(CU) - 1, 2), 3, dtype=torch.int32)),
                          r"block_table entries must be page indices in \[0, 3\)"),
    "heads": (_paged(h=3), r"nheads \(4\) must be a multiple of nheads_k \(3\)"),
    "dropout": (lambda **kw: _paged()(dropout_p=0.1, **kw), r"paged K / V \(block_table\) takes no dropout"),
    "max_seqlen_k": (lambda **kw: fac.flash_attn_varlen_func(
        t(T, H, D), t(3, 16, H, D), t(3, 16, H, D), CU, CU, 7, 33, block_table=torch.zeros(len(CU) - 1, 2,
                                                                                         dtype=torch.int32)),
        r"max_seqlen_k \(33\) is more keys than a block_table row's pages hold \(32\)"),
    "fwd_head_dim": (lambda **kw: fac.fwd(
        t(T, H, 60), t(3, 16, H, 60), t(3, 16, H, 60), cu_seqlens_q=CU, cu_seqlens_k=CU, max_seqlen_q=7,
        max_seqlen_k=7, block_table=torch.zeros(len(CU) - 1, 2, dtype=torch.int32)),
        r"fwd needs a head dim that is a multiple of 8, got 60"),
    "table_stride": (_paged(table=torch.zeros(2, len(CU) - 1, dtype=torch.int32).t()),
                     r"block_table must have a contiguous last dimension"),
}


@pytest.mark.parametrize("case", PAGED)
def test_paged_varlen_bad_input(case):
    fn, msg = PAGED[case]
    raises(msg, fn)


@pytest.mark.parametrize("d", [D, 59])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_paged_varlen_forward(grad, d, monkeypatch):
    """flash_attn_varlen_func over a paged K / V runs its forward whether or not the inputs require
    grad, with a head dim that is not a multiple of 8 padded (q and every page) as flash-attn 2.x
    pads it; with grad the output joins the graph, and only its backward raises."""
    import math
    from flash_attn_cute import _ops, interface, validation
    seen = []

    def fake_run_fwd(q, k, v, out, scale, causal, cu_q, cu_k, max_q, max_k, window, softcap, alibi, seqused_k,
                     dropout_p, block_table):
        seen.append((q.shape, k.shape, v.shape, scale, block_table is not None))
        return torch.full_like(q, 2.0), torch.zeros(q.size(1), q.size(0))

    pages = (t(3, 16, H, d), t(3, 16, H, d))
    raises(DEVICE_MSG, lambda: fac.flash_attn_varlen_func(t(T, H, d).requires_grad_(grad), *pages, CU, CU, 7, 7,
                                                          block_table=torch.zeros(3, 2, dtype=torch.int32)))
    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    q = t(T, H, d).requires_grad_(grad)
    out, lse, _ = fac.flash_attn_varlen_func(q, *pages, CU, CU, 7, 7, block_table=torch.zeros(3, 2, dtype=torch.int32),
                                             return_attn_probs=True)
    padded = -(-d // 8) * 8
    assert seen == [((T, H, padded), (3, 16, H, padded), (3, 16, H, padded), pytest.approx(1 / math.sqrt(d)), True)]
    assert out.shape == q.shape and (out == 2).all() and out.requires_grad == grad and not lse.requires_grad
    if grad:
        with pytest.raises(NotImplementedError, match=r"block_table \(a paged K / V\) has no backward"):
            out.sum().backward()


SCORE_MODS = {  # bad window / softcap / ALiBi arguments (2 sequences, or 3 in varlen; H heads)
    "window_not_pair": (dict(window_size=5), r"window_size must be a pair of ints"),
    "window_three": (dict(window_size=(1, 2, 3)), r"window_size must be a pair of ints"),
    "softcap_negative": (dict(softcap=-1.0), r"softcap must be a number >= 0"),
    "softcap_str": (dict(softcap="30"), r"softcap must be a number >= 0"),
    "alibi_fp16": (dict(alibi_slopes=torch.zeros(H, dtype=F16)), r"alibi_slopes must be float32 of shape"),
    "alibi_shape": (dict(alibi_slopes=torch.zeros(H + 1, dtype=F32)), r"alibi_slopes must be float32 of shape"),
    "alibi_batch_shape": (dict(alibi_slopes=torch.zeros(5, H, dtype=F32)), r"alibi_slopes must be float32"),
    "alibi_strided": (dict(alibi_slopes=torch.zeros(2 * H, dtype=F32)[::2]), r"contiguous last dimension"),
    # The kernels take softmax_scale, softcap and their quotient times log2(e) in float32: an
    # infinite one there would make every output NaN.
    "softcap_inf": (dict(softcap=float("inf")), r"softcap must be a number >= 0 \(0: off\) and at most 2.359e\+38"),
    "softcap_nan": (dict(softcap=float("nan")), r"softcap must be a number >= 0"),
    "softcap_past_float32": (dict(softcap=3e38), r"softcap must be a number >= 0 .* got 3e\+38"),
    "scale_nan": (dict(softmax_scale=float("nan")), r"softmax_scale must be a finite number .* got nan"),
    "scale_minus_inf": (dict(softmax_scale=float("-inf")), r"softmax_scale must be a finite number .* got -inf"),
    "scale_past_float32": (dict(softmax_scale=1e39), r"softmax_scale must be a finite number"),
    "scale_str": (dict(softmax_scale="0.1"), r"softmax_scale must be a finite number"),
    "scale_two_values": (dict(softmax_scale=torch.ones(2)), r"softmax_scale must be a finite number"),
    "scale_over_softcap": (dict(softmax_scale=1e30, softcap=1e-10), r"softmax_scale / softcap must be at most"),
    "default_scale_over_softcap": (dict(softcap=1e-39), r"softmax_scale / softcap .* None \(at most 1\)"),
}


def test_bad_seqused_k():
    raises(r"seqused_k needs the varlen form", lambda: fac.fwd(*qkv(), seqused_k=torch.zeros(B, dtype=torch.int32)))
    raises(r"seqused_k must be an int32 tensor of shape \(3,\)", lambda: CALLS["varlen"](seqused_k=torch.zeros(2)))
    raises(r"seqused_k must be an int32 tensor of shape \(3,\)",
           lambda: CALLS["varlen"](seqused_k=torch.zeros(4, dtype=torch.int32)))


def test_bad_leftpad_k():
    def varlen_fwd(**kw):
        return fac.fwd(*vqkv(), cu_seqlens_q=CU, cu_seqlens_k=CU, max_seqlen_q=7, max_seqlen_k=7, **kw)

    pad = torch.zeros(3, dtype=torch.int32)
    raises(r"leftpad_k needs the varlen form", lambda: fac.fwd(*qkv(), leftpad_k=torch.zeros(B, dtype=torch.int32)))
    raises(r"leftpad_k must be an int32 tensor of shape \(3,\)", lambda: varlen_fwd(leftpad_k=torch.zeros(3)))
    raises(r"leftpad_k must be an int32 tensor of shape \(3,\)",
           lambda: varlen_fwd(leftpad_k=torch.zeros(2, dtype=torch.int32)))
    raises(r"leftpad_k must be contiguous", lambda: varlen_fwd(leftpad_k=torch.zeros(6, dtype=torch.int32)[::2]))
    raises(r"leftpad_k takes no dropout", lambda: varlen_fwd(leftpad_k=pad, dropout_p=0.1))
    raises(r"block_table\) takes no leftpad_k",
           lambda: fac.fwd(t(T, H, D), t(3, 16, H, D), t(3, 16, H, D), cu_seqlens_q=CU, cu_seqlens_k=CU,
                           max_seqlen_q=7, max_seqlen_k=7, block_table=torch.zeros(3, 1, dtype=torch.int32),
                           leftpad_k=pad))
    raises(DEVICE_MSG, lambda: varlen_fwd(leftpad_k=pad))


@pytest.mark.parametrize("case", SCORE_MODS)
@pytest.mark.parametrize("fn", CALLS)
def test_bad_score_mods(fn, case):
    kw, msg = SCORE_MODS[case]
    raises(msg, lambda: CALLS[fn](**kw))


@pytest.mark.parametrize("case", ["softcap_inf", "scale_nan", "scale_over_softcap"])
def test_bad_scales_low_level(case):
    """fwd and bwd check softmax_scale and softcap as the flash_attn_* functions do."""
    kw, msg = SCORE_MODS[case]
    q, k, v = qkv()
    raises(msg, lambda: fac.fwd(q, k, v, **kw))
    raises(msg, lambda: fac.bwd(t(B, S, H, D), q, k, v, t(B, S, H, D), t(B, H, S, dtype=F32), **kw))


@pytest.mark.parametrize("window, want", [((-2, 0), (-1, 0)), ((5, -7), (5, -1)), ((-100, -3), (-1, -1)),
                                          (torch.tensor([-4, 3]), (-1, 3)), ([0, 0], (0, 0))], ids=str)
def test_negative_window_sides_are_unbounded(window, want, monkeypatch):
    """flash-attn 2.x takes any negative window side as unbounded: such calls pass the checks, and the
    kernels get -1 for that side."""
    from flash_attn_cute import _ops, interface, validation
    assert validation.check_score_mods(window, 0.0, None, B, H, torch.device("cpu")) == want
    seen = []

    def fake_run_fwd(q, k, v, out, scale, causal, cu_q, cu_k, max_q, max_k, window, *args, **kwargs):
        seen.append(window)
        return torch.zeros_like(q), torch.zeros(q.size(0), q.size(2), q.size(1))

    for fn in CALLS:
        raises(DEVICE_MSG, lambda: CALLS[fn](window_size=window))
    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    fac.flash_attn_func(*qkv(), window_size=window)
    assert seen == [want]


# --- valid inputs get through every check and stop at the device -----------------------------------------
VALID = {
    "mha": lambda: fac.flash_attn_func(*qkv(), causal=True),
    "gqa_bf16": lambda: fac.flash_attn_func(*qkv(h=6, hk=2, dtype=BF16)),
    "mqa": lambda: fac.flash_attn_func(*qkv(h=6, hk=1)),
    "hdim40": lambda: fac.flash_attn_func(*qkv(d=40)),
    "hdim59": lambda: fac.flash_attn_func(*qkv(d=59)),
    "hdim111_kvpacked": lambda: fac.flash_attn_kvpacked_func(t(B, S, 6, 111), t(B, 5, 2, 3, 111)),
    "hdim256_qkvpacked": lambda: fac.flash_attn_qkvpacked_func(t(B, S, 3, H, 256), return_attn_probs=True),
    "seqlen1": lambda: fac.flash_attn_func(*qkv(sq=1, sk=1)),
    "seqlen_q1_k99": lambda: fac.flash_attn_func(*qkv(sq=1, sk=99)),
    "defaults_spelled_out": lambda: CALLS["func"](dropout_p=0.0, window_size=[-1, -1], softcap=0.0, alibi_slopes=None),
    "window_softcap_alibi": lambda: CALLS["func"](window_size=(3, 0), softcap=30.0, alibi_slopes=torch.ones(H, dtype=F32)),
    "varlen_batch_alibi": lambda: CALLS["varlen"](causal=True, window_size=[2, -1],
                                                  alibi_slopes=torch.ones(3, H, dtype=F32)),
    # flash_attn_* pad head dims that are not multiples of 8, so odd strides are fine there.
    "hdim60_stride61": lambda: fac.flash_attn_func(t(B, S, H, 61)[..., :60], *qkv(d=60)[1:]),
    "fwd_out_hdim256": lambda: fac.fwd(*qkv(d=256), out=t(B, S, H, 256), softmax_scale=0.1),
    "fwd_gqa": lambda: fac.fwd(*qkv(h=8, hk=2, d=128)),
    "varlen_empty_seq": lambda: fac.flash_attn_varlen_func(*vqkv(h=6, hk=2), CU, CU, 7, 7, causal=True),
    "varlen_diff_totals": lambda: fac.flash_attn_varlen_func(t(T, H, 40), t(3, 1, 40), t(3, 1, 40), CU,
                                                             cu(0, 1, 1, 3), 7, 2),
    "varlen_qkvpacked_hdim59": lambda: fac.flash_attn_varlen_qkvpacked_func(t(T, 3, H, 59), CU, 7),
    "varlen_kvpacked_mqa": lambda: fac.flash_attn_varlen_kvpacked_func(t(T, H, D), t(T, 2, 1, D), CU, CU, 7, 7),
    "varlen_batch0": lambda: fac.flash_attn_varlen_func(*vqkv(), cu(0), cu(0), 0, 0),
    "fwd_varlen": lambda: fac.fwd(*vqkv(d=256), cu_seqlens_q=CU, cu_seqlens_k=CU, max_seqlen_q=7, max_seqlen_k=7),
    # Large, negative and tensor scales are numbers the kernels can take.
    "scale_negative_softcap_large": lambda: CALLS["func"](softmax_scale=-0.5, softcap=2e38),
    "scale_tensor": lambda: CALLS["varlen"](softmax_scale=torch.tensor(0.1), softcap=1e-30),
    "bwd_scale_large": lambda: fac.bwd(t(B, S, H, D), *qkv(), t(B, S, H, D), t(B, H, S, dtype=F32), softmax_scale=2e38),
}


@pytest.mark.parametrize("case", VALID)
def test_valid_inputs_reach_device_check(case):
    raises(DEVICE_MSG, VALID[case])


def test_device_is_checked_last():
    assert issubclass(FlashAttnInputError, ValueError) and issubclass(FlashAttnInputError, RuntimeError)
    raises(r"dtype torch.float32", lambda: fac.flash_attn_func(*qkv(dtype=F32)))  # not the device message
    raises(r"cu_seqlens_q must be torch.int32", lambda: VARLEN["fwd"](*vqkv(), CU.long(), CU, 7, 7))
    raises(r"out must match q", lambda: fac.fwd(*qkv(), out=t(B, S, H, 32)))
    meta = torch.empty(B, S, H, D, dtype=F16, device="meta")
    raises(r"q is on meta; flash_attn_cute needs CUDA tensors", lambda: fac.flash_attn_func(meta, meta, meta))


@pytest.mark.parametrize("fn", ["flash_attn_func", "flash_attn_varlen_func"])
def test_inputs_are_checked_once(fn, monkeypatch):
    """The flash_attn_* functions check their arguments once (each pass over them costs host time
    on every call); the checks still all run, up to the device check."""
    from flash_attn_cute import validation
    calls = []
    check_qkv = validation.check_qkv
    monkeypatch.setattr(validation, "check_qkv", lambda *a: calls.append(a) or check_qkv(*a))
    if fn == "flash_attn_func":
        raises(DEVICE_MSG, lambda: fac.flash_attn_func(*qkv(), causal=True))
    else:
        raises(DEVICE_MSG, lambda: fac.flash_attn_varlen_func(*vqkv(), CU, CU, 7, 7))
    assert len(calls) == 1


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_head_dim_padding_keeps_the_callers_softmax_scale(grad, monkeypatch):
    """flash_attn_func pads head dim 59 to 64 for the kernels, with or without the autograd
    function: the kernels get the padded tensors and the default scale of the caller's head dim."""
    import math
    from flash_attn_cute import _ops, interface, validation
    calls = []

    def fake_run_fwd(q, k, v, out, softmax_scale, *args, **kwargs):
        calls.append((q.shape, k.shape, v.shape, softmax_scale))
        return torch.zeros_like(q), torch.zeros(q.size(0), q.size(2), q.size(1))

    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    q, k, v = qkv(d=59)
    if grad:
        q.requires_grad_()
    out = fac.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (B, S, H, 59) and out.requires_grad == grad
    padded = (B, S, H, 64)
    assert calls == [(padded, padded, padded, pytest.approx(1 / math.sqrt(59)))]


# --- checks added after these tests first found them missing ---
@pytest.mark.parametrize("q, k, msg", [((65536, 1, 1, 8), (65536, 1, 1, 8), "batch"),
                                       ((1, 1, 65536, 8), (1, 1, 1, 8), "nheads")], ids=["batch", "nheads"])
def test_grid_limits_rejected(q, k, msg):
    raises(msg, lambda: fac.flash_attn_func(t(*q), t(*k), t(*k)))


def test_non_contiguous_cu_seqlens_rejected():
    strided = cu(0, 9, 3, 9, T, 9)[::2]  # values (0, 3, 10), stride 2
    raises(r"cu_seqlens_q.*contiguous", lambda: fac.flash_attn_varlen_func(*vqkv(), strided, cu(0, 3, T), 7, 7))


def test_max_seqlen_below_longest_sequence_rejected():
    raises(r"max_seqlen_q", lambda: fac.flash_attn_varlen_func(*vqkv(), CU, CU, 1, 7))


@pytest.mark.parametrize("tensors, cu_k", [(vqkv(), CU), (qkv(), None)], ids=["3d_cu_k_only", "4d_no_cu"])
def test_varlen_without_cu_seqlens_q(tensors, cu_k):
    raises(r"cu_seqlens_q", lambda: fac.flash_attn_varlen_func(*tensors, None, cu_k, 7, 7))


# --- the low-level backward ---
def bwd_args(d=D, h=H, hk=H, dtype=F16):
    q, k, v = qkv(h=h, hk=hk, d=d, dtype=dtype)
    return dict(dout=t(B, S, h, d, dtype=dtype), q=q, k=k, v=v, out=t(B, S, h, d, dtype=dtype),
                softmax_lse=t(B, h, S, dtype=F32))


def call_bwd(**changes):
    args = bwd_args()
    args.update(changes)
    return lambda: fac.bwd(**args)


@pytest.mark.parametrize("changes, msg", [
    (dict(dout=t(B, S, H, 32)), r"dout must match q: shape \(2, 8, 4, 64\) dtype torch.float16, got \(2, 8, 4, 32\)"),
    (dict(dout=t(B, S, H, D, dtype=BF16)), r"dout must match q: .* torch.bfloat16"),
    (dict(out=t(B, S + 1, H, D)), r"out must match q"),
    (dict(softmax_lse=t(B, H, S)), r"softmax_lse must be the forward's contiguous float32 tensor of shape "
                                   r"\(2, 4, 8\), got \(2, 4, 8\) torch.float16"),
    (dict(softmax_lse=t(B, S, H, dtype=F32)), r"softmax_lse .* shape \(2, 4, 8\), got \(2, 8, 4\)"),
    (dict(softmax_lse=t(B, H, 2 * S, dtype=F32)[..., ::2]), r"softmax_lse .* \(not contiguous\)"),
    (dict(dq=t(B, S, H, D, dtype=BF16)), r"dq must match q"),
    (dict(dk=t(B, S, 2, D)), r"dk must match k: shape \(2, 8, 4, 64\)"),
    (dict(dv="dv"), r"dv must be a torch.Tensor, got str"),
    (dict(dout=t(B, S, H, 2 * D)[..., ::2]), r"dout must have a contiguous last dimension"),
    (dict(q=t(B, S, H, D, dtype=F32)), r"q has dtype torch.float32"),
    (dict(dout=t(B, S, H, 60), q=t(B, S, H, 60), k=t(B, S, H, 60), v=t(B, S, H, 60), out=t(B, S, H, 60)),
     r"bwd needs a head dim that is a multiple of 8, got 60"),
], ids=["dout_shape", "dout_dtype", "out_shape", "lse_dtype", "lse_shape", "lse_strided", "dq_dtype", "dk_shape",
        "dv_str", "dout_strided", "q_fp32", "hdim60"])
def test_bwd_bad_input(changes, msg):
    raises(msg, call_bwd(**changes))


def test_bwd_valid_inputs_reach_device_check():
    raises(DEVICE_MSG, call_bwd())
    raises(DEVICE_MSG, call_bwd(dq=t(B, S, H, D), dk=t(B, S, H, D), dv=t(B, S, H, D), deterministic=True))
    q, k, v = vqkv(h=6, hk=2)
    raises(DEVICE_MSG, lambda: fac.bwd(t(T, 6, D), q, k, v, t(T, 6, D), t(6, T, dtype=F32), cu_seqlens_q=CU,
                                       cu_seqlens_k=CU, max_seqlen_q=7, max_seqlen_k=7, causal=True))
    raises(r"softmax_lse .* shape \(6, 10\)", lambda: fac.bwd(t(T, 6, D), q, k, v, t(T, 6, D), t(1, 6, T, dtype=F32),
                                                             cu_seqlens_q=CU, cu_seqlens_k=CU, max_seqlen_q=7,
                                                             max_seqlen_k=7))


@pytest.mark.parametrize("window, causal, softcap, alibi, dropout_p, want", [
    ((-1, -1), False, 0.0, False, 0.0, "plain"), ((-1, -1), True, 0.0, False, 0.0, "plain"),
    ((-1, 0), True, 0.0, False, 0.0, "plain"), ((100, 0), True, 0.0, False, 0.0, "plain"),
    ((-1, 0), False, 0.0, False, 0.0, "plain"), ((100, 0), False, 0.0, False, 0.0, "plain"),
    ((100, 3), True, 0.0, False, 0.0, "plain"), ((100, 3), False, 0.0, False, 0.0, "mods"),
    ((-1, 3), False, 0.0, False, 0.0, "mods"), ((500, 500), False, 0.0, False, 0.0, "plain"),
    ((-1, -1), False, 30.0, False, 0.0, "mods"), ((-1, -1), True, 0.0, True, 0.0, "mods"),
    ((-1, -1), False, 0.0, False, 0.1, "dropout"), ((100, 0), True, 30.0, True, 0.5, "dropout")])
def test_kernel_variant_choice(window, causal, softcap, alibi, dropout_p, want):
    """Which instantiation a call needs: softcap / ALiBi take the score-mod kernels, and so does a
    window on a non-causal kernel (a side as long as the keys is no window); a window (left, 0) runs
    on the plain causal kernels, as causal does; dropout takes the dropout kernels (which have the
    mods too)."""
    from flash_attn_cute._ops import kernel_variant
    slopes = torch.ones(H, dtype=F32) if alibi else None
    assert kernel_variant(window, softcap, slopes, causal, seqlen_k=500, dropout_p=dropout_p) == want


def test_require_kernel_names_the_missing_instantiation(monkeypatch):
    """_require_kernel looks up the instantiation a call runs: the causal form (a window (left, 0)
    runs the causal kernels) and the variant (kernel_variant), in the pass's list of built kernels."""
    from flash_attn_cute import _ops
    monkeypatch.setattr(_ops, "_require_extension", lambda: None)
    monkeypatch.setattr(_ops, "BUILT_FWD_KERNELS", frozenset({("fp16", 64, True, "plain"), ("fp16", 64, False, "mods")}))
    monkeypatch.setattr(_ops, "BUILT_BWD_KERNELS", frozenset({("fp16", 64, True, "plain")}))

    def built(*args, **kwargs):  # conftest turns a "this build has no" error into a skip: fail instead
        try:
            _ops._require_kernel(*args, **kwargs)
        except NotImplementedError as exc:
            pytest.fail("a built kernel reported missing: " + str(exc).removeprefix("flash_attn_cute: "))

    built(F16, 59, False, (100, 0), 0.0, None, 500)  # window (100, 0): the causal kernel
    built(F16, 64, False, (-1, -1), 30.0, None, 500)  # softcap: the score-mod kernel
    built(F16, 64, True, (-1, -1), 0.0, None, 500, pass_="backward")
    with pytest.raises(NotImplementedError, match=r"no forward kernel for fp16, head dim 64 \(kernel 64\), "
                                                  r"causal=True with dropout"):
        _ops._require_kernel(F16, 64, True, (-1, -1), 0.0, None, 500, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match=r"no backward kernel for fp16, head dim 64 \(kernel 64\), "
                                                  r"causal=False with softcap"):
        _ops._require_kernel(F16, 64, False, (-1, -1), 30.0, None, 500, pass_="backward")
    with pytest.raises(NotImplementedError, match=r"no forward kernel for bf16"):
        _ops._require_kernel(BF16, 64, True, (-1, -1), 0.0, None, 500)
