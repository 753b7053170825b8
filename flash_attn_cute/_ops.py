"""The compiled ops (torch.ops.flash_attn_cute.*), their fake implementations, and the low-level
`fwd` / `bwd` entry points."""
import math

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import validation as V

try:
    from . import _C  # noqa: F401  (registers torch.ops.flash_attn_cute.*)
    _IMPORT_ERROR = None
except ImportError as exc:  # a CPU-only install: the pure-Python parts still work
    _C = None
    _IMPORT_ERROR = exc

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # include/flash_attn_cute/tile_size.h


def kernel_head_dim(head_dim):
    """The kernel a (multiple-of-8) head dim runs on."""
    return next(d for d in _KERNEL_HEAD_DIMS if head_dim <= d)


# {(dtype name, kernel head dim, causal, variant)} compiled into this install (empty without CUDA);
# read once so that torch.compile sees a constant. Variant: "plain", "mods" (softcap / ALiBi / local
# windows) or "dropout" (dropout, with the score mods).
BUILT_FWD_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_fwd_kernels())
BUILT_BWD_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_bwd_kernels())
# {(dtype name, kernel head dim, causal, variant)} of the Hopper forward (sm_90a; "plain", "mods" or "dropout"),
# which whole launches take on compute capability 9.0 unless FLASH_ATTN_CUTE_SM90=0.
BUILT_FWD_SM90_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_fwd_sm90_kernels())
# The Hopper backward's (every variant), which non-deterministic calls take on compute capability 9.0
# unless FLASH_ATTN_CUTE_SM90_BWD=0.
BUILT_BWD_SM90_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_bwd_sm90_kernels())
# The SM80 kernels on small tiles, which GPUs that allow a block less shared memory than the default
# tiles take (sm_86 / sm_89; sm_80's backward at head dim 256), and whether they run on Hopper too
# (built with FLASH_ATTN_CUTE_SMALL_SMEM=1: the tests force them there with FLASH_ATTN_CUTE_SMEM_LIMIT).
BUILT_FWD_SMALL_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_fwd_small_kernels())
BUILT_BWD_SMALL_KERNELS = frozenset() if _C is None else frozenset(tuple(k) for k in _C.built_bwd_small_kernels())
SMALL_SMEM_RUNS_ON_HOPPER = _C is not None and _C.small_smem_runs_on_hopper()
# Eager flash_attn_* calls on head dims that are multiples of 8 take the C++ autograd function
# (run_attention); tests of the Python layer's own autograd function switch it off.
EAGER_CPP_AUTOGRAD = _C is not None


def is_local(window_size, seqlen_k):
    """A window side shorter than the keys (csrc/glue.cpp effective_window)."""
    left, right = window_size
    return 0 <= left < seqlen_k or 0 <= right < seqlen_k


def kernel_causal(causal, window_size):
    """Whether a call runs the causal kernels: causal, or a window (left, 0), the same bottom-right
    aligned mask with a left edge that the causal kernels take at run time (csrc/glue.cpp
    kernel_causal)."""
    return bool(causal) or window_size[1] == 0


def kernel_variant(window_size, softcap, alibi_slopes, causal, seqlen_k, dropout_p=0.0):
    """The kernel variant a call needs (csrc/glue.cpp kernel_variant): "dropout", "mods" (softcap,
    ALiBi or a window on a non-causal kernel) or "plain"."""
    if dropout_p:
        return "dropout"
    window_mods = not kernel_causal(causal, window_size) and is_local(window_size, seqlen_k)
    mods = bool(softcap) or alibi_slopes is not None or window_mods
    return "mods" if mods else "plain"


_VARIANT_WORDS = {"plain": "", "mods": " with softcap / ALiBi / a local window", "dropout": " with dropout"}


def _require_extension():
    if _C is None:
        raise RuntimeError("flash_attn_cute was installed without its CUDA extension "
                           f"(import failed: {_IMPORT_ERROR}); reinstall on a machine with CUDA torch")


