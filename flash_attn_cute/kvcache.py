"""flash_attn_with_kvcache (flash-attn 2.x signature): attention over a KV cache, dense or paged,
with new keys and values appended in place and rotary embedding applied on the way. No check or
kernel here reads a GPU tensor on the host, so a decode step can be captured in a CUDA graph and
replayed with new cache_seqlens: values are checked only when they are Python ints or CPU tensors,
and the kernels skip (never read or write) rows outside the cache.
"""
import torch

from . import _ops
from . import validation as V
from .interface import _round_up_head_dim

MAX_SPLITS = 128  # include/flash_attn_cute/split_kv.h: kMaxSplits


def check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, num_splits):
    """Shapes, dtypes and the values that can be read without a device synchronisation. Returns the
    cache's capacity: the key rows one sequence can hold."""
    V.check_dtypes(q=q, k_cache=k_cache, v_cache=v_cache)
    q_shape, k_cache_shape, v_cache_shape = q.shape, k_cache.shape, v_cache.shape
    if len(q_shape) != 4:
        V._fail(f"q must be 4-D (batch, seqlen_q, nheads, headdim), got shape {tuple(q_shape)}")
    for name, shape in (("k_cache", k_cache_shape), ("v_cache", v_cache_shape)):
        if len(shape) != 4:
            V._fail(f"{name} must be 4-D (batch_cache, seqlen_cache, nheads_k, headdim) or, paged, "
                    f"(num_blocks, page_size, nheads_k, headdim), got shape {tuple(shape)}")
    if k_cache_shape[:-1] != v_cache_shape[:-1]:
        V._fail(f"k_cache {tuple(k_cache_shape)} and v_cache {tuple(v_cache_shape)} must agree in all but the "
                "last dimension")
    batch, seqlen_q, nheads, head_dim = q_shape
    nheads_k = k_cache_shape[2]
    if k_cache_shape[3] != head_dim:
        V._fail(f"q head dim {head_dim} and k_cache head dim {k_cache_shape[3]} differ")
    V.check_head_dim(head_dim, v_cache_shape[3])
    if nheads_k == 0 or nheads % nheads_k:
        V._fail(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    if batch > V.MAX_GRID_YZ or nheads > V.MAX_GRID_YZ:
        V._fail(f"batch ({batch}) and nheads ({nheads}) must be at most {V.MAX_GRID_YZ}")

    if block_table is not None:
        capacity = V.check_block_table(block_table, batch, k_cache, "k_cache")
        for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if t is not None:
                V._fail(f"{name} cannot be combined with block_table (a paged cache)")
    else:
        capacity = k_cache_shape[1]
        if cache_batch_idx is None and k_cache_shape[0] != batch:
            V._fail(f"k_cache batch {k_cache_shape[0]} must equal q batch {batch} (or give cache_batch_idx)")
        if cache_batch_idx is not None:
            V.check_int32_vector("cache_batch_idx", cache_batch_idx, batch)
        if cache_leftpad is not None:
            V.check_int32_vector("cache_leftpad", cache_leftpad, batch)

    seqlen_new = 0
    if (k is None) != (v is None):
        V._fail("give both k and v (the new keys and values to append) or neither")
    if k is not None:
        V.check_dtypes(q=q, k=k, v=v)
        k_shape = k.shape
        if len(k_shape) != 4 or k_shape[0] != batch or k_shape[2:] != (nheads_k, head_dim) or v.shape != k_shape:
            V._fail(f"k and v must have shape (batch={batch}, seqlen_new, nheads_k={nheads_k}, headdim={head_dim}), "
                    f"got {tuple(k_shape)} and {tuple(v.shape)}")
        seqlen_new = k_shape[1]

    if (rotary_cos is None) != (rotary_sin is None):
        V._fail("give both rotary_cos and rotary_sin or neither")
    if rotary_cos is not None:
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            V._check_tensor(name, t)
            if t.dim() != 2 or t.dtype != q.dtype:
                V._fail(f"{name} must be 2-D (seqlen_rotary, rotary_dim / 2) with q's dtype {q.dtype}, "
                        f"got {t.dtype} {tuple(t.shape)}")
        if rotary_cos.shape != rotary_sin.shape:
            V._fail(f"rotary_cos {tuple(rotary_cos.shape)} and rotary_sin {tuple(rotary_sin.shape)} differ")
        rotary_dim = 2 * rotary_cos.size(1)
        if rotary_dim == 0 or rotary_dim > head_dim or rotary_dim % 16:
            V._fail(f"rotary_dim (2 * rotary_cos.size(1) = {rotary_dim}) must be a multiple of 16 in [16, {head_dim}]")
        if k is None:
            V._fail("rotary_cos / rotary_sin rotate the new keys: give k and v too")
    if rotary_cos is not None and rotary_cos.size(0) < capacity:
        V._fail(f"rotary_cos / rotary_sin have {rotary_cos.size(0)} positions; the cache holds {capacity} rows "
                "per sequence and needs one position per row")

    if cache_seqlens is None:  # the whole cache is in use
        cache_seqlens = capacity
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.Tensor)):
        V._fail(f"cache_seqlens must be an int or an int32 tensor of shape ({batch},), "
                f"got {type(cache_seqlens).__name__}")
    if isinstance(cache_seqlens, int):
        longest = cache_seqlens
        if cache_seqlens < 0:
            V._fail(f"cache_seqlens must be >= 0, got {cache_seqlens}")
    else:
        V.check_int32_vector("cache_seqlens", cache_seqlens, batch)
        longest = None
        if cache_seqlens.device.type == "cpu" and batch and not torch.compiler.is_compiling():
            if bool((cache_seqlens < 0).any()):
                V._fail("cache_seqlens must be >= 0")
            longest = int(cache_seqlens.max())
    if longest is not None and longest + seqlen_new > capacity:
        V._fail(f"cache_seqlens ({longest}) + the new keys ({seqlen_new}) exceed the cache capacity ({capacity})")

    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits > MAX_SPLITS:
        V._fail(f"num_splits must be an int of at most {MAX_SPLITS} (below 1: the heuristic), got {num_splits!r}")
    # The caches are written in place, so their layout must be one the kernels take (with a head dim
    # that is not a multiple of 8 they run as padded copies, written back: a contiguous last dim
    # will do, as flash-attn 2.x asks); q, k and v are copied where it is not (_ops.kernel_input).
    if head_dim % V.ALIGN_ELEMENTS == 0:
        V.check_layout(k_cache=k_cache, v_cache=v_cache)
    else:
        V.check_last_dim(k_cache=k_cache, v_cache=v_cache)
    V.check_device(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                   block_table=block_table,
                   cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                   cache_seqlens=cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None)
    return capacity


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """q: (batch, seqlen_q, nheads, d); k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, d), or
    paged (num_blocks, page_size, nheads_k, d) with block_table (batch, max_blocks_per_seq) int32;
    k, v: new keys/values (batch, seqlen_new, nheads_k, d) written into the cache at cache_seqlens (int
    or int32 (batch,)) and attended to in the same call; rotary_cos / rotary_sin (seqlen_ro,
    rotary_dim / 2) rotate them and q (q at cache_seqlens + its row when causal or local, else all
    rows at cache_seqlens, as flash-attn 2.x). cache_batch_idx picks the cache entry of each sequence; cache_leftpad[b] is where
    sequence b's keys start. Returns out like q, or (out, softmax_lse (batch, nheads, seqlen_q)) with
    return_softmax_lse. A head dim that is not a multiple of 8 runs on padded copies (of the caches
    too, written back after an append), as in flash-attn 2.x: correct, but it copies the caches."""
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        window_size = V.check_score_mods(window_size, softcap, alibi_slopes, q.size(0), q.size(2), q.device,
                                         softmax_scale)
    checked = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
               block_table, num_splits)
    kernel = (causal, window_size, softcap, alibi_slopes)
    args = (rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
            window_size, softcap, rotary_interleaved, alibi_slopes, num_splits)
    if _op_checks(q, cache_seqlens, num_splits):
        # The op checks every argument before it writes anything (csrc/kvcache_api.cpp), so the Python
        # checks, a third of an eager decode step's host time, run only to name the problem it raised.
        try:
            capacity = k_cache.size(1) * (1 if block_table is None else block_table.size(1))
            out, lse = _attend(q, k_cache, v_cache, k, v, *args, capacity)
        except Exception as failure:
            V.raise_named(failure, _check, *checked, *kernel)
    else:
        out, lse = _attend(q, k_cache, v_cache, k, v, *args, _check(*checked, *kernel))
    return (out, lse) if return_softmax_lse else out


