"""Backward kernels against the float32 reference (GPU only).

Accuracy rule, for each of dq, dk, dv (the forward's rule): max |g - g_ref32| <= 2 * max |g_lowp -
g_ref32| + 1e-5, where g_ref32 is autograd through the float32 reference and g_lowp through the same
math in the input dtype.
"""
import itertools
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute.reference import attention_ref, attention_varlen_ref
from test_fwd import DTYPES, HEADS, _assert_close_rule, _check_varlen, _randn, attention_grid

pytestmark = pytest.mark.cuda


def _ref_grads(ref_fn, inputs, dout, upcast):
    """Gradients of ref_fn(*inputs) for dout: float32 leaves when upcast, else the inputs' dtype."""
    leaves = [x.detach().float() if upcast else x.detach().clone() for x in inputs]
    leaves = [x.requires_grad_() for x in leaves]
    out = ref_fn(*leaves, upcast=upcast, reorder_ops=not upcast)
    return torch.autograd.grad(out, leaves, dout.float() if upcast else dout)


def _check_grads(grads, ref_fn, inputs, dout):
    ref = _ref_grads(ref_fn, inputs, dout, upcast=True)
    ref_lowp = _ref_grads(ref_fn, inputs, dout, upcast=False)
    for name, g, r, r_lowp, x in zip(("dq", "dk", "dv"), grads, ref, ref_lowp, inputs):
        assert g.shape == x.shape and g.dtype == x.dtype, f"{name}: shape / dtype"
        try:
            _assert_close_rule(g, r, r_lowp)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def _dense_ref(causal, softmax_scale=None):
    return lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, **kw)[0]


def _grads_of(fn, inputs, dout):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dout)


@attention_grid
def test_bwd_matches_reference(dtype, head_dim, seqlens, causal, heads):
    (seqlen_q, seqlen_k), (nheads, nheads_k), batch = seqlens, HEADS[heads], 2
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    dout = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    grads = _grads_of(lambda q, k, v: fac.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    _check_grads(grads, _dense_ref(causal), (q, k, v), dout)


def _varlen_case(dtype, head_dim, seqlens_q, seqlens_k, nheads=4, nheads_k=2):
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), nheads, head_dim, dtype=dtype)
    k = _randn(int(cu_k[-1]), nheads_k, head_dim, dtype=dtype)
    v = _randn(int(cu_k[-1]), nheads_k, head_dim, dtype=dtype)
    dout = _randn(int(cu_q[-1]), nheads, head_dim, dtype=dtype)
    return q, k, v, dout, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [40, 64, 111, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_bwd_varlen_uneven_and_empty_sequences(dtype, head_dim, causal):
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 3]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 1]
    q, k, v, dout, cu_q, cu_k = _varlen_case(dtype, head_dim, seqlens_q, seqlens_k)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    causal=causal)
    grads = _grads_of(fn, (q, k, v), dout)
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
    _check_grads(grads, ref, (q, k, v), dout)
    # Keys that no query row sees (sequence 0 has 5 keys and no query) get exactly 0.
    assert (grads[1][:5] == 0).all() and (grads[2][:5] == 0).all()


def test_bwd_writes_every_gradient_element():
    """dq, dk, dv are poisoned with NaN first: every element must be overwritten."""
    q, k, v, dout, cu_q, cu_k = _varlen_case(torch.bfloat16, 128, [0, 130, 1, 64], [70, 0, 200, 64])
    out, lse = fac.fwd(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=130,
                       max_seqlen_k=200)
    dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, k, v))
    fac.bwd(dout, q, k, v, out, lse, dq, dk, dv, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
            max_seqlen_q=130, max_seqlen_k=200)
    for g in (dq, dk, dv):
        assert g.isfinite().all()
    # dense: seqlen_q > seqlen_k causal leaves the first rows with no key: zero dq there
    q, k, v = (_randn(2, n, 4, 64, dtype=torch.float16) for n in (300, 200, 200))
    dout = _randn(2, 300, 4, 64, dtype=torch.float16)
    out, lse = fac.fwd(q, k, v, causal=True)
    dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, k, v))
    fac.bwd(dout, q, k, v, out, lse, dq, dk, dv, causal=True)
    assert (dq[:, :100] == 0).all() and all(g.isfinite().all() for g in (dq, dk, dv))
    _check_grads((dq, dk, dv), _dense_ref(True), (q, k, v), dout)