def _require_kernel(dtype, head_dim, causal, window, softcap, alibi_slopes, seqlen_k, dropout_p=0.0, pass_="forward"):
    """The kernel a call with these arguments runs (kernel_causal, kernel_variant) is in this build."""
    _require_extension()
    variant = kernel_variant(window, softcap, alibi_slopes, causal, seqlen_k, dropout_p)
    causal = kernel_causal(causal, window)
    key = (_DTYPE_NAMES[dtype], kernel_head_dim(head_dim), causal, variant)
    if key not in (BUILT_FWD_KERNELS if pass_ == "forward" else BUILT_BWD_KERNELS):
        raise NotImplementedError(
            f"flash_attn_cute: this build has no {pass_} kernel for {key[0]}, head dim {head_dim} "
            f"(kernel {key[1]}), causal={causal}" + _VARIANT_WORDS[variant] +
            "; rebuild with FLASH_ATTN_CUTE_HDIMS / FLASH_ATTN_CUTE_DTYPES / FLASH_ATTN_CUTE_PASSES"
            " / FLASH_ATTN_CUTE_SCORE_MODS / FLASH_ATTN_CUTE_DROPOUT")


def _fake_only(t):
    """The fake implementations serve torch.compile's FakeTensors. A meta tensor (alone, or beside CUDA
    ones: the Meta dispatch key wins) reaches them too: refuse it, as the CUDA implementations'
    checks refuse any tensor off the GPU, instead of returning empty results."""
    if not isinstance(t, FakeTensor):
        V._fail(f"the ops need CUDA tensors: a meta tensor (beside {t.device} ones) sent this call to the fake "
                "implementation, which serves torch.compile's FakeTensors only")


if _C is not None:
    @torch.library.register_fake("flash_attn_cute::fwd")
    def _fwd_fake(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                  window_size_left, window_size_right, softcap, alibi_slopes, seqused_k, dropout_p, rng_state,
                  block_table, out_residual, leftpad_k=None):
        _fake_only(q)
        if cu_seqlens_q is not None:
            return q.new_empty((q.size(1), q.size(0)), dtype=torch.float32)
        return q.new_empty((q.size(0), q.size(2), q.size(1)), dtype=torch.float32)

    @torch.library.register_fake("flash_attn_cute::bwd")
    def _bwd_fake(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
                  deterministic, seqused_k, dropout_p, rng_state, out_residual):
        _fake_only(dout)
        return None

    @torch.library.register_fake("flash_attn_cute::dropout_mask")
    def _dropout_mask_fake(rng_state, dropout_p, batch, heads, max_seqlen_q, max_seqlen_k, cu_seqlens_q,
                           cu_seqlens_k):
        _fake_only(rng_state)
        return rng_state.new_empty((batch, heads, max_seqlen_q, max_seqlen_k), dtype=torch.bool)

    @torch.library.register_fake("flash_attn_cute::fwd_kvcache")
    def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_rows,
                          cache_batch_idx, leftpad_k, block_table, softmax_scale, causal, window_size_left,
                          window_size_right, softcap, rotary_interleaved, alibi_slopes, num_splits):
        _fake_only(q)
        return (torch.empty_like(q, memory_format=torch.contiguous_format),
                q.new_empty((q.size(0), q.size(2), q.size(1)), dtype=torch.float32))


def kernel_input(x):
    """x itself if the kernels take its layout (V.layout_problem), else a contiguous copy in fresh
    (16-byte aligned) memory: flash-attn 2.x copies a q, k or v whose last dim is strided, and this
    copies the misaligned ones too. clone, not contiguous(): a contiguous tensor at a misaligned
    address would come back as it is."""
    if V.layout_problem("x", x) is None:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _check_aligned_head_dim(q, name):
    if q.size(-1) % V.ALIGN_ELEMENTS:
        V._fail(f"{name} needs a head dim that is a multiple of {V.ALIGN_ELEMENTS}, got {q.size(-1)} "
                "(flash_attn_func pads it for you)")


def _check_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The (max) sequence lengths the kernels run on."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return V.check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return q.size(1), k.size(1)


def _check_score_mods(q, cu_seqlens_q, window_size, softcap, alibi_slopes, softmax_scale):
    batch = q.size(0) if cu_seqlens_q is None else cu_seqlens_q.size(0) - 1
    return V.check_score_mods(window_size, softcap, alibi_slopes, batch, q.size(-2), q.device, softmax_scale)


