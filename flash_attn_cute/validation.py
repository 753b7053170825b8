"""Input checks for every public entry point, with messages that name the problem.

Shapes, dtypes, head dims, strides and cu_seqlens are checked before the device, so a CPU-only
machine can test all of it. Checks that would need a host read of a GPU tensor are not done.
"""
import operator

import torch

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
ALIGN_ELEMENTS = 8  # 16 bytes of fp16 / bf16: the kernels move 16-byte vectors
MAX_GRID_YZ = 65535  # batch and nheads index grid.y / grid.z
MAX_SEQLEN = 2 ** 31 - 1024  # the kernels count a sequence's rows in int, rounded up to whole blocks
# The kernels take softmax_scale, softcap and softmax_scale / softcap times log2(e) in float32: past
# this, one is infinite and every score NaN.
SCALE_LIMIT = float(torch.finfo(torch.float32).max) / 1.4426950408889634


class FlashAttnInputError(ValueError, RuntimeError):
    """Raised for tensors or arguments the kernels cannot take. A ValueError, and a RuntimeError as
    flash-attn 2.x's TORCH_CHECK failures are, so callers catching either see it."""


def _fail(msg):
    raise FlashAttnInputError(f"flash_attn_cute: {msg}")


def raise_named(failure, check, *args, **kwargs):
    """For a call whose op checks its own arguments and raised `failure`: runs the Python checks
    (check(*args, **kwargs)) to name the problem, raising what they raise chained from `failure`, or
    `failure` itself when they find nothing (or a missing extension, which they also report)."""
    try:
        check(*args, **kwargs)
    except Exception as problem:
        raise problem from failure
    raise failure


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_dtypes(**tensors):
    dtype = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            _check_tensor(name, t)
        if dtype is None:
            first_name, dtype = name, t.dtype
        if t.dtype is not dtype or dtype not in SUPPORTED_DTYPES:
            if t.dtype not in SUPPORTED_DTYPES:
                _fail(f"{name} has dtype {t.dtype}; only torch.float16 and torch.bfloat16 are supported")
            _fail(f"{name} has dtype {t.dtype} but {first_name} has {dtype}; all must match")


def last_dim_problem(name, t):
    """Why t's last dim is not contiguous, or None."""
    if t.dim() and t.size(-1) > 1 and t.stride(-1) != 1:
        return f"{name} must have a contiguous last dimension (stride(-1) == 1), got strides {t.stride()}"
    return None


def layout_problem(name, t):
    """Why the kernels cannot take t's layout, or None: the last dim contiguous, 16-byte aligned
    strides and pointer (the pointer is unknown while torch.compile traces)."""
    sizes = t.shape
    # Contiguous with rows of whole 16-byte vectors: every stride is a multiple (the common case, fast).
    if not (t.is_contiguous() and sizes and sizes[-1] % ALIGN_ELEMENTS == 0):
        strides = t.stride()
        if not strides:
            return None
        if strides[-1] != 1 and sizes[-1] > 1:
            return last_dim_problem(name, t)
        for size, stride in zip(sizes[:-1], strides[:-1]):
            if stride % ALIGN_ELEMENTS and size > 1:
                return (f"{name} strides {strides} must be multiples of {ALIGN_ELEMENTS} elements "
                        f"(16 bytes) in every dimension but the last")
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:
        return f"{name} data pointer must be 16-byte aligned"
    return None


def check_layout(**tensors):
    _fail_on_first(layout_problem, tensors)


def check_last_dim(**tensors):
    """A contiguous last dim: all the Python layer's padded copies of a tensor need."""
    _fail_on_first(last_dim_problem, tensors)


def _fail_on_first(problem_of, tensors):
    for name, t in tensors.items():
        problem = problem_of(name, t)
        if problem:
            _fail(problem)


def check_head_dim(head_dim, head_dim_v):
    if head_dim != head_dim_v:
        _fail(f"q/k head dim {head_dim} and v head dim {head_dim_v} must be equal")
    if not 0 < head_dim <= MAX_HEAD_DIM:
        _fail(f"head dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")


