"""Test-only shim: `flash_attn` -> flash_attn_cute, so upstream flash-attn's tests import our package.
Re-exports only; nothing is implemented here (names flash_attn_cute lacks stay missing on purpose)."""
from flash_attn_cute import *  # noqa: F401,F403
from flash_attn_cute import __version__  # noqa: F401
