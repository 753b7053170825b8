"""Calls the registered op with input its C++ checks reject; it must raise, not crash."""
import torch

import flash_attn_cute  # noqa: F401  (loads the op)

q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16)
bad = q[..., :60]
try:
    torch.ops.flash_attn_cute.fwd(bad, bad, bad, torch.empty_like(bad), None, None, 16, 16, 0.1, False)
except RuntimeError as exc:
    print("raised:", str(exc).splitlines()[0])
