"""Dropout against the float32 reference (GPU only): the reference applies the mask the kernel
reports (return_attn_probs marks dropped entries negative; dropout_mask redraws it from the
forward's rng_state), forward and backward, with the accuracy rule of test_fwd / test_bwd; plus the
kept fraction, seeding, and CUDA graphs.
"""
import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute.reference import attention_ref, attention_varlen_ref
from test_bwd import _check_grads, _varlen_case
from test_fwd import HEADS, _check, _randn

pytestmark = pytest.mark.cuda

BF16, F16 = torch.bfloat16, torch.float16
P = 0.17


def _run_with_probs(fn, inputs, dout):
    """out, lse, the keep mask (from the returned probabilities) and the gradients of one call."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse, probs = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), lse, ~probs.signbit(), grads


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [40, 64, 111, 128, 160, 256])
@pytest.mark.parametrize("seqlens", [(1, 239), (113, 203), (127, 513), (512, 256), (1023, 1024)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", ["mha", "gqa"])
def test_dropout_fwd_bwd(dtype, head_dim, seqlens, causal, heads):
    torch.manual_seed(0)
    (seqlen_q, seqlen_k), (nheads, nheads_k), batch = seqlens, HEADS[heads], 2
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=dtype)
    dout = _randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, dropout_p=P, causal=causal, return_attn_probs=True)  # noqa: E731
    out, lse, keep, grads = _run_with_probs(fn, (q, k, v), dout)
    mods = dict(dropout_p=P, dropout_mask=keep)
    _check(q, k, v, causal, out, lse, **mods)
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, **mods, **kw)[0]  # noqa: E731
    _check_grads(grads, ref, (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_dropout_varlen_with_empty_sequences(head_dim, causal):
    torch.manual_seed(1)
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 3]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 1]
    q, k, v, dout, cu_q, cu_k = _varlen_case(BF16, head_dim, seqlens_q, seqlens_k)
    fn = lambda q, k, v: fac.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),  # noqa: E731
                                                    dropout_p=P, causal=causal, return_attn_probs=True)
    out, lse, keep, grads = _run_with_probs(fn, (q, k, v), dout)
    assert keep.shape == (8, 4, max(seqlens_q), max(seqlens_k))
    ref = lambda q, k, v, **kw: attention_varlen_ref(q, k, v, cu_q, cu_k, causal=causal, dropout_p=P,  # noqa: E731
                                                     dropout_mask=keep, **kw)[0]
    ref_out = ref(q, k, v)
    ref_lowp = ref(q, k, v, upcast=False, reorder_ops=True)
    err = (out.float() - ref_out).abs().max().item()
    assert err <= 2 * (ref_lowp.float() - ref_out).abs().max().item() + 1e-5
    _check_grads(grads, ref, (q, k, v), dout)


@pytest.mark.parametrize("window, causal, softcap, alibi", [
    ((64, 0), False, 0.0, False), ((100, 30), False, 0.0, True), ((-1, -1), True, 30.0, False),
    ((-1, -1), False, 5.0, True), ((256, -1), True, 30.0, True)], ids=["window", "window-alibi", "causal-softcap",
                                                                        "softcap-alibi", "all"])
def test_dropout_with_score_mods(window, causal, softcap, alibi):
    torch.manual_seed(2)
    batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim = 2, 200, 333, 8, 2, 128
    q = _randn(batch, seqlen_q, nheads, head_dim, dtype=BF16)
    k = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=BF16)
    v = _randn(batch, seqlen_k, nheads_k, head_dim, dtype=BF16)
    dout = _randn(batch, seqlen_q, nheads, head_dim, dtype=BF16)
    slopes = torch.rand(nheads, device="cuda") * 0.3 if alibi else None
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    fn = lambda q, k, v: fac.flash_attn_func(q, k, v, dropout_p=P, return_attn_probs=True, **kw)  # noqa: E731
    out, lse, keep, grads = _run_with_probs(fn, (q, k, v), dout)
    mods = dict(window_size=window, softcap=softcap, alibi_slopes=slopes, dropout_p=P, dropout_mask=keep)
    _check(q, k, v, causal, out, lse, **mods)
    ref = lambda q, k, v, **kw: attention_ref(q, k, v, causal=causal, **mods, **kw)[0]  # noqa: E731
    _check_grads(grads, ref, (q, k, v), dout)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_kept_fraction(p):
    torch.manual_seed(3)
    q, k, v = (_randn(2, 512, 4, 64, dtype=BF16) for _ in range(3))
    _, _, rng_state = fac.fwd(q, k, v, dropout_p=p)
    keep = fac.dropout_mask(rng_state, p, 2, 4, 512, 512)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    # Heads, rows and columns draw independent bits: no head's or 16-row band's mask repeats.
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    assert not torch.equal(keep[0, 0, :16], keep[0, 0, 16:32])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 59, 128])
def test_dropout_attn_probs_encoding(head_dim, causal):
    """return_attn_probs with dropout returns flash-attn 2.x's S_dmask encoding: an independent
    normalize step (flash-attn's normalize_flash_attn_S, float64 logits) recovers the float32
    reference's probabilities from it; its sign is the mask the forward applied (the output matches
    the reference under it, and about 1 - p of the visible entries are kept). Without dropout the
    third value is an empty tensor of q's dtype (flash-attn 2.7+)."""
    from flash_attn_cute.flash_attn_interface import _get_block_size_n
    from flash_attn_cute.reference import attention_probs_ref
    from test_attn_probs import naive_scores, normalize_flash_attn_S
    torch.manual_seed(4)
    q = _randn(2, 150, 4, head_dim, dtype=BF16)
    k, v = (_randn(2, 333, 2, head_dim, dtype=BF16) for _ in range(2))
    out, lse, S = fac.flash_attn_func(q, k, v, causal=causal, dropout_p=0.3, return_attn_probs=True)
    assert S.shape == (2, 4, 150, 333) and S.dtype == torch.float32 and not S.isnan().any()
    scores = naive_scores(q.cpu(), k.cpu(), causal)
    probs = normalize_flash_attn_S(S.cpu().double(), scores, _get_block_size_n(q.device, head_dim, True, causal))
    want = attention_probs_ref(q, k, causal=causal).cpu().double()
    assert (probs - want).abs().max().item() <= 1e-5
    keep = ~S.signbit()
    visible = ~scores.isinf().expand(2, 4, -1, -1).to(keep.device)
    assert abs(keep[visible].float().mean().item() - 0.7) < 0.01
    _check(q, k, v, causal, out, lse, dropout_p=0.3, dropout_mask=keep)
    _, _, none = fac.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert none.shape == (0,) and none.dtype == q.dtype


