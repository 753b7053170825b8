"""flash_attn_with_kvcache against the float32 reference (GPU only): dense, batch-indexed and paged
caches, appended keys with and without rotary embedding, GQA, causal chunks, split counts, CUDA
graph replay, and a cache that must hold exactly what was appended (every other row untouched).
"""
import math

import pytest
import torch

import flash_attn_cute as fac
from flash_attn_cute.reference import attention_ref, rotary_ref
from test_fwd import _assert_close_rule, _assert_lse_close, _randn

pytestmark = pytest.mark.cuda

BF16, F16, I32 = torch.bfloat16, torch.float16, torch.int32


def _rotary_tables(positions, rotary_dim, dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device="cuda", dtype=torch.float32) / rotary_dim))
    angles = torch.outer(torch.arange(positions, device="cuda", dtype=torch.float32), inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Cache:
    """A KV cache of `capacity` rows per sequence, dense or in pages of page_size rows (pages handed
    out in a shuffled order, with spare pages no sequence owns)."""

    def __init__(self, batch, capacity, nheads_k, d, dtype, page_size=None, entries=None):
        self.page_size, self.capacity = page_size, capacity
        if page_size is None:
            shape = (entries or batch, capacity, nheads_k, d)
            self.block_table = None
        else:
            pages_per_seq = capacity // page_size
            num_pages = batch * pages_per_seq + 3
            shape = (num_pages, page_size, nheads_k, d)
            perm = torch.randperm(num_pages, device="cuda")[: batch * pages_per_seq]
            self.block_table = perm.view(batch, pages_per_seq).to(I32)
        self.k = _randn(*shape, dtype=dtype)
        self.v = _randn(*shape, dtype=dtype)

    def dense(self, t, b, entry):
        """Sequence b's rows as (capacity, nheads_k, d)."""
        if self.block_table is None:
            return t[entry]
        return t[self.block_table[b].long()].flatten(0, 1)


def _expected_cache(before, new, seqlen, rotate):
    """Sequence rows after appending new (seqlen_new, nheads_k, d) at row seqlen (nothing when new is
    None), rotated by rotate(rows, positions) when given."""
    after = before.clone()
    if new is not None:
        positions = torch.arange(seqlen, seqlen + new.size(0), device="cuda")
        after[seqlen:seqlen + new.size(0)] = (rotate(new, positions) if rotate else new.float()).to(before.dtype)
    return after


def _run_and_check(*, batch=3, seqlen_q=1, nheads=8, nheads_k=2, d=128, capacity=512, page_size=None,
                   seqlen_new=0, rotary=None, causal=False, dtype=BF16, num_splits=0, cache_seqlens=None,
                   batch_idx=None, leftpad=None, entries=None, window_size=(-1, -1)):
    cache = Cache(batch, capacity, nheads_k, d, dtype, page_size, entries)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    if cache_seqlens is None:
        cache_seqlens = torch.randint(0, capacity - seqlen_new + 1, (batch,), device="cuda", dtype=I32)
    q = _randn(batch, seqlen_q, nheads, d, dtype=dtype)
    k_new = _randn(batch, seqlen_new, nheads_k, d, dtype=dtype) if seqlen_new else None
    v_new = _randn(batch, seqlen_new, nheads_k, d, dtype=dtype) if seqlen_new else None
    cos = sin = None
    if rotary is not None:
        cos, sin = _rotary_tables(capacity, d // 2 // 16 * 16, dtype)  # rotary_dim: a multiple of 16
    out, lse = fac.flash_attn_with_kvcache(
        q, cache.k, cache.v, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=cache.block_table, causal=causal,
        rotary_interleaved=rotary == "interleaved", num_splits=num_splits, return_softmax_lse=True,
        window_size=window_size)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (batch, nheads, seqlen_q)

    rotate = None
    if rotary is not None:
        def rotate(x, positions):
            return rotary_ref(x, cos, sin, positions, interleaved=rotary == "interleaved")
    lens = cache_seqlens.tolist()
    for b in range(batch):
        entry = batch_idx[b].item() if batch_idx is not None else b
        start = leftpad[b].item() if leftpad is not None else 0
        end = lens[b] + seqlen_new
        for name, now, was, new in (("k", cache.k, before_k, k_new), ("v", cache.v, before_v, v_new)):
            got = cache.dense(now, b, entry)
            want = _expected_cache(cache.dense(was, b, entry), None if new is None else new[b], lens[b],
                                   rotate if name == "k" else None)
            untouched = torch.ones(capacity, dtype=torch.bool, device="cuda")
            untouched[lens[b]:end] = False
            assert torch.equal(got[untouched], want[untouched]), f"{name} cache rows outside the append changed"
            # Appended rows: the copy, or the rotation as rotary_ref computes it, bit for bit.
            assert torch.equal(got[~untouched], want[~untouched]), f"{name} appended rows differ"
        keys = cache.dense(cache.k, b, entry)[start:end].unsqueeze(0)
        values = cache.dense(cache.v, b, entry)[start:end].unsqueeze(0)
        q_b = q[b]
        if rotate is not None:
            per_row = causal or any(0 <= w < capacity for w in window_size)
            positions = lens[b] + (torch.arange(seqlen_q, device="cuda") if per_row else
                                   torch.zeros(seqlen_q, device="cuda", dtype=torch.long))
            q_b = rotate(q_b, positions).to(dtype)
        q_b = q_b.unsqueeze(0)
        ref, lse_ref = attention_ref(q_b, keys, values, causal=causal, window_size=window_size)
        ref_lowp, _ = attention_ref(q_b, keys, values, causal=causal, upcast=False, reorder_ops=True,
                                    window_size=window_size)
        try:
            _assert_close_rule(out[b], ref[0], ref_lowp[0])
            _assert_lse_close(lse[b], lse_ref[0])
        except AssertionError as e:
            raise AssertionError(f"sequence {b} (cache {lens[b]}, new {seqlen_new}): {e}") from None
    return out


@pytest.mark.parametrize("page_size", [None, 16, 64, 256], ids=lambda p: f"page{p}" if p else "dense")
@pytest.mark.parametrize("update", ["none", "append", "rotary_interleaved", "rotary_half"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa4", "gqa8"])
@pytest.mark.parametrize("rows", ["decode", "decode_causal", "chunk4_causal"])
def test_kvcache_matches_reference(page_size, update, heads, rows):
    torch.manual_seed(0)
    seqlen_q, causal = {"decode": (1, False), "decode_causal": (1, True), "chunk4_causal": (4, True)}[rows]
    rotary = {"rotary_interleaved": "interleaved", "rotary_half": "half"}.get(update)
    _run_and_check(nheads=heads[0], nheads_k=heads[1], page_size=page_size, seqlen_new=0 if update == "none" else 3,
                   rotary=rotary, seqlen_q=seqlen_q, causal=causal)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [32, 64, 80, 128, 192, 256])
@pytest.mark.parametrize("page_size", [16, 256])
def test_kvcache_dtypes_head_dims(dtype, d, page_size):
    """Head dims of every split-KV tile (80 runs on the 96 kernel with masked columns), with 16-key
    pages (smaller than the split kernel's key block up to head dim 128: looked up row by row; one
    16-key block at 192 and 256) and pages that hold whole key blocks (one lookup per block); then a
    dense cache."""
    torch.manual_seed(1)
    _run_and_check(dtype=dtype, d=d, seqlen_new=2, rotary="interleaved", page_size=page_size)
    if page_size == 16:
        _run_and_check(dtype=dtype, d=d, seqlen_q=5, causal=True, capacity=300)


@pytest.mark.parametrize("num_splits", [-1, 0, 1, 2, 3, 4, 8, 128])
@pytest.mark.parametrize("page_size", [None, 64], ids=["dense", "page64"])
def test_num_splits_agree(num_splits, page_size):
    """Every split count gives a result within the accuracy rule (128 splits: many are empty; 2 and 4
    run as the warps of one CTA, merged in shared memory, without the combine kernel; below 1, as 0,
    the heuristic)."""
    torch.manual_seed(2)
    _run_and_check(batch=2, capacity=4096, page_size=page_size, num_splits=num_splits, seqlen_new=1,
                   cache_seqlens=torch.tensor([4000, 17], device="cuda", dtype=I32))


@pytest.mark.parametrize("num_splits", [2, 4])
@pytest.mark.parametrize("window_size", [(-1, -1), (70, 0)], ids=str)
@pytest.mark.parametrize("d", [128, 256])
def test_warp_splits_many_rows(num_splits, window_size, d):
    """Splits as the warps of one CTA with several query row blocks (GQA packs 4 heads x 9 rows into
    36 rows: three 16-row blocks, the last partial), causal or windowed, and a sequence whose keys
    some warps never reach (17 keys over 2-4 splits). At head dim 256 a warp's fp32 partial fills
    its Q and K tiles and reaches into V's."""
    torch.manual_seed(5)
    _run_and_check(batch=2, seqlen_q=9, nheads=8, nheads_k=2, d=d, capacity=2048, num_splits=num_splits,
                   causal=True, window_size=window_size,
                   cache_seqlens=torch.tensor([2000, 17], device="cuda", dtype=I32))


@pytest.mark.parametrize("length", [1, 1000, 131072 - 1])
def test_long_and_short_caches(length):
    """Cache lengths from 1 to 128k (32 query heads over 8 KV heads, as in decoding)."""
    torch.manual_seed(3)
    _run_and_check(batch=1, nheads=32, nheads_k=8, capacity=131072, seqlen_new=1, page_size=256,
                   cache_seqlens=torch.tensor([length], device="cuda", dtype=I32))


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_rotary_append_equals_apply_rotary_emb(interleaved, dtype):
    """flash-attn's kvcache test compares the cache after a rotary append with apply_rotary_emb's
    keys at atol 1e-3, below one bf16 step at 1: the append must round as that rotation does, bit
    for bit (2M rotated values a case; the float32 products of 16-bit inputs are exact, so only the
    sum and the cast round, in the kernel as in torch)."""
    from flash_attn_cute.layers.rotary import apply_rotary_emb
    torch.manual_seed(0)
    batch, capacity, nheads_k, d, seqlen_new = 2, 2048, 8, 128, 1024
    k_cache, v_cache = _randn(batch, capacity, nheads_k, d, dtype=dtype), _randn(batch, capacity, nheads_k, d, dtype=dtype)
    k, v = _randn(batch, seqlen_new, nheads_k, d, dtype=dtype), _randn(batch, seqlen_new, nheads_k, d, dtype=dtype)
    q = _randn(batch, 1, 2 * nheads_k, d, dtype=dtype)
    cache_seqlens = torch.tensor([0, 700], device="cuda", dtype=I32)
    cos, sin = _rotary_tables(capacity, d, dtype)
    fac.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                cache_seqlens=cache_seqlens, rotary_interleaved=interleaved)
    want = apply_rotary_emb(k, cos, sin, interleaved=interleaved, seqlen_offsets=cache_seqlens)
    for b, start in enumerate(cache_seqlens.tolist()):
        got = k_cache[b, start:start + seqlen_new]
        differ = (got != want[b]).sum().item()
        assert differ == 0, f"sequence {b}: {differ} of {got.numel()} appended key values differ from apply_rotary_emb's"
        assert torch.equal(v_cache[b, start:start + seqlen_new], v[b])


@pytest.mark.parametrize("window_size", [(100, 0), (50, 50)], ids=str)
def test_rotary_with_window_rotates_q_per_row(window_size):
    """A local window (not causal) rotates q's rows at their own positions, as flash-attn 2.x does."""
    torch.manual_seed(7)
    _run_and_check(seqlen_q=3, seqlen_new=3, rotary="interleaved", window_size=window_size)


def test_batch_idx_and_leftpad():
    torch.manual_seed(4)
    _run_and_check(batch=3, entries=5, batch_idx=torch.tensor([4, 0, 2], device="cuda", dtype=I32),
                   leftpad=torch.tensor([0, 30, 100], device="cuda", dtype=I32),
                   cache_seqlens=torch.tensor([50, 200, 100], device="cuda", dtype=I32), seqlen_new=2,
                   rotary="half", seqlen_q=2, causal=True)


def test_empty_cache_rows_without_keys():
    """cache_seqlens 0 and nothing appended: no key at all, out 0 and LSE +inf (never NaN)."""
    q = _randn(2, 1, 8, 128, dtype=BF16)
    k_cache = _randn(2, 64, 2, 128, dtype=BF16)
    out, lse = fac.flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_seqlens=0, return_softmax_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and (lse == math.inf).all()


def test_bad_pages_on_device_stay_in_bounds():
    """A block table with entries outside the cache (which only the device can see) reads those pages
    as zeros and writes nothing into them: no fault, finite output."""
    q = _randn(2, 1, 8, 128, dtype=BF16)
    k_cache = _randn(4, 16, 2, 128, dtype=BF16)
    v_cache = _randn(4, 16, 2, 128, dtype=BF16)
    table = torch.tensor([[0, -1, 1 << 30], [3, 2, 1]], device="cuda", dtype=I32)
    k_new = _randn(2, 1, 2, 128, dtype=BF16)
    out = fac.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new.clone(), block_table=table,
                                      cache_seqlens=torch.tensor([20, 40], device="cuda", dtype=I32))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


class DecodeStep:
    """A decoder's step over a dense bf16 cache: step() appends k_new / v_new (k rotated) at seqlens,
    rotates q and attends causally."""

    def __init__(self, seqlens, nheads=16, nheads_k=4, d=128, capacity=2048):
        batch = seqlens.numel()
        self.seqlens = seqlens
        self.cos, self.sin = _rotary_tables(capacity, d, BF16)
        self.k_cache = _randn(batch, capacity, nheads_k, d, dtype=BF16)
        self.v_cache = _randn(batch, capacity, nheads_k, d, dtype=BF16)
        self.q = _randn(batch, 1, nheads, d, dtype=BF16)
        self.k_new = _randn(batch, 1, nheads_k, d, dtype=BF16)
        self.v_new = _randn(batch, 1, nheads_k, d, dtype=BF16)

    def __call__(self):
        return fac.flash_attn_with_kvcache(self.q, self.k_cache, self.v_cache, self.k_new, self.v_new,
                                           rotary_cos=self.cos, rotary_sin=self.sin, cache_seqlens=self.seqlens,
                                           causal=True)


def test_cuda_graph_replay_with_new_lengths():
    """A decode step (append + rotary + attention) captured once and replayed with new q, k, v and
    cache_seqlens gives what an eager call gives."""
    torch.manual_seed(5)
    step = DecodeStep(torch.tensor([10, 500, 1000, 2000], device="cuda", dtype=I32))
    step()  # warm-up (allocations, lazy init) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = step()
    for lengths in ([0, 1, 2046, 7], [1500, 3, 64, 1024]):
        step.seqlens.copy_(torch.tensor(lengths, dtype=I32))
        step.q.copy_(torch.randn_like(step.q))
        step.k_new.copy_(torch.randn_like(step.k_new))
        k_before, v_before = step.k_cache.clone(), step.v_cache.clone()
        graph.replay()
        replayed, k_after, v_after = out_static.clone(), step.k_cache.clone(), step.v_cache.clone()
        step.k_cache.copy_(k_before)
        step.v_cache.copy_(v_before)
        eager = step()
        torch.testing.assert_close(replayed, eager, atol=0, rtol=0)
        assert torch.equal(step.k_cache, k_after) and torch.equal(step.v_cache, v_after)


def test_decode_step_appends_in_one_launch():
    """A decode step with append and rotary launches one row copy (keys, values, q's rotation and the
    caches' new lengths) and, besides it, only the attention's kernels: no torch kernel, copy or fill."""
    torch.manual_seed(7)
    step = DecodeStep(torch.tensor([100, 900], device="cuda", dtype=I32), capacity=1024)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("rotary_copy_kernel" in name for name in kernels) == 1, kernels
    assert not any("at::" in name or name.startswith(("Memcpy", "Memset")) for name in kernels), kernels


def test_torch_compile_decode_step():
    """A decode step (append + rotary + attention) under torch.compile(fullgraph=True) writes the
    caches in place and returns what the eager step does (the op's schema declares those writes)."""
    torch.manual_seed(8)
    step = DecodeStep(torch.tensor([10, 700, 0], device="cuda", dtype=I32))
    k_before, v_before = step.k_cache.clone(), step.v_cache.clone()
    eager = step()
    k_eager, v_eager = step.k_cache.clone(), step.v_cache.clone()
    step.k_cache.copy_(k_before)
    step.v_cache.copy_(v_before)

    @torch.compile(fullgraph=True)
    def compiled(q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens):
        return fac.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                           cache_seqlens=seqlens, causal=True) * 2

    out = compiled(step.q, step.k_cache, step.v_cache, step.k_new, step.v_new, step.cos, step.sin, step.seqlens)
    torch.testing.assert_close(out, eager * 2, atol=0, rtol=0)
    assert torch.equal(step.k_cache, k_eager) and torch.equal(step.v_cache, v_eager)
    assert not torch.equal(k_eager, k_before)