@pytest.mark.parametrize("layout", ["transposed_heads", "last_dim_strided"])
def test_bwd_non_contiguous_dout(layout):
    q, k, v = (_randn(2, 257, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    if layout == "transposed_heads":
        dout = _randn(2, 4, 257, 64, dtype=torch.bfloat16).transpose(1, 2)
    else:
        dout = _randn(2, 257, 4, 64, 2, dtype=torch.bfloat16)[..., 0]
    grads = _grads_of(lambda q, k, v: fac.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    _check_grads(grads, _dense_ref(True), (q, k, v), dout)


@pytest.mark.parametrize("layout", ["last_dim_strided", "row_stride_67", "misaligned_pointer", "transposed_heads"])
def test_strided_qkv_are_copied(layout):
    """q, k, v in layouts the kernels cannot read (flash-attn 2.x copies a strided last dim) are copied
    by flash_attn_func: output and gradients (shaped like the caller's tensors) match the reference."""
    torch.manual_seed(11)

    def make(*shape):
        if layout == "last_dim_strided":
            return _randn(*shape, 2, dtype=torch.bfloat16)[..., 1]
        if layout == "row_stride_67":
            return _randn(*shape[:-1], shape[-1] + 3, dtype=torch.bfloat16)[..., :shape[-1]]
        if layout == "misaligned_pointer":
            return _randn(math.prod(shape) + 1, dtype=torch.bfloat16)[1:].view(shape)
        return _randn(shape[0], shape[2], shape[1], shape[3], dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = make(2, 257, 4, 64), make(2, 300, 2, 64), make(2, 300, 2, 64)
    dout = _randn(2, 257, 4, 64, dtype=torch.bfloat16)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]  # detach keeps the layout (clone would not)
    assert leaves[0].stride() == q.stride() and leaves[0].data_ptr() == q.data_ptr()
    out = fac.flash_attn_func(*leaves, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    ref_lowp, _ = attention_ref(q, k, v, causal=True, upcast=False, reorder_ops=True)
    _assert_close_rule(out, ref, ref_lowp)
    grads = torch.autograd.grad(out, leaves, dout)
    _check_grads(grads, _dense_ref(True), (q, k, v), dout)


def test_bwd_large_inputs_do_not_overflow():
    q, k, v = (_randn(2, 512, 4, 128, dtype=torch.bfloat16, scale=5.0) for _ in range(3))
    dout = _randn(2, 512, 4, 128, dtype=torch.bfloat16)
    grads = _grads_of(lambda q, k, v: fac.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    assert all(g.isfinite().all() for g in grads)
    _check_grads(grads, _dense_ref(True), (q, k, v), dout)


def test_bwd_seqlen_one_and_tiny_k_varlen():
    q, k, v, dout, cu_q, cu_k = _varlen_case(torch.float16, 64, [1, 1, 1, 2], [1, 2, 0, 1])
    for causal in (False, True):
        fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 2, causal=causal)  # noqa: E731
        grads = _grads_of(fn, (q, k, v), dout)
        assert all(g.isfinite().all() for g in grads)
        ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
        _check_grads(grads, ref, (q, k, v), dout)


def test_bwd_custom_softmax_scale():
    q, k, v = (_randn(1, 200, 2, 96, dtype=torch.float16) for _ in range(3))
    dout = _randn(1, 200, 2, 96, dtype=torch.float16)
    grads = _grads_of(lambda q, k, v: fac.flash_attn_func(q, k, v, softmax_scale=0.37), (q, k, v), dout)
    _check_grads(grads, _dense_ref(False, 0.37), (q, k, v), dout)


# (seqlen_q, seqlen_k), head dim 128 (64-row, 128-key blocks). Not causal, deterministic: 1000, 3000,
# 2000 x 300 and 1024 x 2048 (as many key blocks as row blocks) take the rotated dQ order (8, 24, 3
# and 16 key blocks, all resident); 300 x 2000 has more key blocks than row blocks and keeps the
# order from the first key block up, in the same grid; 9000 has more key blocks than half the SMs
# (on 132) and walks in key-block-major order.
RACE_SEQLENS = [(1000, 1000), (3000, 3000), (2000, 300), (1024, 2048), (300, 2000), (9000, 9000)]


@pytest.fixture(params=["default", "sm80"])
def bwd_kernel(request, monkeypatch):
    """The backward the default dispatch takes (on Hopper its own), and the SM80 one on any GPU."""
    if request.param == "sm80":
        monkeypatch.setenv("FLASH_ATTN_CUTE_SM90_BWD", "0")
    return request.param


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(8, 8), (8, 1)], ids=["mha", "mqa"])
@pytest.mark.parametrize("seqlens", RACE_SEQLENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_bwd_race_free_and_deterministic(bwd_kernel, causal, heads, seqlens):
    """dk, dv are bitwise reproducible always; dq too with deterministic=True, in every dQ order."""
    (nheads, nheads_k), (seqlen_q, seqlen_k), n = heads, seqlens, 10
    batch = 2 if seqlen_q < 9000 else 1  # the float32 reference holds seqlen_q * seqlen_k per head
    if seqlen_q >= 9000:
        nheads, nheads_k = nheads // 4, max(1, nheads_k // 4)
    q = _randn(batch, seqlen_q, nheads, 128, dtype=torch.bfloat16)
    k, v = (_randn(batch, seqlen_k, nheads_k, 128, dtype=torch.bfloat16) for _ in range(2))
    dout = _randn(batch, seqlen_q, nheads, 128, dtype=torch.bfloat16)
    out, lse = fac.fwd(q, k, v, causal=causal)
    runs = [fac.bwd(dout, q, k, v, out, lse, causal=causal) for _ in range(n)]
    det = [fac.bwd(dout, q, k, v, out, lse, causal=causal, deterministic=True) for _ in range(n)]
    for dq, dk, dv in runs[1:]:
        assert torch.equal(dk, runs[0][1]) and torch.equal(dv, runs[0][2])
    for dq, dk, dv in det[1:]:
        assert torch.equal(dq, det[0][0]) and torch.equal(dk, det[0][1]) and torch.equal(dv, det[0][2])
    _check_grads(det[0], _dense_ref(causal), (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_deterministic(bwd_kernel, causal):
    """Varlen sequences with more and fewer key blocks than row blocks, no rows, no keys, in one call:
    each takes its own dQ order; dq is bitwise reproducible and right."""
    seqlens_q, seqlens_k = [1000, 0, 300, 2000, 17, 40], [1000, 5, 2000, 300, 900, 0]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(s)], device="cuda", dtype=torch.int32)
                  for s in (seqlens_q, seqlens_k))
    q, dout = (_randn(sum(seqlens_q), 4, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (_randn(sum(seqlens_k), 2, 128, dtype=torch.bfloat16) for _ in range(2))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k),
              causal=causal)
    out, lse = fac.fwd(q, k, v, **kw)
    det = [fac.bwd(dout, q, k, v, out, lse, deterministic=True, **kw) for _ in range(5)]
    for grads in det[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads, det[0]))
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, **kw)[0]  # noqa: E731
    _check_grads(det[0], ref, (q, k, v), dout)


