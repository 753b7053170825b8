"""flash_attn_cute.flash_attn_interface: flash-attn 2.7+'s module of that name (the public functions,
_get_block_size_n and the low-level _flash_attn_* helpers). CPU tests of the signatures and the
argument handling (kernels faked); GPU tests of the helpers against the float32 reference."""
import inspect
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute import FlashAttnInputError, flash_attn_interface as fai

F16, BF16 = torch.float16, torch.bfloat16
B, S, H, D = 2, 8, 4, 64

# flash-attn 2.7 / 2.8's signatures (parameter names and defaults: callers pass them by keyword).
UPSTREAM = {
    "_flash_attn_forward": "(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap, "
                           "alibi_slopes, return_softmax)",
    "_flash_attn_varlen_forward": "(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, "
                                  "softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0, "
                                  "alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None, "
                                  "seqused_k=None, zero_tensors=False)",
    "_flash_attn_backward": "(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, "
                            "window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None)",
    "_flash_attn_varlen_backward": "(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, "
                                   "max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, "
                                   "window_size_right, softcap, alibi_slopes, deterministic, rng_state=None, "
                                   "zero_tensors=False)",
    "_get_block_size_n": "(device, head_dim, is_dropout, is_causal)",
    "round_multiple": "(x, m)",
    "maybe_contiguous": "(x)",
}


@pytest.mark.parametrize("name", UPSTREAM)
def test_signatures_match_flash_attn(name):
    assert str(inspect.signature(getattr(fai, name))) == UPSTREAM[name]


def test_module_exports_the_public_functions():
    for name in ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
                 "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"):
        assert getattr(fai, name) is getattr(fac, name)
    assert set(fai.__all__) == {n for n in dir(fai) if not n.startswith("__") and callable(getattr(fai, n))}


def _t(*shape, dtype=F16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _fake_kernels(monkeypatch, calls):
    """The kernels replaced (CPU): the forward returns out = 1, lse = 0, and rng_state (7, 9) with
    dropout; the backward writes 1, 2, 3 into dq, dk, dv; the dropout mask keeps entries where a
    seeded draw is above p. calls records the layout problems each kernel would have seen."""
    from flash_attn_cute import _ops, interface, validation

    def fake_run_fwd(q, k, v, out, scale, causal, cu_q, cu_k, max_q, max_k, window, softcap, alibi, seqused_k,
                     dropout_p, block_table=None, out_residual=None, leftpad_k=None):
        calls.append(("fwd", [validation.layout_problem(n, x) for n, x in (("q", q), ("k", k), ("v", v))],
                      (scale, causal, max_q, max_k, window), leftpad_k))
        lse = torch.zeros(q.size(1), q.size(0)) if cu_q is not None else torch.zeros(q.size(0), q.size(2), q.size(1))
        result = (torch.ones_like(q), lse)
        return result + (torch.tensor([7, 9]),) if dropout_p else result

    def fake_run_bwd(dout, q, k, v, out, lse, dq, dk, dv, *args):
        calls.append(("bwd", [validation.layout_problem(n, x) for n, x in (("dout", dout), ("q", q), ("out", out))],
                      args[-3:]))
        for g, value in ((dq, 1.0), (dk, 2.0), (dv, 3.0)):
            g.fill_(value)
        return dq, dk, dv

    def fake_dropout_mask(rng_state, p, batch, heads, sq, sk, cu_q=None, cu_k=None):
        assert rng_state.tolist() == [7, 9]
        return torch.rand(batch, heads, sq, sk, generator=torch.Generator().manual_seed(1)) > p

    check_dropout = validation.check_dropout
    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(validation, "check_dropout", lambda p, rng_state=None, device=None: check_dropout(p))
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(interface, "run_fwd", fake_run_fwd)
    monkeypatch.setattr(interface, "EAGER_CPP_AUTOGRAD", False)  # the Python autograd function, which calls run_fwd
    monkeypatch.setattr(_ops, "run_bwd", fake_run_bwd)
    monkeypatch.setattr(interface, "dropout_mask", fake_dropout_mask)


def test_forward_returns_four_values(monkeypatch):
    calls = []
    _fake_kernels(monkeypatch, calls)
    q, k, v = _t(B, S, H, D), _t(B, 12, 2, D, seed=1), _t(B, 12, 2, D, seed=2)
    out, lse, S_dmask, rng_state = fai._flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, False)
    assert out.shape == q.shape and lse.shape == (B, H, S)
    assert S_dmask.shape == (0,) and S_dmask.dtype == F16
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    assert calls == [("fwd", [None] * 3, (0.125, True, S, 12, (-1, -1)), None)]
    with pytest.raises(FlashAttnInputError, match="return_softmax needs dropout_p > 0"):
        fai._flash_attn_forward(q, k, v, 0.0, 0.125, True, -1, -1, 0.0, None, True)
    # With dropout: S_dmask is return_attn_probs' encoding under the mask rng_state redraws.
    out, lse, S_dmask, rng_state = fai._flash_attn_forward(q, k, v, 0.25, None, False, -3, 4, 0.0, None, True)
    assert rng_state.tolist() == [7, 9] and calls[-1][2] == (pytest.approx(1 / math.sqrt(D)), False, S, 12, (-1, 4))
    keep = torch.rand(B, H, S, 12, generator=torch.Generator().manual_seed(1)) > 0.25
    from flash_attn_cute import interface
    want = interface._attn_probs(q, k, None, None, None, None, keep, 1 / math.sqrt(D), False, (-1, 4), 0.0, None,
                                 None)
    assert torch.equal(S_dmask, want) and torch.equal(S_dmask.signbit(), ~keep)


