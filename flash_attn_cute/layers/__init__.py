"""Modules of flash-attn 2.x's ``flash_attn.layers`` that its users and tests import (rotary)."""