def test_packed_gradients():
    qkv = _randn(2, 333, 3, 4, 64, dtype=torch.bfloat16).requires_grad_()
    dout = _randn(2, 333, 4, 64, dtype=torch.bfloat16)
    (dqkv,) = torch.autograd.grad(fac.flash_attn_qkvpacked_func(qkv, causal=True), qkv, dout)
    assert dqkv.shape == qkv.shape
    _check_grads(dqkv.unbind(2), _dense_ref(True), qkv.detach().unbind(2), dout)
    q = _randn(2, 333, 4, 64, dtype=torch.bfloat16).requires_grad_()
    kv = _randn(2, 333, 2, 2, 64, dtype=torch.bfloat16).requires_grad_()
    dq, dkv = torch.autograd.grad(fac.flash_attn_kvpacked_func(q, kv), (q, kv), dout)
    assert dkv.shape == kv.shape
    _check_grads((dq, *dkv.unbind(2)), _dense_ref(False), (q.detach(), *kv.detach().unbind(2)), dout)


def test_varlen_packed_gradients():
    seqlens = [3, 0, 200, 64]
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    qkv = _randn(int(cu[-1]), 3, 4, 64, dtype=torch.float16).requires_grad_()
    dout = _randn(int(cu[-1]), 4, 64, dtype=torch.float16)
    out = fac.flash_attn_varlen_qkvpacked_func(qkv, cu, max(seqlens), causal=True)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    assert dqkv.shape == qkv.shape
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu, cu, causal=True, **kw)[0]  # noqa: E731
    _check_grads(dqkv.unbind(1), ref, qkv.detach().unbind(1), dout)