def test_forward_copies_strided_inputs_and_checks_the_rest(monkeypatch):
    calls = []
    _fake_kernels(monkeypatch, calls)
    q = _t(B, S, D, H).transpose(-1, -2)
    k = _t(B, S, H, 2 * D)[..., ::2]
    fai._flash_attn_forward(q, k, _t(B, S, H, D), 0.0, None, False, -1, -1, 0.0, None, False)
    assert calls[-1][1] == [None] * 3
    with pytest.raises(FlashAttnInputError, match="head dim that is a multiple of 8, got 60"):
        fai._flash_attn_forward(*(_t(B, S, H, 60),) * 3, 0.0, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(FlashAttnInputError, match="dtype torch.float32"):
        fai._flash_attn_forward(*(_t(B, S, H, D, dtype=torch.float32),) * 3, 0.0, None, False, -1, -1, 0.0, None,
                                False)


def test_varlen_forward(monkeypatch):
    calls = []
    _fake_kernels(monkeypatch, calls)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    q, k, v = _t(10, H, D), _t(10, 2, D, seed=1), _t(10, 2, D, seed=2)
    out, lse, S_dmask, _ = fai._flash_attn_varlen_forward(q, k, v, cu, cu, torch.tensor(7), 7, 0.0, None, True,
                                                          zero_tensors=True)
    assert out.shape == q.shape and lse.shape == (H, 10) and S_dmask.shape == (0,)
    assert calls[-1][2][2:4] == (7, 7)
    _, _, S_dmask, _ = fai._flash_attn_varlen_forward(q, k, v, cu, cu, 7, 7, 0.1, None, True, return_softmax=True)
    assert S_dmask.shape == (3, H, 7, 7) and (S_dmask[1] == 0).all()
    pad = torch.tensor([0, 0, 2], dtype=torch.int32)
    fai._flash_attn_varlen_forward(q, k, v, cu, cu, 7, 7, 0.0, None, True, leftpad_k=pad)
    assert calls[-1][3] is pad
    with pytest.raises(FlashAttnInputError, match="leftpad_k takes no dropout"):
        fai._flash_attn_varlen_forward(q, k, v, cu, cu, 7, 7, 0.1, None, True, leftpad_k=pad)
    table = torch.zeros(3, 1, dtype=torch.int32)
    fai._flash_attn_varlen_forward(q, _t(2, 16, 2, D), _t(2, 16, 2, D), cu, cu, 7, 7, 0.0, None, False,
                                   block_table=table)
    assert calls[-1][0] == "fwd"


def test_backward_writes_the_given_gradients_and_returns_softmax_d(monkeypatch):
    calls = []
    _fake_kernels(monkeypatch, calls)
    q, k, v = _t(B, 130, H, D), _t(B, 12, 2, D, seed=1), _t(B, 12, 2, D, seed=2)
    out, dout = _t(B, 130, H, D, seed=3), _t(B, 130, H, D, seed=4).transpose(1, 2).contiguous().transpose(1, 2)
    dqkv = torch.zeros(B, 130, 3, H, D, dtype=F16)  # packed gradients, as flash-attn's qkvpacked backward passes
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    lse = torch.zeros(B, H, 130)
    softmax_d = fai._flash_attn_backward(dout, q, k, v, out, lse, dqkv[:, :, 0], dk, dv, 0.2, 0.1, True, -1, -1, 0.0,
                                         None, False, torch.tensor([7, 9]))
    assert (dqkv[:, :, 0] == 1).all() and (dqkv[:, :, 1:] == 0).all() and (dk == 2).all() and (dv == 3).all()
    assert calls[-1][1] == [None] * 3, "dout copied into a layout the kernels take"
    dropout_p, rng_state, residual = calls[-1][2]
    assert dropout_p == 0.2 and rng_state.tolist() == [7, 9] and residual is None
    assert softmax_d.shape == (B, H, 256) and softmax_d.dtype == torch.float32
    want = (dout.float() * out.float()).sum(-1).transpose(1, 2) * 0.8
    torch.testing.assert_close(softmax_d[..., :130], want)
    assert (softmax_d[..., 130:] == 0).all()
    with pytest.raises(FlashAttnInputError, match="dq must have a contiguous last dimension"):
        fai._flash_attn_backward(dout, q, k, v, out, lse, torch.zeros(B, 130, H, 2 * D, dtype=F16)[..., ::2], dk, dv,
                                 0.0, 0.1, True, -1, -1, 0.0, None, False)


def test_varlen_backward_softmax_d_layout(monkeypatch):
    """softmax_d (nheads, total_q + 128 * batch): sequence b's rows from column cu_seqlens_q[b] + 128 * b."""
    calls = []
    _fake_kernels(monkeypatch, calls)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    q, k, v = _t(12, H, D), _t(10, 2, D, seed=1), _t(10, 2, D, seed=2)  # rows 10, 11: in no sequence
    out, dout = _t(12, H, D, seed=3), _t(12, H, D, seed=4)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    softmax_d = fai._flash_attn_varlen_backward(dout, q, k, v, out, torch.zeros(H, 12), dq, dk, dv, cu, cu, 7, 7, 0.0,
                                                None, False, -1, -1, 0.0, None, True)
    assert softmax_d.shape == (H, 12 + 128 * 3) and (dq == 1).all()
    assert calls[-1][2][:2] == (0.0, None), "no dropout: no rng_state for the kernels"
    rows = (dout.float() * out.float()).sum(-1).t()
    columns = [0, 1, 2] + [r + 256 for r in range(3, 10)] + [10 + 384, 11 + 384]
    torch.testing.assert_close(softmax_d[:, columns], rows)
    rest = softmax_d.clone()
    rest[:, columns] = 0
    assert (rest == 0).all()


# --- GPU: the helpers against the float32 reference -------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_backward_match_reference(causal, dropout_p):
    from flash_attn_cute.reference import attention_ref
    from test_bwd import _check_grads
    from test_fwd import _check, _randn
    # fp16: the backward takes D from the rounded out (no out_residual in flash-attn's signature),
    # whose rounding error bf16's 8-bit mantissa makes large enough to matter with dropout (README).
    torch.manual_seed(12)
    q = _randn(2, 200, 4, 64, dtype=F16)
    k, v = (_randn(2, 257, 2, 64, dtype=F16) for _ in range(2))
    dout = _randn(2, 200, 4, 64, dtype=F16)
    out, lse, S_dmask, rng_state = fai._flash_attn_forward(q, k, v, dropout_p, 64 ** -0.5, causal, -1, -1, 0.0, None,
                                                           dropout_p > 0)
    mods = dict(dropout_p=dropout_p, dropout_mask=~S_dmask.signbit()) if dropout_p else {}
    _check(q, k, v, causal, out, lse, **mods)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    softmax_d = fai._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, dropout_p, 64 ** -0.5, causal, -1, -1,
                                         0.0, None, False, rng_state)
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, **mods, **kw)[0]  # noqa: E731
    _check_grads((dq, dk, dv), ref, (q, k, v), dout)
    want = (dout.float() * out.float()).sum(-1).transpose(1, 2) * (1 - dropout_p)
    torch.testing.assert_close(softmax_d[..., :200], want)


@pytest.mark.cuda
def test_varlen_forward_backward_match_reference():
    from flash_attn_cute.reference import attention_varlen_ref
    from test_bwd import _check_grads, _varlen_case
    from test_fwd import _check_varlen
    torch.manual_seed(13)
    seqlens_q, seqlens_k = [0, 17, 128, 300], [5, 0, 128, 299]
    q, k, v, dout, cu_q, cu_k = _varlen_case(BF16, 128, seqlens_q, seqlens_k)
    out, lse, _, rng_state = fai._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), 0.0,
                                                            None, True)
    _check_varlen(q, k, v, cu_q, cu_k, out, lse, causal=True)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fai._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                    0.0, None, True, -1, -1, 0.0, None, False, rng_state)
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=True, **kw)[0]  # noqa: E731
    _check_grads((dq, dk, dv), ref, (q, k, v), dout)
