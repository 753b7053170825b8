"""Test-only shim: re-exports flash_attn_cute.flash_attn_interface (its __all__, incl. _get_block_size_n)."""
from flash_attn_cute.flash_attn_interface import *  # noqa: F401,F403