def _op_checks(q, cache_seqlens, num_splits):
    """Whether the op's own checks cover the call: outside torch.compile's tracing (where the Python
    checks cost nothing at run time), a head dim that is a multiple of 8 (else the padded copies),
    arguments of the types the op takes as they are."""
    return (not torch.compiler.is_compiling() and isinstance(q, torch.Tensor) and q.dim() == 4
            and q.size(3) % V.ALIGN_ELEMENTS == 0 and type(num_splits) is int
            and (cache_seqlens is None or type(cache_seqlens) is int or isinstance(cache_seqlens, torch.Tensor)))


def _check(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
           block_table, num_splits, causal, window_size, softcap, alibi_slopes):
    """Every argument check, with the messages that name the problem; returns the cache's capacity."""
    capacity = check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                             cache_leftpad, block_table, num_splits)
    _ops._require_kernel(q.dtype, q.size(-1), causal, window_size, softcap, alibi_slopes, capacity)
    return capacity


def _attend(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
            capacity):
    """_run_kvcache on q, k, v in layouts the kernels take (copies where they do not) and, for a head
    dim that is not a multiple of 8, on padded copies. Returns (out, lse)."""
    head_dim = q.size(-1)
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    args = (rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
            window_size, softcap, rotary_interleaved, alibi_slopes, num_splits, capacity)
    if head_dim % V.ALIGN_ELEMENTS == 0:
        q = _ops.kernel_input(q)
        if k is not None:
            k, v = _ops.kernel_input(k), _ops.kernel_input(v)
        return _run_kvcache(q, k_cache, v_cache, k, v, *args)
    # The kernels move 16-byte vectors: run on copies padded to a multiple of 8, the caches' too, and
    # write the appended rows back into the caller's caches (the whole caches: slow, but correct), as
    # flash-attn 2.x does.
    q_pad, k_cache_pad, v_cache_pad, k_pad, v_pad = (None if x is None else _round_up_head_dim(x)
                                                     for x in (q, k_cache, v_cache, k, v))
    out, lse = _run_kvcache(q_pad, k_cache_pad, v_cache_pad, k_pad, v_pad, *args)
    if k is not None:
        k_cache.copy_(k_cache_pad[..., :head_dim])
        v_cache.copy_(v_cache_pad[..., :head_dim])
    return out[..., :head_dim], lse


def _run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                 block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
                 capacity):
    """The kernels on checked arguments, head dim a multiple of 8, in one op call: append k, v
    (rotated) to the caches in place, then attend. Returns (out, lse)."""
    if isinstance(cache_seqlens, torch.Tensor):
        cache_rows = 0
    else:
        cache_rows, cache_seqlens = (capacity if cache_seqlens is None else cache_seqlens), None
    return torch.ops.flash_attn_cute.fwd_kvcache.default(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_rows, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size[0], window_size[1], float(softcap), rotary_interleaved,
        alibi_slopes, max(num_splits, 0))