def check_qkv(q, k, v, varlen):
    """Shapes of q (b, sq, h, d) / k, v (b, sk, hk, d), or their varlen (total, h, d) forms."""
    check_dtypes(q=q, k=k, v=v)
    rank = 3 if varlen else 4
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != rank:
            form = "(total, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
            _fail(f"{name} must be {rank}-D {form}, got shape {tuple(shape)}")
    if k_shape[:-1] != v_shape[:-1]:
        _fail(f"k {tuple(k_shape)} and v {tuple(v_shape)} must agree in all but the last dimension")
    if not varlen and q_shape[0] != k_shape[0]:
        _fail(f"q batch {q_shape[0]} and k batch {k_shape[0]} differ")
    if q_shape[-1] != k_shape[-1]:
        _fail(f"q head dim {q_shape[-1]} and k head dim {k_shape[-1]} differ")
    check_head_dim(q_shape[-1], v_shape[-1])
    nheads, nheads_k = q_shape[-2], k_shape[-2]
    if nheads_k == 0 or nheads % nheads_k:
        _fail(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    if nheads > MAX_GRID_YZ:
        _fail(f"nheads ({nheads}) must be at most {MAX_GRID_YZ}")
    if not varlen and q_shape[0] > MAX_GRID_YZ:
        _fail(f"batch ({q_shape[0]}) must be at most {MAX_GRID_YZ}")


def check_cu_seqlens(name, cu, total):
    _check_tensor(name, cu)
    if cu.dtype != torch.int32:
        _fail(f"{name} must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        _fail(f"{name} must be 1-D of length batch + 1, got shape {tuple(cu.shape)}")
    if not cu.is_contiguous():
        _fail(f"{name} must be contiguous")
    if cu.numel() - 1 > MAX_GRID_YZ:
        _fail(f"batch ({cu.numel() - 1}) must be at most {MAX_GRID_YZ}")


def _check_cu_seqlens_values(name, cu, total, max_name, max_seqlen):
    """Only for CPU cu_seqlens: reading a GPU tensor here would synchronise the device."""
    if cu.device.type != "cpu" or torch.compiler.is_compiling():
        return
    if cu[0] != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > total:
        _fail(f"{name} must start at 0, be non-decreasing and end at most at {total}")
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    if longest > max_seqlen:
        _fail(f"{max_name} ({max_seqlen}) is smaller than the longest sequence in {name} ({longest})")


def require_cu_seqlens(cu_seqlens_q, cu_seqlens_k):
    if cu_seqlens_q is None or cu_seqlens_k is None:
        _fail("varlen needs both cu_seqlens_q and cu_seqlens_k")


def check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_k=None):
    """total_k: the key rows cu_seqlens_k may span (k.size(0); a paged K / V's batch * capacity).
    Returns (max_seqlen_q, max_seqlen_k) as ints (as_seqlen)."""
    total_k = k.size(0) if total_k is None else total_k
    require_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.size(0))
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        _fail(f"cu_seqlens_q ({cu_seqlens_q.numel()}) and cu_seqlens_k ({cu_seqlens_k.numel()}) "
              "must have the same length (batch + 1)")
    max_seqlen_q = as_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = as_seqlen("max_seqlen_k", max_seqlen_k)
    _check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, q.size(0), "max_seqlen_q", max_seqlen_q)
    _check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, total_k, "max_seqlen_k", max_seqlen_k)
    return max_seqlen_q, max_seqlen_k