@pytest.mark.parametrize("bad", ["short_rotary", "num_splits", "seqlens_past_capacity", "pages_and_batch_idx",
                                 "no_q_rows_pages_and_batch_idx", "v_dtype", "seqlens_int64", "k_batch"])
def test_bad_call_names_the_problem_and_writes_nothing(bad):
    """The op checks every argument before its first launch (the Python checks run only to name the
    problem it raised): a bad call raises the named problem and leaves the caches as they were."""
    from flash_attn_cute import FlashAttnInputError
    torch.manual_seed(9)
    step = DecodeStep(torch.tensor([10, 700], device="cuda", dtype=I32), capacity=1024)
    kwargs = dict(k=step.k_new, v=step.v_new, rotary_cos=step.cos, rotary_sin=step.sin, cache_seqlens=step.seqlens,
                  causal=True)
    q, k_cache, v_cache = step.q, step.k_cache, step.v_cache
    if bad == "short_rotary":
        kwargs.update(rotary_cos=step.cos[:1000], rotary_sin=step.sin[:1000])
        msg = r"have 1000 positions; the cache holds 1024 rows"
    elif bad == "num_splits":
        kwargs.update(num_splits=129)
        msg = r"num_splits must be an int of at most 128"
    elif bad == "seqlens_past_capacity":
        kwargs.update(cache_seqlens=1024)
        msg = r"cache_seqlens \(1024\) \+ the new keys \(1\) exceed the cache capacity \(1024\)"
    elif bad in ("pages_and_batch_idx", "no_q_rows_pages_and_batch_idx"):  # without q's rows: no attention
        q = q[:, :0] if bad.startswith("no_q_rows") else q
        k_cache, v_cache = (x.view(-1, 16, *x.shape[2:]) for x in (k_cache, v_cache))
        kwargs.update(block_table=torch.arange(128, device="cuda", dtype=I32).view(2, 64),
                      cache_batch_idx=torch.tensor([1, 0], device="cuda", dtype=I32))
        msg = r"cache_batch_idx cannot be combined with block_table"
    elif bad == "v_dtype":
        kwargs.update(v=step.v_new.half())
        msg = r"v has dtype torch.float16 but q has torch.bfloat16"
    elif bad == "seqlens_int64":
        kwargs.update(cache_seqlens=step.seqlens.long())
        msg = r"cache_seqlens must be an int32 tensor of shape \(2,\)"
    else:
        kwargs.update(k=step.k_new[:1], v=step.v_new[:1])
        msg = r"k and v must have shape \(batch=2"
    k_before, v_before = k_cache.clone(), v_cache.clone()
    with pytest.raises(FlashAttnInputError, match=msg):
        fac.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    torch.cuda.synchronize()
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


