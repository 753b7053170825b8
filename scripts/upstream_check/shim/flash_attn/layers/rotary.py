"""Test-only shim: re-exports flash_attn_cute.layers.rotary (apply_rotary_emb)."""
from flash_attn_cute.layers.rotary import *  # noqa: F401,F403