def as_seqlen(name, value):
    """A max_seqlen as a non-negative Python int: anything with __index__ (numpy integers) or a 0-d
    integer tensor (transformers passes position_ids.max() + 1; a CUDA one is read on the host, as
    flash-attn 2.x reads it). A SymInt (torch.compile) passes as it is."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not (value.dtype.is_floating_point or value.dtype.is_complex
                                     or value.dtype == torch.bool):
            value = int(value)
    elif not isinstance(value, (bool, int, torch.SymInt)):
        try:
            value = operator.index(value)
        except TypeError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
        _fail(f"{name} must be a non-negative int, got {value!r}")
    if value > MAX_SEQLEN:
        _fail(f"{name} ({value}) must be at most {MAX_SEQLEN}")
    return value


def check_like(ref_name, ref, **tensors):
    """Tensors (None: not given) that must have the shape and dtype of ref."""
    for name, t in tensors.items():
        if t is None:
            continue
        _check_tensor(name, t)
        if t.shape != ref.shape or t.dtype != ref.dtype:
            _fail(f"{name} must match {ref_name}: shape {tuple(ref.shape)} dtype {ref.dtype}, "
                  f"got {tuple(t.shape)} {t.dtype}")


def check_lse(lse, q, varlen):
    """softmax_lse as the forward returns it: contiguous float32 (batch, nheads, seqlen_q) or
    (nheads, total_q)."""
    _check_tensor("softmax_lse", lse)
    shape = (q.size(1), q.size(0)) if varlen else (q.size(0), q.size(2), q.size(1))
    if lse.dtype != torch.float32 or tuple(lse.shape) != shape or not lse.is_contiguous():
        _fail(f"softmax_lse must be the forward's contiguous float32 tensor of shape {shape}, "
              f"got {tuple(lse.shape)} {lse.dtype}" + ("" if lse.is_contiguous() else " (not contiguous)"))


_CAPABILITIES = {}


def _capability(device):
    """torch.cuda.get_device_capability, once per device (it costs microseconds a call)."""
    capability = _CAPABILITIES.get(device)
    if capability is None:
        capability = _CAPABILITIES[device] = torch.cuda.get_device_capability(device)
    return capability


def check_device(**tensors):
    """All tensors (None: not given) on one CUDA device of compute capability 8.0 or newer."""
    device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != "cuda":
            _fail(f"{name} is on {t.device}; flash_attn_cute needs CUDA tensors")
        if device is None:
            device = t.device
        elif t.device != device:
            devices = {t.device for t in tensors.values() if t is not None}
            _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if torch.compiler.is_compiling():
        return  # checked when the op runs; a device query would break the graph
    major, minor = _capability(device)
    if major < 8:
        _fail(f"{torch.cuda.get_device_name(device)} (sm_{major}{minor}) is not supported: "
              "flash_attn_cute needs compute capability 8.0 or newer")


def check_dropout(dropout_p, rng_state=None, device=None):
    """dropout_p: a number in [0, 1). With rng_state (the backward, dropout_mask): the forward's int64
    (2,) tensor on `device`, required when dropout_p > 0."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, torch.SymInt, torch.SymFloat)) \
            or not 0 <= dropout_p < 1:
        _fail(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if device is None and rng_state is None:
        return
    if dropout_p and rng_state is None:
        _fail("dropout_p > 0 needs rng_state, the one the forward (fwd) returned")
    if rng_state is not None:
        _check_tensor("rng_state", rng_state)
        if rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,) or not rng_state.is_contiguous():
            _fail(f"rng_state must be the forward's contiguous int64 tensor of shape (2,), got {rng_state.dtype} "
                  f"{tuple(rng_state.shape)}")
        if rng_state.device.type != "cuda" or (device is not None and rng_state.device != device):
            _fail(f"rng_state is on {rng_state.device}; it must be on q's CUDA device")


MIN_PAGE_SIZE = 16  # pages hold whole 16-row MMA slabs


def check_block_table(block_table, batch, pages, pages_name):
    """A paged K / V: block_table int32 (batch, max_blocks_per_seq) of page indices into `pages`
    (num_blocks, page_size, nheads_k, headdim), page_size a positive multiple of 16. Entries are
    range-checked when block_table is on the CPU. Returns the keys one sequence can hold."""
    _check_tensor("block_table", block_table)
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.size(0) != batch:
        _fail(f"block_table must be an int32 tensor of shape (batch={batch}, max_blocks_per_seq), got "
              f"{block_table.dtype} {tuple(block_table.shape)}")
    if block_table.stride(-1) != 1:
        _fail("block_table must have a contiguous last dimension")
    page_size = pages.size(1)
    if page_size % MIN_PAGE_SIZE or page_size == 0:
        _fail(f"the paged cache's page size ({pages_name}.size(1) = {page_size}) must be a positive multiple of "
              f"{MIN_PAGE_SIZE}")
    if block_table.device.type == "cpu" and block_table.numel() and not torch.compiler.is_compiling():
        if bool((block_table < 0).any()) or bool((block_table >= pages.size(0)).any()):
            _fail(f"block_table entries must be page indices in [0, {pages.size(0)})")
    return block_table.size(1) * page_size


