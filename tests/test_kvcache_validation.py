"""flash_attn_with_kvcache's argument checks, on CPU: every bad argument gets a clear error before
any device work, and a valid call gets as far as the device check."""
import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute import FlashAttnInputError

F16, BF16, I32 = torch.float16, torch.bfloat16, torch.int32
B, SQ, H, HK, D, SC = 2, 1, 8, 2, 64, 256  # batch, new queries, heads, kv heads, head dim, cache length
DEVICE_MSG = r"is on cpu; flash_attn_cute needs CUDA tensors"


def t(*shape, dtype=F16):
    return torch.zeros(*shape, dtype=dtype)


def call(**changes):
    args = dict(q=t(B, SQ, H, D), k_cache=t(B, SC, HK, D), v_cache=t(B, SC, HK, D), cache_seqlens=100)
    args.update(changes)
    return lambda: fac.flash_attn_with_kvcache(**args)


def paged(**changes):
    base = dict(k_cache=t(10, 16, HK, D), v_cache=t(10, 16, HK, D), block_table=torch.zeros(B, 4, dtype=I32),
                cache_seqlens=torch.tensor([3, 60], dtype=I32))
    base.update(changes)
    return call(**base)


def raises(match, fn, exc=FlashAttnInputError):
    with pytest.raises(exc, match=match) as info:
        fn()
    assert str(info.value).startswith("flash_attn_cute: ")


VALID = {
    "decode": call(),
    "append_rotary": call(k=t(B, 3, HK, D), v=t(B, 3, HK, D), rotary_cos=t(SC, 16), rotary_sin=t(SC, 16),
                          cache_seqlens=torch.tensor([0, 253], dtype=I32)),
    "chunked_prefill_causal": call(q=t(B, 4, H, D), causal=True, num_splits=3),
    "batch_idx_leftpad": call(k_cache=t(5, SC, HK, D), v_cache=t(5, SC, HK, D),
                              cache_batch_idx=torch.tensor([4, 0], dtype=I32), cache_leftpad=t(B, dtype=I32)),
    "paged_16": paged(),
    "paged_append": paged(k=t(B, 4, HK, D), v=t(B, 4, HK, D), cache_seqlens=60),
    "mqa_bf16": call(q=t(B, SQ, H, D, dtype=BF16), k_cache=t(B, SC, 1, D, dtype=BF16),
                     v_cache=t(B, SC, 1, D, dtype=BF16), num_splits=128),
    "no_cache_seqlens": call(cache_seqlens=None),
    "window_softcap_alibi": call(window_size=(64, 0), softcap=30.0, alibi_slopes=t(B, H, dtype=torch.float32)),
    "window_below_minus_one": call(window_size=(8, -2)),  # any negative side is unbounded (flash-attn 2.x)
    "num_splits_negative": call(num_splits=-1),  # below 1: the heuristic (flash-attn 2.x)
    # q, k, v in layouts the kernels cannot read are copied (flash-attn 2.x copies a strided last dim).
    "hdim59_append": call(q=t(B, SQ, H, 59), k_cache=t(B, SC, HK, 59), v_cache=t(B, SC, HK, 59), k=t(B, 2, HK, 59),
                          v=t(B, 2, HK, 59), rotary_cos=t(SC, 16), rotary_sin=t(SC, 16)),  # padded copies
    "hdim59_paged_odd_strides": paged(q=t(B, SQ, H, 59), k_cache=t(10, 16, HK, 60)[..., :59],
                                      v_cache=t(10, 16, HK, 59)),
    "strided_q_k_v": call(q=t(B, SQ, D, H).transpose(-1, -2), k=t(B, 3, HK, 2 * D)[..., ::2],
                          v=t(B * 3 * HK * D + 1)[1:].view(B, 3, HK, D)),
}


@pytest.mark.parametrize("case", VALID)
def test_valid_inputs_reach_device_check(case):
    raises(DEVICE_MSG, VALID[case])


