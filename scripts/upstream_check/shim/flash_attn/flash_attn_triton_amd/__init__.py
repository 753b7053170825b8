"""Test-only shim: flash-attn's ROCm/Triton backend package, which upstream's tests import for two
switches. flash_attn_cute is CUDA only, so the stub says "not ROCm" (utils.py)."""
