"""flash-attn 2.x's flash_attn.flash_attn_interface under this package's name: the public functions,
and the low-level and test helpers that callers and flash-attn's tests import from that module."""
from . import *  # noqa: F401,F403 (the package's public names: flash_attn_func, ..., flash_attn_with_kvcache)
from .interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
    _get_block_size_n,
    maybe_contiguous,
    round_multiple,
)

__all__ = sorted(name for name, value in globals().items() if not name.startswith("__") and callable(value))
