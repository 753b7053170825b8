#!/usr/bin/env bash
# Profiles one decode point with Nsight Compute: every kernel of a flash_attn_with_kvcache call
# (split-KV forward, combine) and of torch SDPA's cuDNN and FA2 decode on the same cache, with
# their launch shapes, DRAM throughput and warp stalls ($OUT/ncu_decode_b<batch>_L<len>.txt).
# Needs an installed flash_attn_cute (scripts/gpu_check.sh).
#   usage: bash scripts/ncu_decode.sh [batch] [cache length]
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
batch=${1:-32} length=${2:-1024}
cat > /tmp/ncu_decode_case.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flash_attn_cute as fac
b, L = $batch, $length
q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, L, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
seqlens = torch.full((b,), L, device="cuda", dtype=torch.int32)
for _ in range(3):
    fac.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    with sdpa_kernel(backend):
        for _ in range(3):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
torch.cuda.synchronize()
PY
report="$OUT/ncu_decode_b${batch}_L${length}.txt"
ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis python3 /tmp/ncu_decode_case.py > "$report" 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Grid Size|Block Size|Registers Per|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Issued" \
    "$report" | cut -c1-130 | head -120