def test_torch_compile_fullgraph_backward():
    q, k, v = (_randn(2, 256, 4, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3))

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        return (fac.flash_attn_func(q, k, v, causal=True).float() ** 2).sum()

    grads = torch.autograd.grad(loss_fn(q, k, v), (q, k, v))
    eager = torch.autograd.grad((fac.flash_attn_func(q, k, v, causal=True).float() ** 2).sum(), (q, k, v))
    for g, e in zip(grads, eager):
        torch.testing.assert_close(g, e)


def test_cuda_graph_forward_backward():
    q, k, v = (_randn(2, 300, 4, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = _randn(2, 300, 4, 128, dtype=torch.bfloat16)

    def step():
        out = fac.flash_attn_func(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        for x in (q, k, v, dout):
            x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    _check_grads(captured, _dense_ref(True), (q.detach(), k.detach(), v.detach()), dout)


def test_bwd_bad_input_leaves_cuda_usable():
    q, k, v = (_randn(1, 16, 2, 64, dtype=torch.float16) for _ in range(3))
    out, lse = fac.fwd(q, k, v)
    with pytest.raises(ValueError, match="softmax_lse"):
        fac.bwd(q, q, k, v, out, lse[:, :, :8])
    with pytest.raises(RuntimeError, match="softmax_lse"):
        torch.ops.flash_attn_cute.bwd(q, q, k, v, out, lse.double(), q.clone(), k.clone(), v.clone(), None, None,
                                      16, 16, 0.1, False, False)
    dq, dk, dv = fac.bwd(out, q, k, v, out, lse)
    torch.cuda.synchronize()
    assert all(g.isfinite().all() for g in (dq, dk, dv))


def test_varlen_rows_outside_every_sequence_are_zero():
    """cu_seqlens[-1] < total: the trailing rows belong to no sequence: out 0, LSE +inf, gradients 0."""
    cu = torch.tensor([0, 50, 120], device="cuda", dtype=torch.int32)
    q, k, v = (_randn(130, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(q, math.nan)
    out, lse = fac.fwd(q, k, v, out=out, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=70, max_seqlen_k=70)
    assert (out[120:] == 0).all() and (lse[:, 120:] == math.inf).all() and out[:120].isfinite().all()
    dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, k, v))
    fac.bwd(_randn(130, 4, 64, dtype=torch.bfloat16), q, k, v, out, lse, dq, dk, dv, cu_seqlens_q=cu,
            cu_seqlens_k=cu, max_seqlen_q=70, max_seqlen_k=70)
    for g in (dq, dk, dv):
        assert (g[120:] == 0).all() and g.isfinite().all()


# Run-time switches that pick the forward and backward kernels (read at every call).
KERNEL_PATHS = {"default": {}, "sm80": {"FLASH_ATTN_CUTE_SM90": "0"}, "sm90_ws": {"FLASH_ATTN_CUTE_SM90_WS": "1"},
                "sm90_ctas": {"FLASH_ATTN_CUTE_SM90_WS": "0"}}


@pytest.mark.parametrize("path", list(KERNEL_PATHS))
@pytest.mark.parametrize("nheads", [4, 32], ids=["split_kv", "heads32"])  # 4: few CTAs, the split-KV forward
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_varlen_poisoned_outputs_get_every_row(dtype, head_dim, causal, nheads, path, monkeypatch):
    """Over NaN-filled out, dQ, dK and dV, the kernels write each sequence's rows, rows that see no
    key and keys that no row sees among them. The varlen rows kernel writes the rest: rows past
    cu_seqlens[-1] and keys past seqused_k. Every value is finite, the unwritten rows 0 (LSE +inf),
    the sequences' rows right."""
    for name, value in KERNEL_PATHS[path].items():
        monkeypatch.setenv(name, value)
    torch.manual_seed(5)
    seqlens_q, seqlens_k, used = [70, 0, 33, 128, 5], [90, 40, 0, 200, 5], [60, 40, 0, 150, 3]
    q, k, v, dout, cu_q, cu_k = _varlen_case(dtype, head_dim, seqlens_q, seqlens_k, nheads, nheads // 2)
    rows_q, rows_k = q.size(0), k.size(0)
    q, dout = (torch.cat([x, _randn(7, *x.shape[1:], dtype=dtype)]) for x in (q, dout))  # rows of no sequence
    k, v = (torch.cat([x, _randn(9, *x.shape[1:], dtype=dtype)]) for x in (k, v))
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q), max_seqlen_k=max(seqlens_k),
              causal=causal, seqused_k=torch.tensor(used, device="cuda", dtype=torch.int32))
    out, dq, dk, dv = (torch.full_like(x, math.nan) for x in (q, q, k, v))
    out, lse = fac.fwd(q, k, v, out=out, **kw)
    fac.bwd(dout, q, k, v, out, lse, dq, dk, dv, **kw)
    torch.cuda.synchronize()
    assert all(x.isfinite().all() for x in (out, dq, dk, dv)), "an unwritten row"
    assert (out[rows_q:] == 0).all() and (lse[:, rows_q:] == math.inf).all() and (dq[rows_q:] == 0).all()
    no_keys = slice(int(cu_q[2]), int(cu_q[3]))  # sequence 2: 33 rows, no key
    assert (out[no_keys] == 0).all() and (lse[:, no_keys] == math.inf).all() and (dq[no_keys] == 0).all()
    keep = torch.cat([torch.arange(int(cu_k[b]), int(cu_k[b]) + n, device="cuda") for b, n in enumerate(used)])
    unused = torch.ones(k.size(0), dtype=torch.bool, device="cuda")
    unused[keep] = False
    assert unused[rows_k:].all() and (dk[unused] == 0).all() and (dv[unused] == 0).all()
    no_rows = slice(int(cu_k[1]), int(cu_k[2]))  # sequence 1: 40 keys, no row
    assert (dk[no_rows] == 0).all() and (dv[no_rows] == 0).all()
    # The sequences' rows against the reference over the used keys, packed.
    cu_used = torch.tensor([0] + used, device="cuda").cumsum(0).int()
    _check_varlen(q[:rows_q], k[keep], v[keep], cu_q, cu_used, out[:rows_q], lse[:, :rows_q], causal=causal)
    ref_fn = lambda q, k, v, **r: attention_varlen_ref(q, k, v, cu_q, cu_used, causal=causal, **r)[0]  # noqa: E731
    _check_grads((dq[:rows_q], dk[keep], dv[keep]), ref_fn, (q[:rows_q], k[keep], v[keep]), dout[:rows_q])


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_max_seqlen_below_a_sequence_is_cut_not_hung(deterministic):
    """A max_seqlen shorter than a sequence cannot be checked without reading the device's cu_seqlens:
    the kernels cut the sequence to it instead of reading or writing past their buffers (or waiting
    forever for the deterministic dQ order)."""
    cu = torch.tensor([0, 300], device="cuda", dtype=torch.int32)
    q, k, v, dout = (_randn(300, 4, 128, dtype=torch.bfloat16) for _ in range(4))
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=128, max_seqlen_k=128)
    out, lse = fac.fwd(q, k, v, **kw)
    dq, dk, dv = fac.bwd(dout, q, k, v, out, lse, deterministic=deterministic, **kw)
    torch.cuda.synchronize()
    ref, _ = attention_ref(q[None, :128], k[None, :128], v[None, :128])
    ref_lowp, _ = attention_ref(q[None, :128], k[None, :128], v[None, :128], upcast=False, reorder_ops=True)
    _assert_close_rule(out[None, :128], ref, ref_lowp)
    for g in (dq, dk, dv):
        assert g.isfinite().all() and (g[128:] == 0).all()