def fwd(q, k, v, out=None, softmax_scale=None, causal=False, cu_seqlens_q=None, cu_seqlens_k=None,
        max_seqlen_q=None, max_seqlen_k=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, seqused_k=None,
        dropout_p=0.0, block_table=None, out_residual=None, leftpad_k=None):
    """Low-level forward: returns (out, softmax_lse), and with dropout_p > 0 (out, softmax_lse,
    rng_state).

    q: (batch, seqlen_q, nheads, d), k/v: (batch, seqlen_k, nheads_k, d); or, with cu_seqlens_q/k
    (int32, batch + 1) and max_seqlen_q/k, the varlen forms (total, nheads, d). d must be a multiple
    of 8 and at most 256 (the flash_attn_* functions pad other head dims). softmax_lse is fp32
    (batch, nheads, seqlen_q), or (nheads, total_q) for varlen; rows that see no key get out = 0 and
    lse = +inf. `out`, if given, is written in place. window_size, softcap and alibi_slopes follow
    flash-attn 2.x (local attention, cap * tanh(scores / cap), ALiBi bias); seqused_k (varlen, int32
    (batch,)) keeps only the first seqused_k[b] keys of sequence b. dropout_p drops each attention
    probability with that probability (scaling the kept ones by 1 / (1 - p)), drawing from torch's
    CUDA generator; rng_state (int64 (2,): seed, offset) is what `bwd` and `dropout_mask` need to
    redraw the same mask; out_residual (dropout only, like out) receives out's rounding residual,
    which `bwd` takes to compute its row sums exactly. block_table (varlen only, forward only): k and v are a paged cache
    (num_blocks, page_size, nheads_k, d) and sequence b's keys are its first cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] rows through pages block_table[b] (int32 (batch, max_blocks_per_seq)).
    leftpad_k (varlen only, int32 (batch,), flash-attn 2.6+'s): sequence b's keys start leftpad_k[b]
    rows into its cu_seqlens_k range (and end where the range, or seqused_k[b], does); neither a
    paged K / V nor dropout takes it, and `bwd` does not (as in flash-attn 2.x).
    """
    max_seqlen_q, max_seqlen_k, window = check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   causal, window_size, softcap, alibi_slopes, seqused_k, dropout_p,
                                                   block_table, out=out, out_residual=out_residual, leftpad_k=leftpad_k,
                                                   softmax_scale=softmax_scale)
    return run_fwd(q, k, v, out, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window,
                   softcap, alibi_slopes, seqused_k, dropout_p, block_table, out_residual, leftpad_k)


def check_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_size, softcap,
              alibi_slopes, seqused_k, dropout_p, block_table=None, out=None, out_residual=None, pads=False,
              leftpad_k=None, softmax_scale=None):
    """fwd's checks of its arguments; returns (max_seqlen_q, max_seqlen_k, window) as the kernels
    take them. pads: q, k, v are a flash_attn_* function's, which pads a head dim that is not a
    multiple of 8 and copies a layout the kernels cannot take (kernel_input) before calling run_fwd,
    so their layout needs no check."""
    if block_table is None:
        V.check_qkv(q, k, v, cu_seqlens_q is not None or cu_seqlens_k is not None)
        max_seqlen_q, max_seqlen_k = _check_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    else:  # the varlen arguments are checked with the pages
        max_seqlen_q, max_seqlen_k = V.check_paged_kv(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k,
                                                      max_seqlen_q, max_seqlen_k)
        if dropout_p:
            V._fail("a paged K / V (block_table) takes no dropout (it is for inference)")
    if not pads:
        _check_aligned_head_dim(q, "fwd")
    V.check_like("q", q, out=out, out_residual=out_residual)
    window = _check_score_mods(q, cu_seqlens_q, window_size, softcap, alibi_slopes, softmax_scale)
    V.check_seqused_k(seqused_k, cu_seqlens_k)
    V.check_dropout(dropout_p)
    V.check_leftpad_k(leftpad_k, cu_seqlens_k, block_table, dropout_p)
    if out_residual is not None and not dropout_p:
        V._fail("out_residual is written by the dropout forward only (dropout_p > 0)")
    tensors = dict(q=q, k=k, v=v, out=out, out_residual=out_residual)
    if not pads:
        V.check_layout(**{n: t for n, t in tensors.items() if t is not None})
    V.check_device(**tensors, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                   seqused_k=seqused_k, leftpad_k=leftpad_k)
    _require_kernel(q.dtype, q.size(-1), causal, window, softcap, alibi_slopes, max_seqlen_k, dropout_p)
    return max_seqlen_q, max_seqlen_k, window