def test_dropout_seed_reproduces_and_differs():
    q, k, v = (_randn(2, 300, 4, 128, dtype=BF16) for _ in range(3))
    dout = _randn(2, 300, 4, 128, dtype=BF16)

    def run(seed):
        torch.manual_seed(seed)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fac.flash_attn_func(*leaves, dropout_p=P, causal=True, deterministic=True)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    first, again, other = run(7), run(7), run(8)
    for a, b in zip(first, again):
        assert torch.equal(a, b), "the same seed gives bitwise-equal outputs and gradients"
    assert not torch.equal(first[0], other[0]), "another seed gives another mask"
    torch.manual_seed(7)
    out1 = fac.flash_attn_func(q, k, v, dropout_p=P)
    out2 = fac.flash_attn_func(q, k, v, dropout_p=P)
    assert not torch.equal(out1, out2), "consecutive calls draw new masks"


def test_dropout_cuda_graph_replays_draw_new_masks():
    q, k, v = (_randn(2, 256, 4, 64, dtype=BF16) for _ in range(3))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fac.fwd(q, k, v, dropout_p=P)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, rng_state = fac.fwd(q, k, v, dropout_p=P)
    masks = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        keep = fac.dropout_mask(rng_state, P, 2, 4, 256, 256)
        masks.append(keep)
        _check(q, k, v, False, out, lse, dropout_p=P, dropout_mask=keep)
    assert not torch.equal(masks[0], masks[1]), "each replay advances the generator's offset"


def test_dropout_torch_compile_matches_eager():
    q, k, v = (_randn(2, 256, 4, 64, dtype=BF16).requires_grad_() for _ in range(3))

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        return (fac.flash_attn_func(q, k, v, dropout_p=P, causal=True, deterministic=True).float() ** 2).sum()

    def eager(q, k, v):
        return (fac.flash_attn_func(q, k, v, dropout_p=P, causal=True, deterministic=True).float() ** 2).sum()

    torch.manual_seed(9)
    compiled = torch.autograd.grad(loss_fn(q, k, v), (q, k, v))
    torch.manual_seed(9)
    reference = torch.autograd.grad(eager(q, k, v), (q, k, v))
    for g, e in zip(compiled, reference):
        assert torch.equal(g, e)


def test_dropout_out_residual_is_the_rounding_error():
    """out_residual holds O - O_rounded (at most half an ulp of out); the backward's row sums use it."""
    torch.manual_seed(10)
    q, k, v = (_randn(2, 300, 4, 64, dtype=BF16) for _ in range(3))
    residual = torch.full_like(q, float("nan"))
    out, lse, rng_state = fac.fwd(q, k, v, causal=True, dropout_p=P, out_residual=residual)
    assert not residual.isnan().any(), "every residual element is written"
    assert (residual.float().abs() <= out.float().abs() * 2.0 ** -8).all()
    assert residual.abs().max() > 0
    keep = fac.dropout_mask(rng_state, P, 2, 4, 300, 300)
    _check(q, k, v, True, out, lse, dropout_p=P, dropout_mask=keep)