@pytest.mark.parametrize("fn, msg", [
    (call(q=t(B, H, D)), r"q must be 4-D"),
    (call(k_cache=t(B, SC, HK)), r"k_cache must be 4-D"),
    (call(v_cache=t(B, SC + 1, HK, D)), r"k_cache .* and v_cache .* must agree"),
    (call(k_cache=t(B, SC, HK, D, dtype=BF16)), r"k_cache has dtype torch.bfloat16 but q has torch.float16"),
    (call(k_cache=t(B, SC, 3, D), v_cache=t(B, SC, 3, D)), r"nheads \(8\) must be a multiple of nheads_k \(3\)"),
    (call(q=t(B, SQ, H, 59), k_cache=t(B, SC, HK, 118)[..., ::2], v_cache=t(B, SC, HK, 59)),
     r"k_cache must have a contiguous last dimension \(stride\(-1\) == 1\)"),
    (call(k_cache=t(3, SC, HK, D), v_cache=t(3, SC, HK, D)), r"k_cache batch 3 must equal q batch 2"),
    (call(k=t(B, 2, HK, D)), r"give both k and v"),
    (call(k=t(B, 2, HK, D), v=t(B, 2, 1, D)), r"k and v must have shape \(batch=2, seqlen_new, nheads_k=2"),
    (call(rotary_cos=t(SC, 16)), r"give both rotary_cos and rotary_sin"),
    (call(rotary_cos=t(SC, 12), rotary_sin=t(SC, 12)), r"rotary_dim .* = 24\) must be a multiple of 16"),
    (call(rotary_cos=t(SC, 16, dtype=BF16), rotary_sin=t(SC, 16, dtype=BF16)), r"rotary_cos must be 2-D .* dtype"),
    (call(rotary_cos=t(SC, 16), rotary_sin=t(SC, 16)), r"rotate the new keys: give k and v too"),
    (call(k=t(B, 1, HK, D), v=t(B, 1, HK, D), rotary_cos=t(SC - 1, 16), rotary_sin=t(SC - 1, 16)),
     r"have 255 positions; the cache holds 256 rows"),
    (call(cache_seqlens=torch.tensor([1, 2])), r"cache_seqlens must be an int32 tensor of shape \(2,\)"),
    (call(cache_seqlens=1.5), r"cache_seqlens must be an int or an int32 tensor"),
    (call(cache_seqlens=-1), r"cache_seqlens must be >= 0"),
    (call(cache_seqlens=255, k=t(B, 2, HK, D), v=t(B, 2, HK, D)), r"\(255\) \+ the new keys \(2\) exceed .* \(256\)"),
    (call(cache_seqlens=torch.tensor([1, 300], dtype=I32)), r"\(300\) .* exceed the cache capacity \(256\)"),
    (call(cache_batch_idx=torch.tensor([0, 1])), r"cache_batch_idx must be an int32 tensor of shape \(2,\)"),
    (call(cache_leftpad=t(3, dtype=I32)), r"cache_leftpad must be an int32 tensor of shape \(2,\)"),
    (call(num_splits=129), r"num_splits must be an int of at most 128 \(below 1: the heuristic\), got 129"),
    (call(num_splits=2.0), r"num_splits must be an int"),
    (paged(block_table=torch.zeros(B, 4)), r"block_table must be an int32 tensor of shape \(batch=2"),
    (paged(block_table=torch.zeros(3, 4, dtype=I32)), r"block_table must be an int32 tensor"),
    (paged(k_cache=t(10, 8, HK, D), v_cache=t(10, 8, HK, D)), r"page size .* = 8\) must be a positive multiple of 16"),
    (paged(block_table=torch.full((B, 4), 10, dtype=I32)), r"block_table entries must be page indices in \[0, 10\)"),
    (paged(cache_batch_idx=torch.tensor([0, 1], dtype=I32)), r"cache_batch_idx cannot be combined with block_table"),
    (paged(cache_seqlens=65), r"\(65\) .* exceed the cache capacity \(64\)"),
    (call(k_cache=t(B, SC, HK, 2 * D)[..., ::2], v_cache=t(B, SC, HK, D)), r"k_cache must have a contiguous last"),
    (call(v_cache=t(B, SC, HK, D + 1)[..., :D]), r"v_cache strides .* must be multiples of 8 elements"),
])
def test_bad_input(fn, msg):
    raises(msg, fn)


@pytest.mark.parametrize("changes, msg", [(dict(softcap=-5.0), r"softcap must be a number >= 0"),
                                          (dict(softcap=float("inf")), r"softcap must be a number >= 0"),
                                          (dict(softmax_scale=float("nan")), r"softmax_scale must be a finite"),
                                          (dict(softmax_scale=1e30, softcap=1e-10), r"softmax_scale / softcap"),
                                          (dict(alibi_slopes=t(H + 1, dtype=torch.float32)), r"alibi_slopes must be")])
def test_bad_score_mods(changes, msg):
    raises(msg, call(**changes))


def _fake_kernels(monkeypatch, calls):
    """kvcache._run_kvcache as a CPU emulation of the kernels on a dense cache: appends k, v at
    cache_seqlens (int), then attends (float32 reference) to the first cache_seqlens + seqlen_new keys."""
    from flash_attn_cute import _ops, kvcache, validation
    from flash_attn_cute.reference import attention_ref

    def fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, softmax_scale, causal, window_size, *rest):
        calls.append(dict(shapes=[None if x is None else tuple(x.shape) for x in (q, k_cache, v_cache, k, v)],
                          layouts=[validation.layout_problem("x", x) for x in (q, k, v) if x is not None],
                          caches=(k_cache, v_cache), scale=softmax_scale))
        end = cache_seqlens
        if k is not None:
            k_cache[:, cache_seqlens:cache_seqlens + k.size(1)] = k
            v_cache[:, cache_seqlens:cache_seqlens + k.size(1)] = v
            end += k.size(1)
        out, lse = attention_ref(q, k_cache[:, :end], v_cache[:, :end], causal=causal, softmax_scale=softmax_scale)
        return out.to(q.dtype), lse

    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    monkeypatch.setattr(kvcache, "_run_kvcache", fake)


