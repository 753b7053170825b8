"""Test-only shim: flash_attn.layers -> flash_attn_cute.layers."""