def run_fwd(q, k, v, out, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window,
            softcap, alibi_slopes, seqused_k, dropout_p, block_table=None, out_residual=None, leftpad_k=None):
    """fwd on arguments check_fwd passed (its max_seqlen_q / _k and window)."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))
    if out is None:
        out = torch.empty_like(q)
    rng_state = torch.empty(2, dtype=torch.int64, device=q.device) if dropout_p else None
    lse = torch.ops.flash_attn_cute.fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        float(softmax_scale), bool(causal), *window, float(softcap), alibi_slopes,
                                        seqused_k, float(dropout_p), rng_state, block_table, out_residual, leftpad_k)
    return (out, lse, rng_state) if dropout_p else (out, lse)


def bwd(dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, softmax_scale=None, causal=False,
        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, deterministic=False,
        window_size=(-1, -1), softcap=0.0, alibi_slopes=None, seqused_k=None, dropout_p=0.0, rng_state=None,
        out_residual=None):
    """Low-level backward of `fwd`: returns (dq, dk, dv), like q, k, v.

    out and softmax_lse are what `fwd` returned for the same q, k, v, softmax_scale and causal;
    dout is the gradient of out (any strides with a contiguous last dimension). dq, dk, dv, if
    given, are written in place. With GQA / MQA, dk and dv are summed over the query heads that
    share each KV head. deterministic=True makes dq bitwise reproducible (dk and dv always are).
    window_size, softcap, alibi_slopes, seqused_k and dropout_p must be those the forward ran with,
    and rng_state the one it returned (and out_residual the one it filled, if any).
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    V.check_qkv(q, k, v, varlen)
    _check_aligned_head_dim(q, "bwd")
    max_seqlen_q, max_seqlen_k = _check_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    V.check_like("q", q, dout=dout, out=out, dq=dq, out_residual=out_residual)
    V.check_like("k", k, dk=dk, dv=dv)
    V.check_lse(softmax_lse, q, varlen)
    window = _check_score_mods(q, cu_seqlens_q, window_size, softcap, alibi_slopes, softmax_scale)
    V.check_seqused_k(seqused_k, cu_seqlens_k)
    V.check_dropout(dropout_p, rng_state, q.device)
    tensors = dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv, out_residual=out_residual)
    V.check_layout(**{n: t for n, t in tensors.items() if t is not None})
    V.check_device(**tensors, softmax_lse=softmax_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _require_kernel(q.dtype, q.size(-1), causal, window, softcap, alibi_slopes, max_seqlen_k, dropout_p, "backward")
    return run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k,
                   max_seqlen_q, max_seqlen_k, deterministic, window, softcap, alibi_slopes, seqused_k, dropout_p,
                   rng_state, out_residual)


def run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, deterministic, window, softcap, alibi_slopes, seqused_k, dropout_p, rng_state,
            out_residual):
    """bwd on arguments it checked, or that a checked forward ran with (flash_attn_func's backward):
    max_seqlen_q / _k and window as check_fwd returns them."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.size(-1))
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    torch.ops.flash_attn_cute.bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, float(softmax_scale), bool(causal), *window,
                                  float(softcap), alibi_slopes, bool(deterministic), seqused_k, float(dropout_p),
                                  rng_state, out_residual)
    return dq, dk, dv


def run_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window,
                  softcap, alibi_slopes, seqused_k, dropout_p, deterministic):
    """flash_attn_func's eager forward, through the C++ autograd function (csrc/autograd.cpp) where
    q, k or v requires grad, on arguments checked or left to the forward op to check (q, k, v are
    copied where the kernels cannot take their layout, as kernel_input does). Returns [out, lse] and,
    with dropout, rng_state."""
    return _C.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale),
                        bool(causal), *window, float(softcap), alibi_slopes, seqused_k, float(dropout_p),
                        bool(deterministic))


def dropout_mask(rng_state, dropout_p, batch, nheads, seqlen_q, seqlen_k, cu_seqlens_q=None, cu_seqlens_k=None):
    """The keep mask that `fwd` (which returned rng_state) applied with dropout_p: bool (batch,
    nheads, seqlen_q, seqlen_k), True where the probability was kept. Varlen: give cu_seqlens_q / _k
    (int32, batch + 1) and the max lengths; entries past a sequence's lengths are False."""
    V.check_dropout(dropout_p, rng_state, rng_state.device if isinstance(rng_state, torch.Tensor) else None)
    _require_extension()
    return torch.ops.flash_attn_cute.dropout_mask(rng_state, float(dropout_p), int(batch), int(nheads),
                                                  int(seqlen_q), int(seqlen_k), cu_seqlens_q, cu_seqlens_k)
