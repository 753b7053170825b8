"""flash-attn 2.x's flash_attn.flash_attn_interface under this package's name: the public functions,
and the low-level and test helpers that callers and flash-attn's tests import from that module."""
from .interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
    _get_block_size_n,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    maybe_contiguous,
    round_multiple,
)
from .kvcache import flash_attn_with_kvcache

__all__ = [
    "_flash_attn_backward",
    "_flash_attn_forward",
    "_flash_attn_varlen_backward",
    "_flash_attn_varlen_forward",
    "_get_block_size_n",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "maybe_contiguous",
    "round_multiple",
]