def test_flash_attn_func_decode_uses_splits():
    """flash_attn_func on decode shapes (GQA packed rows, split-KV) against the reference."""
    torch.manual_seed(6)
    q = _randn(2, 1, 32, 128, dtype=BF16)
    k = _randn(2, 30000, 8, 128, dtype=BF16)
    v = _randn(2, 30000, 8, 128, dtype=BF16)
    out, lse, _ = fac.flash_attn_func(q, k, v, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v)
    ref_lowp, _ = attention_ref(q, k, v, upcast=False, reorder_ops=True)
    _assert_close_rule(out, ref, ref_lowp)
    _assert_lse_close(lse, lse_ref)


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mods", ["plain", "window", "softcap"])
def test_varlen_paged_kv(page_size, causal, mods):
    """flash_attn_varlen_func over a paged K / V (shuffled pages) against the reference on the same
    keys gathered densely; sequences of every length, empty ones included."""
    torch.manual_seed(5)
    seqlens_q = [0, 17, 128, 1, 300, 0, 255, 3]
    seqlens_k = [5, 0, 128, 77, 299, 0, 513, 1]
    batch, nheads, nheads_k, d = len(seqlens_q), 8, 2, 128
    pages_per_seq = max(-(-n // page_size) for n in seqlens_k)
    num_pages = batch * pages_per_seq + 3
    k_pages = _randn(num_pages, page_size, nheads_k, d, dtype=BF16)
    v_pages = _randn(num_pages, page_size, nheads_k, d, dtype=BF16)
    block_table = torch.randperm(num_pages, device="cuda")[:batch * pages_per_seq].view(batch, pages_per_seq).int()
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), nheads, d, dtype=BF16)
    kw = dict(causal=causal, window_size=(40, 7) if mods == "window" else (-1, -1),
              softcap=20.0 if mods == "softcap" else 0.0)
    out, lse, _ = fac.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                             block_table=block_table, return_attn_probs=True, **kw)
    # max_seqlen_k beyond what a row of pages holds is refused (its keys would be cut).
    with pytest.raises(ValueError, match="more keys than a block_table row"):
        fac.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(seqlens_q), pages_per_seq * page_size + 1,
                                   block_table=block_table)
    for b in range(batch):
        q0, q1 = cu_q[b].item(), cu_q[b + 1].item()
        if q1 == q0:
            continue
        n = seqlens_k[b]
        keys = k_pages[block_table[b].long()].flatten(0, 1)[:n].unsqueeze(0)
        values = v_pages[block_table[b].long()].flatten(0, 1)[:n].unsqueeze(0)
        ref, lse_ref = attention_ref(q[None, q0:q1], keys, values, **kw)
        ref_lowp, _ = attention_ref(q[None, q0:q1], keys, values, upcast=False, reorder_ops=True, **kw)
        try:
            _assert_close_rule(out[q0:q1], ref[0], ref_lowp[0])
            _assert_lse_close(lse[:, q0:q1], lse_ref[0])
        except AssertionError as e:
            raise AssertionError(f"sequence {b} ({q1 - q0} rows, {n} keys): {e}") from None