@pytest.mark.parametrize("append", [False, True], ids=["no_append", "append"])
def test_head_dim_59_runs_padded_and_updates_the_callers_cache(append, monkeypatch):
    """Head dim 59 (not a multiple of 8) runs on copies padded to 64 (flash-attn 2.x pads them too):
    the kernels get 64-wide tensors and the caller's head dim's scale; out comes back 59 wide, and
    appended rows land in the caller's caches in place (the other rows untouched)."""
    import math
    from flash_attn_cute.reference import attention_ref
    calls = []
    _fake_kernels(monkeypatch, calls)
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(F16)  # noqa: E731
    q, k_cache, v_cache = rand(B, 3, H, 59), rand(B, 40, HK, 59), rand(B, 40, HK, 59)
    k_new, v_new = (rand(B, 2, HK, 59), rand(B, 2, HK, 59)) if append else (None, None)
    k_before, v_before, cache_ptr = k_cache.clone(), v_cache.clone(), k_cache.data_ptr()
    out, lse = fac.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=20, causal=True,
                                           return_softmax_lse=True)
    (call,) = calls
    assert call["shapes"] == [(B, 3, H, 64), (B, 40, HK, 64), (B, 40, HK, 64)] + [(B, 2, HK, 64) if append else None] * 2
    assert call["caches"][0].data_ptr() != cache_ptr and call["scale"] == pytest.approx(1 / math.sqrt(59))
    assert out.shape == q.shape and k_cache.data_ptr() == cache_ptr
    end = 22 if append else 20
    want_k, want_v = k_before.clone(), v_before.clone()
    if append:
        want_k[:, 20:22], want_v[:, 20:22] = k_new, v_new
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    ref, lse_ref = attention_ref(q, want_k[:, :end], want_v[:, :end], causal=True)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, lse_ref)


def test_strided_q_k_v_reach_the_kernels_as_copies(monkeypatch):
    """q, k, v in layouts the kernels cannot read are copied before the kernels (and the cache, in
    place, gets the appended values)."""
    calls = []
    _fake_kernels(monkeypatch, calls)
    k_cache, v_cache = t(B, 16, HK, D), t(B, 16, HK, D)
    k_new = torch.ones(B, 3, HK, 2 * D, dtype=F16)[..., ::2]
    fac.flash_attn_with_kvcache(t(B, SQ, D, H).transpose(-1, -2), k_cache, v_cache, k_new,
                                torch.ones(B * 3 * HK * D + 1, dtype=F16)[1:].view(B, 3, HK, D), cache_seqlens=5)
    assert calls[0]["layouts"] == [None, None, None] and calls[0]["caches"][0] is k_cache
    assert (k_cache[:, 5:8] == 1).all() and (v_cache[:, 5:8] == 1).all() and (k_cache[:, 8:] == 0).all()


@pytest.mark.parametrize("batch, heads", [(65536, H), (1, 65536)], ids=["batch", "nheads"])
def test_batch_and_nheads_past_the_grid_rejected(batch, heads):
    """batch and nheads index grid.y / grid.z (at most 65535): rejected before any launch (the
    rotary append's launch failed with "invalid configuration argument")."""
    q = t(1, SQ, 1, D).expand(batch, SQ, heads, D)
    cache = t(1, SC, 1, D).expand(batch, SC, heads if heads > H else HK, D)
    raises(r"batch \(\d+\) and nheads \(\d+\) must be at most 65535",
           call(q=q, k_cache=cache, v_cache=cache, k=t(1, 1, 1, D).expand(batch, 1, cache.size(2), D),
                v=t(1, 1, 1, D).expand(batch, 1, cache.size(2), D)))


def test_python_checks_run_only_when_the_op_raises(monkeypatch):
    """The op checks every argument itself: a call it takes runs no Python check (they cost a third of
    an eager decode step's host time); when it raises, the Python checks name the problem, and an
    error they find nothing wrong for comes through as it is."""
    from flash_attn_cute import _ops, kvcache, validation
    checked = []
    check_kvcache = kvcache.check_kvcache
    monkeypatch.setattr(kvcache, "check_kvcache", lambda *args: checked.append(args) or check_kvcache(*args))
    monkeypatch.setattr(kvcache, "_run_kvcache", lambda *args: ("out", "lse"))
    assert call()() == "out" and not checked  # CPU tensors: the checks would have raised

    def op_raises(*args):
        raise RuntimeError("flash_attn_cute: from the op")

    monkeypatch.setattr(kvcache, "_run_kvcache", op_raises)
    raises(DEVICE_MSG, call())
    raises(r"num_splits must be an int of at most 128", call(num_splits=129))
    assert len(checked) == 2
    monkeypatch.setattr(validation, "check_device", lambda **tensors: None)
    monkeypatch.setattr(_ops, "_require_kernel", lambda *args, **kwargs: None)
    with pytest.raises(RuntimeError, match="from the op") as info:
        call()()
    assert not isinstance(info.value, FlashAttnInputError)
    # Arguments of other types than the op takes (and head dims it does not) go through the checks first.
    raises(r"cache_seqlens must be an int or an int32 tensor", call(cache_seqlens=True))
    raises(r"num_splits must be an int", call(num_splits=True))
