"""flash_attn_cute: FlashAttention-2 as CUDA/CuTe kernels, a drop-in for flash-attn 2.x."""
__version__ = "0.1.0"

from ._ops import BUILT_BWD_KERNELS, BUILT_FWD_KERNELS, bwd, dropout_mask, fwd
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .kvcache import flash_attn_with_kvcache
from .validation import FlashAttnInputError

__all__ = [
    "BUILT_BWD_KERNELS",
    "BUILT_FWD_KERNELS",
    "FlashAttnInputError",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "bwd",
    "dropout_mask",
    "fwd",
]