def check_paged_kv(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """flash_attn_varlen_func's paged K / V: q (total_q, nheads, d), k / v (num_blocks, page_size,
    nheads_k, d) read through block_table; cu_seqlens_k gives each sequence's key count. Returns
    (max_seqlen_q, max_seqlen_k) as ints."""
    for name, t in (("k", k), ("v", v)):
        _check_tensor(name, t)
        if t.dim() != 4 or t.size(0) == 0:
            _fail(f"with block_table, {name} must be 4-D (num_blocks, page_size, nheads_k, headdim) with at least one "
                  f"block, got shape {tuple(t.shape)}")
    check_qkv(q, k[0], v[0], True)  # one page: the dtype, head and head dim rules
    if k.shape[:-1] != v.shape[:-1]:
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in all but the last dimension")
    require_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    batch = cu_seqlens_k.numel() - 1
    capacity = check_block_table(block_table, batch, k, "k")
    max_seqlen_q, max_seqlen_k = check_varlen(q, k[0], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                              total_k=batch * capacity)
    if max_seqlen_k > capacity:
        _fail(f"max_seqlen_k ({max_seqlen_k}) is more keys than a block_table row's pages hold ({capacity})")
    return max_seqlen_q, max_seqlen_k


def check_seqused_k(seqused_k, cu_seqlens_k):
    """seqused_k: int32 (batch,) next to cu_seqlens_k (varlen only)."""
    _check_sequence_ints("seqused_k", seqused_k, cu_seqlens_k)


def check_leftpad_k(leftpad_k, cu_seqlens_k, block_table, dropout_p):
    """leftpad_k: int32 (batch,) next to cu_seqlens_k (varlen only), with neither a paged K / V nor
    dropout (flash-attn 2.x refuses the first; the second is training, where it has no backward)."""
    if leftpad_k is None:
        return
    _check_sequence_ints("leftpad_k", leftpad_k, cu_seqlens_k)
    if block_table is not None:
        _fail("a paged K / V (block_table) takes no leftpad_k (as in flash-attn 2.x)")
    if dropout_p:
        _fail("leftpad_k takes no dropout (it is for inference; the backward does not take it)")


def _check_sequence_ints(name, t, cu_seqlens_k):
    """A per-sequence key bound: int32 (batch,), contiguous, next to cu_seqlens_k (varlen only)."""
    if t is None:
        return
    if cu_seqlens_k is None:
        _fail(f"{name} needs the varlen form (cu_seqlens_q / cu_seqlens_k)")
    check_int32_vector(name, t, cu_seqlens_k.numel() - 1)
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous")


def check_int32_vector(name, t, batch):
    """t: an int32 tensor of shape (batch,)."""
    _check_tensor(name, t)
    if t.dtype != torch.int32 or t.dim() != 1 or t.size(0) != batch:
        _fail(f"{name} must be an int32 tensor of shape ({batch},), got {t.dtype} {tuple(t.shape)}")


def _check_softmax_scale(softmax_scale, softcap):
    if softmax_scale is not None:
        try:  # a float, an int, a SymFloat under torch.compile or a one-element tensor
            finite = not isinstance(softmax_scale, (bool, str)) and bool(-SCALE_LIMIT <= softmax_scale <= SCALE_LIMIT)
        except (TypeError, RuntimeError):
            finite = False
        if not finite:
            _fail(f"softmax_scale must be a finite number of magnitude at most {SCALE_LIMIT:.4g}, "
                  f"got {softmax_scale!r}")
    scale = 1.0 if softmax_scale is None else softmax_scale  # the default, 1 / sqrt(head_dim), is at most 1
    if softcap > 0 and not -SCALE_LIMIT * softcap <= scale <= SCALE_LIMIT * softcap:
        _fail(f"softmax_scale / softcap must be at most {SCALE_LIMIT:.4g} in magnitude, got softmax_scale "
              f"{'None (at most 1)' if softmax_scale is None else repr(softmax_scale)} and softcap {softcap!r}")


def check_score_mods(window_size, softcap, alibi_slopes, batch, nheads, device, softmax_scale=None):
    """window_size (left, right), a negative side unbounded (as in flash-attn 2.x); softcap >= 0;
    alibi_slopes fp32 (nheads,) or (batch, nheads) on q's device; softmax_scale (None: the default
    1 / sqrt(head_dim), at most 1) a finite number. Returns window_size as a tuple of two ints, -1
    for an unbounded side."""
    try:
        left, right = (max(int(x), -1) for x in window_size)
    except (TypeError, ValueError):
        _fail(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    # Under torch.compile a float saved for the backward arrives as a SymFloat.
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, torch.SymInt, torch.SymFloat)) \
            or not 0 <= softcap <= SCALE_LIMIT:
        _fail(f"softcap must be a number >= 0 (0: off) and at most {SCALE_LIMIT:.4g}, got {softcap!r}")
    _check_softmax_scale(softmax_scale, softcap)
    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes)
        if alibi_slopes.dtype != torch.float32 or tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            _fail(f"alibi_slopes must be float32 of shape ({nheads},) or ({batch}, {nheads}), got "
                  f"{alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            _fail(f"alibi_slopes is on {alibi_slopes.device} but q is on {device}")
        if alibi_slopes.stride(-1) != 1:
            _fail("alibi_slopes must have a contiguous last dimension")
    return left, right