@pytest.mark.parametrize("d", [59, 128])
def test_varlen_paged_kv_grad_inputs_and_odd_head_dim(d):
    """The paged forward runs with inputs that require grad (flash-attn 2.x runs it; only the backward
    is missing) and with a head dim that is not a multiple of 8 (q and the pages padded): its output
    matches the reference, and a backward through it raises."""
    torch.manual_seed(8)
    seqlens_q, seqlens_k, page_size, nheads, nheads_k = [3, 50, 0, 129], [70, 1, 0, 200], 16, 4, 2
    batch = len(seqlens_q)
    pages_per_seq = max(-(-n // page_size) for n in seqlens_k)
    num_pages = batch * pages_per_seq + 1
    k_pages = _randn(num_pages, page_size, nheads_k, d, dtype=BF16).requires_grad_()
    v_pages = _randn(num_pages, page_size, nheads_k, d, dtype=BF16).requires_grad_()
    block_table = torch.randperm(num_pages, device="cuda")[:batch * pages_per_seq].view(batch, pages_per_seq).int()
    cu_q = torch.tensor([0] + seqlens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + seqlens_k, device="cuda").cumsum(0).int()
    q = _randn(int(cu_q[-1]), nheads, d, dtype=BF16).requires_grad_()
    out = fac.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=True,
                                     block_table=block_table)
    assert out.shape == q.shape and out.requires_grad
    for b in range(batch):
        q0, q1, n = cu_q[b].item(), cu_q[b + 1].item(), seqlens_k[b]
        if q1 == q0:
            continue
        keys = k_pages.detach()[block_table[b].long()].flatten(0, 1)[:n].unsqueeze(0)
        values = v_pages.detach()[block_table[b].long()].flatten(0, 1)[:n].unsqueeze(0)
        ref, _ = attention_ref(q.detach()[None, q0:q1], keys, values, causal=True)
        ref_lowp, _ = attention_ref(q.detach()[None, q0:q1], keys, values, causal=True, upcast=False, reorder_ops=True)
        _assert_close_rule(out.detach()[q0:q1], ref[0], ref_lowp[0])
    with pytest.raises(NotImplementedError, match=r"block_table \(a paged K / V\) has no backward"):
        out.float().sum().backward()


@pytest.mark.parametrize("page_size", [None, 16], ids=["dense", "page16"])
@pytest.mark.parametrize("d", [59, 111])
def test_kvcache_head_dim_not_a_multiple_of_8(d, page_size):
    """Head dims that are not a multiple of 8 run on padded copies (flash-attn 2.x pads them): the
    appended rows (rotated) land in the caller's caches in place, every other row untouched, and out
    (of the caller's head dim) is within the accuracy rule of the float32 reference."""
    torch.manual_seed(9)
    out = _run_and_check(d=d, seqlen_new=3, rotary="interleaved", page_size=page_size, capacity=256)
    assert out.shape[-1] == d
    _run_and_check(d=d, seqlen_q=4, causal=True, capacity=320, page_size=page_size)  # nothing appended


def test_kvcache_strided_q_k_v():
    """q, k, v in layouts the kernels cannot read are copied: the same output and caches as
    contiguous inputs give."""
    torch.manual_seed(10)
    q = _randn(2, 3, 64, 8, dtype=BF16).transpose(-1, -2)  # (2, 3, 8, 64), head stride 1
    k_new = _randn(2, 3, 2, 128, dtype=BF16)[..., ::2]  # (2, 3, 2, 64), last dim strided
    v_new = _randn(2 * 3 * 2 * 64 + 1, dtype=BF16)[1:].view(2, 3, 2, 64)  # misaligned pointer
    caches = [_randn(2, 256, 2, 64, dtype=BF16) for _ in range(2)]
    seqlens = torch.tensor([17, 200], device="cuda", dtype=I32)
    copies = [c.clone() for c in caches]
    out = fac.flash_attn_with_kvcache(q, *caches, k_new, v_new, cache_seqlens=seqlens, causal=True)
    want = fac.flash_attn_with_kvcache(q.contiguous(), *copies, k_new.contiguous(), v_new.contiguous(),
                                       cache_seqlens=seqlens, causal=True)
    assert torch.equal(out, want) and all(torch.equal(a, b) for a, b in zip(caches, copies))
